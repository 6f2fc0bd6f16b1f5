"""`connector`: an HTTP webhook delivery (httpx), claimed in side_effect_receipts before sending.

The request carries the step attempt's `Idempotency-Key`. A 2xx answer is a delivery; a 4xx answer
or a refused connection is a definite failure (retry class `connector`); a timeout, a dropped
connection or a 5xx leaves the outcome unknown (in doubt). `idempotentReceiver: true` declares
that the receiver de-duplicates by the key, which lets PAL re-send an unconfirmed delivery with the
same key instead of failing it as in doubt.

The graph names the URL, so the target passes the egress guard (pal.core.egress) before anything is
claimed: a refused target fails the step with code `egress_refused`, and nothing is sent
(docs/side-effects.md).
"""

from __future__ import annotations

import functools
import os
import re
import ssl
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, ClassVar
from urllib.parse import urlsplit

import httpx

from pal.core import egress, templates
from pal.core.redact import bounded, redact_bounded
from pal.core.secrets import scrub_known
from pal.errors import DeliveryError, DeliveryOutcomeUnknown, DeliveryTimeout
from pal.nodes import egress_dns
from pal.nodes.base import ANY, Field, NodeKind, StepContext, run_to_end
from pal.nodes.delivery import delivery

METHODS = ("POST", "PUT", "PATCH", "DELETE")
MAX_TEXT_ANSWER_CHARS = 4000  # of a delivered answer that is not JSON
DEFAULT_PORTS = {"http": 80, "https": 443}

# Routing, framing and hop-by-hop headers belong to PAL and httpx, not to graphs: a graph's Host
# would re-route the request on a shared front end, Content-Length or Transfer-Encoding could
# smuggle a second request past a proxy, Proxy-* and Connection/Upgrade/TE/Trailer/Keep-Alive
# change the connection itself, and Idempotency-Key is the step attempt's (docs/side-effects.md).
FORBIDDEN_HEADERS = frozenset({"host", "transfer-encoding", "content-length", "connection", "upgrade",
                               "te", "trailer", "idempotency-key", "keep-alive"})
FORBIDDEN_PREFIXES = ("proxy-",)


def tls_context() -> ssl.SSLContext:
    """The TLS context a webhook delivery verifies its receiver with. Loading the CA bundle costs
    about 50 ms of CPU, which each delivery paid, so a context is built once per process for each
    SSL_CERT_FILE and SSL_CERT_DIR (still read, docs/security.md): a bundle replaced at the same
    path is seen when the worker restarts."""
    return _tls_context(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))


@functools.cache
def _tls_context(cert_file: str | None, cert_dir: str | None) -> ssl.SSLContext:
    return httpx.create_ssl_context(trust_env=True)  # reads the two variables its key names


_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")  # an HTTP field name (RFC 9110 token)


def header_problem(name: str, value: str | None) -> str | None:
    """Why a graph may not send header `name` (with `value`, when known); None when it may."""
    if not _TOKEN.match(name):
        return f"header name {name!r} is not an HTTP field name (no spaces, colons, CR, LF or NUL)"
    lowered = name.lower()
    if lowered in FORBIDDEN_HEADERS or lowered.startswith(FORBIDDEN_PREFIXES):
        return f"header {name!r} is set by PAL, not by graphs"
    if value is not None and any((ord(c) < 32 and c != "\t") or c == "\x7f" for c in value):
        return f"header {name!r}: its value holds CR, LF, NUL or another control character"
    return None


class Connector(NodeKind):
    type_name = "connector"
    gateable: ClassVar[bool] = True  # the confidence gate may stand before its effect
    fields: ClassVar[Mapping[str, Field]] = {
        "url": Field((str,), required=True),
        "method": Field((str,), templated=False),
        "headers": Field((dict,)),
        "body": Field(ANY),
        "idempotentReceiver": Field((bool,), templated=False),
        "timeoutMs": Field((int,), templated=False),
        "label": Field((str,), templated=False),
    }

    def validate(self, data: Mapping[str, Any], known_tools: frozenset[str] | None) -> list[str]:
        problems = super().validate(data, known_tools)
        method = data.get("method", "POST")
        if isinstance(method, str) and method.upper() not in METHODS:
            problems.append(f"method {method!r} is not a delivery (one of: {', '.join(METHODS)})")
        url = data.get("url")
        if isinstance(url, str) and "{" not in url and urlsplit(url).scheme not in ("http", "https"):
            problems.append(f"url {url!r} must be an http:// or https:// URL")
        headers = data.get("headers")
        if isinstance(headers, Mapping):  # names are never rendered; a value may be a template
            for name, value in headers.items():
                literal = value if isinstance(value, str) and not templates.has_template(value) else None
                problem = header_problem(str(name), literal)
                if problem:
                    problems.append(problem)
        return problems

    def execute(self, data: Mapping[str, Any], ctx: StepContext) -> Any:
        return run_to_end(self.awaitable(data, ctx))

    def awaitable(self, data: Mapping[str, Any], ctx: StepContext) -> Coroutine[Any, Any, Any]:
        """Check the target and claim the receipt here; the request itself is awaited."""
        services = ctx.need_services()
        url = str(ctx.render(data["url"]))
        method = str(data.get("method", "POST")).upper()
        headers = _headers(ctx.render(data.get("headers", {})), f"webhook {method} {url}")
        headers["Idempotency-Key"] = ctx.idempotency_key
        body = ctx.render(data.get("body"))
        timeout = (data.get("timeoutMs") or 0) / 1000 or services.setting("delivery_timeout")
        what = f"webhook {method} {url}"
        # trust_env=False: no HTTP(S)_PROXY/ALL_PROXY (a proxy would connect to the NAME, after the
        # guard checked an address) and no .netrc credentials; SSL_CERT_FILE/DIR are still read.
        # follow_redirects=False (httpx's default, stated so it stays): a 3xx is the receiver's
        # answer, never a hop to a target the guard did not check. A client per delivery: pooled
        # connections are keyed by the pinned address, and one verified for another name's
        # certificate must never carry this request.
        client = httpx.AsyncClient(trust_env=False, verify=tls_context(), follow_redirects=False)

        def build() -> httpx.Request:
            return client.build_request(method, url, json=body, headers=headers, timeout=timeout)

        # Everything below, up to `delivery`, happens before a receipt is claimed: a request PAL
        # cannot form, or a target the guard refuses, fails the step with nothing claimed and
        # nothing sent.
        try:
            request = build()
            scheme, host = request.url.scheme, request.url.raw_host.decode("ascii")
        except (httpx.InvalidURL, ValueError, TypeError) as exc:  # UnicodeError is a ValueError
            raise DeliveryError(f"{what}: not a request PAL can send: {exc}") from exc
        if scheme not in DEFAULT_PORTS or not host:
            raise DeliveryError(f"url {url!r} rendered to something that is not an http(s) URL")
        port = request.url.port or DEFAULT_PORTS[scheme]
        unresolved: egress.Unresolvable | None = None
        addresses: tuple[egress.Address, ...] = ()
        try:
            addresses = egress_dns.check(host, port, services.setting("egress_allow"))
        except egress.Unresolvable as exc:
            # Reported by `send`, after the claim: on a re-drive that finds an earlier claim,
            # the receipt protocol must still say "in doubt" rather than allow a retry.
            unresolved = exc
        send = _sender(client, build, host, addresses, unresolved, what, timeout)
        effect = delivery(ctx, "webhook", f"{method} {url}", bool(data.get("idempotentReceiver")), send)

        async def delivered() -> Any:
            async with client:
                return await effect

        return delivered()


def _headers(rendered: Any, what: str) -> dict[str, str]:
    """The graph's headers after rendering, each checked again (a template may have built them)."""
    if not isinstance(rendered, Mapping):
        raise DeliveryError(f"{what}: headers rendered to {type(rendered).__name__}, not an object")
    headers = {str(k): str(v) for k, v in rendered.items()}
    for name, value in headers.items():
        problem = header_problem(name, value)
        if problem:
            raise DeliveryError(f"{what}: {problem} (nothing was sent)")
    return headers


def _pin(request: httpx.Request, address: egress.Address, host: str) -> httpx.Request:
    """Point the request's connection at the checked `address`, keeping everything else.

    httpx computed the Host header from the URL the graph named when the request was built, so
    the receiver still sees its own name; only the TCP connection goes to the address, with no
    second DNS lookup that a rebinding resolver could answer differently. For https the name
    travels as `sni_hostname`, which httpcore uses for SNI and as the name the certificate is
    verified against, so pinning does not weaken TLS."""
    request.url = request.url.copy_with(host=str(address))
    if request.url.scheme == "https" and not egress.is_address_literal(host):
        request.extensions = {**request.extensions, "sni_hostname": host}
    return request


def _sender(client: httpx.AsyncClient, build: Callable[[], httpx.Request], host: str,
            addresses: tuple[egress.Address, ...], unresolved: egress.Unresolvable | None, what: str,
            timeout: float) -> Callable[[], Awaitable[dict[str, Any]]]:
    async def send() -> dict[str, Any]:
        if unresolved is not None:
            raise DeliveryError(f"{what}: {unresolved}")
        refused: httpx.ConnectError | None = None
        for address in addresses:  # the resolver's order, as a plain connect would try them
            try:
                reply = await client.send(_pin(build(), address, host))
            except httpx.ConnectError as exc:  # nothing reached this address: try the next one
                refused = refused or exc  # the preferred address's error is the one to report
                continue
            except (httpx.UnsupportedProtocol, httpx.LocalProtocolError) as exc:
                # Refused on this side before a byte of the request was written: httpcore raises
                # LocalProtocolError only while forming the request head, and graphs cannot set
                # the framing headers that could make it fail later, mid-body.
                raise DeliveryError(f"{what}: refused before sending: {exc}") from exc
            except httpx.TimeoutException as exc:
                raise DeliveryTimeout(f"{what}: timed out after {timeout:g}s") from exc
            except httpx.TransportError as exc:  # e.g. the connection dropped after the request
                raise DeliveryOutcomeUnknown(f"{what}: {type(exc).__name__}: {exc}") from exc
            # An answer quoted in an error is redacted before it is cut (pal.core.redact.redact_bounded).
            if 400 <= reply.status_code < 500:  # the receiver answered: not accepted
                raise DeliveryError(f"{what}: HTTP {reply.status_code}: {redact_bounded(reply.text, 500)}")
            if not reply.is_success:  # a 5xx (or a proxy's, or an unfollowed 3xx): maybe done
                raise DeliveryOutcomeUnknown(f"{what}: HTTP {reply.status_code}: "
                                             f"{redact_bounded(reply.text, 500)}")
            return {"status": reply.status_code, "body": _body(reply)}
        raise DeliveryError(f"{what}: cannot connect: {refused}") from refused

    return send


def _body(reply: httpx.Response) -> Any:
    """A delivered answer, the step's data: JSON as it is, text scrubbed of secret values and then
    bounded (cut first, a secret across the bound would keep its first part)."""
    try:
        return reply.json()
    except ValueError:
        return bounded(scrub_known(reply.text), MAX_TEXT_ANSWER_CHARS)
