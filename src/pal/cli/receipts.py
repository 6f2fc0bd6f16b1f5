"""`pal receipts ...`: signed receipts of finished runs (docs/receipts.md).

    pal receipts keygen [--out DIR]          a new Ed25519 signing key
    pal receipts show RUN_ID [--json]        what a run's receipt states
    pal receipts export RUN_ID [-o FILE]     the bundle: envelope and events, for an auditor
    pal receipts verify FILE --key PUB ...   offline; --database-url also checks the live journal

`verify` exits 0 when the bundle holds, 7 for a bad signature, 8 for events that do not match
the signed chain (or the live journal), 9 for a key that is not trusted, 2 for a file that is not
a receipt bundle or an unreadable key, 3 for a run the database does not hold.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pal.cli import common
from pal.cli.common import EXIT_BAD_INPUT, AsJson

if TYPE_CHECKING:
    from pal.core.run_receipt import Verified

receipts_app = typer.Typer(help="Signed receipts of finished runs (docs/receipts.md).", no_args_is_help=True)
EXIT_BAD_SIGNATURE, EXIT_CHAIN_MISMATCH, EXIT_UNKNOWN_KEY = 7, 8, 9
_EXIT_OF_REASON = {"malformed": EXIT_BAD_INPUT, "bad_signature": EXIT_BAD_SIGNATURE,
                   "chain_mismatch": EXIT_CHAIN_MISMATCH, "unknown_key": EXIT_UNKNOWN_KEY}


@receipts_app.command("keygen")
def receipts_keygen(
    out: Annotated[Path | None, typer.Option(help="Write pal-signing.key (mode 600) and pal-signing.pub "
                                                  "into this folder instead of printing the private key.")]
    = None,
) -> None:
    """Make an Ed25519 signing key: set PAL_SIGNING_KEY to it and give auditors the public key."""
    from pal.core import dsse

    key = dsse.SigningKey(dsse.new_private_key())
    private, public = dsse.private_text(key.private), dsse.public_text(key.public)
    if out is None:
        typer.echo(f"PAL_SIGNING_KEY={private}")
    else:
        private_path, public_path = out / "pal-signing.key", out / "pal-signing.pub"
        if private_path.exists() or public_path.exists():
            common.fail(f"{private_path} or {public_path} exists; not overwriting a key", EXIT_BAD_INPUT)
        out.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(private + "\n")
        public_path.write_text(public + "\n")
        typer.echo(f"wrote {private_path} (PAL_SIGNING_KEY=$(cat {private_path})) and {public_path}")
    typer.echo(f"public key: {public}")
    typer.echo(f"key id: {key.key_id}")


def _bundle(run_id: str) -> bytes:
    from pal.engine.run_receipts import receipt_bundle

    client = common.client()
    return common.checked(lambda: receipt_bundle(client.runtime, run_id))


@receipts_app.command("show")
def receipts_show(run_id: str, as_json: AsJson = False) -> None:
    """What the run's receipt states: the run, its journal's chain head and count, the key."""
    from pal.core.run_receipt import verify
    from pal.engine.run_receipts import trusted_keys

    verified = verify(_bundle(run_id), trusted_keys(common.settings()))
    if as_json:
        common.print_json(verified.statement)
        return
    journal = verified.statement["predicate"]["journal"]
    typer.echo(f"run {verified.run_id}: {verified.status}")
    typer.echo(f"  {verified.count} journal events, seq {journal['first_seq']}..{journal['last_seq']}")
    typer.echo(f"  chain head sha256:{verified.head}")
    typer.echo(f"  signed by {verified.key_id}")


@receipts_app.command("export")
def receipts_export(
    run_id: str,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="File to write (default stdout).")]
    = None,
) -> None:
    """Write the run's receipt bundle (the signed envelope and every event) for offline checks."""
    data = _bundle(run_id)
    if output is None:
        typer.echo(data.decode("utf-8"), nl=False)
        return
    output.write_bytes(data)
    typer.echo(f"wrote the receipt of run {run_id} to {output} ({len(data):,} bytes)", err=True)


@receipts_app.command("verify")
def receipts_verify(
    file: Annotated[Path, typer.Argument(help="A bundle from `pal receipts export` or the REST route.")],
    key: Annotated[list[str], typer.Option("--key", help="A trusted public key: base64, PEM, or a file "
                                                         "holding one. Repeat for several.")],
    database_url: Annotated[str | None, typer.Option(help="Also recompute the chain from this journal.")]
    = None,
) -> None:
    """Check a receipt bundle offline: the signature, then every event against the signed chain."""
    from pal.core import dsse
    from pal.core.run_receipt import ReceiptInvalid, verify

    keys = []
    for text in key:
        path = Path(text)
        try:
            keys.append(dsse.trusted_key(path.read_text() if len(text) < 4096 and path.is_file() else text))
        except (dsse.UnreadableKey, OSError) as exc:
            common.fail(f"--key {text[:60]!r}: {exc}", EXIT_BAD_INPUT)
    try:
        data = file.read_bytes()
    except OSError as exc:
        common.fail(f"cannot read {file}: {exc.strerror}", EXIT_BAD_INPUT)
    try:
        verified = verify(data, keys)
        if database_url:
            _check_live(database_url, verified)
    except ReceiptInvalid as exc:
        common.fail(f"{exc.reason.replace('_', ' ')}: {exc}", _EXIT_OF_REASON[exc.reason])
    typer.echo(f"verified: run {verified.run_id} {verified.status}, {verified.count} events, chain head "
               f"sha256:{verified.head}, signed by {verified.key_id}"
               + (", matching the live journal" if database_url else ""))


def _check_live(database_url: str, verified: Verified) -> None:
    from pal.engine.run_receipts import check_live_at

    common.checked(lambda: check_live_at(database_url, verified))
