"""The curl examples in docs/api.md run as written against a real server and worker."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO
from tests.support.api_server import Api

BLOCK = re.compile(r"<!-- curl-examples -->\s*```sh\n(?P<script>.*?)```", re.S)


def test_curl_examples_in_docs_api_md(api: Api, tmp_path: Path) -> None:
    script = BLOCK.search((REPO / "docs" / "api.md").read_text())
    assert script is not None
    env = api.env | {"API": api.url, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", script["script"]], env=env, capture_output=True,
                            text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr + result.stdout
    assert "event: run_succeeded" in result.stdout
    assert '"status":"succeeded"' in result.stdout and '"output":"refunded"' in result.stdout
    assert api.client.get_run("docs-refund-1").status == "succeeded"
    assert "verified: run docs-refund-1 succeeded" in result.stdout
