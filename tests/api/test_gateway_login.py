"""The SSH gateway's login steps against the database (SQLite and PostgreSQL): whose keys may log
in, and what a login name resolves to (corral.gateway.resolver). The SSH side itself is in
tests/gateway/ and tests/server/test_sandbox_entry.py."""

from __future__ import annotations

import asyncssh
import pytest
import sqlalchemy as sa

from corral.db.models import User
from corral.gateway import resolver
from corral.services.errors import ServiceError
from tests.api.conftest import World


def test_a_deactivated_users_keys_open_nothing(world: World) -> None:
    """A deactivated user can no longer log in or use a token or session: nor SSH (the keys
    are read at each login, and resolver.authorized_keys says "none for a disabled user")."""
    key = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    added = world.client.post(
        "/api/v1/ssh-keys", json={"name": "laptop", "public_key": key}, headers=world.as_("alice")
    )
    assert added.status_code == 201, added.text
    with world.session_factory() as db:
        assert resolver.authorized_keys(db, "alice") == [key]
        db.execute(sa.update(User).where(User.name == "alice").values(active=False))
        db.commit()
    with world.session_factory() as db:
        assert resolver.authorized_keys(db, "alice") == []
        with pytest.raises(ServiceError, match="deactivated"):
            resolver.principal_for(db, "alice", "127.0.0.1")
