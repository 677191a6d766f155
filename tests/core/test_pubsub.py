"""core.pubsub: the wake-up mode of a client, and the sharded mode on one Redis."""

from __future__ import annotations

import gc
import threading
import time

import redis

from celery_redislock import Lease, RedisLock
from celery_redislock.core import pubsub
from celery_redislock.core.primitive import fresh_token


def test_a_plain_client_listens_classic_and_its_tokens_say_so(r: redis.Redis) -> None:
    assert pubsub.pubsub_mode(r) is pubsub.CLASSIC
    token, tag = fresh_token(r)
    assert token.endswith("." + tag) and not tag.startswith(pubsub.SHARDED_TAG)


def test_sharded_pub_sub_forced_on_one_redis_7_hands_the_lock_over(redis_url: str) -> None:
    """SSUBSCRIBE/SPUBLISH work outside a cluster too (Redis >= 7): the tag, the
    scripts' SPUBLISH and SHARDNUMSUB and the notifier agree."""
    client = redis.Redis.from_url(redis_url)
    if int(client.info("server")["redis_version"].split(".")[0]) < 7:
        client.close()
        return  # nothing to check on 6.2
    pubsub.use_sharded_pubsub(client, True)
    try:
        lock = RedisLock(client, "sharded-alone", ttl=5)
        holder = lock.acquire(blocking=False)
        assert holder is not None
        got: list[Lease | None] = []
        waiter = threading.Thread(target=lambda: got.append(lock.acquire(timeout=5)))
        waiter.start()
        deadline = time.monotonic() + 5
        while lock.info().waiters < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        token = client.zrange(lock.keys.queue, 0, 0)[0].decode()
        channel = f"{lock.keys.channel}:{token.rsplit('.', 1)[1]}"
        assert client.execute_command("PUBSUB", "SHARDNUMSUB", channel)[1] == 1
        released_at = time.monotonic()
        assert holder.release()
        waiter.join(5)
        assert got and got[0] is not None and time.monotonic() - released_at < 1.0
        assert got[0].token == token  # the queued waiter got it
        got[0].release()
    finally:
        client.close()


def test_a_chosen_mode_is_dropped_with_its_client(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    pubsub.use_sharded_pubsub(client, False)
    key = id(client)
    assert key in pubsub._modes
    client.close()
    del client
    gc.collect()
    assert key not in pubsub._modes
