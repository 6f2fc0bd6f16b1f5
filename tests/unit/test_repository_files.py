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
    assert services["api"]["command"][:2] == ["pal", "api"]
    env = services["worker"]["environment"]
    assert env["PAL_DATABASE_URL"].startswith("postgresql://pal_app:${PAL_APP_DB_PASSWORD:?")
    assert env["PAL_BROKER_URL"].startswith("redis://:${PAL_REDIS_PASSWORD:?")


def test_docker_compose_keeps_its_services_private() -> None:
    """The review found Redis published without a password and Postgres published with
    postgres/postgres, every process connecting as the superuser (docs/security.md)."""
    text = (REPO / "docker-compose.yml").read_text()
    services = yaml.safe_load(text)["services"]
    for name in ("postgres", "redis", "worker", "beat", "migrate"):
        assert "ports" not in services[name], name  # reachable only on the internal network
    for name in ("api", "flower"):
        assert all(port.startswith("127.0.0.1:") for port in services[name]["ports"]), name
    assert yaml.safe_load(text)["networks"]["backend"] == {"internal": True}
    assert set(services["postgres"]["networks"]) == set(services["redis"]["networks"]) == {"backend"}
    assert "--requirepass" in services["redis"]["command"]
    assert "postgres:postgres" not in text and "POSTGRES_PASSWORD: postgres" not in text
    for name in ("worker", "beat", "api", "flower"):  # the owner's password only where migrations run
        assert "PAL_POSTGRES_PASSWORD" not in str(services[name]), name
    assert services["migrate"]["command"][-1] == "pal db upgrade && pal db grant pal_app"


def test_make_env_generates_fresh_secrets() -> None:
    import subprocess

    outputs = [subprocess.run(["sh", str(REPO / "deploy" / "make-env.sh")], capture_output=True, text=True,
                              check=True).stdout for _ in range(2)]
    first, second = ({k: v for k, _, v in (line.partition("=") for line in out.splitlines())} for out in outputs)
    assert set(first) == {"PAL_POSTGRES_PASSWORD", "PAL_APP_DB_PASSWORD", "PAL_REDIS_PASSWORD",
                          "PAL_FLOWER_BASIC_AUTH"}
    assert all(len(v) >= 40 for v in first.values())
    assert not set(first.values()) & set(second.values())  # random every time


def test_ci_runs_make_test_with_ci_true() -> None:
    script = (REPO / ".ci" / "run").read_text()
    assert "export CI=true" in script
    assert script.rstrip().endswith("make test")


def test_readme_opens_with_the_two_commands() -> None:
    head = (REPO / "README.md").read_text()[:1500]
    assert "make demo" in head and "make test" in head
