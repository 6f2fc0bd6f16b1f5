"""The files a newcomer and CI rely on say what they must."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
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
    assert services["redis"]["entrypoint"] == ["sh", "/usr/local/bin/pal-redis-start.sh"]  # requirepass
    assert "postgres:postgres" not in text and "POSTGRES_PASSWORD: postgres" not in text
    for name in ("worker", "beat", "api", "flower"):  # the owner's password only where migrations run
        assert "PAL_POSTGRES_PASSWORD" not in str(services[name]), name
    assert services["migrate"]["command"][-1] == "pal db upgrade && pal db grant pal_app"


PASSWORD_VARIABLES = ("PAL_POSTGRES_PASSWORD", "PAL_APP_DB_PASSWORD", "PAL_REDIS_PASSWORD", "PAL_FLOWER_BASIC_AUTH")


def test_no_service_gets_a_password_on_its_command_line() -> None:
    """The review found `--requirepass ${PAL_REDIS_PASSWORD}` in Redis's command: a process's argv
    is readable by every user of the host (`ps`). Passwords go in the environment (readable by the
    process's own user only) or in a file, never in an entrypoint or a command."""
    services = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    for name, service in services.items():
        argv = " ".join(str(service.get(key, "")) for key in ("entrypoint", "command"))
        assert not any(variable in argv for variable in PASSWORD_VARIABLES), (name, argv)
        assert "requirepass" not in argv and "password" not in argv.lower(), (name, argv)
    redis = services["redis"]
    assert redis["environment"]["PAL_REDIS_PASSWORD"].startswith("${PAL_REDIS_PASSWORD:?")
    assert "./deploy/redis-start.sh:/usr/local/bin/pal-redis-start.sh:ro" in redis["volumes"]
    assert redis["command"] == ["--save", "", "--appendonly", "no"]


def run_redis_start(tmp_path: Path, password: str) -> subprocess.CompletedProcess[str]:
    """deploy/redis-start.sh with a stand-in `redis-server` that records its argv and environment."""
    bin_folder = tmp_path / "bin"
    bin_folder.mkdir(exist_ok=True)
    fake = bin_folder / "redis-server"
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$RECORD.argv"\nenv > "$RECORD.env"\n')
    fake.chmod(0o755)
    env = {"PATH": f"{bin_folder}{os.pathsep}{os.environ['PATH']}", "PAL_REDIS_PASSWORD": password,
           "PAL_REDIS_CONF": str(tmp_path / "redis.conf"), "RECORD": str(tmp_path / "record")}
    return subprocess.run(["sh", str(REPO / "deploy" / "redis-start.sh"), "--save", "", "--appendonly", "no"],
                          env=env, capture_output=True, text=True, check=False, timeout=30)


def test_redis_start_hands_the_password_over_in_a_private_config_file(tmp_path: Path) -> None:
    password = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a6978"
    result = run_redis_start(tmp_path, password)
    assert result.returncode == 0, result.stderr
    argv = (tmp_path / "record.argv").read_text().splitlines()
    assert argv == [str(tmp_path / "redis.conf"), "--save", "", "--appendonly", "no"]
    assert password not in (tmp_path / "record.env").read_text()  # unset before redis-server starts
    conf = tmp_path / "redis.conf"
    assert conf.read_text() == f"requirepass {password}\n"
    assert stat.S_IMODE(conf.stat().st_mode) == 0o600


@pytest.mark.parametrize("password", ["", "two words", 'quote"d', "line\nbreak", "back\\slash"])
def test_redis_start_refuses_a_password_its_config_file_cannot_hold(tmp_path: Path, password: str) -> None:
    result = run_redis_start(tmp_path, password)
    assert result.returncode == 1 and "PAL_REDIS_PASSWORD must be set" in result.stderr
    assert not (tmp_path / "record.argv").exists() and not (tmp_path / "redis.conf").exists()


def test_make_env_generates_fresh_secrets() -> None:
    outputs = [subprocess.run(["sh", str(REPO / "deploy" / "make-env.sh")], capture_output=True, text=True,
                              check=True).stdout for _ in range(2)]
    first, second = ({k: v for k, _, v in (line.partition("=") for line in out.splitlines())} for out in outputs)
    assert set(first) == set(PASSWORD_VARIABLES)
    assert all(password.isalnum() for password in (first["PAL_REDIS_PASSWORD"], second["PAL_REDIS_PASSWORD"]))
    assert all(len(v) >= 40 for v in first.values())
    assert not set(first.values()) & set(second.values())  # random every time


def test_ci_runs_make_test_with_ci_true() -> None:
    script = (REPO / ".ci" / "run").read_text()
    assert "export CI=true" in script
    commands = [line for line in script.splitlines() if line.startswith("make ")]
    # The whole suite, then its core and end-to-end lanes on the lowest supported stack.
    assert commands == ["make test", "make test-lowest"]
    assert script.rstrip().endswith("make test-lowest")


def test_readme_opens_with_the_two_commands() -> None:
    head = (REPO / "README.md").read_text()[:1500]
    assert "make demo" in head and "make test" in head


def _declared() -> list[str]:
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = (d for extra in project["optional-dependencies"].values() for d in extra)
    return [*project["dependencies"], *(d for d in extras if not d.startswith("pal["))]  # `all`: PAL's own


def test_pyproject_states_ranges_and_constraints_pin_a_version_inside_each() -> None:
    """PAL lives inside other people's apps: pyproject.toml gives ranges (never `==`), and the exact
    versions the suite installs are in constraints.txt, each inside its range."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pinned = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not name==version"
            pinned[canonicalize_name(name)] = version
    for text in _declared():
        requirement = Requirement(text)
        assert all(spec.operator not in ("==", "===") for spec in requirement.specifier), text
        assert any(spec.operator == ">=" for spec in requirement.specifier), f"{text}: no tested lower bound"
        version = pinned.get(canonicalize_name(requirement.name))
        assert version is not None, f"{requirement.name} has no exact version in constraints.txt"
        assert requirement.specifier.contains(version), f"constraints.txt's {version} is outside {text}"
    makefile = (REPO / "Makefile").read_text()
    installs = [line for line in makefile.splitlines() if "pip install" in line and "-e " in line]
    assert installs and all("-c constraints.txt" in line or "-c constraints-lowest.txt" in line
                            for line in installs), installs


def test_each_runtime_lower_bound_is_the_version_the_lowest_lane_installs() -> None:
    """`make test-lowest` runs on constraints-lowest.txt: every runtime dependency's lower bound (of
    PAL and of its optional parts) is the version pinned there, so the bound PAL states is one its
    suite ran on."""
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    lowest = {}
    for line in (REPO / "constraints-lowest.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            lowest[canonicalize_name(name)] = version
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    parts = [d for name, extra in project["optional-dependencies"].items() if name not in ("dev", "bench")
             for d in extra if not d.startswith("pal[")]
    for text in [*project["dependencies"], *parts]:
        requirement = Requirement(text)
        floor = next(spec.version for spec in requirement.specifier if spec.operator == ">=")
        assert lowest.get(canonicalize_name(requirement.name)) == floor, (text, lowest.get(requirement.name))
