"""``LeaderScheduler`` over django-celery-beat's ``DatabaseScheduler`` (one SQLite
database shared by the beats) and RedBeat's scheduler, and the plain-Celery control.

Three beats each; the leader is SIGKILLed and a standby takes over: every slot from
the first to the last counted once at a real worker, no gap longer than a lease plus
an interval (plus slack). The control runs three plain ``PersistentScheduler`` beats
and sees every second sent about three times -- what the guard prevents.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..workers import AppModule, WorkerProcess
from .beats import BeatProcess, beat_module, module_env, runs, wait_for
from .test_failover import (
    INTERVAL,
    LEASE,
    SCHEDULE,
    SLACK,
    check_exactly_once,
    max_gap,
    wait_new_leader,
)

# Real beats measured against lease and interval bounds: alone, after the parallel part.
pytestmark = [pytest.mark.slow, pytest.mark.serial]

_DJANGO_SETTINGS = """\
SECRET_KEY = "tests"
INSTALLED_APPS = ["django_celery_beat"]
DATABASES = {{
    "default": {{
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": {path!r},
        "OPTIONS": {{"timeout": 30}},
    }}
}}
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
"""

_DJANGO_SETUP = """
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "beat_django_settings")
import django
django.setup()
"""


def kill_scenario(module: AppModule) -> None:
    """Three beats; the leader SIGKILLed once the others run; stopped 3 s after the
    takeover. The runs are left in the module's Redis."""
    first = BeatProcess(module).start()
    beats = [first]
    try:
        wait_for(lambda: "beat: leading group" in first.log(), 30, "the first leader")
        beats += [BeatProcess(module).start(), BeatProcess(module).start()]
        time.sleep(3)
        first.kill()
        wait_new_leader(beats, first, 30)
        time.sleep(3)
    finally:
        for beat in beats:
            beat.stop()


def check_runs(module: AppModule, redis_url: str) -> None:
    recorded = runs(module, redis_url)
    slots = check_exactly_once(recorded, "every-second")
    assert len(slots) >= 5, recorded
    gap = max_gap(recorded)
    assert gap <= LEASE + INTERVAL + SLACK, "\n".join(
        [f"gap {gap:.2f}", *(f"{r.slot} {r.ran_at:.3f} {r.sender}" for r in recorded)]
    )


def test_database_scheduler_three_beats_each_slot_once(tmp_path: Path, redis_url: str) -> None:
    (tmp_path / "beat_django_settings.py").write_text(
        _DJANGO_SETTINGS.format(path=str(tmp_path / "beat.sqlite3")), encoding="utf-8"
    )
    module = beat_module(
        tmp_path,
        redis_url,
        schedule=SCHEDULE,
        conf=(
            f'{{"redislock_beat_lease": {LEASE}, '
            '"redislock_beat_scheduler": "django_celery_beat.schedulers:DatabaseScheduler"}'
        ),
        prelude=_DJANGO_SETUP,
    )
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "-v", "0"],
        cwd=tmp_path,
        env={**module_env(module), "DJANGO_SETTINGS_MODULE": "beat_django_settings"},
        check=True,
        timeout=120,
    )
    with WorkerProcess(module, pool="solo", concurrency=1):
        kill_scenario(module)
        time.sleep(2)  # the worker runs what is queued
    check_runs(module, redis_url)


def test_redbeat_scheduler_three_beats_each_slot_once(tmp_path: Path, redis_url: str) -> None:
    module = beat_module(
        tmp_path,
        redis_url,
        schedule=SCHEDULE,
        conf=(
            f'{{"redislock_beat_lease": {LEASE}, '
            '"redislock_beat_scheduler": "redbeat.schedulers:RedBeatScheduler", '
            '"redbeat_key_prefix": app.main}'
        ),
    )
    with WorkerProcess(module, pool="solo", concurrency=1):
        kill_scenario(module)
        time.sleep(2)
    check_runs(module, redis_url)


def test_plain_celery_control_three_beats_send_duplicates(tmp_path: Path, redis_url: str) -> None:
    module = beat_module(tmp_path, redis_url, schedule=SCHEDULE)
    with WorkerProcess(module, pool="solo", concurrency=1):
        beats = [BeatProcess(module, scheduler="celery.beat:PersistentScheduler") for _ in range(3)]
        try:
            for beat in beats:
                beat.start()
            wait_for(
                lambda: all(b.log().count("Sending due task") >= 4 for b in beats),
                60,
                "three plain beats sending",
            )
        finally:
            for beat in beats:
                beat.stop()
        time.sleep(2)
    recorded = runs(module, redis_url)
    span = max(r.ran_at for r in recorded) - min(r.ran_at for r in recorded)
    # One run per second would be span + 1 runs; three beats send each second thrice.
    assert len(recorded) >= 2 * (span + 1), (len(recorded), span)
