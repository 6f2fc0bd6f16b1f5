"""One redaction function for everything PAL writes or logs: journal errors, receipts, logs.

What PAL journals is read back by the API, SSE, the waterfall and `pal runs events`, so redacting at
the write is what keeps a credential out of all of them (docs/security.md, "Secrets"). Removed:
  - a URL's user-info (`https://user:pass@host` -> `https://[redacted]@host`) and every query value
    (`?token=abc` -> `?token=[redacted]`): which parameter is a credential cannot be known;
  - `Bearer …` / `Basic …` credentials, `key=value` pairs whose key names a credential (api_key,
    password, secret, token, authorization, …), model-provider key shapes (`sk-…`);
  - every value PAL knows to be secret: the operator's provider API keys and the graph secrets of
    pal.core.secrets (named `[secret:NAME]` where the name is known).
In a mapping, the value of a key that names a credential is replaced whole.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

REDACTED = "[redacted]"
# Environment variables whose values are credentials PAL itself holds (the providers' SDK names).
SECRET_ENVIRONMENT = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")
MIN_SECRET_CHARS = 6  # shorter "secrets" would redact ordinary words

_CREDENTIAL_NAME = r"(?:api[_-]?key|apikey|x[_-]api[_-]key|password|passwd|pwd|secret|client[_-]secret|" \
                   r"access[_-]?token|refresh[_-]?token|auth[_-]?token|token|authorization|signature|sig|" \
                   r"private[_-]?key|session|cookie)"
_SENSITIVE_KEY = re.compile(rf"(?i)^[\w-]*{_CREDENTIAL_NAME}[\w-]*$")
_URL = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^\s\"'<>`]+)")
_QUERY_PAIR = re.compile(r"(^|&|;)([^=&;]*)=([^&;]*)")
_AUTH_SCHEME = re.compile(r"(?i)\b(bearer|basic|token|digest)(\s+)[A-Za-z0-9._~+/=:-]{6,}")
_KEY_VALUE = re.compile(rf"(?i)(?<!\[)\b({_CREDENTIAL_NAME})([\"']?\s*[:=]\s*[\"']?)"
                        r"(?!\[redacted\]|\[secret:)([^\s\"',;&)}\]]+)")
_PROVIDER_KEY = re.compile(r"\bsk-(?:ant-|proj-)?[A-Za-z0-9_-]{10,}")

_secret_sources: list[Callable[[], Mapping[str, str]]] = []


def add_secret_source(source: Callable[[], Mapping[str, str]]) -> None:
    """Register a provider of {name: value} secrets whose values are redacted wherever they appear
    (pal.core.secrets registers the graph secrets this way)."""
    if source not in _secret_sources:
        _secret_sources.append(source)


def _known_secrets() -> list[tuple[str, str]]:
    found = {os.environ.get(name, ""): name for name in SECRET_ENVIRONMENT}
    for source in _secret_sources:
        found.update({value: name for name, value in source().items()})
    # Longest first, so a secret that contains another is replaced whole.
    return sorted(((v, n) for v, n in found.items() if len(v) >= MIN_SECRET_CHARS),
                  key=lambda item: -len(item[0]))


# A text holding none of these (lowercased) has nothing the patterns below could match: most log
# lines, so the patterns are skipped for them.
_TRIGGERS = ("://", "=", "bearer", "basic", "token", "digest", "sk-", "key", "secret", "pass", "pwd",
             "auth", "session", "cookie", "sig")


def redact_text(text: str) -> str:
    """`text` with every credential PAL can recognise replaced (see the module's docstring)."""
    for value, name in _known_secrets():
        if value in text:
            text = text.replace(value, f"[secret:{name}]")
    lowered = text.lower()
    if not any(trigger in lowered for trigger in _TRIGGERS):
        return text
    text = _URL.sub(_redact_url, text)
    text = _AUTH_SCHEME.sub(rf"\1\2{REDACTED}", text)
    text = _KEY_VALUE.sub(rf"\1\2{REDACTED}", text)
    return _PROVIDER_KEY.sub(REDACTED, text)


def bounded(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, with a note of how many more there were. Only for text
    that is redacted already (or needs none): see redact_bounded."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"


def redact_bounded(text: str, limit: int) -> str:
    """`text` redacted, then bounded to `limit` characters. In that order: a cut through a
    credential leaves a piece that redaction no longer recognises (a secret's first half, a
    `Bearer` token too short to match), so cutting first would keep half of it."""
    return bounded(redact_text(text), limit)


def _redact_url(match: re.Match[str]) -> str:
    scheme, rest = match[1], match[2]
    authority, slash, path = rest.partition("/")
    if "@" in authority:  # user-info: credentials, whatever they look like
        authority = f"{REDACTED}@{authority.rpartition('@')[2]}"
    rest = authority + slash + path
    if "?" in rest:
        base, _, query = rest.partition("?")
        query, hash_, fragment = query.partition("#")
        query = _QUERY_PAIR.sub(lambda m: f"{m[1]}{m[2]}={REDACTED}" if m[3] else m[0], query)
        rest = f"{base}?{query}{hash_}{fragment}"
    return scheme + rest


def redact(value: Any) -> Any:
    """A JSON value with every string redacted and every credential-named key's value replaced."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {k: (REDACTED if isinstance(k, str) and _SENSITIVE_KEY.match(k) and v not in (None, "")
                    else redact(v)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    return value


class _RedactingRecords:
    """A log record factory that redacts a record's message (and its traceback) when it is made.

    PAL's own records (loggers `pal` and `pal.*`) always; in a process PAL runs (`pal worker`, `pal
    api`, `celery -A pal.workers`: `whole_process`) every record, since an HTTP library logs the
    URLs it calls at INFO and Celery the arguments of tasks. In someone else's process (an app with
    a `pal.Client`, a team's Celery app with `pal.install`) the app's own records are its own and
    pass untouched. A record with nothing credential-like in it is returned as it was made, its
    arguments intact (a handler may read them: uvicorn's access log unpacks its five). One that has
    is redacted argument by argument, keeping their shape, and only when a credential appears only
    once they are put together is the message replaced by its redacted text."""

    def __init__(self, inner: Callable[..., logging.LogRecord], whole_process: bool = False) -> None:
        self.inner, self.whole_process = inner, whole_process

    def __call__(self, *args: Any, **kwargs: Any) -> logging.LogRecord:
        record = self.inner(*args, **kwargs)
        if not (self.whole_process or record.name == "pal" or record.name.startswith("pal.")):
            return record
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: leave it to the handler to report
            return record
        redacted = redact_text(message)
        if redacted != message:
            _redact_record(record, message, redacted)
        if record.exc_info and not record.exc_text:
            record.exc_text = redact_text(logging.Formatter().formatException(record.exc_info))
        return record


def _redact_record(record: logging.LogRecord, message: str, redacted: str) -> None:
    """Redact the record's format string and arguments in place; failing that, its message."""
    msg, arguments = record.msg, record.args
    if isinstance(msg, str):
        record.msg = redact_text(msg)
    if isinstance(arguments, tuple):
        record.args = tuple(redact_text(a) if isinstance(a, str) else a for a in arguments)
    elif isinstance(arguments, Mapping):
        record.args = {k: redact_text(v) if isinstance(v, str) else v for k, v in arguments.items()}
    try:
        if redact_text(record.getMessage()) == record.getMessage():
            return
    except Exception:
        pass
    record.msg, record.args = redacted, None  # the credential spans the pieces: the whole message


def install_log_redaction(*, whole_process: bool = False) -> None:
    """Redact PAL's log records from now on; with `whole_process` (a process PAL runs), every
    record of the process. Idempotent; a later `whole_process` widens an earlier install."""
    factory = logging.getLogRecordFactory()
    if isinstance(factory, _RedactingRecords):
        factory.whole_process = factory.whole_process or whole_process
    else:
        logging.setLogRecordFactory(_RedactingRecords(factory, whole_process))
