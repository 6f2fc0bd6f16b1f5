"""Receipts of finished runs (pal.core.run_receipt, pal.core.dsse): a golden vector, the same bytes
every time, and every tampering refused with its own reason (docs/receipts.md)."""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from pal.core import dsse
from pal.core.jcs import canonical
from pal.core.records import Event, RunRecord
from pal.core.run_receipt import ReceiptInvalid, issue, verify

T0 = datetime(2030, 1, 1, tzinfo=UTC)
KEY = dsse.SigningKey(Ed25519PrivateKey.from_private_bytes(bytes(range(32))))
TRUSTED = [KEY.trusted]
RUN = RunRecord(id="r-golden", tenant_id="acme", kind="graph", status="succeeded", graph={"nodes": []},
                graph_hash="ab" * 32, input={"q": "hi"}, output={"answer": 42}, error=None, parent_run_id=None,
                parent_step_id=None, cost_usd=Decimal(0), input_tokens=0, output_tokens=0, created_at=T0,
                started_at=T0, finished_at=T0, limits=None)


def event(seq: int, kind: str, step_id: str | None = None, payload: Any = None, seconds: float = 0) -> Event:
    return Event(seq, RUN.id, step_id, 1 if step_id else None, kind, payload if payload is not None else {},
                 1, T0 + timedelta(seconds=seconds))


EVENTS = [
    event(1, "run_queued", payload={"input": {"q": "hi"}}),
    event(4, "step_started", "ask", seconds=0.5),
    event(7, "step_completed", "ask", {"output": {"text": "caf\u00e9", "score": 1.0, "n": 10}}, 1.25),
    event(9, "run_succeeded", payload={"output": {"answer": 42}}, seconds=1.5),
]
# The golden vector: this key, these events. Changing the format changes these, on purpose only.
GOLDEN_HEAD = "cc03b4edb7b4c5f50c5495d49a60fc924d61adcc6bdfa8aa0d8f8ff025f1e187"
GOLDEN_SIG = "pNc+DfpUF2xLGQXQHdQdOwGWbYK0CIUDDsXDnOW0zAKhrzQ7MITub50jEEVmByqFuv8keOc/nKlGJpzfBCUtCw=="
GOLDEN_BUNDLE_SHA256 = "12b55f6ec20420a7bed684172d9a119271d4001b45e705111ade69fee3ed575a"


def bundle_of(data: bytes) -> dict[str, Any]:
    bundle: dict[str, Any] = json.loads(data)
    return bundle


def rewrite(bundle: dict[str, Any]) -> bytes:
    return canonical(bundle) + b"\n"


def statement_of(bundle: dict[str, Any]) -> dict[str, Any]:
    statement: dict[str, Any] = json.loads(base64.b64decode(bundle["envelope"]["payload"]))
    return statement


def test_the_chain_is_sha256_over_each_events_rfc8785_text() -> None:
    # Computed here from the events' canonical texts, written out by hand.
    texts = [
        '{"attempt":null,"created_at":"2030-01-01T00:00:00.000000Z","generation":1,"kind":"run_queued",'
        '"payload":{"input":{"q":"hi"}},"run_id":"r-golden","seq":1,"step_id":null}',
        '{"attempt":1,"created_at":"2030-01-01T00:00:00.500000Z","generation":1,"kind":"step_started",'
        '"payload":{},"run_id":"r-golden","seq":4,"step_id":"ask"}',
        '{"attempt":1,"created_at":"2030-01-01T00:00:01.250000Z","generation":1,"kind":"step_completed",'
        '"payload":{"output":{"n":10,"score":1,"text":"caf\u00e9"}},"run_id":"r-golden","seq":7,"step_id":"ask"}',
        '{"attempt":null,"created_at":"2030-01-01T00:00:01.500000Z","generation":1,"kind":"run_succeeded",'
        '"payload":{"output":{"answer":42}},"run_id":"r-golden","seq":9,"step_id":null}',
    ]
    link = hashlib.sha256(b'{"chain":"pal-journal-chain/v1","run_id":"r-golden"}').digest()
    for text in texts:
        link = hashlib.sha256(link + hashlib.sha256(text.encode()).digest()).digest()
    verified = verify(issue(RUN, EVENTS, KEY), TRUSTED)
    assert verified.head == link.hex()


def test_golden_vector() -> None:
    data = issue(RUN, EVENTS, KEY)
    bundle = bundle_of(data)
    assert KEY.key_id == "ed25519:" + hashlib.sha256(dsse.raw_public(KEY.public)).hexdigest()[:16]
    assert statement_of(bundle)["predicate"]["journal"]["head"] == GOLDEN_HEAD
    assert bundle["envelope"]["signatures"][0]["sig"] == GOLDEN_SIG
    assert hashlib.sha256(data).hexdigest() == GOLDEN_BUNDLE_SHA256
    assert KEY.key_id == "ed25519:56475aa75463474c"


def test_issuing_twice_gives_the_same_bytes_and_they_verify() -> None:
    data = issue(RUN, EVENTS, KEY)
    assert issue(RUN, list(EVENTS), KEY) == data
    verified = verify(data, TRUSTED)
    assert (verified.run_id, verified.status, verified.count, verified.key_id) == \
        ("r-golden", "succeeded", 4, KEY.key_id)
    statement = verified.statement
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["subject"] == [{"name": "pal-run:r-golden", "digest": {"sha256": GOLDEN_HEAD}}]
    assert statement["predicate"]["journal"] | {"head": None} == {
        "chain": "pal-journal-chain/v1", "head": None, "count": 4, "first_seq": 1, "last_seq": 9}


def test_a_run_whose_journal_does_not_end_in_its_terminal_event_gets_no_receipt() -> None:
    with pytest.raises(ValueError, match="no terminal event matching its status succeeded"):
        issue(RUN, EVENTS[:-1], KEY)


def edited_event(index: int, **changes: Any) -> dict[str, Any]:
    bundle = bundle_of(issue(RUN, EVENTS, KEY))
    bundle["events"][index]["event"].update(changes)
    return bundle


def resign(statement: dict[str, Any], key: dsse.SigningKey, bundle: dict[str, Any]) -> dict[str, Any]:
    bundle["envelope"] = dsse.sign(canonical(statement), key)
    return bundle


OTHER = dsse.SigningKey(Ed25519PrivateKey.from_private_bytes(bytes(range(1, 33))))


def tampered(how: str) -> dict[str, Any]:
    bundle = bundle_of(issue(RUN, EVENTS, KEY))
    events = bundle["events"]
    if how == "payload byte":
        return edited_event(2, payload={"output": {"text": "cafe", "score": 1.0, "n": 10}})
    if how == "kind":
        return edited_event(2, kind="step_failed")
    if how == "step id":
        return edited_event(1, step_id="ask2")
    if how == "timestamp":
        return edited_event(3, created_at="2030-01-01T00:00:01.500001Z")
    if how == "deleted event":
        del events[1]
    elif how == "inserted event":
        events.insert(2, {"event": events[1]["event"] | {"seq": 5}, "link": events[1]["link"]})
    elif how == "reordered events":
        events[1], events[2] = events[2], events[1]
    elif how == "links rewritten to hide an edit":
        events[2]["event"]["payload"] = {"output": "forged"}
        from pal.core.run_receipt import chain_links
        for item, link in zip(events, chain_links(RUN.id, [e["event"] for e in events]), strict=True):
            item["link"] = link
    elif how == "foreign event":
        events[2]["event"]["run_id"] = "r-other"
    elif how == "run status":
        statement = statement_of(bundle)
        statement["predicate"]["run"]["status"] = "failed"
        bundle["envelope"]["payload"] = base64.b64encode(canonical(statement)).decode()
    elif how == "another key":
        return resign(statement_of(bundle), OTHER, bundle)
    elif how == "another key under the trusted id":
        resign(statement_of(bundle), OTHER, bundle)
        bundle["envelope"]["signatures"][0]["keyid"] = KEY.key_id
    elif how == "truncated signature":
        signature = bundle["envelope"]["signatures"][0]
        signature["sig"] = base64.b64encode(base64.b64decode(signature["sig"])[:-1]).decode()
    elif how == "payload type":
        bundle["envelope"]["payloadType"] = "application/json"
    else:
        raise AssertionError(how)
    return bundle


@pytest.mark.parametrize(("how", "reason", "message"), [
    ("payload byte", "chain_mismatch", "event seq 7 (step_completed of step 'ask') is not the event that was signed"),
    ("kind", "chain_mismatch", "event seq 7 (step_failed of step 'ask') is not the event that was signed"),
    ("step id", "chain_mismatch", "event seq 4 (step_started of step 'ask2') is not the event that was signed"),
    ("timestamp", "chain_mismatch", "event seq 9 (run_succeeded) is not the event that was signed"),
    ("deleted event", "chain_mismatch", "3 events, but the receipt signed 4: an event was deleted"),
    ("inserted event", "chain_mismatch", "5 events, but the receipt signed 4: an event was inserted"),
    ("reordered events", "chain_mismatch", "events out of order: seq 4 comes after seq 7"),
    ("links rewritten to hide an edit", "chain_mismatch", "do not hash to the signed chain head"),
    ("foreign event", "chain_mismatch", "event seq 7 belongs to run 'r-other', not 'r-golden'"),
    ("run status", "bad_signature", "does not verify"),
    ("another key", "unknown_key", "which is not among the trusted keys"),
    ("another key under the trusted id", "bad_signature", "does not verify"),
    ("truncated signature", "bad_signature", "does not verify"),
    ("payload type", "malformed", "payloadType is not application/vnd.in-toto+json"),
])
def test_each_tampering_fails_with_its_own_reason(how: str, reason: str, message: str) -> None:
    with pytest.raises(ReceiptInvalid) as refused:
        verify(rewrite(tampered(how)), TRUSTED)
    assert refused.value.reason == reason
    assert message in str(refused.value)


def test_a_bundle_in_any_other_spelling_is_refused() -> None:
    data = issue(RUN, EVENTS, KEY)
    for spelling in (json.dumps(bundle_of(data), indent=1).encode(), data.rstrip(b"\n"), data + b"\n",
                     b"\xef\xbb\xbf" + data, data.replace(b'"format"', b'"format" ', 1)):
        with pytest.raises(ReceiptInvalid) as refused:
            verify(spelling, TRUSTED)
        assert refused.value.reason == "malformed"


@pytest.mark.parametrize("data", [b"", b"null\n", b"[]\n", b'{"format":"x"}\n', b"\xff\n",
                                  b'{"a":1,"a":2}\n', b"NaN\n", b"[" * 5000 + b"]" * 5000 + b"\n"])
def test_garbage_is_malformed_not_a_crash(data: bytes) -> None:
    with pytest.raises(ReceiptInvalid) as refused:
        verify(data, TRUSTED)
    assert refused.value.reason == "malformed"


def test_a_retired_key_still_verifies_when_trusted_and_no_key_trusts_nothing() -> None:
    old = issue(RUN, EVENTS, OTHER)
    assert verify(old, [KEY.trusted, OTHER.trusted]).key_id == OTHER.key_id
    with pytest.raises(ReceiptInvalid, match="none given"):
        verify(old, [])


GOLDEN = issue(RUN, EVENTS, KEY)


@settings(max_examples=400, deadline=None)
@given(st.integers(0, len(GOLDEN) - 1), st.integers(1, 255))
def test_any_changed_byte_of_a_bundle_is_caught(position: int, flip: int) -> None:
    data = bytearray(GOLDEN)
    data[position] ^= flip
    with pytest.raises(ReceiptInvalid):
        verify(bytes(data), TRUSTED)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, len(GOLDEN) - 1), st.binary(min_size=1, max_size=3))
def test_any_inserted_or_deleted_bytes_are_caught(position: int, extra: bytes) -> None:
    with pytest.raises(ReceiptInvalid):
        verify(GOLDEN[:position] + extra + GOLDEN[position:], TRUSTED)
    with pytest.raises(ReceiptInvalid):
        verify(GOLDEN[:position] + GOLDEN[position + len(extra):], TRUSTED)


@pytest.mark.parametrize(("text", "problem"), [
    ("", "is 32 bytes, this one is 0"), ("AAAA", "is 32 bytes, this one is 3"), ("not base64!", "not an Ed25519"),
    ("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----", "not an Ed25519 public key"),
])
def test_unreadable_public_keys_are_refused_by_name(text: str, problem: str) -> None:
    with pytest.raises(dsse.UnreadableKey, match=problem):
        dsse.trusted_key(text)


def test_keys_read_back_from_their_texts_and_pem() -> None:
    from cryptography.hazmat.primitives import serialization

    assert dsse.SigningKey(dsse.read_private_key(dsse.private_text(KEY.private))).key_id == KEY.key_id
    assert dsse.trusted_key(dsse.public_text(KEY.public)).key_id == KEY.key_id
    pem = KEY.public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert dsse.trusted_key(pem.decode()).key_id == KEY.key_id
    with pytest.raises(dsse.UnreadableKey, match="32 bytes"):
        dsse.read_private_key(base64.b64encode(b"short").decode())
