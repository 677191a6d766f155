"""Redlock under faults of real processes: masters SIGKILLed, SIGSTOPped, restarted
empty; a client paused past its validity; fences kept in order by the floor."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import redis

from celery_redislock import RedisLock, RedlockLock, RedlockUnavailable
from celery_redislock.core.redlock import rounds
from celery_redislock.testing import RedisServer
from tests.topologies.redlock.conftest import GRACE

# Masters stopped and killed, bounds on how long a round takes.
pytestmark = pytest.mark.serial


def make(clients: list[redis.Redis], **options: object) -> RedlockLock:
    options.setdefault("ttl", GRACE)
    return RedlockLock(clients, "job", **options)  # type: ignore[arg-type]


def test_a_minority_killed_during_a_hold(
    masters: list[RedisServer], clients: list[redis.Redis]
) -> None:
    lease = make(clients, renew=True).acquire(timeout=2)
    assert lease is not None
    masters[0].kill()
    masters[1].kill()
    time.sleep(GRACE * 2.5)  # renewed twice or more, by the three left
    assert not lease.lost, lease.lost_reason
    assert lease.remaining() > 0
    assert make(clients).acquire(blocking=False) is None  # the three refuse a second client
    assert lease.release()


def test_a_majority_down_fails_with_a_clear_error_within_the_deadline(
    masters: list[RedisServer], clients: list[redis.Redis]
) -> None:
    for server in masters[:3]:
        server.kill()
    lock = make(clients)
    with pytest.raises(
        RedlockUnavailable,
        match=rf"only 2 of 5 masters answered, 3 needed: "
        rf"127.0.0.1:{masters[0].port}: ConnectionError",
    ):
        lock.acquire(blocking=False)
    started = time.monotonic()
    with pytest.raises(RedlockUnavailable, match="only 2 of 5"):
        lock.acquire(timeout=0.5)
    assert time.monotonic() - started < 1.5


def test_a_master_stopped_past_the_ttl_and_resumed(
    masters: list[RedisServer], clients: list[redis.Redis]
) -> None:
    stopped = masters[0]
    assert stopped.process is not None
    first = make(clients, master_timeout=0.2).acquire(timeout=2)
    assert first is not None
    os.kill(stopped.process.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        assert first.release()  # four of five answer: released
        assert time.monotonic() - started < 0.5  # the stopped master costs its timeout only
        second = make(clients, master_timeout=0.2).acquire(timeout=2)
        assert second is not None and second.fence > first.fence
        time.sleep(GRACE + 0.2)  # past the TTL on the stopped master's clock too
    finally:
        os.kill(stopped.process.pid, signal.SIGCONT)
    # Resumed, it runs the requests queued meanwhile; the lease it held is expired there.
    third = make(clients)
    assert third.acquire(blocking=False) is not None  # second expired, nothing stale holds
    assert not RedisLock(clients[0], "job").info().holders or third.locked()


def test_a_master_restarted_empty_grants_nothing_while_an_old_lease_may_live(
    masters: list[RedisServer], clients: list[redis.Redis]
) -> None:
    # Three masters: the holder has two of them (the third is held by a stranger).
    three = clients[:3]
    stranger = RedisLock(three[2], "job", ttl=5).acquire(blocking=False)
    assert stranger is not None
    held = make(three).acquire(blocking=False)
    assert held is not None
    assert stranger.release()
    masters[0].restart()  # empty: it forgot the holder's lease
    for _ in range(2):  # the connection to the old process fails once: reconnected
        RedlockLock(three, "warm", ttl=GRACE).acquire(blocking=False)
    # Without the grace it would grant, and with the free third master make a majority.
    lock = make(three)
    outcome = rounds.attempt(
        lock._masters,
        lock._acquire_call("probe", [1000, "", b"0", 0, round(GRACE * 1000)]),
        1000,
        1.0,
    )
    assert outcome.restarting() == [0], outcome  # it answers, refusing: restarted
    lock._release_token("probe")  # the free third master granted the probe
    second = make(three).acquire(blocking=False)
    assert second is None, "a second grant while the first lease may be live"
    assert held.remaining() > 0
    time.sleep(max(held.remaining(), 0) + GRACE)  # the old lease and the grace are over
    later = make(three).acquire(timeout=3)
    assert later is not None and later.fence > held.fence


def test_the_fence_floor_keeps_fences_increasing_without_the_fastest_master(
    masters: list[RedisServer], clients: list[redis.Redis]
) -> None:
    # Master 0's counter is far ahead (as a master with a fast clock would be): the
    # lease's fence is its fence, and must be stored on a majority before acquire returns.
    ahead = time.time_ns() // 1000 + 3_600_000_000
    clients[0].set("redislock:lock:{job}:fence", ahead)
    first = make(clients).acquire(blocking=False)
    assert first is not None and first.fence == ahead + 1
    stored = [int(client.get("redislock:lock:{job}:fence") or 0) for client in clients]
    assert sum(value >= first.fence for value in stored) >= 3, stored
    assert first.release()
    masters[0].kill()
    second = make(clients).acquire(blocking=False)
    assert second is not None and second.fence > first.fence


def test_a_client_paused_past_its_validity_loses_its_lease(
    masters: list[RedisServer], clients: list[redis.Redis]
) -> None:
    ports = ",".join(str(server.port) for server in masters)
    holder = subprocess.Popen(
        [sys.executable, "-m", "tests.topologies.redlock._holder", ports, "job", str(GRACE)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        first_fence = int(holder.stdout.readline().split()[1])
        os.kill(holder.pid, signal.SIGSTOP)  # paused: no renewal
        second = make(clients).acquire(timeout=GRACE * 3)
        assert second is not None and second.fence > first_fence
        os.kill(holder.pid, signal.SIGCONT)
        lost = holder.stdout.readline()
        assert lost.startswith("lost "), lost
        assert holder.stdout.readline().strip() == "release False"
        assert second.release()
    finally:
        os.kill(holder.pid, signal.SIGCONT)
        holder.kill()
        holder.wait(5)
        if holder.stdout is not None:
            holder.stdout.close()


def test_a_waiter_is_woken_by_the_release_not_by_a_poll(clients: list[redis.Redis]) -> None:
    # ttl 30: a waiter that only polled would ask again after a second. (The masters
    # are marked as past a 30 s restart grace, as after 30 s of uptime.)
    for client in clients:
        run_id = client.info("server")["run_id"]
        client.set(f"redislock:redlock:boot:{run_id}:30000", 1)
    lock = RedlockLock(clients, "job", ttl=30)
    lease = lock.acquire(blocking=False)
    assert lease is not None
    threading.Timer(0.3, lease.release).start()
    started = time.monotonic()
    second = RedlockLock(clients, "job", ttl=30).acquire(timeout=5)
    took = time.monotonic() - started
    assert second is not None and second.release()
    assert 0.25 < took < 0.8, took


def test_an_extend_no_master_answered_in_time_waits_as_renewal_does(
    masters: list[RedisServer], clients: list[redis.Redis]
) -> None:
    # #30 item 6: every master stalled for a moment (0.3 s of a 1 s lease, each round
    # waiting 0.1 s): extend() answered False and marked the lease lost at once, and
    # leaving the block raised LockNotOwned after its own release removed the lease.
    # It is held by every master all along: extend() waits, as renewal does.
    three, pids = clients[:3], [server.process.pid for server in masters[:3]]  # type: ignore[union-attr]
    lock = make(three, master_timeout=0.1)

    def resume() -> None:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)

    with lock as lease:
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        timer = threading.Timer(0.3, resume)
        timer.start()
        try:
            started = time.monotonic()
            extended = lease.extend()
            took = time.monotonic() - started
        finally:
            timer.cancel()
            resume()
        assert extended and not lease.lost, lease.lost_reason
        assert 0.25 < took < GRACE, took
    assert not lock.locked()  # released on leaving the block, which raised nothing


def test_an_extend_no_master_answers_until_the_deadline_is_a_loss_there(
    masters: list[RedisServer], clients: list[redis.Redis]
) -> None:
    three, pids = clients[:3], [server.process.pid for server in masters[:3]]  # type: ignore[union-attr]
    lease = make(three, master_timeout=0.1).acquire(blocking=False)
    assert lease is not None
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        assert not lease.extend()
        took = time.monotonic() - started
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    assert lease.lost and took < GRACE + 1.0, took


def test_a_restarted_master_refuses_for_the_whole_grace_measured_from_its_start(
    masters: list[RedisServer], clients: list[redis.Redis]
) -> None:
    # INFO's uptime_in_seconds reads 1 as early as a few ms after the start (two
    # rounded-down wall clock seconds): taken as the age, it cut the grace short.
    three = clients[:3]
    lock = make(three)
    started = time.monotonic()  # before the new process starts: its age is less
    masters[0].restart()
    for _ in range(2):  # the connection to the old process fails once: reconnected
        lock.acquire(blocking=False)
    probes = 0
    while time.monotonic() < started + GRACE * 0.95:
        outcome = rounds.attempt(
            lock._masters,
            lock._acquire_call(f"probe{probes}", [1000, "", b"0", 0, round(GRACE * 1000)]),
            1000,
            1.0,
        )
        assert 0 not in outcome.grants, (time.monotonic() - started, outcome)
        lock._release_token(f"probe{probes}")
        probes += 1
        time.sleep(0.01)
    assert probes > 10
