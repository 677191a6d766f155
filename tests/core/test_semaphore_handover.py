"""A release that names the caller's own waiter tag (``here``, an event loop's: see
asyncio/notifier.py) grants that tag's waiters without a message and answers their
grants; other waiters are told as before; a re-sent release answers the same."""

from __future__ import annotations

import redis

from celery_redislock import RedisSemaphore
from celery_redislock.core.semaphore_scripts import RELEASE, release_reply


def release_here(sem: RedisSemaphore, token: str, here: str) -> tuple[bool, list[tuple[str, int]]]:
    scripts = sem._scripts
    keys, args = scripts.release_call(token), scripts.release_args(token, here)
    return release_reply(RELEASE(sem._client, keys, args))


def test_a_release_answers_its_own_tag_s_grants_and_tells_the_others(r: redis.Redis) -> None:
    sem = RedisSemaphore(r, "s", limit=2)
    held = [sem.acquire() for _ in range(2)]
    assert all(held)
    for name in ("a.loop1", "b.other"):
        assert sem._attempt(name, "", 5000, True)[0] == 0  # queued, in that order
    pubsub = r.pubsub()  # type: ignore[no-untyped-call]
    pubsub.psubscribe(f"{sem.keys.channel}*")
    assert pubsub.get_message(timeout=2)["type"] == "psubscribe"
    other = r.pubsub()  # type: ignore[no-untyped-call]
    other.subscribe(f"{sem.keys.channel}:other")  # "b.other"'s process listens
    assert held[0] and held[1]
    released, grants = release_here(sem, held[0].token, "loop1")
    assert released and [token for token, _ in grants] == ["a.loop1"]
    fence = grants[0][1]
    assert r.hget(sem.keys.leases, "f:a.loop1") == str(fence).encode()
    # Re-sent (its reply lost): the same answer, nothing granted twice.
    assert release_here(sem, held[0].token, "loop1") == (True, grants)
    released, grants = release_here(sem, held[1].token, "loop1")
    assert released and grants == []  # "b.other" is told by message instead
    messages = []
    while (message := pubsub.get_message(timeout=0.5)) is not None:
        if message["type"] == "pmessage":
            messages.append((message["channel"].decode(), message["data"].decode().split()[0]))
    assert messages == [(f"{sem.keys.channel}:other", "b.other")]
    assert r.zcard(sem.keys.holders) == 2 and r.zcard(sem.keys.queue) == 0
    pubsub.close()
    other.close()


def test_a_release_without_a_tag_answers_as_before(r: redis.Redis) -> None:
    sem = RedisSemaphore(r, "s", limit=1)
    lease = sem.acquire()
    assert lease is not None
    keys, args = sem._scripts.release_call(lease.token), sem._scripts.release_args(lease.token)
    assert RELEASE(r, keys, args) == 1
    assert RELEASE(r, keys, args) == 1  # re-sent
    unknown = sem._scripts.release_call("unknown")
    assert release_reply(RELEASE(r, unknown, ["unknown", *args[1:]])) == (False, [])


def test_the_caller_s_own_waiter_is_granted_however_late_its_check_in(r: redis.Redis) -> None:
    sem = RedisSemaphore(r, "s", limit=1)
    lease = sem.acquire()
    assert lease is not None
    assert sem._attempt("a.loop1", "", 5000, True)[0] == 0
    seconds, micros = r.time()
    r.zadd(sem.keys.alive, {"a.loop1": seconds * 1000 + micros // 1000 + 1500})  # stale
    released, grants = release_here(sem, lease.token, "loop1")
    assert released and [token for token, _ in grants] == ["a.loop1"]
