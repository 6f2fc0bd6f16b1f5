"""PAL_* settings: defaults, each variable, bad values, and Go durations."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest

from pal import config
from pal.config import load_settings, recovery_interval
from pal.core.durations import parse_go_duration
from pal.errors import ConfigError


def test_defaults_with_an_empty_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    settings = load_settings({})
    home = tmp_path / ".pal"
    assert settings.home == home
    assert settings.database_url == f"sqlite:///{home / 'pal.db'}"
    assert settings.broker_url == "filesystem://"
    assert settings.is_embedded_broker
    assert settings.broker_folder == home / "broker"
    assert settings.queue == "pal"
    assert settings.broker_key_prefix == ""
    assert settings.tenant == "default"
    assert settings.lease_ttl == 30.0
    assert settings.recovery_interval == 30.0
    assert settings.tool_modules == ()
    assert settings.worker_concurrency is None
    assert settings.max_graph_bytes == 1_000_000
    assert settings.max_input_bytes == 1_000_000
    assert settings.filesystem_poll == 0.02


def test_blank_values_mean_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    names = ["PAL_HOME", "PAL_DATABASE_URL", "PAL_BROKER_URL", "PAL_QUEUE", "PAL_TENANT",
             "PAL_LEASE_TTL", "PAL_RECOVERY_INTERVAL", "PAL_TOOL_MODULES", "PAL_WORKER_CONCURRENCY",
             "PAL_MAX_GRAPH_BYTES", "PAL_MAX_INPUT_BYTES", "PAL_FILESYSTEM_POLL"]
    assert load_settings(dict.fromkeys(names, "  ")) == load_settings({})


def test_reads_the_process_environment_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAL_QUEUE", "from-os-environ")
    assert load_settings().queue == "from-os-environ"


def test_pal_home_moves_the_embedded_journal_and_broker(tmp_path: Path) -> None:
    settings = load_settings({"PAL_HOME": str(tmp_path / "h")})
    assert settings.home == tmp_path / "h"
    assert settings.database_url == f"sqlite:///{tmp_path / 'h' / 'pal.db'}"
    assert settings.broker_folder == tmp_path / "h" / "broker"


def test_relative_pal_home_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert load_settings({"PAL_HOME": "state"}).home == tmp_path / "state"


@pytest.mark.parametrize(
    ("name", "raw", "attribute", "expected"),
    [
        ("PAL_DATABASE_URL", "postgresql://u@db/pal", "database_url", "postgresql://u@db/pal"),
        ("PAL_BROKER_URL", " redis://localhost:6379/0 ", "broker_url", "redis://localhost:6379/0"),
        ("PAL_QUEUE", "jobs", "queue", "jobs"),
        ("PAL_BROKER_KEY_PREFIX", "t1:", "broker_key_prefix", "t1:"),
        ("PAL_TENANT", "acme", "tenant", "acme"),
        ("PAL_LEASE_TTL", "45s", "lease_ttl", 45.0),
        ("PAL_LEASE_TTL", "12", "lease_ttl", 12.0),
        ("PAL_LEASE_TTL", "1.5", "lease_ttl", 1.5),
        ("PAL_RECOVERY_INTERVAL", "2m", "recovery_interval", 120.0),
        ("PAL_TOOL_MODULES", "a.b, c ,,d", "tool_modules", ("a.b", "c", "d")),
        ("PAL_WORKER_CONCURRENCY", "4", "worker_concurrency", 4),
        ("PAL_MAX_GRAPH_BYTES", "2048", "max_graph_bytes", 2048),
        ("PAL_MAX_INPUT_BYTES", " 512 ", "max_input_bytes", 512),
        ("PAL_FILESYSTEM_POLL", "100ms", "filesystem_poll", 0.1),
    ],
    ids=lambda v: v if isinstance(v, str) and v.startswith("PAL_") else None,
)
def test_each_variable_is_read(name: str, raw: str, attribute: str, expected: object) -> None:
    assert getattr(load_settings({name: raw}), attribute) == expected


def test_non_filesystem_broker_is_not_embedded() -> None:
    assert not load_settings({"PAL_BROKER_URL": "redis://localhost"}).is_embedded_broker


@pytest.mark.parametrize(
    ("name", "raw", "fragment"),
    [
        ("PAL_LEASE_TTL", "soon", "is not a duration"),
        ("PAL_LEASE_TTL", "0", "must be positive"),
        ("PAL_LEASE_TTL", "-5s", "must be positive"),
        ("PAL_FILESYSTEM_POLL", "5 ms", "is not a duration"),
        ("PAL_FILESYSTEM_POLL", "0s", "must be positive"),
        ("PAL_WORKER_CONCURRENCY", "many", "is not a whole number"),
        ("PAL_WORKER_CONCURRENCY", "0", "must be positive"),
        ("PAL_WORKER_CONCURRENCY", "2.5", "is not a whole number"),
        ("PAL_MAX_GRAPH_BYTES", "1MB", "is not a whole number"),
        ("PAL_MAX_GRAPH_BYTES", "-1", "must be positive"),
        ("PAL_MAX_INPUT_BYTES", "lots", "is not a whole number"),
        ("PAL_MAX_INPUT_BYTES", "0", "must be positive"),
        ("PAL_BASELINE_INTERVAL", "hourly", "is not a duration"),
        ("PAL_BASELINE_INTERVAL", "0s", "must be positive"),
        ("PAL_ANOMALY_MAX_RETRIES", "many", "is not a whole number"),
        ("PAL_ANOMALY_MAX_RETRIES", "0", "must be positive"),
        ("PAL_ANOMALY_LOOP_FRACTION", "most", "is not a number"),
        ("PAL_ANOMALY_LOOP_FRACTION", "-0.5", "must be positive"),
        ("PAL_ANOMALY_SPIKE_MADS", "inf", "must be positive and finite"),
    ],
)
def test_bad_values_raise_config_error_naming_the_variable(
    name: str, raw: str, fragment: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({name: raw})
    message = str(info.value)
    assert f"{name}={raw!r}" in message
    assert fragment in message


@pytest.mark.parametrize(
    ("raw", "expected", "warns"),
    [
        ("30s", 30.0, False),
        ("2m", 120.0, False),
        ("1m30s", 90.0, False),
        ("500ms", 0.5, False),
        ("1h", 3600.0, False),
        ("abc", 30.0, True),
        ("30", 30.0, True),  # a Go duration needs a unit
        ("-5s", 30.0, True),
        ("0", 30.0, True),
        ("0s", 30.0, True),
        ("", 30.0, False),
        ("   ", 30.0, False),
        (None, 30.0, False),
    ],
)
def test_recovery_interval(
    raw: str | None, expected: float, warns: bool, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="pal.config"):
        assert recovery_interval(raw) == expected
    warnings = [r for r in caplog.records if r.name == "pal.config" and r.levelno == logging.WARNING]
    if warns:
        assert len(warnings) == 1
        assert "PAL_RECOVERY_INTERVAL" in warnings[0].getMessage()
        assert repr(raw) in warnings[0].getMessage()
        assert "using 30s" in warnings[0].getMessage()
    else:
        assert warnings == []


def test_recovery_interval_bad_value_never_raises_from_load_settings(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="pal.config"):
        settings = load_settings({"PAL_RECOVERY_INTERVAL": "-1m"})
    assert settings.recovery_interval == config.DEFAULT_RECOVERY_INTERVAL_SECONDS
    assert "not positive" in caplog.text


def test_with_replaces_a_field() -> None:
    settings = load_settings({"PAL_QUEUE": "a"})
    changed = settings.with_(queue="b")
    assert changed.queue == "b" and settings.queue == "a"
    assert changed.tenant == settings.tenant


@pytest.mark.parametrize("raw", ["nan", "inf"])
def test_lease_ttl_rejects_non_finite_numbers(raw: str) -> None:
    with pytest.raises(ConfigError):
        load_settings({"PAL_LEASE_TTL": raw})


# --- parse_go_duration ---------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0.0),
        ("-0", 0.0),
        ("0s", 0.0),
        ("1ns", 1e-9),
        ("3us", 3e-6),
        ("3\u00b5s", 3e-6),
        ("250ms", 0.25),
        ("30s", 30.0),
        ("1.5s", 1.5),
        (".5s", 0.5),
        ("2m", 120.0),
        ("1m30s", 90.0),
        ("2h45m", 9900.0),
        ("1h1m1s1ms", 3661.001),
        ("+5s", 5.0),
        ("-1m", -60.0),
        ("  10s  ", 10.0),
        ("1s500ms", 1.5),
    ],
)
def test_parse_go_duration(text: str, seconds: float) -> None:
    assert math.isclose(parse_go_duration(text), seconds, rel_tol=1e-12, abs_tol=1e-15)


@pytest.mark.parametrize(
    "text",
    ["", "   ", "5", "1.5", "s", "abc", "1x", "1 s", "1s 2m", "-", "+", ".s", "1d", "1S", "1m-2s",
     "--1s", "1e3s"],
)
def test_parse_go_duration_errors(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_go_duration(text)


def test_the_pool_size_bounds_each_process_and_refuses_less_than_two() -> None:
    from pal.storage.database import create_engine, pool_limit

    assert load_settings({}).db_pool_size == 20 and load_settings({"PAL_DB_POOL_SIZE": "7"}).db_pool_size == 7
    for bad, fragment in (("1", "must be at least 2"), ("0", "must be positive"), ("many", "not a whole number")):
        with pytest.raises(ConfigError, match=fragment):
            load_settings({"PAL_DB_POOL_SIZE": bad})
    engine = create_engine("postgresql://postgres@127.0.0.1:5432/test", pool_size=7)
    try:  # 3 for transactions (the engine's own pool), 4 for one-call statements: 7 in all
        assert engine.pool.size() == 3  # type: ignore[attr-defined]
        assert pool_limit(engine) == 4
    finally:
        engine.dispose()


def test_the_awaited_steps_of_a_process_are_bounded_and_bad_values_refused() -> None:
    assert load_settings({}).async_steps == 1000
    assert load_settings({"PAL_ASYNC_STEPS": "1"}).async_steps == 1
    for bad, fragment in (("0", "must be positive"), ("-5", "must be positive"), ("lots", "not a whole number"),
                          ("100001", "more than 100000")):
        with pytest.raises(ConfigError, match=fragment):
            load_settings({"PAL_ASYNC_STEPS": bad})

