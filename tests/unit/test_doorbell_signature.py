"""A doorbell's signature is HMAC-SHA256 of (run, step, generation) under the fence key, cut to
128 bits: the same value whichever way it is computed, and no other message's."""

from __future__ import annotations

import hashlib
import hmac

from hypothesis import given
from hypothesis import strategies as st

from pal.core import doorbell

keys = st.binary(min_size=16, max_size=64)
names = st.text(min_size=1, max_size=40)


@given(keys, names, names, st.integers(min_value=0, max_value=2**31))
def test_the_signature_is_the_truncated_hmac_of_the_three(key: bytes, run: str, step: str, generation: int) -> None:
    message = f"{run}\x00{step}\x00{generation}".encode()
    expected = hmac.new(key, message, hashlib.sha256).hexdigest()[:doorbell.SIGNATURE_HEX_CHARS]
    assert doorbell.sign(key, run, step, generation) == expected
    assert doorbell.verify(key, run, step, generation, expected)


@given(keys, names, names, st.integers(min_value=0, max_value=2**31))
def test_a_signature_does_not_verify_another_step_generation_or_key(key: bytes, run: str, step: str,
                                                                    generation: int) -> None:
    signature = doorbell.sign(key, run, step, generation)
    assert not doorbell.verify(key, run, step + "x", generation, signature)
    assert not doorbell.verify(key, run, step, generation + 1, signature)
    assert not doorbell.verify(key + b"!", run, step, generation, signature)
    assert not doorbell.verify(key, run, step, generation, signature.upper() + "0")
    assert not doorbell.verify(key, run, step, generation, None)
