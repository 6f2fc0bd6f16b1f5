"""One-off HTTP requests for tests, made as httpx's module functions make them, minus their cost.

Each `httpx.get(...)` builds a client whose TLS context loads the CA bundle again: about 50 ms of
CPU per request, even for plain HTTP on loopback, and the suite makes thousands. These pass one
context, built once, instead; everything else about a request is httpx's own.
"""

from __future__ import annotations

from typing import Any

import httpx

TLS = httpx.create_ssl_context()


def request(method: str, url: str, **kwargs: Any) -> httpx.Response:
    return httpx.request(method, url, verify=TLS, **kwargs)


def get(url: str, **kwargs: Any) -> httpx.Response:
    return request("GET", url, **kwargs)


def post(url: str, **kwargs: Any) -> httpx.Response:
    return request("POST", url, **kwargs)


def put(url: str, **kwargs: Any) -> httpx.Response:
    return request("PUT", url, **kwargs)
