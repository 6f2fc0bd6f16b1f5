"""Decoding a graph document's text (JSON or YAML) into JSON values only, within its limits.

PAL_MAX_GRAPH_BYTES is checked before decoding, and a YAML alias expands after it: nine nested
lists of nine aliases each are 490 bytes and hundreds of millions of nodes. A graph document has no
use for anchors (&a) or aliases (*a), so the loader refuses both, even an anchor used once.

A document is journaled as JSON, so it may hold JSON values only: YAML's `!!binary` (bytes),
`!!set`, `!!omap`, `!!pairs` and timestamps (an unquoted `2024-01-01` is one), and infinities or
NaN in either syntax, are refused. So is an integer of more than MAX_INT_DIGITS digits: Python
refuses to convert one to or from text (a ValueError deep in the decoder or in json.dumps), or, in a
process that lifted that limit, spends quadratic time on it. Every refusal is a GraphError naming
what and, for YAML, the line (docs/security.md, "YAML graph documents").
"""

from __future__ import annotations

import json
import math
import sys
from functools import lru_cache
from typing import Any

import yaml

from pal.errors import GraphError

MAX_YAML_NODES = 500_000  # without aliases a node costs at least two bytes; a backstop, not a limit
MAX_INT_DIGITS = 4300  # Python's default int_max_str_digits; lower if the process lowered it
_NOT_JSON = {  # YAML tags whose values JSON cannot hold, and what a graph author wrote
    "tag:yaml.org,2002:binary": "a !!binary value (bytes)",
    "tag:yaml.org,2002:set": "a !!set",
    "tag:yaml.org,2002:omap": "an !!omap",
    "tag:yaml.org,2002:pairs": "a !!pairs",
    "tag:yaml.org,2002:timestamp": "a date or time (quote it to keep it as text)",
}


def _refused(what: str, line: int | None = None) -> GraphError:
    where = f" (line {line})" if line is not None else ""
    return GraphError([f"graph document has {what}{where}: a graph document holds only JSON values"])


def _line(node: yaml.Node) -> int | None:
    return node.start_mark.line + 1 if node.start_mark else None


def _digit_limit() -> int:
    """The most digits an integer may have: 4300, or fewer when the process set fewer (0 is none)."""
    return min(MAX_INT_DIGITS, sys.get_int_max_str_digits() or MAX_INT_DIGITS)


@lru_cache(maxsize=4)
def _int_bound(digits: int) -> int:
    bound: int = 10**digits  # a hex or binary integer's value: it must print within the limit too
    return bound


def _too_long(line: int | None = None) -> GraphError:
    return _refused(f"an integer of more than {_digit_limit()} digits", line)


class _GraphYamlLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors, aliases and values JSON cannot hold, and counts nodes
    while it composes them."""

    def __init__(self, stream: str, max_nodes: int) -> None:
        super().__init__(stream)
        self._max_nodes = self._nodes_left = max_nodes

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        line = event.start_mark.line + 1 if event.start_mark else 0
        if isinstance(event, yaml.AliasEvent):
            raise GraphError([f"graph document uses the YAML alias *{event.anchor} (line {line}): "
                              "anchors and aliases are not allowed in graph documents, because an "
                              "alias can expand a small document into a huge one; write it out"])
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            raise GraphError([f"graph document defines the YAML anchor &{anchor} (line {line}): "
                              "anchors and aliases are not allowed in graph documents"])
        self._nodes_left -= 1
        if self._nodes_left < 0:
            raise GraphError([f"graph document has more than {self._max_nodes} YAML nodes"])
        return super().compose_node(parent, index)

    def construct_checked_int(self, node: yaml.ScalarNode) -> int:
        # Counted before int() runs: see the module's docstring. Letters count (a hex number's).
        limit = _digit_limit()
        if sum(c.isalnum() for c in str(node.value)) > limit:
            raise _too_long(_line(node))
        value: int = self.construct_yaml_int(node)
        if abs(value) >= _int_bound(limit):
            raise _too_long(_line(node))
        return value

    def construct_finite_float(self, node: yaml.ScalarNode) -> float:
        value: float = self.construct_yaml_float(node)
        if not math.isfinite(value):
            raise _refused(f"{node.value!r}, which is not a JSON number", _line(node))
        return value

    def construct_not_json(self, node: yaml.Node) -> Any:
        raise _refused(f"{_NOT_JSON[node.tag]}", _line(node))


_GraphYamlLoader.add_constructor("tag:yaml.org,2002:int", _GraphYamlLoader.construct_checked_int)
_GraphYamlLoader.add_constructor("tag:yaml.org,2002:float", _GraphYamlLoader.construct_finite_float)
for _tag in _NOT_JSON:
    _GraphYamlLoader.add_constructor(_tag, _GraphYamlLoader.construct_not_json)


def load_yaml(text: str, max_nodes: int | None = None) -> Any:
    """Decode one YAML document of JSON values without anchors or aliases; GraphError otherwise.
    yaml.YAMLError and RecursionError pass through for the caller to word."""
    loader = _GraphYamlLoader(text, MAX_YAML_NODES if max_nodes is None else max_nodes)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _json_int(text: str) -> int:
    if len(text) - text.startswith("-") > _digit_limit():
        raise _too_long()
    return int(text)


def _json_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999
        raise _refused(f"{text}, which is not a finite number")
    return value


def _json_constant(name: str) -> Any:
    raise _refused(f"{name}, which is not a JSON number")


def load_json(text: str) -> Any:
    """json.loads that refuses what JSON itself does not allow (NaN, Infinity, an overflowing
    exponent) and integers past MAX_INT_DIGITS, with a GraphError; json.JSONDecodeError and
    RecursionError pass through."""
    return json.loads(text, parse_int=_json_int, parse_float=_json_float, parse_constant=_json_constant)
