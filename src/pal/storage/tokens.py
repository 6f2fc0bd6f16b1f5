"""Secrets the journal keeps: API bearer tokens (only their sha256) and the key that signs PAL's
step messages (pal.core.doorbell)."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from pal.errors import StorageError
from pal.storage.base import Caches, StoreBase
from pal.storage.schema import FENCE_KEY, api_tokens, pal_keys


def _token_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class TokenStore(StoreBase):
    def __init__(self, engine: Engine, caches: Caches | None = None) -> None:
        super().__init__(engine, caches)
        self._fence_key: bytes | None = None

    @property
    def fence_key(self) -> bytes:
        """The key that signs PAL's step messages; read once per process."""
        if self._fence_key is None:
            with self._tx() as conn:
                secret = conn.execute(sa.select(pal_keys.c.secret)
                                      .where(pal_keys.c.name == FENCE_KEY)).scalar()
            if secret is None:
                raise StorageError("the journal has no fence key: run `pal db upgrade`")
            self._fence_key = bytes.fromhex(secret)
        return self._fence_key

    def create_token(self, *, tenant_id: str, name: str, now: datetime) -> tuple[str, str]:
        """A new bearer token for `tenant_id`: (token id, the secret, shown once; only its
        sha256 is stored)."""
        token_id = secrets.token_hex(8)
        secret = f"pal_{token_id}_{secrets.token_urlsafe(32)}"
        with self._tx() as conn:
            conn.execute(api_tokens.insert().values(
                id=token_id, tenant_id=tenant_id, name=name, token_hash=_token_hash(secret),
                created_at=now, revoked_at=None))
        return token_id, secret

    def token_tenant(self, secret: str) -> str | None:
        """The tenant of a live token, None for an unknown or revoked one."""
        owner = self.token_owner(secret)
        return owner[0] if owner else None

    def token_owner(self, secret: str) -> tuple[str, str] | None:
        """(tenant, name) of a live token, None for an unknown or revoked one."""
        with self._tx() as conn:
            row = conn.execute(sa.select(api_tokens.c.tenant_id, api_tokens.c.name).where(
                api_tokens.c.token_hash == _token_hash(secret), api_tokens.c.revoked_at.is_(None))).first()
        return (row.tenant_id, row.name) if row else None

    def revoke_token(self, *, token_id: str, now: datetime) -> bool:
        with self._tx() as conn:
            return conn.execute(api_tokens.update().where(api_tokens.c.id == token_id,
                                                          api_tokens.c.revoked_at.is_(None))
                                .values(revoked_at=now).returning(api_tokens.c.id)).first() is not None

    def list_tokens(self) -> list[dict[str, Any]]:
        with self._tx() as conn:
            rows = conn.execute(sa.select(api_tokens.c.id, api_tokens.c.tenant_id, api_tokens.c.name,
                                          api_tokens.c.created_at, api_tokens.c.revoked_at)
                                .order_by(api_tokens.c.created_at)).mappings()
            return [dict(r) for r in rows]
