"""A real `pal api` server process for tests, with tokens of two tenants and a revoked one."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pal.client import Client
from pal.core import dsse
from tests.support import web

# The receipts of a test control plane: signed with RECEIPT_KEY, and RETIRED_KEY's still trusted
# (a key rotated out). Fixed, so a failure can be replayed; never a key of a real deployment.
RECEIPT_KEY = dsse.SigningKey(Ed25519PrivateKey.from_private_bytes(b"pal-test-receipt-signing-key-32b"))
RETIRED_KEY = dsse.SigningKey(Ed25519PrivateKey.from_private_bytes(b"pal-test-retired-signing-key-32b"))
RECEIPT_ENV = {"PAL_SIGNING_KEY": dsse.private_text(RECEIPT_KEY.private),
               "PAL_TRUSTED_KEYS": dsse.public_text(RETIRED_KEY.public)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Api:
    url: str
    token: str  # tenant "acme"
    other: str  # tenant "globex"
    revoked: str
    client: Client
    env: dict[str, str]  # the PAL_* environment of the server's backend, for `pal` commands

    def call(self, method: str, path: str, token: str | None = None, **kwargs: Any) -> httpx.Response:
        headers = kwargs.pop("headers", {})
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        return web.request(method, self.url + path, headers=headers, timeout=30, **kwargs)

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.call("GET", path, self.token, **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.call("POST", path, self.token, **kwargs)
