"""How the control plane answers an error: a JSON body with a `detail` (and, for an invalid graph,
every `problems` entry), under the status that says whose mistake it was (the list is in
pal.api.app's docstring, the OpenAPI description)."""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from pal.engine.recovery import ResumeRefused
from pal.errors import (
    BrokerUnavailable,
    GraphError,
    InputError,
    NotFound,
    PalError,
    QuotaExceeded,
    ReceiptsOff,
    Refused,
    StorageError,
)

# First match wins, so a subclass stands before its base (QuotaExceeded is a Refused).
_STATUS_CODES: tuple[tuple[type[PalError], int], ...] = (
    (NotFound, 404),
    (ReceiptsOff, 501),
    (QuotaExceeded, 429),
    (Refused, 409),
    (ResumeRefused, 409),
    (GraphError, 422),
    (InputError, 422),
    (StorageError, 503),
    (BrokerUnavailable, 503),
)


def status_code_of(exc: PalError) -> int:
    """The HTTP status of a PalError: 400 for any kind not listed above."""
    return next((code for kind, code in _STATUS_CODES if isinstance(exc, kind)), 400)


def error_payload(exc: PalError) -> dict[str, Any]:
    """The JSON body of a PalError's response."""
    if isinstance(exc, StorageError):
        # The database's own message may name hosts, users or SQL: the client gets none of it.
        return {"detail": "the journal database failed; try again"}
    if isinstance(exc, BrokerUnavailable):  # its message names the broker's host: not the client's
        return {"detail": "the broker is unavailable; the run is journaled and the orphan sweep sends it",
                "run_id": exc.run_id}
    if isinstance(exc, GraphError):
        return {"detail": str(exc), "problems": exc.problems}
    return {"detail": str(exc)}


async def pal_error(_: Request, exc: PalError) -> JSONResponse:
    """Any PalError a route lets through, as its status and JSON body."""
    return JSONResponse(error_payload(exc), status_code=status_code_of(exc))


async def invalid_request(_: Request, exc: RequestValidationError) -> Response:
    """A request FastAPI could not validate: 422 with pydantic's errors."""
    # FastAPI's own handler echoes the input: a non-JSON body is echoed as bytes, which were a
    # 500 when not UTF-8. Decode with replacement, and write ASCII JSON, which always encodes.
    as_text = {bytes: lambda b: b.decode("utf-8", "replace")}
    detail = jsonable_encoder(exc.errors(), custom_encoder=as_text)
    return Response(json.dumps({"detail": detail}), status_code=422, media_type="application/json")


def add_error_handlers(api: FastAPI) -> None:
    # The decorator form: add_exception_handler's type wants a handler of any Exception.
    api.exception_handler(PalError)(pal_error)
    api.exception_handler(RequestValidationError)(invalid_request)
