"""`connector`: an HTTP webhook delivery (httpx), claimed in side_effect_receipts before sending.

The request carries the step attempt's `Idempotency-Key`. A 2xx answer is a delivery; a 4xx answer
or a refused connection is a definite failure (retry class `connector`); a timeout, a dropped
connection or a 5xx leaves the outcome unknown (in doubt). `idempotentReceiver: true` declares
that the receiver de-duplicates by the key, which lets PAL re-send an unconfirmed delivery with the
same key instead of failing it as in doubt.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar
from urllib.parse import urlsplit

import httpx

from pal.errors import DeliveryError, DeliveryOutcomeUnknown, DeliveryTimeout
from pal.nodes.base import ANY, Field, NodeKind, StepContext
from pal.nodes.delivery import deliver

METHODS = ("POST", "PUT", "PATCH", "DELETE")


class Connector(NodeKind):
    type_name = "connector"
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
        return problems

    def execute(self, data: Mapping[str, Any], ctx: StepContext) -> Any:
        url = str(ctx.render(data["url"]))
        if urlsplit(url).scheme not in ("http", "https"):
            raise DeliveryError(f"url {url!r} rendered to something that is not http(s)")
        method = str(data.get("method", "POST")).upper()
        headers = {str(k): str(v) for k, v in ctx.render(data.get("headers", {})).items()}
        headers["Idempotency-Key"] = ctx.idempotency_key
        body = ctx.render(data.get("body"))
        timeout = (data.get("timeoutMs") or 0) / 1000 or ctx.need_services().setting("delivery_timeout")

        def send() -> dict[str, Any]:
            try:
                reply = httpx.request(method, url, json=body, headers=headers, timeout=timeout)
            except httpx.ConnectError as exc:  # nothing reached the receiver
                raise DeliveryError(f"webhook {method} {url}: cannot connect: {exc}") from exc
            except httpx.TimeoutException as exc:
                raise DeliveryTimeout(f"webhook {method} {url}: timed out after {timeout:g}s") from exc
            except httpx.TransportError as exc:  # e.g. the connection dropped after the request
                raise DeliveryOutcomeUnknown(f"webhook {method} {url}: {type(exc).__name__}: {exc}") from exc
            if 400 <= reply.status_code < 500:  # the receiver answered: not accepted
                raise DeliveryError(f"webhook {method} {url}: HTTP {reply.status_code}: {reply.text[:500]}")
            if not reply.is_success:  # a 5xx (or a proxy's) may come after the work was done
                raise DeliveryOutcomeUnknown(
                    f"webhook {method} {url}: HTTP {reply.status_code}: {reply.text[:500]}")
            return {"status": reply.status_code, "body": _body(reply)}

        return deliver(ctx, "webhook", f"{method} {url}", bool(data.get("idempotentReceiver")), send)


def _body(reply: httpx.Response) -> Any:
    try:
        return reply.json()
    except ValueError:
        return reply.text[:4000]
