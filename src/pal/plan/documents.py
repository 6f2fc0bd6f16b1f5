"""Plan documents before validation: decoding JSON or YAML text, and the document limits
(PAL_MAX_GRAPH_BYTES, PAL_MAX_JSON_DEPTH) checked in one place for graphs and plain-LLM specs."""

from __future__ import annotations

import json
from typing import Any

import yaml

from pal.core.document_text import load_json, load_yaml
from pal.core.limits import depth_problem
from pal.errors import GraphError


def check_size(document: Any, *, max_bytes: int | None, what: str = "graph document",
               error_what: str = "graph") -> None:
    """GraphError when the document (text, or decoded and measured as JSON) is over `max_bytes`."""
    if max_bytes is None:
        return
    text = document if isinstance(document, str) else json.dumps(document, default=str)
    size = len(text.encode())
    if size > max_bytes:
        raise GraphError([f"{what} is {size} bytes, over the limit of {max_bytes} (PAL_MAX_GRAPH_BYTES)"],
                         what=error_what)


def check_depth(document: Any, max_depth: int) -> None:
    problem = depth_problem(document, max_depth, "the document")
    if problem:
        raise GraphError([problem])


def load_graph_text(text: str, *, max_bytes: int | None = None) -> Any:
    """Decode a JSON or YAML graph document (not yet validated)."""
    check_size(text, max_bytes=max_bytes)
    try:
        return load_json(text)  # JSON values only, as the YAML loader (pal.core.document_text)
    except json.JSONDecodeError:
        pass
    except RecursionError as exc:  # nested brackets, far past any real graph (PAL_MAX_JSON_DEPTH)
        raise GraphError(["graph document nests too deeply to decode"]) from exc
    try:
        return load_yaml(text)  # no anchors or aliases: they expand past the byte limit
    except yaml.YAMLError as exc:
        raise GraphError([f"graph is neither JSON nor YAML: {exc}"]) from exc
    except RecursionError as exc:
        raise GraphError(["graph document nests too deeply to decode"]) from exc
