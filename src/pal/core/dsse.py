"""Ed25519 keys and DSSE envelopes: how a run receipt is signed and checked (docs/receipts.md).

A DSSE envelope (the Dead Simple Signing Envelope of the in-toto and Sigstore projects) carries a
payload, its type and signatures over the *pre-authentication encoding* of both,
`DSSEv1 <len(type)> <type> <len(payload)> <payload>`, so a signature can never be replayed over the
same bytes read as another type. Ed25519 is deterministic: the same key and payload give the same
signature, hence the same envelope bytes every time a receipt is issued.

A key id names a public key: `ed25519:` and the first 16 hex digits of the SHA-256 of its 32 raw
bytes, always derived, so an id can never be bound to another key by configuration. Keys travel as
base64 of their raw 32 bytes (what `pal receipts keygen` prints) or as PEM.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

K = TypeVar("K", Ed25519PrivateKey, Ed25519PublicKey)
PAYLOAD_TYPE = "application/vnd.in-toto+json"
ENVELOPE_FIELDS = frozenset({"payload", "payloadType", "signatures"})


class UnreadableKey(ValueError):
    """A key that cannot be read."""


def b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def b64decode_strict(text: Any, what: str) -> bytes:
    """Standard base64 in its one canonical spelling: a string that decodes but is not what
    encoding its bytes gives (other padding bits, line breaks) is refused, so no two texts of an
    envelope carry the same bytes."""
    if not isinstance(text, str):
        raise ValueError(f"{what} is not a base64 string")
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{what} is not base64") from None
    if b64encode(data) != text:
        raise ValueError(f"{what} is not canonical base64")
    return data


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what is signed."""
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id_of(key: Ed25519PublicKey) -> str:
    return "ed25519:" + hashlib.sha256(raw_public(key)).hexdigest()[:16]


@dataclass(frozen=True)
class SigningKey:
    """The private key receipts are signed with."""

    private: Ed25519PrivateKey

    @property
    def public(self) -> Ed25519PublicKey:
        return self.private.public_key()

    @property
    def key_id(self) -> str:
        return key_id_of(self.public)

    @property
    def trusted(self) -> TrustedKey:
        return TrustedKey(self.key_id, self.public)


@dataclass(frozen=True)
class TrustedKey:
    key_id: str
    public: Ed25519PublicKey

    def as_dict(self) -> dict[str, str]:
        return {"keyid": self.key_id, "alg": "ed25519", "public_key": b64encode(raw_public(self.public))}


def new_private_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def private_text(key: Ed25519PrivateKey) -> str:
    """The base64 of the key's raw 32 bytes: PAL_SIGNING_KEY's value."""
    return b64encode(key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                       serialization.NoEncryption()))


def public_text(key: Ed25519PublicKey) -> str:
    return b64encode(raw_public(key))


def read_private_key(text: str) -> Ed25519PrivateKey:
    """A private key from base64 of its raw 32 bytes or from unencrypted PKCS#8 PEM."""
    def from_pem(pem: bytes) -> Ed25519PrivateKey | None:
        key = serialization.load_pem_private_key(pem, password=None)
        return key if isinstance(key, Ed25519PrivateKey) else None

    return _read_key(text, "private", from_pem, Ed25519PrivateKey.from_private_bytes)


def read_public_key(text: str) -> Ed25519PublicKey:
    """A public key from base64 of its raw 32 bytes or from PEM (SubjectPublicKeyInfo)."""
    def from_pem(pem: bytes) -> Ed25519PublicKey | None:
        key = serialization.load_pem_public_key(pem)
        return key if isinstance(key, Ed25519PublicKey) else None

    return _read_key(text, "public", from_pem, Ed25519PublicKey.from_public_bytes)


def _read_key(text: str, what: str, from_pem: Callable[[bytes], K | None],
              from_raw: Callable[[bytes], K]) -> K:
    text = text.strip()
    try:
        if text.startswith("-----BEGIN"):
            key = from_pem(text.encode("ascii"))
            if key is None:
                raise UnreadableKey("the PEM key is not an Ed25519 key")
            return key
        raw = base64.b64decode(text, validate=True)
        if len(raw) != 32:
            raise UnreadableKey(f"an Ed25519 {what} key is 32 bytes, this one is {len(raw)}")
        return from_raw(raw)
    except UnreadableKey:
        raise
    except (ValueError, TypeError, binascii.Error, UnicodeError):
        raise UnreadableKey(f"not an Ed25519 {what} key (base64 of 32 bytes, or PEM)") from None


def trusted_key(text: str) -> TrustedKey:
    """A public key and its (derived) id."""
    key = read_public_key(text)
    return TrustedKey(key_id_of(key), key)


def sign(payload: bytes, key: SigningKey) -> dict[str, Any]:
    """A DSSE envelope over `payload` with one signature."""
    signature = key.private.sign(pae(PAYLOAD_TYPE, payload))
    return {"payload": b64encode(payload), "payloadType": PAYLOAD_TYPE,
            "signatures": [{"keyid": key.key_id, "sig": b64encode(signature)}]}


class UnknownKey(ValueError):
    """No trusted key has the id the envelope was signed with."""


class BadSignature(ValueError):
    """The signature does not verify over the envelope's payload and type."""


def open_envelope(envelope: Any, keys: list[TrustedKey]) -> bytes:
    """The payload of an envelope signed by one of `keys`. Raises ValueError for an envelope that
    is not well formed, UnknownKey, or BadSignature."""
    if not isinstance(envelope, dict) or set(envelope) != ENVELOPE_FIELDS:
        raise ValueError(f"the envelope must have exactly the fields {', '.join(sorted(ENVELOPE_FIELDS))}")
    if envelope["payloadType"] != PAYLOAD_TYPE:
        raise ValueError(f"the envelope's payloadType is not {PAYLOAD_TYPE}")
    payload = b64decode_strict(envelope["payload"], "the envelope's payload")
    signatures = envelope["signatures"]
    if not isinstance(signatures, list) or len(signatures) != 1 or not isinstance(signatures[0], dict) \
            or set(signatures[0]) != {"keyid", "sig"} or not isinstance(signatures[0]["keyid"], str):
        raise ValueError("the envelope must carry exactly one signature {keyid, sig}")
    key_id = signatures[0]["keyid"]
    signature = b64decode_strict(signatures[0]["sig"], "the signature")
    key = next((k for k in keys if k.key_id == key_id), None)
    if key is None:
        raise UnknownKey(f"signed by key {key_id!r}, which is not among the trusted keys "
                         f"({', '.join(k.key_id for k in keys) or 'none given'})")
    try:
        key.public.verify(signature, pae(PAYLOAD_TYPE, payload))
    except InvalidSignature:
        raise BadSignature(f"the signature by {key_id} does not verify: the envelope was altered "
                           "or signed by another key") from None
    return payload
