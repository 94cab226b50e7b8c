"""The storage layer: the storage root's layout (layout.py), the one mount mechanism both engines
use (mounts.py), stable uids/gids of users and groups (identities.py), content-addressed code
snapshots (code.py) and what one job gets mounted (plan.py). See docs/storage.md."""
