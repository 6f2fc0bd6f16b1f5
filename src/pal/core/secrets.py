"""Secrets by name: `{{ secrets.NAME }}` in a graph, resolved in the worker when the template renders.

A graph holds only a secret's name. Its value comes from the worker's environment, the variable
`PAL_SECRET_<NAME>`, or from `PAL_SECRETS_FILE`, a JSON object of name -> value; a variable wins over
the file. Both are read at render time (a rotated value is used by the next render), never at
validation, so the API and CLI never see a value. See docs/nodes.md (templates) and docs/guarantees.md.

A rendered value holds the secret in plain text (a header, a body, a prompt), and a node's output
may echo it back. Whatever PAL journals or logs therefore goes through `scrub`, which replaces every
secret value with `[secret:NAME]`; the journal and log code (pal.core.redact) calls it.

For the rest of PAL:
    resolve(name)            the value, or SecretError naming the secret (never its value)
    known_secrets()          {name: value} of every secret a template could render here; never raises
    known_secret_values()    the values alone, for a redaction filter
    scrub(value, secrets)    pure: `value` with every secret value replaced by [secret:NAME]
    scrub_known(value)       scrub(value, known_secrets())
    hand_on(value)           a child run's input as stored: scrub_known, after placeholders already in it
                             are made [redacted] (only values the handing step held are handed on)
    reveal(value)            what a child run's steps see of that input: each placeholder resolved
    holds_placeholder(value) whether `value` holds a [secret:NAME] placeholder
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from pal.core import redact
from pal.errors import TemplateError

ENV_PREFIX = "PAL_SECRET_"
FILE_VARIABLE = "PAL_SECRETS_FILE"
SECRET_NAME = re.compile(r"[A-Z][A-Z0-9_]*\Z")
# Every value is scrubbed as a substring of whatever is journaled: a value this short would also
# replace ordinary text (a 3-character secret would rewrite every word holding those letters).
MIN_SECRET_CHARS = 8
MAX_FILE_BYTES = 1_000_000


class SecretError(TemplateError):
    """A template names a secret that is not available; the message names it, never a value."""


def placeholder(name: str) -> str:
    """What a secret's value is replaced with in anything journaled or logged."""
    return f"[secret:{name}]"


@dataclass(frozen=True)
class _Loaded:
    values: Mapping[str, str] = field(default_factory=dict)
    problems: Mapping[str, str] = field(default_factory=dict)  # name -> why it cannot be used
    file_error: str | None = None


def _entry_problem(name: str, value: Any, where: str) -> str | None:
    if not SECRET_NAME.fullmatch(name):
        return f"{where}: {name!r} is not a secret name (A-Z, 0-9 and _, starting with a letter)"
    if not isinstance(value, str):
        return f"{where}: secret {name} must be a string, not {type(value).__name__}"
    if len(value) < MIN_SECRET_CHARS:
        return (f"{where}: secret {name} is shorter than {MIN_SECRET_CHARS} characters; PAL scrubs "
                "secret values from everything it journals, and one that short would also replace "
                "ordinary text")
    return None


def _read_file(path: str) -> tuple[dict[str, Any], str | None]:
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        return {}, f"{FILE_VARIABLE}={path!r} cannot be read: {exc.strerror or type(exc).__name__}"
    if len(raw) > MAX_FILE_BYTES:
        return {}, f"{FILE_VARIABLE}={path!r} is over {MAX_FILE_BYTES} bytes"
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # the message gives a position, never the content
        where = f"line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
        return {}, f"{FILE_VARIABLE}={path!r} is not JSON {where}".rstrip()
    if not isinstance(document, dict):
        return {}, f"{FILE_VARIABLE}={path!r} must hold a JSON object of name -> value"
    return document, None


@lru_cache(maxsize=8)
def _load(variables: tuple[tuple[str, str], ...], path: str,
          file_version: tuple[int, int, int] | None) -> _Loaded:
    """The secrets of one state of the environment and the file (`file_version` keys the cache)."""
    values: dict[str, str] = {}
    problems: dict[str, str] = {}
    file_error = None
    if path:
        document, file_error = _read_file(path)
        for name, value in document.items():
            problem = _entry_problem(name, value, FILE_VARIABLE)
            if problem:
                problems[name] = problem
            else:
                values[name] = value
    for variable, value in variables:
        name = variable[len(ENV_PREFIX):]
        problem = _entry_problem(name, value, variable)
        if problem:
            problems[name] = problem
            values.pop(name, None)  # a variable wins over the file, a broken one too
        else:
            values[name] = value
            problems.pop(name, None)
    return _Loaded(values, problems, file_error)


def _current(env: Mapping[str, str] | None) -> _Loaded:
    env = os.environ if env is None else env
    # Keys first, values only of the matches: this runs for every log record (pal.core.redact).
    variables = tuple(sorted((k, env[k]) for k in env if k.startswith(ENV_PREFIX)))
    path = env.get(FILE_VARIABLE, "").strip()
    version = None
    if path:
        try:
            stat = os.stat(path)
            version = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        except OSError:
            version = None
    return _load(variables, path, version)


def is_secret_name(name: str) -> bool:
    return bool(SECRET_NAME.fullmatch(name))


def resolve(name: str, env: Mapping[str, str] | None = None) -> str:
    """The value of secret `name` from `env` (default: this process's environment)."""
    if not is_secret_name(name):
        raise SecretError(f"{name!r} is not a secret name (A-Z, 0-9 and _, starting with a letter)")
    loaded = _current(env)
    if name in loaded.values:
        return loaded.values[name]
    if name in loaded.problems:
        raise SecretError(f"secret {name} cannot be used: {loaded.problems[name]}")
    # Entries under a malformed name may be the one meant (api_token for API_TOKEN): say so.
    malformed = [problem for key, problem in sorted(loaded.problems.items()) if not is_secret_name(key)]
    hint = "".join(f"; {problem}" for problem in [loaded.file_error, *malformed[:3]] if problem)
    raise SecretError(f"unknown secret {name}: set {ENV_PREFIX}{name} in the worker's environment or "
                      f"add {name!r} to the JSON object in {FILE_VARIABLE}{hint}")


def known_secrets(env: Mapping[str, str] | None = None) -> Mapping[str, str]:
    """{name: value} of every secret a template could render in this process; never raises, so a
    log filter can call it."""
    return dict(_current(env).values)


def known_secret_values(env: Mapping[str, str] | None = None) -> frozenset[str]:
    """The values of `known_secrets()`, for a redaction filter that has no use for the names."""
    return frozenset(_current(env).values.values())


@lru_cache(maxsize=32)
def _replacer(secrets: frozenset[tuple[str, str]]) -> Callable[[str], str]:
    by_value: dict[str, str] = {}
    for name, value in sorted(secrets):
        by_value.setdefault(value, placeholder(name))
    # Longest first: a secret that contains another is replaced whole, not around the shorter one.
    pattern = re.compile("|".join(re.escape(v) for v in sorted(by_value, key=len, reverse=True)))
    return lambda text: pattern.sub(lambda match: by_value[match.group(0)], text)


def _scrub_scalar(value: Any, sub: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return sub(value)
    if value is None or isinstance(value, bool):
        return value
    try:
        text = str(value)  # a number or other scalar that spells a secret becomes the placeholder text
    except ValueError:  # an int too long to print cannot hold a secret worth the name
        return value
    scrubbed = sub(text)
    return value if scrubbed == text else scrubbed


def scrub(value: Any, secrets: Mapping[str, str]) -> Any:
    """`value` (JSON-like: dicts, lists, scalars) with every occurrence of a secret value, in strings,
    keys and printed numbers, replaced by `[secret:NAME]`. Pure: `value` is not changed; tuples come
    back as lists. Iterative, so any depth is fine; shared or cyclic parts stay shared."""
    usable = frozenset((name, v) for name, v in secrets.items() if isinstance(v, str) and v)
    if not usable:
        return value
    return _rewrite(value, _replacer(usable))


def _rewrite(value: Any, sub: Callable[[str], str]) -> Any:
    """`value` rebuilt with `sub` applied to every string, key and printed number (see scrub)."""
    holder: list[Any] = [None]
    rebuilt: dict[int, Any] = {}
    stack: list[tuple[Any, Any, Any]] = [(value, holder, 0)]
    while stack:
        item, parent, slot = stack.pop()
        if isinstance(item, Mapping | list | tuple) and id(item) in rebuilt:
            parent[slot] = rebuilt[id(item)]
        elif isinstance(item, Mapping):
            new: dict[Any, Any] = {}
            rebuilt[id(item)] = parent[slot] = new
            for key, child in item.items():
                new_key = _scrub_scalar(key, sub)
                new[new_key] = None
                stack.append((child, new, new_key))
        elif isinstance(item, list | tuple):
            new_list: list[Any] = [None] * len(item)
            rebuilt[id(item)] = parent[slot] = new_list
            stack.extend((child, new_list, index) for index, child in enumerate(item))
        else:
            parent[slot] = _scrub_scalar(item, sub)
    return holder[0]


def scrub_known(value: Any, env: Mapping[str, str] | None = None) -> Any:
    """`scrub(value, known_secrets())`: what to call before journaling or logging a value."""
    return scrub(value, known_secrets(env))


# A placeholder as scrub writes it; a child run's input holds them where its parent handed on a secret.
_PLACEHOLDER = re.compile(r"\[secret:([A-Z][A-Z0-9_]*)\]")


def hand_on(value: Any, env: Mapping[str, str] | None = None) -> Any:
    """A child run's input as it is stored: every secret value replaced by its placeholder, which the
    child's steps reveal again (`reveal`). Placeholder text already in `value` (an earlier step's
    scrubbed output, or input that merely looks like one) becomes `[redacted]` first: otherwise text
    from a run's input could make a child resolve any secret the worker holds."""
    usable = frozenset((name, v) for name, v in known_secrets(env).items() if v)
    scrub_text = _replacer(usable) if usable else str
    return _rewrite(value, lambda text: scrub_text(_PLACEHOLDER.sub(redact.REDACTED, text)))


def reveal(value: Any, env: Mapping[str, str] | None = None) -> Any:
    """What a child run's steps see of its stored input: each `[secret:NAME]` replaced by the value
    `resolve` gives now (SecretError, naming the secret, when this worker does not have it);
    `value` itself when it holds none, as most inputs do (this runs for every step of a child run)."""
    if not holds_placeholder(value):
        return value
    return _rewrite(value, lambda text: _PLACEHOLDER.sub(lambda match: resolve(match[1], env), text)
                    if "[secret:" in text else text)


def holds_placeholder(value: Any) -> bool:
    """Whether a JSON value holds a `[secret:NAME]` placeholder (in a string or a key)."""
    return bool(_PLACEHOLDER.search(json.dumps(value, default=str)))


# pal.core.redact replaces every known secret value in what PAL journals and logs; this is its source of
# the graph secrets (see its add_secret_source).
redact.add_secret_source(known_secrets)
