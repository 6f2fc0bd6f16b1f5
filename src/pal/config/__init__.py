"""Settings from PAL_* environment variables, parsed once, each with a named default.

With nothing set PAL uses the embedded default: a SQLite journal and a filesystem broker under
`PAL_HOME` (./.pal), so the demo and a multi-process `pal worker` need no server.

PAL_HOME                 folder for the embedded journal and broker (default ./.pal)
PAL_DATABASE_URL         SQLAlchemy URL of the journal (default sqlite:///$PAL_HOME/pal.db)
PAL_BROKER_URL           Celery broker (default filesystem://, folders under $PAL_HOME/broker)
PAL_QUEUE                Celery queue the tasks use (default "pal")
PAL_BROKER_KEY_PREFIX    Redis key prefix for every broker key (default none)
PAL_BROKER_TRANSPORT_OPTIONS, PAL_BROKER_TLS_*   a Sentinel's master, TLS files (pal.config.broker)
PAL_TENANT               tenant of runs started from this process (default "default")
PAL_LEASE_TTL            lease length, a duration (default 30s)
PAL_RECOVERY_INTERVAL    orphan sweep period, a Go duration (default 30s; bad values -> 30s)
PAL_TOOL_MODULES         comma-separated modules that register tools with @pal.tool
PAL_WORKER_CONCURRENCY   processes per `pal worker` (default: Celery's, the CPU count)
PAL_MAX_GRAPH_BYTES      largest accepted graph document (default 1,000,000 bytes)
PAL_MAX_INPUT_BYTES      largest accepted run input as JSON (default 1,000,000 bytes)
PAL_MAX_OUTPUT_BYTES     largest step output journaled, as JSON (default 1,000,000 bytes)
PAL_MAX_JSON_DEPTH       deepest nesting of lists and objects in graphs, inputs, outputs (default 64)
PAL_FILESYSTEM_POLL      poll period of the embedded broker (default 20ms)
PAL_OPENAI_BASE_URL      OpenAI API base URL (default: the SDK's, or OPENAI_BASE_URL)
PAL_ANTHROPIC_BASE_URL   Anthropic API base URL (default: the SDK's, or ANTHROPIC_BASE_URL)
PAL_PROVIDER_TIMEOUT     one model call's time limit, a duration (default 60s)
PAL_PRICES               model prices: a JSON file or inline JSON (see pal.providers.pricing)
PAL_SMTP_URL             SMTP server of email nodes, smtp://host:port (default smtp://127.0.0.1:25)
PAL_SMTP_FROM            sender of email nodes that name none (default pal@localhost)
PAL_DELIVERY_TIMEOUT     one webhook or SMTP delivery's time limit (default 30s)
PAL_MAX_STEPS_PER_RUN    steps one run may complete; the next one fails the run (default 10,000)
PAL_MAX_CHILD_RUNS       child runs under one top-level run, at any depth (default 100)
PAL_TENANT_CONCURRENCY, PAL_TENANT_WEIGHTS   runs a tenant has admitted at once (pal.config.admission)
PAL_MAX_RUN_DEPTH        deepest subagent nesting; a top-level run is depth 0 (default 4)
PAL_MAX_RUNS_IN_FLIGHT   top-level runs one tenant may have queued or running (default 1,000)
PAL_STEP_TIMEOUT         a step's time limit when its node sets no timeoutMs (default 5m)
PAL_EGRESS_ALLOW         non-public targets connector nodes may reach, comma-separated: host
                         names, IPs, CIDRs, each optionally :port, e.g. 127.0.0.1:8080,10.0.0.0/8
                         (default none: only public addresses; see pal.core.egress)
PAL_SECRETS_FILE         JSON object of graph secrets, {"NAME": "value"}, read by the worker
                         whenever a template renders {{ secrets.NAME }} (default none; pal.core.secrets)
PAL_BASELINE_INTERVAL    how often celery beat recomputes the per-node baselines (default 5m)
PAL_ANOMALY_<THRESHOLD>  an anomaly rule's threshold, e.g. PAL_ANOMALY_MAX_RETRIES=20 (docs/anomalies.md)
PAL_DB_POOL_SIZE         the most Postgres connections one process opens, shared by its threads (default 20)
PAL_SHUTDOWN_GRACE       how long a stopping worker's steps may take to finish before their leases are
                         handed back to another worker (default 25s; pal.workers.shutdown)
PAL_CONTROL_URL          where VM harnesses report, the control plane's URL (default http://127.0.0.1:8000)
PAL_VM_QUEUE             the Celery queue of VM spawns, consumed by `pal worker --vm-host` (default pal-vm)
PAL_VM_ROOT              the folder holding microVM runs' work directories on a VM host
                         (default $PAL_HOME/vm-work; docs/isolated-tier.md)
PAL_VM_GUEST             the qemu-microvm guest's folder: vmlinuz and initrd.img (default
                         $PAL_HOME/vm-guest; `make vm-guest` builds it under .venv/vm-guest)
PAL_VM_ACCEL             kvm | tcg: how qemu-microvm runs its guests (default kvm; tcg emulates)
PAL_VM_UID               the unprivileged user (and group) id workloads run as on a VM host (default 100000)
PAL_VM_MAX_MEMORY_MB     the most memory one VM may ask for on this host (default 4096)
PAL_VM_MAX_CPUS          the most CPUs one VM may ask for on this host (default: the host's count)
PAL_VM_MAX_PIDS          the most processes one VM may ask for on this host (default 4096)
PAL_VM_EXPOSE            extra host folders or files a sandbox sees read-only, colon-separated
PAL_FIRECRACKER_BIN      the firecracker binary of a VM host (default firecracker)
PAL_FIRECRACKER_KERNEL   the guest kernel the firecracker driver boots
PAL_FIRECRACKER_ROOTFS   the guest's read-only root filesystem image
PAL_CONFIDENCE_GATE      off | shadow | enforce: the confidence gate of nodes with a `confidence`
                         block (default off; docs/anomalies.md, "The confidence gate")
PAL_SIGNING_KEY          the Ed25519 key receipts of finished runs are signed with: base64 of its 32
                         bytes or PEM (default none: receipts are off; `pal receipts keygen`)
PAL_TRUSTED_KEYS         comma-separated public keys (base64) whose receipts still verify, e.g. keys
                         retired by a rotation; published with the signing key's (docs/receipts.md)
PAL_SECRET_<NAME>        the value of graph secret NAME, winning over the file; NAME matches
                         [A-Z][A-Z0-9_]*, a value has at least 8 characters (pal.core.secrets)

API keys are read by the providers from OPENAI_API_KEY and ANTHROPIC_API_KEY, the SDKs' own
names; they are never part of the settings, so they cannot reach the journal or a log line.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from pal.config.admission import AdmissionSettings, load_admission
from pal.config.broker import BrokerOptions, load_broker_options
from pal.core.anomalies import AnomalyLimits
from pal.core.confidence import GateMode
from pal.core.durations import parse_go_duration
from pal.core.egress import parse_allow_list
from pal.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_HOME = ".pal"
DEFAULT_BROKER_URL = "filesystem://"
DEFAULT_QUEUE = "pal"
DEFAULT_TENANT = "default"
DEFAULT_LEASE_TTL_SECONDS = 30.0
DEFAULT_RECOVERY_INTERVAL_SECONDS = 30.0
DEFAULT_FILESYSTEM_POLL_SECONDS = 0.02
DEFAULT_MAX_GRAPH_BYTES = 1_000_000
DEFAULT_MAX_INPUT_BYTES = 1_000_000
DEFAULT_MAX_OUTPUT_BYTES = 1_000_000
DEFAULT_MAX_JSON_DEPTH = 64
DEFAULT_VISIBILITY_TIMEOUT_SECONDS = 3600
DEFAULT_PROVIDER_TIMEOUT_SECONDS = 60.0
DEFAULT_DELIVERY_TIMEOUT_SECONDS = 30.0
DEFAULT_SMTP_URL = "smtp://127.0.0.1:25"
DEFAULT_SMTP_FROM = "pal@localhost"
DEFAULT_MAX_TURNS = 10
# What one run may create (docs/security.md): a small graph of nested loops and subagents could
# otherwise ask for about 10^12 steps.
DEFAULT_MAX_STEPS_PER_RUN = 10_000  # steps completed in one run before its next step fails it
DEFAULT_MAX_CHILD_RUNS = 100  # child runs (at any depth) under one top-level run
DEFAULT_MAX_RUN_DEPTH = 4  # subagent nesting: a top-level run is depth 0
DEFAULT_MAX_RUNS_IN_FLIGHT = 1_000  # top-level runs queued or running per tenant
DEFAULT_STEP_TIMEOUT_SECONDS = 300.0  # a step's time limit when its node sets no timeoutMs

DEFAULT_BASELINE_INTERVAL_SECONDS = 300.0
# A stopping worker's steps finish within this, else their leases are handed back: before
# Kubernetes' default 30 s termination grace ends in a SIGKILL.
DEFAULT_SHUTDOWN_GRACE_SECONDS = 25.0

@dataclass(frozen=True)
class Settings:
    """Every PAL setting; `load_settings` documents the variable behind each field."""

    home: Path
    database_url: str
    broker_url: str
    queue: str
    broker_key_prefix: str
    tenant: str
    lease_ttl: float
    recovery_interval: float
    tool_modules: tuple[str, ...]
    worker_concurrency: int | None
    max_graph_bytes: int
    max_input_bytes: int
    max_output_bytes: int
    max_json_depth: int
    filesystem_poll: float
    openai_base_url: str
    anthropic_base_url: str
    provider_timeout: float
    prices: str
    smtp_url: str
    smtp_from: str
    delivery_timeout: float
    egress_allow: tuple[str, ...] = ()  # PAL_EGRESS_ALLOW entries, normalized (pal.core.egress)
    max_steps_per_run: int = DEFAULT_MAX_STEPS_PER_RUN
    max_child_runs: int = DEFAULT_MAX_CHILD_RUNS
    max_run_depth: int = DEFAULT_MAX_RUN_DEPTH
    max_runs_in_flight: int = DEFAULT_MAX_RUNS_IN_FLIGHT
    step_timeout: float = DEFAULT_STEP_TIMEOUT_SECONDS
    secrets_file: str = ""  # PAL_SECRETS_FILE; pal.core.secrets reads the variable itself, at render time
    anomaly_limits: AnomalyLimits = field(default_factory=AnomalyLimits)  # PAL_ANOMALY_*
    baseline_interval: float = DEFAULT_BASELINE_INTERVAL_SECONDS  # PAL_BASELINE_INTERVAL
    confidence_gate: GateMode = GateMode.OFF  # PAL_CONFIDENCE_GATE
    db_pool_size: int = 20  # PAL_DB_POOL_SIZE
    async_steps: int = 1000  # PAL_ASYNC_STEPS: awaited effects in flight per worker process
    control_url: str = "http://127.0.0.1:8000"  # PAL_CONTROL_URL
    vm_queue: str = "pal-vm"  # PAL_VM_QUEUE
    vm_root: str = ""  # PAL_VM_ROOT ("" before load_settings fills in $PAL_HOME/vm-work)
    vm_guest: str = ""  # PAL_VM_GUEST
    vm_accel: str = "kvm"  # PAL_VM_ACCEL
    vm_uid: int = 100000  # PAL_VM_UID
    vm_max_memory_mb: int = 4096  # PAL_VM_MAX_MEMORY_MB
    vm_max_cpus: float = float(os.cpu_count() or 1)  # PAL_VM_MAX_CPUS
    vm_max_pids: int = 4096  # PAL_VM_MAX_PIDS
    vm_expose: tuple[str, ...] = ()  # PAL_VM_EXPOSE
    firecracker_bin: str = "firecracker"  # PAL_FIRECRACKER_BIN
    firecracker_kernel: str = ""  # PAL_FIRECRACKER_KERNEL
    firecracker_rootfs: str = ""  # PAL_FIRECRACKER_ROOTFS
    signing_key: str = field(default="", repr=False)  # PAL_SIGNING_KEY, a secret: never in a repr
    trusted_keys: tuple[str, ...] = ()  # PAL_TRUSTED_KEYS
    broker: BrokerOptions = field(default_factory=BrokerOptions)  # PAL_BROKER_TRANSPORT_OPTIONS, _TLS_*
    admission: AdmissionSettings = field(default_factory=AdmissionSettings)  # PAL_TENANT_CONCURRENCY
    shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE_SECONDS  # PAL_SHUTDOWN_GRACE

    @property
    def is_embedded_broker(self) -> bool:
        return self.broker_url.startswith("filesystem://")

    @property
    def broker_folder(self) -> Path:
        return self.home / "broker"

    def with_(self, **changes: object) -> Settings:
        return replace(self, **changes)  # type: ignore[arg-type]


def _positive_float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = parse_go_duration(raw) if not _is_plain_number(raw) else float(raw)
    except ValueError as exc:
        raise ConfigError(f"{name}={raw!r} is not a duration (examples: 30s, 1m30s, 500ms)") from exc
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name}={raw!r} must be positive and finite")
    return value


def _is_plain_number(raw: str) -> bool:
    try:
        float(raw)
    except ValueError:
        return False
    return True


def _anomaly_limits(env: Mapping[str, str]) -> AnomalyLimits:
    """PAL_ANOMALY_<FIELD> for each threshold of pal.core.anomalies.AnomalyLimits, e.g.
    PAL_ANOMALY_MAX_RETRIES=20; a bad value is a ConfigError naming the variable."""
    changes: dict[str, Any] = {}
    for item in fields(AnomalyLimits):
        name = f"PAL_ANOMALY_{item.name.upper()}"
        if env.get(name, "").strip():
            changes[item.name] = _int(env, name, 1) if item.type == "int" else _positive_number(env, name)
    return replace(AnomalyLimits(), **changes)


def _positive_number(env: Mapping[str, str], name: str) -> float:
    raw = env.get(name, "").strip()
    try:
        value = float(raw)
    except ValueError as exc:
        raise ConfigError(f"{name}={raw!r} is not a number") from exc
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name}={raw!r} must be positive and finite")
    return value


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ConfigError(f"{name}={raw!r} is not a whole number") from exc
    if value <= 0:
        raise ConfigError(f"{name}={raw!r} must be positive")
    return value


def recovery_interval(raw: str | None) -> float:
    """PAL_RECOVERY_INTERVAL as docs/specification.md (Recovery sweep) defines it.

    A Go duration; an invalid, empty or non-positive value falls back to 30 s with a warning,
    so the sweep can never be disabled.
    """
    if raw is None or not raw.strip():
        return DEFAULT_RECOVERY_INTERVAL_SECONDS
    try:
        value = parse_go_duration(raw)
    except ValueError:
        log.warning("PAL_RECOVERY_INTERVAL=%r is not a Go duration; using 30s", raw)
        return DEFAULT_RECOVERY_INTERVAL_SECONDS
    if value <= 0:
        log.warning("PAL_RECOVERY_INTERVAL=%r is not positive; using 30s", raw)
        return DEFAULT_RECOVERY_INTERVAL_SECONDS
    return value


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Read the settings from `env` (default: the process environment); the variables are
    listed in this module's docstring."""
    env = os.environ if env is None else env
    home = Path(env.get("PAL_HOME", "").strip() or DEFAULT_HOME).absolute()
    database_url = env.get("PAL_DATABASE_URL", "").strip() or f"sqlite:///{home / 'pal.db'}"
    concurrency_raw = env.get("PAL_WORKER_CONCURRENCY", "").strip()
    broker_url = env.get("PAL_BROKER_URL", "").strip() or DEFAULT_BROKER_URL
    broker_key_prefix = env.get("PAL_BROKER_KEY_PREFIX", "").strip()
    tool_modules = tuple(
        m.strip() for m in env.get("PAL_TOOL_MODULES", "").split(",") if m.strip()
    )
    return Settings(
        home=home,
        database_url=database_url,
        broker_url=broker_url,
        queue=env.get("PAL_QUEUE", "").strip() or DEFAULT_QUEUE,
        broker_key_prefix=broker_key_prefix,
        tenant=env.get("PAL_TENANT", "").strip() or DEFAULT_TENANT,
        lease_ttl=_positive_float(env, "PAL_LEASE_TTL", DEFAULT_LEASE_TTL_SECONDS),
        recovery_interval=recovery_interval(env.get("PAL_RECOVERY_INTERVAL")),
        tool_modules=tool_modules,
        worker_concurrency=(
            _int(env, "PAL_WORKER_CONCURRENCY", 1) if concurrency_raw else None
        ),
        max_graph_bytes=_int(env, "PAL_MAX_GRAPH_BYTES", DEFAULT_MAX_GRAPH_BYTES),
        max_input_bytes=_int(env, "PAL_MAX_INPUT_BYTES", DEFAULT_MAX_INPUT_BYTES),
        max_output_bytes=_int(env, "PAL_MAX_OUTPUT_BYTES", DEFAULT_MAX_OUTPUT_BYTES),
        max_json_depth=_int(env, "PAL_MAX_JSON_DEPTH", DEFAULT_MAX_JSON_DEPTH),
        filesystem_poll=_positive_float(
            env, "PAL_FILESYSTEM_POLL", DEFAULT_FILESYSTEM_POLL_SECONDS
        ),
        openai_base_url=env.get("PAL_OPENAI_BASE_URL", "").strip(),
        anthropic_base_url=env.get("PAL_ANTHROPIC_BASE_URL", "").strip(),
        provider_timeout=_positive_float(env, "PAL_PROVIDER_TIMEOUT", DEFAULT_PROVIDER_TIMEOUT_SECONDS),
        prices=env.get("PAL_PRICES", "").strip(),
        smtp_url=_smtp_url(env.get("PAL_SMTP_URL", "").strip() or DEFAULT_SMTP_URL),
        smtp_from=env.get("PAL_SMTP_FROM", "").strip() or DEFAULT_SMTP_FROM,
        delivery_timeout=_positive_float(env, "PAL_DELIVERY_TIMEOUT", DEFAULT_DELIVERY_TIMEOUT_SECONDS),
        egress_allow=_egress_allow(env.get("PAL_EGRESS_ALLOW", "")),
        max_steps_per_run=_int(env, "PAL_MAX_STEPS_PER_RUN", DEFAULT_MAX_STEPS_PER_RUN),
        max_child_runs=_int(env, "PAL_MAX_CHILD_RUNS", DEFAULT_MAX_CHILD_RUNS),
        max_run_depth=_int(env, "PAL_MAX_RUN_DEPTH", DEFAULT_MAX_RUN_DEPTH),
        max_runs_in_flight=_int(env, "PAL_MAX_RUNS_IN_FLIGHT", DEFAULT_MAX_RUNS_IN_FLIGHT),
        step_timeout=_positive_float(env, "PAL_STEP_TIMEOUT", DEFAULT_STEP_TIMEOUT_SECONDS),
        secrets_file=env.get("PAL_SECRETS_FILE", "").strip(),
        anomaly_limits=_anomaly_limits(env),
        baseline_interval=_positive_float(env, "PAL_BASELINE_INTERVAL", DEFAULT_BASELINE_INTERVAL_SECONDS),
        confidence_gate=_gate_mode(env.get("PAL_CONFIDENCE_GATE", "")),
        db_pool_size=_pool_size(env),
        async_steps=_async_steps(env),
        control_url=env.get("PAL_CONTROL_URL", "").strip() or "http://127.0.0.1:8000",
        vm_queue=env.get("PAL_VM_QUEUE", "").strip() or "pal-vm",
        vm_root=str(Path(env.get("PAL_VM_ROOT", "").strip() or home / "vm-work").absolute()),
        vm_guest=str(Path(env.get("PAL_VM_GUEST", "").strip() or home / "vm-guest").absolute()),
        vm_accel=_choice(env, "PAL_VM_ACCEL", ("kvm", "tcg")),
        vm_uid=_int(env, "PAL_VM_UID", 100000),
        vm_max_memory_mb=_int(env, "PAL_VM_MAX_MEMORY_MB", 4096),
        vm_max_cpus=_positive_number(env, "PAL_VM_MAX_CPUS") if env.get("PAL_VM_MAX_CPUS", "").strip()
        else float(os.cpu_count() or 1),
        vm_max_pids=_int(env, "PAL_VM_MAX_PIDS", 4096),
        vm_expose=_absolute_paths(env, "PAL_VM_EXPOSE"),
        firecracker_bin=env.get("PAL_FIRECRACKER_BIN", "").strip() or "firecracker",
        firecracker_kernel=env.get("PAL_FIRECRACKER_KERNEL", "").strip(),
        firecracker_rootfs=env.get("PAL_FIRECRACKER_ROOTFS", "").strip(),
        signing_key=env.get("PAL_SIGNING_KEY", "").strip(),
        trusted_keys=tuple(k.strip() for k in env.get("PAL_TRUSTED_KEYS", "").split(",") if k.strip()),
        broker=load_broker_options(env, broker_url, broker_key_prefix),
        admission=load_admission(env),
        shutdown_grace=_positive_float(env, "PAL_SHUTDOWN_GRACE", DEFAULT_SHUTDOWN_GRACE_SECONDS),
    )


def _pool_size(env: Mapping[str, str]) -> int:
    size = _int(env, "PAL_DB_POOL_SIZE", 20)
    if size < 2:
        raise ConfigError(f"PAL_DB_POOL_SIZE={size} must be at least 2 (one connection for transactions, "
                          "one for the step protocol's one-call statements)")
    return size


MAX_ASYNC_STEPS = 100_000


def _async_steps(env: Mapping[str, str]) -> int:
    limit = _int(env, "PAL_ASYNC_STEPS", 1000)
    if limit > MAX_ASYNC_STEPS:
        raise ConfigError(f"PAL_ASYNC_STEPS={limit} is more than {MAX_ASYNC_STEPS} awaited steps per process")
    return limit


def _absolute_paths(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    paths = tuple(p.strip() for p in env.get(name, "").split(":") if p.strip())
    bad = [p for p in paths if not p.startswith("/") or any(c.isspace() or c in ",'\"\\" for c in p)
           or ".." in p.split("/")]
    if bad:
        raise ConfigError(f"{name}: {bad[0]!r} must be an absolute path without '..', spaces, commas "
                          "or quotes")
    return paths


def _choice(env: Mapping[str, str], name: str, allowed: tuple[str, ...]) -> str:
    value = env.get(name, "").strip().lower() or allowed[0]
    if value not in allowed:
        raise ConfigError(f"{name}={env.get(name)!r} must be one of {', '.join(allowed)}")
    return value


def _gate_mode(raw: str) -> GateMode:
    value = raw.strip().lower() or GateMode.OFF
    if value not in tuple(GateMode):
        raise ConfigError(f"PAL_CONFIDENCE_GATE={raw!r} must be one of {', '.join(GateMode)}")
    return GateMode(value)


def _egress_allow(raw: str) -> tuple[str, ...]:
    """PAL_EGRESS_ALLOW checked at startup (ConfigError naming a bad entry), kept normalized."""
    return tuple(entry.text for entry in parse_allow_list(raw))


def _smtp_url(raw: str) -> str:
    host, port = smtp_address(raw)
    return f"smtp://{host}:{port}"


def smtp_address(url: str) -> tuple[str, int]:
    """(host, port) of an smtp://host[:port] URL; ConfigError otherwise."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    try:
        port = parts.port or 25
    except ValueError as exc:
        raise ConfigError(f"PAL_SMTP_URL={url!r}: bad port") from exc
    if parts.scheme != "smtp" or not parts.hostname:
        raise ConfigError(f"PAL_SMTP_URL={url!r} must look like smtp://host:port")
    return parts.hostname, port
