"""A finished run's receipt: a hash chain over every journal event of the run, stated as an in-toto
statement, signed in a DSSE envelope (pal.core.dsse), and exported with the events as one bundle
anyone can check offline (docs/receipts.md).

The chain. Each event is taken as its decoded fields (`event_fields`: seq, run_id, step_id,
attempt, kind, payload, generation, created_at as `YYYY-MM-DDTHH:MM:SS.ffffffZ`), canonicalised
with RFC 8785 (pal.core.jcs), never the database's text, so Postgres and SQLite give the same
bytes. `link_0 = sha256(jcs({"chain": CHAIN, "run_id": run_id}))`, and
`link_i = sha256(link_{i-1} || sha256(jcs(event_i)))`; the head is the last link. The statement
signs the head with the count and the first and last seq, so a deleted, inserted, reordered or
edited event shows.

The bundle is the envelope plus the events, each with its link (a hint: a verifier recomputes
every link and names the first event that differs). It is written in exactly one form (RFC 8785 and
a newline); a verifier refuses any other spelling, so no byte of a bundle can change unnoticed.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass
from datetime import UTC
from typing import Any

from pal.core import dsse
from pal.core.jcs import canonical
from pal.core.records import Event, RunRecord
from pal.core.vocabulary import TERMINAL_EVENT

CHAIN = "pal-journal-chain/v1"
FORMAT = "pal-receipt-bundle/v1"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://pal.dev/receipt/v1"
TERMINAL_STATUS: dict[str, str] = {str(kind): str(status) for status, kind in TERMINAL_EVENT.items()}
# The fields of an event in a bundle and the JSON types each may have (a payload: any JSON).
_NONE = type(None)
EVENT_FIELDS: dict[str, tuple[type, ...]] = {
    "seq": (int,), "run_id": (str,), "step_id": (str, _NONE), "attempt": (int, _NONE), "kind": (str,),
    "payload": (dict, list, str, int, float, bool, _NONE), "generation": (int,), "created_at": (str,)}


class ReceiptInvalid(ValueError):
    """A bundle that does not verify; `reason` is one of REASONS."""

    REASONS = ("malformed", "unknown_key", "bad_signature", "chain_mismatch")

    def __init__(self, reason: str, message: str) -> None:
        assert reason in self.REASONS
        super().__init__(message)
        self.reason = reason


def event_fields(event: Event) -> dict[str, Any]:
    """The fields of a journal event a receipt covers, in the one form every backend agrees on."""
    return {"seq": event.seq, "run_id": event.run_id, "step_id": event.step_id, "attempt": event.attempt,
            "kind": event.kind, "payload": event.payload, "generation": event.generation,
            "created_at": event.created_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")}


def chain_links(run_id: str, events: list[dict[str, Any]]) -> list[str]:
    """The hex link after each event (ValueError if an event cannot be canonicalised)."""
    link = hashlib.sha256(canonical({"chain": CHAIN, "run_id": run_id})).digest()
    links = []
    for fields in events:
        link = hashlib.sha256(link + hashlib.sha256(canonical(fields)).digest()).digest()
        links.append(link.hex())
    return links


def statement(run: RunRecord, events: list[dict[str, Any]], head: str) -> dict[str, Any]:
    """The in-toto statement a receipt signs: the run and its chain's head, count and ends."""
    terminal = events[-1]
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": f"pal-run:{run.id}", "digest": {"sha256": head}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "run": {"id": run.id, "tenant_id": run.tenant_id, "kind": run.kind, "status": run.status,
                    "graph_sha256": run.graph_hash, "parent_run_id": run.parent_run_id,
                    "parent_step_id": run.parent_step_id},
            "journal": {"chain": CHAIN, "head": head, "count": len(events), "first_seq": events[0]["seq"],
                        "last_seq": terminal["seq"]},
            "terminal": {"kind": terminal["kind"], "seq": terminal["seq"], "at": terminal["created_at"]},
        },
    }


def issue(run: RunRecord, events: list[Event], key: dsse.SigningKey) -> bytes:
    """The bundle of a finished run: the same bytes every time for the same journal and key.
    ValueError when the journal does not end in the run's terminal event."""
    fields = [event_fields(e) for e in events]
    if not fields or TERMINAL_STATUS.get(fields[-1]["kind"]) != run.status:
        raise ValueError(f"run {run.id} has no terminal event matching its status {run.status}")
    links = chain_links(run.id, fields)
    envelope = dsse.sign(canonical(statement(run, fields, links[-1])), key)
    bundle = {"format": FORMAT, "envelope": envelope,
              "events": [{"event": f, "link": link} for f, link in zip(fields, links, strict=True)]}
    return canonical(bundle) + b"\n"


@dataclass(frozen=True)
class Verified:
    """What a verified bundle proves."""

    run_id: str
    status: str
    count: int
    head: str
    key_id: str
    statement: dict[str, Any]
    events: list[dict[str, Any]]
    links: list[str]  # the chain after each event: a later check names the first event that differs


def verify(data: bytes, keys: list[dsse.TrustedKey]) -> Verified:
    """Check a bundle against trusted keys; ReceiptInvalid names the first thing wrong."""
    bundle = _parse(data)
    try:
        payload = dsse.open_envelope(bundle["envelope"], keys)
    except dsse.UnknownKey as exc:
        raise ReceiptInvalid("unknown_key", str(exc)) from None
    except dsse.BadSignature as exc:
        raise ReceiptInvalid("bad_signature", str(exc)) from None
    except ValueError as exc:
        raise ReceiptInvalid("malformed", str(exc)) from None
    signed = _statement_of(payload)
    events, links = [item["event"] for item in bundle["events"]], [item["link"] for item in bundle["events"]]
    journal, run = signed["predicate"]["journal"], signed["predicate"]["run"]
    check_chain(run["id"], run["status"], journal, events, links)
    key_id = bundle["envelope"]["signatures"][0]["keyid"]
    return Verified(run["id"], run["status"], journal["count"], journal["head"], key_id, signed, events,
                    links)


def check_chain(run_id: str, status: str, journal: dict[str, Any], events: list[dict[str, Any]],
                hints: list[str] | None = None) -> None:
    """The events against a signed journal summary: ReceiptInvalid("chain_mismatch") names the
    first difference (a foreign, reordered, missing, extra or edited event, another ending)."""
    def mismatch(message: str) -> ReceiptInvalid:
        return ReceiptInvalid("chain_mismatch", message)

    for event in events:
        if event["run_id"] != run_id:
            raise mismatch(f"event seq {event['seq']} belongs to run {event['run_id']!r}, not {run_id!r}")
    for before, after in itertools.pairwise(events):
        if after["seq"] <= before["seq"]:
            raise mismatch(f"events out of order: seq {after['seq']} comes after seq {before['seq']}")
    if len(events) != journal["count"]:
        raise mismatch(f"{len(events)} events, but the receipt signed {journal['count']}: "
                       f"an event was {'deleted' if len(events) < journal['count'] else 'inserted'}")
    if events and (events[0]["seq"], events[-1]["seq"]) != (journal["first_seq"], journal["last_seq"]):
        raise mismatch(f"the events run from seq {events[0]['seq']} to {events[-1]['seq']}, the receipt "
                       f"signed {journal['first_seq']} to {journal['last_seq']}")
    try:
        links = chain_links(run_id, events)
    except ValueError as exc:
        raise mismatch(str(exc)) from None
    for event, link, hint in zip(events, links, hints or links, strict=True):
        if link != hint:
            raise mismatch(f"event seq {event['seq']} ({event['kind']}"
                           f"{' of step ' + repr(event['step_id']) if event['step_id'] else ''}) "
                           "is not the event that was signed")
    if not links or links[-1] != journal["head"]:
        raise mismatch("the events do not hash to the signed chain head: an event was changed")
    if TERMINAL_STATUS.get(events[-1]["kind"]) != status:
        raise mismatch(f"the signed status {status!r} is not what the last event "
                       f"({events[-1]['kind']}) says")


def _strict_json(text: str, what: str) -> Any:
    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        if len({k for k, _ in pairs}) != len(pairs):
            raise ValueError("a key appears twice")
        return dict(pairs)

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        return json.loads(text, object_pairs_hook=no_duplicates, parse_constant=no_constant)
    except (ValueError, RecursionError) as exc:
        raise ReceiptInvalid("malformed", f"{what} is not JSON: {exc}") from None


def _parse(data: bytes) -> dict[str, Any]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ReceiptInvalid("malformed", "the bundle is not UTF-8") from None
    bundle = _strict_json(text, "the bundle")
    try:
        exact = canonical(bundle) + b"\n" == data
    except ValueError:
        exact = False
    if not exact:
        raise ReceiptInvalid("malformed", "the bundle is not in its one canonical form (RFC 8785 and a "
                                          "newline): it was edited or re-serialised")
    if not isinstance(bundle, dict) or set(bundle) != {"format", "envelope", "events"} \
            or bundle["format"] != FORMAT:
        raise ReceiptInvalid("malformed", f"not a PAL receipt bundle ({FORMAT})")
    items = bundle["events"]
    if not isinstance(items, list) or not items:
        raise ReceiptInvalid("malformed", "the bundle holds no events")
    for item in items:
        if not isinstance(item, dict) or set(item) != {"event", "link"} or not isinstance(item["link"], str) \
                or not _is_event(item["event"]):
            raise ReceiptInvalid("malformed", "an entry of `events` is not {event, link} with the fields "
                                              f"{', '.join(EVENT_FIELDS)}")
    return bundle


def _is_event(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == set(EVENT_FIELDS) and all(
        isinstance(value[name], kinds) and (bool in kinds or not isinstance(value[name], bool))
        for name, kinds in EVENT_FIELDS.items())


def _statement_of(payload: bytes) -> dict[str, Any]:
    signed = _strict_json(payload.decode("utf-8", "replace"), "the signed statement")
    try:
        predicate = signed["predicate"]
        journal, run = predicate["journal"], predicate["run"]
        ok = (signed["_type"] == STATEMENT_TYPE and signed["predicateType"] == PREDICATE_TYPE
              and isinstance(run["id"], str) and isinstance(run["status"], str)
              and all(isinstance(journal[k], int) for k in ("count", "first_seq", "last_seq"))
              and isinstance(journal["head"], str) and journal["chain"] == CHAIN)
    except (KeyError, TypeError):
        ok = False
    if not ok:
        raise ReceiptInvalid("malformed", "the signed statement is not a PAL receipt statement")
    return dict(signed)
