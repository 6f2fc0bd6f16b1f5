"""Receipts through every door, against a real `pal api` and worker on Postgres: the REST route
(the same bytes each time, 409 in flight, 404 to another tenant), the keys at their well-known
address, `pal receipts show|export|verify` with each exit code, and the routes' answer when
receipts are off (docs/receipts.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pal.cli.demo import wait_until
from pal.core import dsse
from tests.support.api_server import RECEIPT_KEY, RETIRED_KEY, Api
from tests.support.graphs import approval, linear
from tests.support.processes import Processes


def test_a_finished_runs_receipt_over_rest_and_the_cli(api: Api, processes: Processes, tmp_path: Path) -> None:
    assert api.post("/v1/runs", json={"graph": linear(tmp_path / "c", 3), "run_id": "paid-1"}).status_code == 201
    assert api.client.wait("paid-1", timeout=60).status == "succeeded"
    reply = api.get("/v1/runs/paid-1/receipt")
    assert reply.status_code == 200 and reply.headers["content-type"] == "application/json", reply.text
    assert reply.headers["content-disposition"] == 'attachment; filename="paid-1.receipt.json"'
    assert api.get("/v1/runs/paid-1/receipt").content == reply.content  # deterministic
    assert api.call("GET", "/v1/runs/paid-1/receipt", api.other).status_code == 404
    assert api.call("GET", "/v1/runs/paid-1/receipt", api.revoked).status_code == 401
    keys = api.call("GET", "/.well-known/pal-receipt-keys").json()  # public: no token needed
    assert keys["signing_key"] == RECEIPT_KEY.key_id
    assert keys["keys"] == [RECEIPT_KEY.trusted.as_dict(), RETIRED_KEY.trusted.as_dict()]

    pal = processes.cli
    exported = tmp_path / "paid-1.json"
    done = pal("receipts", "export", "paid-1", "-o", str(exported), **api.env)
    assert done.returncode == 0, done.stderr
    assert exported.read_bytes() == reply.content  # the CLI and REST issue the same receipt
    shown = pal("receipts", "show", "paid-1", **api.env)
    assert shown.returncode == 0 and "run paid-1: succeeded" in shown.stdout and RECEIPT_KEY.key_id in shown.stdout
    public = tmp_path / "pal.pub"
    public.write_text(dsse.public_text(RECEIPT_KEY.public))
    # Offline: no PAL_* settings at all, only the file and the key.
    offline = {"PAL_DATABASE_URL": "", "PAL_SIGNING_KEY": "", "PAL_TRUSTED_KEYS": ""}
    verified = pal("receipts", "verify", str(exported), "--key", str(public), **offline)
    assert verified.returncode == 0, verified.stderr
    assert verified.stdout.startswith("verified: run paid-1 succeeded, ")
    live = pal("receipts", "verify", str(exported), "--key", str(public), "--database-url",
               api.env["PAL_DATABASE_URL"], **offline)
    assert live.returncode == 0 and "matching the live journal" in live.stdout, live.stderr

    data = exported.read_bytes()
    cases = {  # a changed byte in each part of the bundle, and the exit code it must get
        "signature": (data.replace(b'"sig":"', b'"sig":"A', 1), 2),  # no longer canonical base64
        "event": (data.replace(b'"kind":"step_completed"', b'"kind":"step_completes"', 1), 8),
        "unknown key": (data, 9),  # checked with the retired key only
    }
    for name, (changed, code) in cases.items():
        path = tmp_path / f"{name}.json"
        path.write_bytes(changed)
        key = dsse.public_text(RETIRED_KEY.public) if name == "unknown key" else str(public)
        result = pal("receipts", "verify", str(path), "--key", key, **offline)
        assert result.returncode == code, (name, result.stdout, result.stderr)
        assert result.stderr.startswith("error: ") and "Traceback" not in result.stderr
    forged = pal("receipts", "verify", str(exported), "--key", "not-a-key", **offline)
    assert forged.returncode == 2 and "not an Ed25519 public key" in forged.stderr


def test_no_receipt_while_a_run_waits_for_approval(api: Api, tmp_path: Path) -> None:
    api.post("/v1/runs", json={"graph": approval(tmp_path / "c"), "input": {"amount": 3, "customer": "z"},
                               "run_id": "gate-1"})
    assert wait_until(lambda: api.client.get_run("gate-1").status == "waiting", timeout=60)
    reply = api.get("/v1/runs/gate-1/receipt")
    assert reply.status_code == 409
    assert reply.json() == {"detail": "run gate-1 is waiting: its receipt is issued once it has finished"}


@pytest.mark.parametrize("api_env", [{}])
def test_without_a_signing_key_the_routes_say_receipts_are_off(api: Api, processes: Processes,
                                                               tmp_path: Path) -> None:
    assert api.post("/v1/runs", json={"graph": linear(tmp_path / "c", 1), "run_id": "r-1"}).status_code == 201
    assert api.client.wait("r-1", timeout=60).status == "succeeded"
    off = {"detail": "receipts are off: set PAL_SIGNING_KEY (`pal receipts keygen` makes one)"}
    for path in ("/v1/runs/r-1/receipt", "/.well-known/pal-receipt-keys"):
        reply = api.get(path)
        assert (reply.status_code, reply.json()) == (501, off)
    shown = processes.cli("receipts", "show", "r-1")
    assert shown.returncode == 2 and "receipts are off" in shown.stderr


def test_pal_receipts_keygen_writes_a_private_key_only_its_owner_reads(processes: Processes,
                                                                       tmp_path: Path) -> None:
    made = processes.cli("receipts", "keygen", "--out", str(tmp_path / "keys"))
    assert made.returncode == 0, made.stderr
    private, public = tmp_path / "keys" / "pal-signing.key", tmp_path / "keys" / "pal-signing.pub"
    assert private.stat().st_mode & 0o777 == 0o600
    key = dsse.SigningKey(dsse.read_private_key(private.read_text()))
    assert dsse.trusted_key(public.read_text()).key_id == key.key_id and key.key_id in made.stdout
    again = processes.cli("receipts", "keygen", "--out", str(tmp_path / "keys"))
    assert again.returncode == 2 and "not overwriting" in again.stderr
    assert dsse.read_private_key(private.read_text()).public_key() == key.public  # untouched
