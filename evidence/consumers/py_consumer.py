"""One Redis Streams consumer process of the consumers evidence row (evidence/consumers/run.py).

    python -m evidence.consumers.py_consumer URL NAME LOG TAKEOVER LEASE_MS CLAIM_IDLE_MS

It reads the ``orders`` stream in the ``billing`` group (pending entries idle for CLAIM_IDLE_MS
first, by XAUTOCLAIM, then new ones) and hands each message to an ``idempotent_function`` keyed by
the producer's ``msg_id``, on a ``RedisStore`` in the same Redis. The function stands for a
payment: it logs an ``exec`` line with the downstream key (what a provider would deduplicate on)
before it works ``work_ms``, so a kill -9 after the effect still counts as an execution.

What each answer does: a result (fresh or replayed) is acknowledged; ``CallOutcomeUnknown`` and
``PayloadMismatch`` are acknowledged as dead letters (a person looks at them); ``CallInFlight``,
``CallStoreUnavailable`` and a broker error leave the entry pending, claimed again later. Every
step is one JSON line appended to LOG with ``os.write`` (nothing is buffered in the process, so a
kill -9 loses no line it wrote).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Dict, List

import redis

from idempo import IdempotencyError
from idempo.functions import (
    CallInFlight,
    CallOutcomeUnknown,
    CallStoreUnavailable,
    PayloadMismatch,
    current_call,
    idempotent_function,
)
from idempo.stores import RedisStore

STREAM = "orders"
GROUP = "billing"


def main(url: str, name: str, log_path: str, takeover: str, lease_ms: int, claim_idle_ms: int) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    pid = os.getpid()

    def log(**rec: Any) -> None:
        os.write(fd, (json.dumps({"pid": pid, "t": time.time(), **rec}) + "\n").encode())

    client: "redis.Redis" = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=1)
    store = RedisStore(redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=1))

    @idempotent_function(store=store, key=lambda m: m["msg_id"], name="ev.charge",
                         payload=lambda m: {"msg_id": m["msg_id"], "cents": m["cents"]},
                         lease_ms=lease_ms, takeover=takeover)
    def charge(m: Dict[str, str]) -> Dict[str, Any]:
        call = current_call()
        assert call is not None
        log(ev="exec", msg=m["msg_id"], cents=m["cents"], dk=call.downstream_key, gen=call.generation)
        time.sleep(int(m["work_ms"]) / 1000)
        return {"charged": m["msg_id"], "cents": int(m["cents"])}

    log(ev="start", name=name)
    while True:
        try:
            claimed: Any = client.xautoclaim(STREAM, GROUP, name, claim_idle_ms, "0-0", count=10)
            batch: List[Any] = list(claimed[1])
            fresh: Any = client.xreadgroup(GROUP, name, {STREAM: ">"}, count=10, block=200)
        except redis.RedisError as exc:
            log(ev="broker_error", kind=type(exc).__name__)
            time.sleep(0.1)
            continue
        for _, entries in fresh or []:
            batch.extend(entries)
        for entry_id, fields in batch:
            m = {k.decode(): v.decode() for k, v in fields.items()}
            log(ev="delivery", msg=m["msg_id"], cents=m["cents"])
            try:
                result = charge(m)
                outcome = "done"
            except (CallOutcomeUnknown, PayloadMismatch) as exc:
                log(ev="typed", kind=type(exc).__name__, msg=m["msg_id"])
                outcome, result = type(exc).__name__, None  # a dead letter: acknowledged
            except (CallInFlight, CallStoreUnavailable) as exc:
                log(ev="typed", kind=type(exc).__name__, msg=m["msg_id"])
                continue  # stays pending: claimed again after claim_idle_ms
            except IdempotencyError as exc:
                log(ev="typed", kind=type(exc).__name__, msg=m["msg_id"], text=str(exc))
                continue
            except Exception as exc:  # noqa: BLE001 - counted: an untyped error is a finding
                log(ev="untyped", kind=type(exc).__name__, msg=m["msg_id"], text=str(exc))
                continue
            try:
                client.xack(STREAM, GROUP, entry_id)
            except redis.RedisError as exc:
                log(ev="broker_error", kind=type(exc).__name__)
                continue
            log(ev="ack", msg=m["msg_id"], cents=m["cents"], outcome=outcome, result=result)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], a[1], a[2], a[3], int(a[4]), int(a[5]))
