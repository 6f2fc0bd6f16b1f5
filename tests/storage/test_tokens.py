"""API tokens: only a hash of the secret is kept, a revoked token names no tenant; the fence key
is one per database."""

from __future__ import annotations

import hashlib

import sqlalchemy as sa

from pal.storage.journal import Journal
from pal.storage.schema import api_tokens
from tests.storage.kit import at


def test_a_token_is_kept_only_as_its_hash(journal: Journal) -> None:
    token_id, secret = journal.tokens.create_token(tenant_id="t1", name="ci", now=at(1))
    assert secret.startswith(f"pal_{token_id}_") and len(secret) > 40
    with journal.engine.connect() as conn:
        rows = [dict(r) for r in conn.execute(sa.select(api_tokens)).mappings()]
    assert rows == [{"id": token_id, "tenant_id": "t1", "name": "ci",
                     "token_hash": hashlib.sha256(secret.encode()).hexdigest(),
                     "created_at": at(1), "revoked_at": None}]
    assert journal.tokens.token_tenant(secret) == "t1"
    assert journal.tokens.token_tenant(secret + "x") is None
    assert journal.tokens.token_tenant(rows[0]["token_hash"]) is None  # the hash is not a credential
    assert journal.tokens.token_owner(secret) == ("t1", "ci")  # who decides an approval with it
    assert journal.tokens.token_owner(rows[0]["token_hash"]) is None


def test_a_revoked_token_names_no_tenant(journal: Journal) -> None:
    revoked, secret = journal.tokens.create_token(tenant_id="t1", name="old", now=at(1))
    kept, other = journal.tokens.create_token(tenant_id="t2", name="new", now=at(2))
    assert journal.tokens.revoke_token(token_id=revoked, now=at(3))
    assert not journal.tokens.revoke_token(token_id=revoked, now=at(4))  # once
    assert not journal.tokens.revoke_token(token_id="unknown", now=at(4))
    assert journal.tokens.token_tenant(secret) is None and journal.tokens.token_owner(secret) is None
    assert journal.tokens.token_tenant(other) == "t2"
    assert [(t["id"], t["tenant_id"], t["revoked_at"]) for t in journal.tokens.list_tokens()] == [
        (revoked, "t1", at(3)), (kept, "t2", None)]


def test_the_fence_key_is_one_per_database(journal: Journal) -> None:
    key = journal.tokens.fence_key
    assert len(key) == 32
    assert Journal(journal.engine).tokens.fence_key == key
