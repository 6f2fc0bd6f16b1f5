"""Schemathesis fuzzes the served OpenAPI schema against a real `pal api`: no response is a 500."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.api_server import Api


def test_fuzzing_the_openapi_schema_finds_no_server_errors(api: Api, tmp_path: Path) -> None:
    schemathesis = Path(sys.executable).parent / "schemathesis"
    result = subprocess.run(
        [str(schemathesis), "run", f"{api.url}/openapi.json", "--checks", "not_a_server_error",
         "--header", f"Authorization: Bearer {api.token}", "--max-examples", "25", "--seed", "7"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert "Tested: 27" in result.stdout  # every operation of the schema was exercised
