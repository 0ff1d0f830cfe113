"""The Celery app of the Celery worker test: one blocking client per kind, made at import.

The worker imports this before it forks its pool, as a real tasks module is imported:
the clients are made in the parent and used only in the children. Configured by the
environment: DISPATCH_TEST_BROKER (a Redis URL), DISPATCH_TEST_PLAIN_URL and
DISPATCH_TEST_SHARED_URL (two simulators), DISPATCH_TEST_PREFIX (the token store's keys,
and the Redis list each task pushes its outcome onto, for the test to pop).
"""

from __future__ import annotations

import json
import os

import redis
from celery import Celery

import dispatch_async as da

BROKER = os.environ["DISPATCH_TEST_BROKER"]

PREFIX = os.environ["DISPATCH_TEST_PREFIX"]

app = Celery("dispatch_test", broker=BROKER)
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    worker_prefetch_multiplier=1,
)

# Each worker process fetches its own token...
plain = da.DispatchClient(
    os.environ["DISPATCH_TEST_PLAIN_URL"], client_secret="test-secret", account="acme"
)
# ... unless they share one through Redis.
shared = da.DispatchClient(
    os.environ["DISPATCH_TEST_SHARED_URL"],
    client_secret="test-secret",
    account="acme",
    token_store=da.RedisTokenStore(BROKER, key_prefix=PREFIX),
)
outcomes = redis.Redis.from_url(BROKER)  # redis-py's own pool starts anew in each child


@app.task(name="send")
def send(kind: str, number: str) -> None:
    client = shared if kind == "shared" else plain
    result = client.send_basic([number], text="Olá")
    outcome = {"kind": kind, "ok": result.ok, "valid": len(result.valid), "pid": os.getpid()}
    outcomes.rpush(f"{PREFIX}outcomes", json.dumps(outcome))
