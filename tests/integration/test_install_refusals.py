"""`pal.install` refuses, with nothing changed on the app, what PAL cannot work with: another
broker or key prefix than its clients use, no JSON, a second install."""

from __future__ import annotations

from pathlib import Path

import pytest
from celery import Celery

import pal
from pal.config import load_settings
from pal.errors import ConfigError

BROKER = "redis://127.0.0.1:6379/0"


def settings(tmp_path: Path, **env: str):  # type: ignore[no-untyped-def]
    return load_settings({"PAL_HOME": str(tmp_path / ".pal"), "PAL_BROKER_URL": BROKER,
                          "PAL_DATABASE_URL": f"sqlite:///{tmp_path / 'j.db'}", **env})


def untouched(app: Celery) -> bool:
    return not any(name.startswith("pal.") for name in app.tasks) and not app.conf.beat_schedule \
        and getattr(app, "runtime", None) is None


@pytest.mark.parametrize(("conf", "env", "says"), [
    ({"broker_url": "redis://:s3cret@10.0.0.9:6379/0"}, {}, "PAL_BROKER_URL is redis://127.0.0.1:6379/0"),
    ({"broker_url": BROKER, "broker_transport_options": {"global_keyprefix": "team:"}}, {},
     "key prefix is 'team:', PAL_BROKER_KEY_PREFIX is ''"),
    ({"broker_url": BROKER}, {"PAL_BROKER_KEY_PREFIX": "pal:"}, "key prefix is '', PAL_BROKER_KEY_PREFIX is 'pal:'"),
    ({"broker_url": BROKER, "accept_content": ["pickle"]}, {}, "accepts ['pickle'], not JSON"),
])
def test_what_pal_cannot_work_with_is_refused_and_nothing_changes(tmp_path: Path, conf: dict[str, object],
                                                                  env: dict[str, str], says: str) -> None:
    app = Celery("team", set_as_current=False)
    app.conf.update(conf)
    with pytest.raises(ConfigError) as refused:
        pal.install(app, settings(tmp_path, **env))
    assert says in str(refused.value)
    assert "s3cret" not in str(refused.value)  # a broker's password is never repeated
    assert untouched(app)


def test_a_second_install_is_refused(tmp_path: Path) -> None:
    app = Celery("team", broker=BROKER, set_as_current=False)
    app.conf.beat_schedule = {"team-nightly": {"task": "team.nightly", "schedule": 86400}}
    runtime = pal.install(app, settings(tmp_path))
    assert app.runtime is runtime  # type: ignore[attr-defined]
    assert set(app.conf.beat_schedule) == {"team-nightly", "pal-sweep-orphans", "pal-fire-schedules",
                                            "pal-recompute-baselines"}
    with pytest.raises(ConfigError, match="installed on this Celery app already"):
        pal.install(app, settings(tmp_path))
    app.close()
