"""The fault proxy itself (tests/faults.py): each fault does what its docstring says."""

from __future__ import annotations

import threading
import time

import redis

from tests.faults import FaultProxy


def test_forwards_normally(r: redis.Redis, fault_proxy: FaultProxy) -> None:
    client = fault_proxy.client()
    assert client.set("k", "v") and client.get("k") == b"v"
    client.close()


def test_dropped_reply_is_resent_and_ran_twice(r: redis.Redis, fault_proxy: FaultProxy) -> None:
    client = fault_proxy.client()  # redis-py's default Retry re-sends
    client.ping()
    fault_proxy.drop_reply(match=b"counter")
    assert client.incr("counter") == 2  # the first execution's reply was lost
    assert fault_proxy.dropped == 1
    assert r.get("counter") == b"2"
    client.close()


def test_delay_each_way(r: redis.Redis, fault_proxy: FaultProxy) -> None:
    client = fault_proxy.client()
    client.ping()
    fault_proxy.delay = 0.05
    started = time.monotonic()
    client.ping()
    assert 0.09 <= time.monotonic() - started < 1.0
    client.close()


def test_pause_holds_until_resume(r: redis.Redis, fault_proxy: FaultProxy) -> None:
    client = fault_proxy.client()
    client.ping()
    fault_proxy.pause()
    done = threading.Event()
    threading.Thread(target=lambda: (client.set("p", 1), done.set()), daemon=True).start()
    assert not done.wait(0.3)
    fault_proxy.resume()
    assert done.wait(5)
    assert r.get("p") == b"1"
    client.close()


def test_cut_closes_connections(r: redis.Redis, fault_proxy: FaultProxy) -> None:
    client = fault_proxy.client()
    client.ping()
    assert fault_proxy.connections == 1
    fault_proxy.cut()
    assert client.ping()  # reconnects through the proxy
    client.close()
