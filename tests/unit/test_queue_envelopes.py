"""What a worker accepts from a Redis queue before kombu reads it (pal.workers.redis_transport)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from pal.workers.redis_transport import is_envelope

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
                    max_leaves=20)

GOOD = {"body": "e30=", "content-encoding": "utf-8", "content-type": "application/json",
        "headers": {"task": "pal.execute_node"},
        "properties": {"delivery_tag": "t", "body_encoding": "base64",
                       "delivery_info": {"exchange": "", "routing_key": "pal"}}}


def with_(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    payload: dict[str, Any] = json.loads(json.dumps(GOOD))
    target = payload
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return payload


def test_a_message_kombu_wrote_is_an_envelope() -> None:
    assert is_envelope(GOOD)


def test_what_kombu_could_not_read_is_not() -> None:
    assert not is_envelope({})
    assert not is_envelope([GOOD])
    assert not is_envelope(with_(("properties",), "x"))
    assert not is_envelope(with_(("properties", "delivery_tag"), 7))
    assert not is_envelope(with_(("properties", "delivery_info"), None))
    assert not is_envelope(with_(("properties", "delivery_info", "routing_key"), ["pal"]))
    assert not is_envelope(with_(("body",), 7))
    assert not is_envelope(with_(("body",), "not base64!"))
    assert not is_envelope(with_(("headers",), "x"))


@given(JSON)
def test_any_json_value_is_judged_without_raising(value: Any) -> None:
    assert is_envelope(value) in (True, False)
