"""RFC 8785, the JSON Canonicalization Scheme: one byte string per JSON value, so a hash or a
signature over a value does not depend on who serialised it (Postgres's JSONB reorders keys and
rewrites numbers; SQLite keeps the text it was given; Python's json module does neither the way
RFC 8785 says).

The rules, from the RFC: no whitespace; object members sorted by their names' UTF-16 code units;
strings escaped as ECMAScript's JSON.stringify escapes them (only `"`, `\\` and control characters);
numbers as IEEE 754 doubles printed by ECMAScript's Number.prototype.toString (so 1.0 and 1 are
both `1`, and 1e21 is `1e+21`); the result encoded as UTF-8. Values JSON cannot hold (NaN, the
infinities, a lone surrogate, a key that is not a string) raise ValueError.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}
_SAFE_INT = 2**53  # beyond it an integer is not exactly a double: RFC 8785 prints the double


def canonical(value: Any) -> bytes:
    """The RFC 8785 form of `value` (JSON types: dict, list/tuple, str, int, float, bool, None)."""
    parts: list[str] = []
    _write(value, parts)
    try:
        return "".join(parts).encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate, e.g. from json.loads('"\\ud800"')
        raise ValueError(f"not canonicalisable: a string holds a lone surrogate ({exc.reason})") from None


def _write(value: Any, parts: list[str]) -> None:
    if value is None:
        parts.append("null")
    elif value is True:
        parts.append("true")
    elif value is False:
        parts.append("false")
    elif isinstance(value, str):
        parts.append(_string(value))
    elif isinstance(value, int):
        parts.append(str(value) if -_SAFE_INT <= value <= _SAFE_INT else number(float(value)))
    elif isinstance(value, float):
        parts.append(number(value))
    elif isinstance(value, dict):
        if not all(isinstance(key, str) for key in value):
            raise ValueError("not canonicalisable: an object key is not a string")
        parts.append("{")
        for i, key in enumerate(sorted(value, key=_utf16)):
            parts.append("," if i else "")
            parts.append(_string(key))
            parts.append(":")
            _write(value[key], parts)
        parts.append("}")
    elif isinstance(value, list | tuple):
        parts.append("[")
        for i, item in enumerate(value):
            parts.append("," if i else "")
            _write(item, parts)
        parts.append("]")
    else:
        raise ValueError(f"not canonicalisable: a {type(value).__name__} is not a JSON value")


def _utf16(key: str) -> bytes:
    # Big-endian UTF-16 bytes compare as the code units do. surrogatepass: a lone surrogate still
    # sorts here and is refused when the whole text is encoded as UTF-8.
    return key.encode("utf-16-be", "surrogatepass")


def _string(text: str) -> str:
    out = ['"']
    for char in text:
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif char < " ":
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def number(value: float) -> str:
    """A double as ECMAScript's Number.prototype.toString prints it (RFC 8785, section 3.2.2.3)."""
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"not canonicalisable: {value} is not a JSON number")
    if value == 0:
        return "0"  # -0 too
    sign = "-" if value < 0 else ""
    # repr gives the shortest digits that read back as the same double, which is what ECMAScript
    # prints; only the placement of the decimal point and the exponent differ.
    _, digit_tuple, exponent = Decimal(repr(abs(value))).as_tuple()
    digits = "".join(map(str, digit_tuple)).rstrip("0")
    assert isinstance(exponent, int)  # a finite value
    exponent += len(digit_tuple) - len(digits)
    k = len(digits)
    n = exponent + k  # the value is 0.<digits> x 10^n
    if k <= n <= 21:
        return sign + digits + "0" * (n - k)
    if 0 < n <= 21:
        return sign + digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * -n + digits
    shown = digits[0] + ("." + digits[1:] if k > 1 else "")
    return f"{sign}{shown}e{'+' if n - 1 > 0 else '-'}{abs(n - 1)}"
