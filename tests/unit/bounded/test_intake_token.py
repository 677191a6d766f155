"""The intake park token (bounded/intake.py, intake_token): the same for every delivery of
one message, different for every publish of a run."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from celery_redislock.celery.bounded.intake import intake_token
from celery_redislock.celery.bounded.parking import SENT_HEADER


def _request(
    task_id: str = "t1",
    retries: int = 0,
    sent: str | None = "1700000000.123456",
    body: Any = b"[[1], {}, {}]",
    **extra: Any,
) -> Any:
    message = {"id": task_id, "retries": retries, **extra}
    if sent is not None:
        message[SENT_HEADER] = sent
    return SimpleNamespace(id=task_id, request_dict=message, body=body)


def test_a_redelivered_message_gets_the_same_token() -> None:
    # AMQP: another delivery tag, the redelivered flag; the message itself is the same.
    first = intake_token(_request(delivery_info={"delivery_tag": 1}))
    again = intake_token(_request(delivery_info={"delivery_tag": 9, "redelivered": True}))
    assert first == again and len(first) == 32
    assert intake_token(_request(sent=None)) == intake_token(_request(sent=None))


def test_a_retry_and_a_second_send_get_new_tokens() -> None:
    first = intake_token(_request())
    assert intake_token(_request(retries=1)) != first  # retry(): same id, a new run
    assert intake_token(_request(sent="1700000000.123457")) != first  # apply_async again
    assert intake_token(_request(task_id="t2")) != first


def test_without_our_header_the_body_tells_sends_apart() -> None:
    assert intake_token(_request(sent=None)) != intake_token(_request(sent=None, body=b"[[2]]"))
    assert intake_token(_request(sent=None)) != intake_token(_request())
