"""Signatures of `pal.execute_node` messages: a message is a doorbell, and only PAL may ring it.

A message names (run, step, generation). The fence in the journal refuses an old generation, but a
generation is a small integer: anyone who can publish to the broker (or use Flower's task-apply
route) could guess the current one. So every message PAL publishes carries an HMAC-SHA256 of the
three under the deployment's fence key (table `pal_keys`, migration 0008), and the task refuses a
message whose signature does not verify before it touches the journal. A copied message is only a
duplicate of one PAL sent (harmless: the claim finds the step started or done); the signature
binds the step, so it cannot be re-aimed at another step or generation. docs/security.md.
"""

from __future__ import annotations

import hmac

SIGNATURE_HEX_CHARS = 32  # 128 bits of the HMAC: far beyond guessing, short on the wire


def sign(key: bytes, run_id: str, step_id: str, generation: int) -> str:
    message = f"{run_id}\x00{step_id}\x00{int(generation)}".encode()
    # hmac.digest: OpenSSL's one-shot HMAC, the same bytes as hmac.new(...).digest() without
    # building an HMAC object (two per step: the signing worker's and the receiving one's).
    return hmac.digest(key, message, "sha256").hex()[:SIGNATURE_HEX_CHARS]


def verify(key: bytes, run_id: str, step_id: str, generation: int, signature: object) -> bool:
    """Whether `signature` is PAL's for exactly this (run, step, generation); any other value,
    of any type, is not."""
    if not isinstance(signature, str) or len(signature) != SIGNATURE_HEX_CHARS:
        return False
    return hmac.compare_digest(sign(key, run_id, step_id, generation), signature)
