"""PAL installed without its optional parts (`.venv-core`, which `make test` builds with
`pip install -e .` alone): the demo runs, and what needs a missing part (the API server, Flower,
receipts, a Postgres journal, a provider's SDK, an OTLP exporter) says which extra to install,
rather than a traceback (pal.core.extras)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CORE = REPO / ".venv-core" / "bin"


@pytest.fixture
def core(tmp_path: Path) -> Path:
    if not (CORE / "pal").exists():
        pytest.fail(".venv-core is missing: `make test` builds it (PAL without its optional parts)")
    return tmp_path


def run(folder: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PAL_", "OTEL_", "PYTHONPATH"))}
    return subprocess.run([str(CORE / args[0]), *args[1:]], cwd=folder, env=clean | env,
                          capture_output=True, text=True, timeout=180)


def test_the_demo_runs_without_any_optional_part(core: Path) -> None:
    listed = run(core, "python", "-m", "pip", "list", "--format=freeze")
    for part in ("fastapi", "openai", "anthropic", "psycopg2-binary", "cryptography", "flower",
                 "opentelemetry-sdk", "uvicorn"):
        assert f"\n{part}==" not in "\n" + listed.stdout.lower(), f"{part} is installed in .venv-core"
    # A key set for a provider whose SDK is missing keeps the demo on the offline provider.
    demo = run(core, "pal", "demo", OPENAI_API_KEY="sk-never-used")
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    assert "3 of 3 runs succeeded" in demo.stdout and "provider scripted" in demo.stdout


@pytest.mark.parametrize(("args", "env", "extra"), [
    (("pal", "api"), {}, "api"),
    (("pal", "flower"), {"PAL_FLOWER_BASIC_AUTH": "ops:a-long-secret",
                         "PAL_BROKER_URL": "redis://127.0.0.1:6379/0"}, "flower"),
    (("pal", "receipts", "verify", "receipt.json", "--key", "pal.pub"), {}, "receipts"),
    (("pal", "runs", "list"), {"PAL_DATABASE_URL": "postgresql://postgres@127.0.0.1:5432/test"}, "postgres"),
])
def test_a_command_that_needs_a_missing_part_names_its_extra(core: Path, args: tuple[str, ...],
                                                              env: dict[str, str], extra: str) -> None:
    done = run(core, *args, PAL_HOME=str(core / ".pal"), **env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"pip install 'pal[{extra}]'" in done.stderr and "Traceback" not in done.stderr


def test_a_provider_or_tracing_without_its_sdk_says_so_and_runs_go_on(core: Path) -> None:
    script = (
        "import logging, pal.engine.runtime as r\n"
        "from pal.config import load_settings\n"
        "from pal.errors import ConfigError\n"
        "from pal.providers import get_provider\n"
        "for name in ('openai', 'anthropic'):\n"
        "    try:\n"
        "        get_provider(name, base_urls={}, timeout=1)\n"
        "    except ConfigError as exc:\n"
        "        print(exc)\n"
        "logging.basicConfig()\n"
        "rt = r.Runtime(load_settings(), lambda *a, **k: None, None)\n"
        "print('tracing', rt.tracing)\n")
    done = run(core, "python", "-c", script, PAL_HOME=str(core / ".pal"),
               OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:4318")
    assert done.returncode == 0, done.stderr
    assert "provider 'openai' needs 'openai'" in done.stdout and "pip install 'pal[openai]'" in done.stdout
    assert "pip install 'pal[anthropic]'" in done.stdout
    assert "tracing None" in done.stdout  # traces off, not a failure
    assert "pip install 'pal[otel]'" in done.stderr and "traces are off" in done.stderr
