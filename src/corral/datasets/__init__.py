"""Datasets (named, owned, immutable versions under `<storage root>/data/`), their chunked
resumable uploads, the `data/<name>[@v]` mount source, job lineage, and storage quotas.

Modules: `models` (tables, migration 0010_datasets), `names` (what a name or an uploaded path may
be), `store` (the filesystem layout), `service` (datasets, access, sharing, deletion, the mount
source and lineage), `uploads` (upload sessions), `quotas` (storage quotas and usage), `loops`
(the leased background loops: stale uploads, usage scan).
"""
