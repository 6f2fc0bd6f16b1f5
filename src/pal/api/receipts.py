"""Receipts over REST (docs/receipts.md): a finished run's bundle, and the public keys receipts
are signed with at a well-known address, so an auditor fetches both from the control plane and
checks them with `pal receipts verify` or any DSSE tool. Without PAL_SIGNING_KEY both answer 501
and say so."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response

from pal.api.auth import Auth
from pal.api.deps import Rt
from pal.engine.run_receipts import receipt_bundle, signing_key, trusted_keys

router = APIRouter()
KEYS_PATH = "/.well-known/pal-receipt-keys"


@router.get("/v1/runs/{run_id}/receipt", response_class=Response,
            responses={200: {"content": {"application/json": {}}, "description": "The receipt bundle"}})
def receipt(run_id: str, caller: Auth, rt: Rt) -> Response:
    """The signed receipt of a finished run: 409 while it is in flight, 501 when receipts are off;
    a pruned run's kept receipt (docs/retention.md). Another tenant's run is a 404 either way."""
    data = receipt_bundle(rt, run_id, tenant_id=caller.tenant_id)
    # A run id is [A-Za-z0-9_.:-] (pal.engine.runs.RUN_ID): safe inside the quoted file name.
    return Response(data, media_type="application/json",
                    headers={"Content-Disposition": f'attachment; filename="{run_id}.receipt.json"'})


@router.get(KEYS_PATH)
def receipt_keys(rt: Rt) -> dict[str, Any]:
    """The public keys receipts verify against: the signing key first, then PAL_TRUSTED_KEYS."""
    return {"signing_key": signing_key(rt.settings).key_id,
            "keys": [key.as_dict() for key in trusted_keys(rt.settings)]}
