"""What a start's dedupe or debounce key may be: malformed keys and durations, a window or period
without its key, and both kinds at once are refused before anything is written."""

from __future__ import annotations

from typing import Any

import pytest

from pal.core.start_keys import DEBOUNCE, DEDUPE, StartKey, start_key
from pal.errors import InputError


def test_keys_and_their_durations() -> None:
    assert start_key() is None
    assert start_key(dedupe_key="order-7") == StartKey(DEDUPE, "order-7", 86_400.0)
    assert start_key(dedupe_key="k", dedupe_window="90m") == StartKey(DEDUPE, "k", 5_400.0)
    assert start_key(debounce_key="k", debounce=30) == StartKey(DEBOUNCE, "k", 30.0)
    assert start_key(debounce_key="ü " * 128, debounce="1s").key == "ü " * 128  # printable, any script


@pytest.mark.parametrize("options, says", [
    ({"dedupe_key": ""}, "1 to 256 printable"),
    ({"dedupe_key": "x" * 257}, "1 to 256 printable"),
    ({"dedupe_key": "a\nb"}, "1 to 256 printable"),
    ({"dedupe_key": 7}, "1 to 256 printable"),
    ({"dedupe_key": "k", "dedupe_window": "0s"}, "from 1s to 30 days"),
    ({"dedupe_key": "k", "dedupe_window": "31d"}, "a duration"),
    ({"dedupe_key": "k", "dedupe_window": 31 * 86_400}, "from 1s to 30 days"),
    ({"dedupe_key": "k", "dedupe_window": float("nan")}, "from 1s to 30 days"),
    ({"dedupe_key": "k", "dedupe_window": True}, "a duration"),
    ({"dedupe_key": "k", "dedupe_window": "9" * 40 + "h"}, "a duration"),
    ({"dedupe_window": "1h"}, "dedupe_window needs a dedupe_key"),
    ({"debounce": "1h"}, "debounce needs a debounce_key"),
    ({"debounce_key": "k"}, "debounce_key needs debounce"),
    ({"debounce_key": "k", "debounce": "-5s"}, "from 1s to 7 days"),
    ({"debounce_key": "k", "debounce": "8h" * 30}, "a duration"),  # over 32 characters
    ({"debounce_key": "k", "debounce": "169h"}, "from 1s to 7 days"),
    ({"dedupe_key": "a", "debounce_key": "b", "debounce": "1s"}, "not both"),
])
def test_a_bad_start_key_is_refused(options: dict[str, Any], says: str) -> None:
    with pytest.raises(InputError) as info:
        start_key(**options)
    assert says in str(info.value)
