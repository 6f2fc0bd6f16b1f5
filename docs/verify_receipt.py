"""Check a PAL receipt bundle without PAL: the standard library and `cryptography` only.

    pip install cryptography
    python verify_receipt.py RUN_ID.receipt.json PUBLIC_KEY_BASE64

Exit 0 when the DSSE signature verifies and the events hash to the signed chain; 1 otherwise, with
the reason. The format is docs/receipts.md's; this file is a second, independent reading of it (it
shares no code with PAL on purpose: an auditor should not have to trust PAL's code to check PAL).
"""

from __future__ import annotations

import base64
import hashlib
import json
import sys
from decimal import Decimal
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

PAYLOAD_TYPE = "application/vnd.in-toto+json"
CHAIN = "pal-journal-chain/v1"


def jcs(value: Any) -> str:
    """RFC 8785: sorted members (UTF-16 order), no spaces, ECMAScript numbers, JSON.stringify strings."""
    if isinstance(value, dict):
        keys = sorted(value, key=lambda k: k.encode("utf-16-be"))
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + jcs(value[k]) for k in keys) + "}"
    if isinstance(value, list):
        return "[" + ",".join(jcs(item) for item in value) + "]"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int) and abs(value) <= 2**53:
        return str(value)
    if isinstance(value, int | float):
        return ecmascript_number(float(value))
    return json.dumps(value, ensure_ascii=False)


def ecmascript_number(x: float) -> str:
    if x == 0:
        return "0"
    sign, (_, digit_tuple, exponent) = ("-" if x < 0 else ""), Decimal(repr(abs(x))).as_tuple()
    digits = "".join(map(str, digit_tuple)).rstrip("0")
    n = int(exponent) + len(digit_tuple)  # x = 0.<digits> * 10^n
    k = len(digits)
    if k <= n <= 21:
        return sign + digits + "0" * (n - k)
    if 0 < n <= 21:
        return sign + digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * -n + digits
    mantissa = digits[0] + ("." + digits[1:] if k > 1 else "")
    return f"{sign}{mantissa}e{'+' if n > 1 else '-'}{abs(n - 1)}"


def verify(bundle: dict[str, Any], public_key: bytes) -> str:
    envelope = bundle["envelope"]
    payload = base64.b64decode(envelope["payload"], validate=True)
    kind = envelope["payloadType"].encode()
    signed = b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(
            base64.b64decode(envelope["signatures"][0]["sig"], validate=True), signed)
    except InvalidSignature:
        raise SystemExit("bad signature") from None
    if envelope["payloadType"] != PAYLOAD_TYPE:
        raise SystemExit("not an in-toto statement")
    statement = json.loads(payload)
    run, journal = statement["predicate"]["run"], statement["predicate"]["journal"]
    events = [item["event"] for item in bundle["events"]]
    link = hashlib.sha256(jcs({"chain": CHAIN, "run_id": run["id"]}).encode()).digest()
    for event in events:
        if event["run_id"] != run["id"]:
            raise SystemExit(f"event seq {event['seq']} is another run's")
        link = hashlib.sha256(link + hashlib.sha256(jcs(event).encode()).digest()).digest()
    seqs = [event["seq"] for event in events]
    if seqs != sorted(set(seqs)) or (len(events), seqs[0], seqs[-1]) != (
            journal["count"], journal["first_seq"], journal["last_seq"]):
        raise SystemExit("the events are not the ones signed (count, order or ends differ)")
    if journal["chain"] != CHAIN or link.hex() != journal["head"]:
        raise SystemExit("the events do not hash to the signed chain head")
    return f"run {run['id']} {run['status']}: {len(events)} events, chain head {journal['head']}"


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    with open(sys.argv[1], "rb") as file:
        print("verified:", verify(json.load(file), base64.b64decode(sys.argv[2])))
