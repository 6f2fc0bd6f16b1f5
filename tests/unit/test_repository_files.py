"""The files a newcomer and CI rely on say what they must."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def test_docker_compose_parses_and_names_the_services() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"postgres", "redis", "worker", "beat", "flower", "api"} <= set(services)
    assert services["worker"]["command"][:4] == ["celery", "-A", "pal.workers", "worker"]
    assert {"--without-mingle", "--without-gossip"} <= set(services["worker"]["command"])  # as `pal worker`
    assert services["beat"]["command"][:4] == ["celery", "-A", "pal.workers", "beat"]
    assert services["flower"]["command"][:2] == ["pal", "flower"]
    assert "PAL_FLOWER_BASIC_AUTH" in services["flower"]["environment"]
    assert services["api"]["command"][:2] == ["pal", "api"] and services["api"]["ports"] == ["8000:8000"]
    env = services["worker"]["environment"]
    assert env["PAL_DATABASE_URL"].startswith("postgresql://")
    assert env["PAL_BROKER_URL"].startswith("redis://")


def test_ci_runs_make_test_with_ci_true() -> None:
    script = (REPO / ".ci" / "run").read_text()
    assert "export CI=true" in script
    assert script.rstrip().endswith("make test")


def test_readme_opens_with_the_two_commands() -> None:
    head = (REPO / "README.md").read_text()[:1500]
    assert "make demo" in head and "make test" in head
