"""A Redis Streams consumer group whose handler runs once per message, however often it is
delivered: several consumers, redeliveries of pending messages after a crash (XAUTOCLAIM), and a
producer that retried its XADD all end in one charge.

The key is the producer's own message id (``msg_id`` field), not the stream entry id: a
producer retry adds a second entry with a new entry id but the same ``msg_id``. The record lives
in the same Redis (``RedisStore``); a message whose call is still in flight elsewhere is left
pending (not acknowledged) and claimed again later.

Run:  python redis_streams_consumer.py redis://localhost:6379/0 consumer-1
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Dict, List, Tuple

import redis

from idempo.functions import CallInFlight, current_call, idempotent_function
from idempo.stores import RedisStore

STREAM = "orders"
GROUP = "billing"

Message = Dict[str, str]


def make_handler(store: RedisStore, charges: List[Tuple[str, str]]) -> Callable[[Message], str]:
    """The idempotent handler: ``charges`` stands for the payment provider (the downstream key
    is what a real one would deduplicate on)."""

    @idempotent_function(store=store, key=lambda m: m["msg_id"], name="billing.charge",
                         lease_ms=10_000)
    def charge(message: Message) -> str:
        call = current_call()
        assert call is not None
        charges.append((message["order"], call.downstream_key))
        return f"charged {message['order']}"

    return charge


def ensure_group(client: "redis.Redis") -> None:
    try:
        client.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def consume_once(
    client: "redis.Redis", consumer: str, handler: Callable[[Message], str],
    *, block_ms: int = 200, min_idle_ms: int = 5_000,
) -> int:
    """Handles one batch: pending messages idle for ``min_idle_ms`` (a crashed consumer's),
    then new ones. Acknowledges each handled message; returns how many were acknowledged."""
    claimed: Any = client.xautoclaim(STREAM, GROUP, consumer, min_idle_ms, "0-0", count=10)
    batch: List[Any] = list(claimed[1])
    fresh: Any = client.xreadgroup(GROUP, consumer, {STREAM: ">"}, count=10, block=block_ms)
    for _, entries in fresh or []:
        batch.extend(entries)
    acked = 0
    for entry_id, fields in batch:
        message = {_text(k): _text(v) for k, v in fields.items()}
        try:
            handler(message)
        except CallInFlight:
            continue  # another consumer runs it: stays pending, claimed again later
        client.xack(STREAM, GROUP, entry_id)
        acked += 1
    return acked


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def main(url: str, consumer: str) -> None:
    client: "redis.Redis" = redis.Redis.from_url(url)
    store = RedisStore(url)
    ensure_group(client)
    charges: List[Tuple[str, str]] = []
    handler = make_handler(store, charges)
    while True:
        consume_once(client, consumer, handler, block_ms=1_000)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
