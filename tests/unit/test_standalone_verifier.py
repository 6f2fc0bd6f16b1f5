"""docs/verify_receipt.py, the verifier an auditor runs without PAL (docs/receipts.md): it imports
nothing of PAL, accepts a bundle PAL issued, refuses a tampered one, and its RFC 8785 reading agrees
with PAL's on any JSON value."""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from hypothesis import given

from pal.core import dsse
from pal.core.jcs import canonical
from pal.core.run_receipt import issue
from tests.conftest import REPO
from tests.unit.test_jcs import json_values
from tests.unit.test_run_receipt import EVENTS, KEY, OTHER, RUN

SCRIPT = REPO / "docs" / "verify_receipt.py"


def standalone() -> ModuleType:
    spec = importlib.util.spec_from_file_location("verify_receipt", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(bundle: bytes, key: dsse.SigningKey, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "bundle.json"
    path.write_bytes(bundle)
    return subprocess.run([sys.executable, "-I", str(SCRIPT), str(path), dsse.public_text(key.public)],
                          capture_output=True, text=True, timeout=60)


def test_it_imports_nothing_of_pal() -> None:
    imported = {alias.name.split(".")[0] for node in ast.walk(ast.parse(SCRIPT.read_text()))
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(ast.parse(SCRIPT.read_text()))
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= {"__future__", "base64", "hashlib", "json", "sys", "decimal", "typing", "cryptography"}


def test_it_accepts_what_pal_issued_and_refuses_tampering(tmp_path: Path) -> None:
    good = issue(RUN, EVENTS, KEY)
    accepted = run(good, KEY, tmp_path)
    assert accepted.returncode == 0 and accepted.stdout.startswith("verified: run r-golden succeeded: 4 events")
    assert run(good, OTHER, tmp_path).stderr.strip() == "bad signature"
    bundle: dict[str, Any] = json.loads(good)
    bundle["events"][2]["event"]["payload"] = {"output": "forged"}
    edited = run(canonical(bundle) + b"\n", KEY, tmp_path)
    assert edited.returncode == 1 and "do not hash to the signed chain head" in edited.stderr
    del bundle["events"][1]
    assert "not the ones signed" in run(canonical(bundle) + b"\n", KEY, tmp_path).stderr


@given(json_values)
def test_its_rfc8785_agrees_with_pals(value: Any) -> None:
    assert standalone().jcs(value).encode() == canonical(value)
