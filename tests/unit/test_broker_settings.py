"""PAL_BROKER_TRANSPORT_OPTIONS and PAL_BROKER_TLS_*: what a deployment's broker needs, checked when
the settings load, and what a bad, oversized or downgrading value gets."""

from __future__ import annotations

import json
import ssl
from pathlib import Path

import pytest

from pal.api.errors import error_payload, status_code_of
from pal.config import load_settings
from pal.config.broker import MAX_TRANSPORT_OPTIONS_BYTES
from pal.errors import BrokerUnavailable, ConfigError
from pal.workers import celery_private
from pal.workers.pal_app import broker_paths_off, broker_transport_options, create_app

SENTINEL = "sentinel://127.0.0.1:26379;sentinel://127.0.0.1:26380"


def settings(tmp_path: Path, **env: str):  # type: ignore[no-untyped-def]
    return load_settings({"PAL_HOME": str(tmp_path), **env})


def refused(tmp_path: Path, **env: str) -> str:
    with pytest.raises(ConfigError) as info:
        settings(tmp_path, **env)
    return str(info.value)


def test_transport_options_are_merged_over_pals_own(tmp_path: Path) -> None:
    s = settings(tmp_path, PAL_BROKER_URL="redis://127.0.0.1:6379/0", PAL_BROKER_KEY_PREFIX="team:",
                 PAL_BROKER_TRANSPORT_OPTIONS='{"visibility_timeout": 7200, "socket_timeout": 5}')
    options = broker_transport_options(s)
    assert options["visibility_timeout"] == 7200 and options["socket_timeout"] == 5
    assert options["global_keyprefix"] == "team:"


def test_a_sentinel_url_gets_its_master_and_password_through_the_options(tmp_path: Path) -> None:
    given = {"master_name": "mymaster", "sentinel_kwargs": {"password": "s3cret-sentinel"}}
    s = settings(tmp_path, PAL_BROKER_URL=SENTINEL, PAL_BROKER_TRANSPORT_OPTIONS=json.dumps(given))
    app = create_app(s)
    assert app.conf.broker_transport_options["master_name"] == "mymaster"
    assert app.conf.broker_transport_options["sentinel_kwargs"] == {"password": "s3cret-sentinel"}
    assert app.node_publisher is None  # the fast path's one connection would not follow a failover
    assert set(broker_paths_off(s.broker_url)) == {"publisher", "redis_transport"}
    assert "s3cret-sentinel" not in repr(s)


def test_a_sentinel_url_without_a_master_name_is_refused(tmp_path: Path) -> None:
    assert "master_name" in refused(tmp_path, PAL_BROKER_URL=SENTINEL)
    assert "master_name" in refused(tmp_path, PAL_BROKER_URL=SENTINEL,
                                    PAL_BROKER_TRANSPORT_OPTIONS='{"master_name": 3}')


@pytest.mark.parametrize("raw, says", [
    ("{not json", "is not JSON"),
    ('["master_name", "m"]', "must be a JSON object"),
    ("[" * 100_000, "more than"),
    ("[" * 5_000 + "]" * 5_000, "nested too deeply"),
    ('{"data_folder_in": "/tmp/elsewhere"}', "are PAL's own"),
    ('{"global_keyprefix": "other:"}', "PAL_BROKER_KEY_PREFIX"),
])
def test_bad_transport_options_are_refused_naming_the_variable(tmp_path: Path, raw: str, says: str) -> None:
    message = refused(tmp_path, PAL_BROKER_TRANSPORT_OPTIONS=raw)
    assert "PAL_BROKER_TRANSPORT_OPTIONS" in message and says in message


def test_a_refused_option_value_is_not_echoed(tmp_path: Path) -> None:
    message = refused(tmp_path, PAL_BROKER_TRANSPORT_OPTIONS='{"sentinel_kwargs": {"password": "hunter2"')
    assert "hunter2" not in message


def test_the_size_limit_is_the_documented_one(tmp_path: Path) -> None:
    padding = "x" * (MAX_TRANSPORT_OPTIONS_BYTES - 20)
    settings(tmp_path, PAL_BROKER_TRANSPORT_OPTIONS=json.dumps({"p": padding}))
    assert "more than" in refused(tmp_path, PAL_BROKER_TRANSPORT_OPTIONS=json.dumps({"p": padding + "x" * 40}))


@pytest.mark.parametrize("url", ["amqp://guest@127.0.0.1//", "redis", "http://127.0.0.1:6379"])
def test_a_broker_pal_does_not_run_on_is_refused(tmp_path: Path, url: str) -> None:
    assert "PAL_BROKER_URL" in refused(tmp_path, PAL_BROKER_URL=url)


@pytest.mark.parametrize("reqs", ["none", "CERT_NONE", "optional"])
def test_a_tls_url_that_would_not_check_the_certificate_is_refused(tmp_path: Path, reqs: str) -> None:
    assert "ssl_cert_reqs" in refused(tmp_path, PAL_BROKER_URL=f"rediss://127.0.0.1:6380/0?ssl_cert_reqs={reqs}")


def test_tls_files_become_celerys_broker_use_ssl(tmp_path: Path) -> None:
    ca, cert, key = (tmp_path / name for name in ("ca.crt", "client.crt", "client.key"))
    for path in (ca, cert, key):
        path.write_text("-----")
    s = settings(tmp_path, PAL_BROKER_URL="rediss://127.0.0.1:6380/0", PAL_BROKER_TLS_CA_FILE=str(ca),
                 PAL_BROKER_TLS_CERT_FILE=str(cert), PAL_BROKER_TLS_KEY_FILE=str(key))
    app = create_app(s)
    assert app.conf.broker_use_ssl == {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": str(ca),
                                       "ssl_certfile": str(cert), "ssl_keyfile": str(key)}
    # The fast path speaks TLS too: TLS turns it off nowhere (an old kombu may, by its version).
    assert (app.node_publisher is not None) == celery_private.fast_paths().on("publisher")
    assert str(key) not in repr(s)


def test_bad_tls_files_are_refused(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("-----")
    assert "not a readable file" in refused(tmp_path, PAL_BROKER_URL="rediss://127.0.0.1:6380/0",
                                            PAL_BROKER_TLS_CA_FILE=str(tmp_path / "missing.crt"))
    assert "rediss://" in refused(tmp_path, PAL_BROKER_URL="redis://127.0.0.1:6379/0",
                                  PAL_BROKER_TLS_CA_FILE=str(ca))
    assert "PAL_BROKER_TLS_CERT_FILE" in refused(tmp_path, PAL_BROKER_URL="rediss://127.0.0.1:6380/0",
                                                 PAL_BROKER_TLS_KEY_FILE=str(ca))


def test_a_broker_failure_is_a_503_that_names_no_host() -> None:
    failure = BrokerUnavailable("run r1 is journaled, but the broker did not take the doorbell: "
                                "Error 111 connecting to 10.1.2.3:6379", run_id="r1")
    assert status_code_of(failure) == 503
    assert error_payload(failure)["run_id"] == "r1"
    assert "10.1.2.3" not in json.dumps(error_payload(failure))
