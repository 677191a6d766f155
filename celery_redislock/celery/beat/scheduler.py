"""``LeaderScheduler``: any beat scheduler, sending only while its beat leads, each
slot at most once.

``celery -A proj beat -S celery_redislock.beat:LeaderScheduler`` builds the scheduler
``redislock_beat_scheduler`` names (Celery's ``PersistentScheduler`` by default,
django-celery-beat's ``DatabaseScheduler``, RedBeat's ``RedBeatScheduler``) with this
class mixed in front of it, so the inner scheduler keeps its own storage, ticks and
entries, and three of its methods are guarded:

* ``tick`` -- a standby beat does not tick the inner scheduler at all (no sends, no
  writes to a shared schedule); it checks every :data:`STANDBY_TICK` seconds whether
  it was elected.
* ``apply_async`` -- every send of every scheduler passes here. Before sending, the
  beat claims the run's slot (see :mod:`.slots`) in one atomic call
  (``beat_claim.lua``); a slot claimed already is skipped, logged and signalled. A
  new leader first sends the slots that came due since the entry's last claimed slot
  and were not sent (within ``redislock_beat_catch_up``), oldest first, each claimed.
* ``reserve`` -- an interval entry's next run counts from its slot, not from when the
  tick happened, so the inner scheduler wakes at the slots instead of drifting.

Two beats that both believe they lead for a moment (a paused leader waking up) send
nothing twice: claims of an entry only move forward in time.
"""

from __future__ import annotations

import itertools
import logging
import os
import secrets
import socket
import time
from collections.abc import Iterator
from datetime import datetime, tzinfo
from typing import Any, ClassVar, Final

from celery import Celery
from celery.beat import ScheduleEntry, Scheduler
from celery.schedules import crontab
from kombu import Producer
from redis.exceptions import RedisError

from ...core.lease import Lease
from ...core.lock import RedisLock
from ...errors import ConfigurationError, RedisLockError
from ..client import get_redis, replica_options
from . import slots
from .claims import BeatKeys, Claims, lock_name
from .leader import Leadership
from .settings import BeatSettings
from .signals import beat_elected, beat_lease_lost, beat_slot_sent, beat_slot_skipped

__all__ = [
    "ENTRY_HEADER",
    "SENDER_HEADER",
    "SLOT_HEADER",
    "STANDBY_TICK",
    "LeaderScheduler",
]

log = logging.getLogger("celery_redislock.beat")

STANDBY_TICK: Final = 0.1
"""Seconds between a standby's checks of whether it was elected, and the longest a
standby waits between tries for the lease: what a takeover adds to the lease's
expiry (a check costs a flag read; a try one script call)."""

SLOT_HEADER: Final = "redislock_beat_slot"
"""Message header: the slot a beat message was sent for (ISO 8601, UTC)."""

ENTRY_HEADER: Final = "redislock_beat_entry"
"""Message header: the schedule entry's name."""

SENDER_HEADER: Final = "redislock_beat_sender"
"""Message header: the owner id of the beat that claimed and sent the slot."""


class LeaderScheduler(Scheduler):
    """A beat scheduler that sends only while its beat holds the group's leader lease.

    ``LeaderScheduler(app, ...)`` returns an instance of the inner scheduler (the
    ``redislock_beat_scheduler`` setting) with this class in front of it: an
    ``isinstance`` of both.
    """

    _composed: ClassVar[dict[type[Scheduler], type[LeaderScheduler]]] = {}

    def __new__(cls, app: Celery, *args: Any, **kwargs: Any) -> LeaderScheduler:
        if cls is LeaderScheduler:
            inner = BeatSettings.from_app(app).scheduler
            if issubclass(inner, LeaderScheduler):  # a guard cannot guard itself
                raise ConfigurationError(
                    "redislock_beat_scheduler must name the scheduler LeaderScheduler "
                    f"guards, not LeaderScheduler itself, got {inner!r}"
                )
            cls = _compose(inner)
        return super().__new__(cls)

    def __init__(self, app: Celery, *args: Any, **kwargs: Any) -> None:
        self.beat_settings = BeatSettings.from_app(app)
        self._leadership: Leadership | None = None
        self._claims: Claims | None = None
        # The lease the entries were last aligned for (see _align_entries); a fresh
        # object at first, so the first tick that leads aligns them.
        self._aligned_for: object = object()
        self._unsure: dict[str, int] = {}
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        super().__init__(app, *args, **kwargs)
        if getattr(self, "lock_key", None):
            # RedBeat takes its own lock at beat_init (blocking every other beat there)
            # and extends it on ticks: the leader lease replaces it.
            log.info("beat: RedBeat's lock is off: the leader lease replaces it")
            self.lock_key = None

    # -- the election ------------------------------------------------------------------

    def leads(self) -> bool:
        """True while this beat holds the leader lease (as far as it knows locally)."""
        return self._leadership is not None and self._leadership.leads()

    def _elect(self) -> Leadership:
        leadership = self._leadership
        if leadership is None:
            settings = self.beat_settings
            client = get_redis(self.app)
            lock = RedisLock(
                client,
                lock_name(settings.group),
                ttl=settings.lease,
                prefix=settings.prefix,
                **replica_options(self.app),
            )
            self._claims = Claims(client, BeatKeys.of(settings.prefix, settings.group), self.owner)
            poll = min(STANDBY_TICK, settings.lease / 10.0)
            leadership = Leadership(lock, self.owner, poll, self._elected, self._lost)
            self._leadership = leadership
            leadership.start()
        return leadership

    def _elected(self, lease: Lease) -> None:
        group = self.beat_settings.group
        log.info(
            "beat: leading group %r as %s (lease %g s, fence %d)",
            group,
            self.owner,
            self.beat_settings.lease,
            lease.fence,
        )
        beat_elected.send(sender=self, group=group, owner=self.owner)

    def _lost(self, lease: Lease) -> None:
        group = self.beat_settings.group
        log.warning(
            "beat: lost the leader lease of group %r (%s): sending stopped",
            group,
            lease.lost_reason,
        )
        beat_lease_lost.send(sender=self, group=group, owner=self.owner, reason=lease.lost_reason)

    # -- the guarded methods -------------------------------------------------------------

    def tick(self, *args: Any, **kwargs: Any) -> float:
        leadership = self._elect()
        if not leadership.leads():
            return min(STANDBY_TICK, float(self.max_interval or STANDBY_TICK))
        lease = leadership.lease
        if lease is not self._aligned_for:
            self._aligned_for = lease
            self._align_entries()
        result: float = super().tick(*args, **kwargs)
        return result

    def _align_entries(self) -> None:
        """On election: each aligned entry's next run is the slot after its last claimed
        one (due now when that one is past: the catch-up sends it), so the inner
        scheduler does not wait for a run counted from when this beat started or
        last led (#26: a standby started 50 min before it took over sent an hourly
        entry's next slot 50 min late)."""
        claims = self._claims
        if claims is None:
            return
        now_ms = _now_ms()
        try:
            for entry in self.schedule.values():
                if not isinstance(entry, ScheduleEntry) or not slots.aligned(entry.schedule):
                    continue
                last = claims.last(str(entry.name))
                interval = slots.interval_ms(entry.schedule)
                if last is None:
                    # No slot on record (never sent, or the lock Redis lost its data):
                    # the next slot from now, never a past one the last leader may
                    # have sent (#26: a standby whose entries last ran when it started
                    # sent every crontab entry's latest run again).
                    last = now_ms if interval is None else now_ms // interval * interval
                when = slots.as_datetime(last)
                zone = entry.schedule.tz if isinstance(entry.schedule, crontab) else None
                if isinstance(zone, tzinfo):
                    # In the crontab's own zone, as Celery gives it (a Celery that
                    # matches the fields on last_run_at as given needs it).
                    when = when.astimezone(zone)
                entry.last_run_at = when
        except (RedisError, RedisLockError) as exc:
            log.warning("beat: cannot read the last slots sent on the lock Redis: %s", exc)
        # The inner scheduler orders its runs in a heap built from the entries' last
        # runs: built again from the ones just set.
        self.populate_heap()

    def reserve(self, entry: ScheduleEntry) -> Any:
        new_entry = super().reserve(entry)
        interval = slots.interval_ms(entry.schedule)
        if interval is not None and isinstance(new_entry, ScheduleEntry):
            # The next run is due one interval after this slot (not after this tick).
            new_entry.last_run_at = slots.as_datetime(_now_ms() // interval * interval)
        return new_entry

    def apply_async(
        self,
        entry: ScheduleEntry,
        producer: Producer | None = None,
        advance: bool = True,
        **kwargs: Any,
    ) -> Any:
        leadership = self._leadership
        claims = self._claims
        result = None
        if leadership is None or claims is None or not leadership.leads():
            log.debug("beat: not the leader: %s not sent", entry.name)
            return None
        name = str(entry.name)
        claiming: int | None = None
        decided_upto = -1
        # A slot whose claim call failed first: the claim may have run with its reply
        # lost, recording the slot as this beat's (a claim again by the same beat is
        # granted), and no catch-up would send it (#26).
        unsure = self._unsure.pop(name, None)
        try:
            for slot in itertools.chain(
                () if unsure is None else (unsure,), self._slots(entry, claims)
            ):
                if slot <= decided_upto:
                    continue
                if not leadership.leads():
                    break  # lost meanwhile: the one line was logged by _lost
                claiming = slot
                granted, last = claims.claim(name, slot)
                claiming = None
                decided_upto = slot
                when = slots.as_datetime(slot)
                if not granted:
                    self._skipped(name, when, slots.as_datetime(last))
                    continue
                stamped = _stamped(entry, when, self.owner)
                try:
                    result = super().apply_async(stamped, producer, False, **kwargs)
                except Exception as exc:
                    # Claimed, so no beat sends it again: say so (at most once wins).
                    log.error(
                        "beat: %s at %s was claimed but not sent, and is lost: %s",
                        name,
                        when.isoformat(),
                        exc,
                    )
                    raise
                beat_slot_sent.send(sender=self, entry=name, slot=when)
        except (RedisError, RedisLockError) as exc:
            # Not sent; this beat claims it again first at the entry's next send (its
            # claim may have run), else the next leader sends it in its catch-up.
            if claiming is not None:
                self._unsure[name] = claiming
            log.warning("beat: %s not sent: cannot claim its slot on the lock Redis: %s", name, exc)
        if advance:
            self.reserve(entry)
        return result

    def _skipped(self, name: str, when: datetime, last: datetime) -> None:
        log.info(
            "beat: %s at %s was sent already (last slot sent %s): skipped",
            name,
            when.isoformat(),
            last.isoformat(),
        )
        beat_slot_skipped.send(sender=self, entry=name, slot=when, last=last)

    def _slots(self, entry: ScheduleEntry, claims: Claims) -> Iterator[int]:
        """The slots of ``entry`` to claim now, oldest first."""
        name = str(entry.name)
        now_ms = _now_ms()
        last = claims.last(name)
        schedule = entry.schedule
        if not slots.aligned(schedule):  # one slot, from the entry's last run
            slot = slots.fallback_slot(schedule, entry.last_run_at, now_ms)
            if last is None or slot > last:
                yield slot
            return
        catch_up = self.beat_settings.catch_up
        if last is None or catch_up == 0:
            # Nothing sent yet (no history to make up), or no catch-up asked for: the
            # latest slot only, however late this tick is, as Celery sends one run for
            # any number missed (#26: with catch-up 0 the window was empty, and nothing
            # after the first slot was ever sent).
            latest = slots.latest_slot(schedule, last, now_ms)
            if latest is None and last is None:
                # The inner scheduler says due, but no slot lies within the search (a
                # rare crontab missed long ago): send that one run, as Celery would.
                latest = slots.fallback_slot(schedule, entry.last_run_at, now_ms)
            if latest is not None:
                yield latest
            return
        window_start = now_ms - round(catch_up * 1000)
        due = slots.due_slots(schedule, max(last, window_start), now_ms) or []
        # An unsent slot before the window: missed -- unless the window holds none,
        # when it is the run this (late) tick fires for and is sent (#26: a tick later
        # than the window dropped it, and an interval longer than the window reported
        # every on-time run as missed).
        missed = slots.latest_slot(schedule, last, window_start)
        if missed is not None and not due:
            due = [missed]
            missed = slots.latest_slot(schedule, last, missed - 1)
        if missed is not None:
            log.warning(
                "beat: %s: slots after %s up to %s were not sent and are older than "
                "redislock_beat_catch_up (%g s): not sent",
                name,
                slots.as_datetime(last).isoformat(),
                slots.as_datetime(missed).isoformat(),
                catch_up,
            )
        yield from due

    def close(self) -> None:
        # Released, so a standby takes over at once; a tick after close (Celery lets a
        # closed scheduler resume) tries for the lease again.
        leadership, self._leadership = self._leadership, None
        if leadership is not None:
            leadership.stop()
        super().close()

    @property
    def info(self) -> str:
        settings = self.beat_settings
        inner: str = super().info
        own = (
            f"    . leader lease -> group {settings.group!r}, {settings.lease:g} s "
            f"(guarding {settings.scheduler.__module__}.{settings.scheduler.__name__})"
        )
        return f"{inner}\n{own}" if inner else own


def _compose(inner: type[Scheduler]) -> type[LeaderScheduler]:
    """The class ``LeaderScheduler`` + ``inner`` (made once per inner class)."""
    composed = LeaderScheduler._composed.get(inner)
    if composed is None:
        composed = type(
            f"LeaderScheduler[{inner.__name__}]",
            (LeaderScheduler, inner),
            {"__module__": __name__, "__qualname__": f"LeaderScheduler[{inner.__qualname__}]"},
        )
        LeaderScheduler._composed[inner] = composed
    return composed


def _stamped(entry: ScheduleEntry, slot: datetime, owner: str) -> ScheduleEntry:
    """A shallow copy of ``entry`` whose message carries the slot headers."""
    stamped: ScheduleEntry = object.__new__(type(entry))
    stamped.__dict__.update(entry.__dict__)
    options = dict(entry.options or {})
    headers = dict(options.get("headers") or {})
    headers[SLOT_HEADER] = slot.isoformat()
    headers[ENTRY_HEADER] = entry.name
    headers[SENDER_HEADER] = owner
    options["headers"] = headers
    stamped.options = options
    return stamped


def _now_ms() -> int:
    return int(time.time() * 1000)
