"""What a deployment's broker needs beyond its URL: transport options (a Sentinel's master name, its
password, timeouts) and the TLS files of a `rediss://` broker. Checked when the settings load, so a
worker, beat, the CLI, the API and Flower refuse the same bad value with the same message.

PAL_BROKER_TRANSPORT_OPTIONS  a JSON object merged over PAL's own transport options, e.g.
                              {"master_name": "mymaster", "sentinel_kwargs": {"password": "..."}}
PAL_BROKER_TLS_CA_FILE        CA bundle the broker's certificate is checked against (rediss://)
PAL_BROKER_TLS_CERT_FILE      client certificate, for a broker that asks for one
PAL_BROKER_TLS_KEY_FILE       its private key
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import parse_qs, urlsplit

from pal.errors import ConfigError

MAX_TRANSPORT_OPTIONS_BYTES = 16_384
# Set by PAL itself from its own settings: a second source for them would only disagree.
PAL_OWNED_OPTIONS = frozenset({"data_folder_in", "data_folder_out", "control_folder", "polling_interval",
                               "global_keyprefix"})
SCHEMES = ("redis", "rediss", "sentinel", "filesystem", "memory")
_UNCHECKED_CERT = frozenset({"none", "cert_none", "optional", "cert_optional"})


@dataclass(frozen=True)
class BrokerOptions:
    """The broker settings beyond PAL_BROKER_URL, validated."""

    # May hold a Sentinel's password: never in a repr.
    transport_options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}), repr=False)
    tls_ca_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = field(default="", repr=False)

    def use_ssl(self) -> dict[str, Any] | None:
        """Celery's `broker_use_ssl` for these files (None: the URL alone decides)."""
        if not self.tls_ca_file and not self.tls_cert_file:
            return None
        import ssl

        options: dict[str, Any] = {"ssl_cert_reqs": ssl.CERT_REQUIRED}
        if self.tls_ca_file:
            options["ssl_ca_certs"] = self.tls_ca_file
        if self.tls_cert_file:
            options["ssl_certfile"] = self.tls_cert_file
            options["ssl_keyfile"] = self.tls_key_file or None
        return options


def scheme_of(broker_url: str) -> str:
    """The broker URL's scheme; several Sentinels are `sentinel://a;sentinel://b`."""
    return broker_url.split("://", 1)[0].lower() if "://" in broker_url else ""


def load_broker_options(env: Mapping[str, str], broker_url: str, key_prefix: str) -> BrokerOptions:
    scheme = scheme_of(broker_url)
    if scheme not in SCHEMES:
        raise ConfigError(f"PAL_BROKER_URL: scheme {scheme or '(none)'!r} is not one of "
                          f"{', '.join(s + '://' for s in SCHEMES)}")
    options = _transport_options(env.get("PAL_BROKER_TRANSPORT_OPTIONS", ""))
    given = options.get("global_keyprefix")
    if given is not None and given != key_prefix:
        raise ConfigError("PAL_BROKER_TRANSPORT_OPTIONS: set the key prefix with PAL_BROKER_KEY_PREFIX, "
                          "not global_keyprefix")
    owned = sorted(PAL_OWNED_OPTIONS & options.keys() - {"global_keyprefix"})
    if owned:
        raise ConfigError(f"PAL_BROKER_TRANSPORT_OPTIONS: {', '.join(owned)} are PAL's own "
                          "(the embedded broker's folders and poll: PAL_HOME, PAL_FILESYSTEM_POLL)")
    if scheme == "sentinel" and not isinstance(options.get("master_name"), str):
        raise ConfigError("PAL_BROKER_URL is a Sentinel URL: name its master in "
                          "PAL_BROKER_TRANSPORT_OPTIONS, e.g. '{\"master_name\": \"mymaster\"}'")
    _refuse_unchecked_tls(broker_url)
    files = {name: _readable_file(env, name) for name in
             ("PAL_BROKER_TLS_CA_FILE", "PAL_BROKER_TLS_CERT_FILE", "PAL_BROKER_TLS_KEY_FILE")}
    if any(files.values()) and scheme != "rediss":
        raise ConfigError("PAL_BROKER_TLS_* files are for a rediss:// broker URL "
                          f"(PAL_BROKER_URL is {scheme}://)")
    if files["PAL_BROKER_TLS_KEY_FILE"] and not files["PAL_BROKER_TLS_CERT_FILE"]:
        raise ConfigError("PAL_BROKER_TLS_KEY_FILE needs PAL_BROKER_TLS_CERT_FILE, the certificate it "
                          "is the key of")
    return BrokerOptions(MappingProxyType(options), files["PAL_BROKER_TLS_CA_FILE"],
                         files["PAL_BROKER_TLS_CERT_FILE"], files["PAL_BROKER_TLS_KEY_FILE"])


def _transport_options(raw: str) -> dict[str, Any]:
    raw = raw.strip()
    if not raw:
        return {}
    if len(raw.encode()) > MAX_TRANSPORT_OPTIONS_BYTES:
        raise ConfigError(f"PAL_BROKER_TRANSPORT_OPTIONS is more than {MAX_TRANSPORT_OPTIONS_BYTES} bytes")
    try:
        options = json.loads(raw)
    except json.JSONDecodeError as exc:  # the value may hold a password: never echoed
        raise ConfigError(f"PAL_BROKER_TRANSPORT_OPTIONS is not JSON ({exc.msg}, at {exc.pos})") from None
    except RecursionError:
        raise ConfigError("PAL_BROKER_TRANSPORT_OPTIONS is nested too deeply") from None
    if not isinstance(options, dict):
        raise ConfigError("PAL_BROKER_TRANSPORT_OPTIONS must be a JSON object of transport options")
    return options


def _refuse_unchecked_tls(broker_url: str) -> None:
    """A rediss:// URL that asks not to check the broker's certificate is refused: anyone on the
    path could read every message (they carry run ids and signatures)."""
    for url in broker_url.split(";"):
        query = parse_qs(urlsplit(url.strip()).query)
        values = {value.strip().lower() for value in query.get("ssl_cert_reqs", [])}
        if values & _UNCHECKED_CERT:
            raise ConfigError("PAL_BROKER_URL: ssl_cert_reqs must be required (PAL does not talk TLS "
                              "to a broker whose certificate it does not check)")


def _readable_file(env: Mapping[str, str], name: str) -> str:
    raw = env.get(name, "").strip()
    if not raw:
        return ""
    path = Path(raw).expanduser()
    if not path.is_file():
        raise ConfigError(f"{name}={raw!r} is not a readable file")
    return str(path.absolute())
