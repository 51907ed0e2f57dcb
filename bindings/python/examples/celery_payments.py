"""A Celery payments task (Redis broker) whose charge runs once per payment, however often the
task is delivered: a producer that retried its ``delay()`` (a new task id each time), Celery's own
retries of the task, several worker processes, and a worker killed mid-task (``acks_late``: the
broker delivers the task again) all end in one charge and one receipt.

The task has two idempotent steps, each keyed by the payment's own id (``payment_id``), never by
Celery's task id (a producer retry, or a redelivery by the broker, is another message):

- ``charge`` sends the charge to the provider under ``current_call().downstream_key``, which the
  provider deduplicates on (as Stripe does with an Idempotency-Key). Its result, a Pydantic
  ``Receipt``, is stored and replayed as a ``Receipt``.
- ``send_receipt`` mails the receipt. When the mail service is down (``ReceiptsDown``: certainly
  not sent) the key is released (``on_error``) and the task retries (``self.retry``): the retry
  replays the charge's stored receipt, and only the mail is sent again.

What the task does with each answer:

- ``CallInFlight`` (another worker runs this payment now) or ``CallStoreUnavailable``: retry
  after ``retry_after`` seconds (``self.retry``), which the broker delivers again;
- ``PayloadMismatch`` (the same ``payment_id`` with other data: a producer bug) or
  ``CallOutcomeUnknown``: the task fails with that error, for a person to look at. The errors
  round-trip through Celery's JSON result backend: ``AsyncResult.result`` is the same class.

A worker killed mid-charge: with ``task_acks_late`` the message was not acknowledged, so the broker
delivers it again (at once for a killed pool process, ``task_reject_on_worker_lost``; after
``visibility_timeout`` when the whole worker died). While the dead process's idempo lease lasts
that is ``CallInFlight`` (retried); after it, the takeover policy decides: ``outcome_unknown``
(the default) fails the task with ``CallOutcomeUnknown`` and never charges again, as the first
charge may have gone through; ``re_run`` (``PAYMENTS_TAKEOVER=re_run``, safe because the provider
deduplicates on the downstream key) charges again under the same downstream key: one charge.

Run a worker (from this folder):
    IDEMPO_CELERY_REDIS_URL=redis://localhost:6379/0 celery -A celery_payments worker -c 2
Enqueue a payment:
    IDEMPO_CELERY_REDIS_URL=redis://localhost:6379/0 python celery_payments.py pay-1 1250

Environment: ``IDEMPO_CELERY_REDIS_URL`` (broker, result backend, idempo's store and the stand-in
provider and mail service), ``PAYMENTS_TAKEOVER`` (``outcome_unknown``), ``PAYMENTS_LEASE_MS``
(idempo's lease, 30000), ``PAYMENTS_VISIBILITY_S`` (the broker's ``visibility_timeout``, 3600),
``PAYMENTS_PROVIDER_DELAY_S`` (how long the stand-in provider takes to answer, 0),
``PAYMENTS_RECEIPTS_FLAKY=1`` (the stand-in mail service refuses each payment's first receipt).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Dict

import redis
from celery import Celery, Task  # type: ignore[import-untyped]
from pydantic import BaseModel

from idempo.functions import (
    CallInFlight,
    CallStoreUnavailable,
    current_call,
    idempotent_function,
)
from idempo.stores import RedisStore

URL = os.environ.get("IDEMPO_CELERY_REDIS_URL", "redis://localhost:6379/0")
TAKEOVER = os.environ.get("PAYMENTS_TAKEOVER", "outcome_unknown")
LEASE_MS = int(os.environ.get("PAYMENTS_LEASE_MS", "30000"))

app = Celery("celery_payments", broker=URL, backend=URL)
app.conf.update(
    task_acks_late=True,  # acknowledged after the task ran: a crash mid-task redelivers it
    task_reject_on_worker_lost=True,  # a killed pool process's task goes back to the queue
    worker_prefetch_multiplier=1,
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    broker_transport_options={
        "visibility_timeout": float(os.environ.get("PAYMENTS_VISIBILITY_S", "3600")),
        # Look for a dead worker's unacknowledged tasks every second (one ZRANGE), not every 100 s.
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    },
    broker_connection_retry_on_startup=True,
)

store = RedisStore(URL)  # redis-py's pool reconnects in each forked pool process
client: "redis.Redis" = redis.Redis.from_url(URL)


class Payment(BaseModel):
    payment_id: str
    cents: int
    currency: str = "EUR"


class Receipt(BaseModel):
    payment_id: str
    cents: int
    charge_id: str


class ReceiptsDown(Exception):
    """The mail service refused the receipt: nothing was sent."""


def provider_charge(payment: Payment, idempotency_key: str) -> str:
    """The stand-in payment provider (in Redis): every request is logged, and a charge is made
    once per idempotency key, as a real provider does; it answers after the charge."""
    client.rpush("provider:calls", json.dumps(
        {"payment_id": payment.payment_id, "idempotency_key": idempotency_key, "pid": os.getpid()}
    ))
    client.hsetnx("provider:charges", idempotency_key, payment.model_dump_json())
    time.sleep(float(os.environ.get("PAYMENTS_PROVIDER_DELAY_S", "0")))
    return "ch_" + idempotency_key[:16]


def mail_receipt(receipt: Receipt) -> None:
    """The stand-in mail service (in Redis); with ``PAYMENTS_RECEIPTS_FLAKY=1`` it refuses each
    payment's first receipt."""
    attempt = client.hincrby("receipts:attempts", receipt.payment_id, 1)
    if os.environ.get("PAYMENTS_RECEIPTS_FLAKY") == "1" and attempt == 1:
        raise ReceiptsDown(f"mail service down for {receipt.payment_id}")
    client.rpush("receipts:sent", receipt.payment_id)


@idempotent_function(store=store, key=lambda p: p.payment_id, name="payments.charge",
                     lease_ms=LEASE_MS, takeover=TAKEOVER)
def charge(payment: Payment) -> Receipt:
    call = current_call()
    assert call is not None
    charge_id = provider_charge(payment, call.downstream_key)
    return Receipt(payment_id=payment.payment_id, cents=payment.cents, charge_id=charge_id)


@idempotent_function(store=store, key=lambda r: r.payment_id, name="payments.receipt",
                     lease_ms=LEASE_MS, on_error={ReceiptsDown: "release"})
def send_receipt(receipt: Receipt) -> bool:
    mail_receipt(receipt)
    return True


@app.task(bind=True, max_retries=50)  # type: ignore[untyped-decorator]
def charge_payment(self: Task, payment: Dict[str, Any]) -> Dict[str, Any]:
    try:
        receipt = charge(Payment.model_validate(payment))
        send_receipt(receipt)
    except (CallInFlight, CallStoreUnavailable) as busy:
        raise self.retry(countdown=busy.retry_after) from busy
    except ReceiptsDown as down:
        raise self.retry(countdown=0.2) from down  # the retry replays the charge, mails again
    return receipt.model_dump(mode="json")


if __name__ == "__main__":
    result = charge_payment.delay({"payment_id": sys.argv[1], "cents": int(sys.argv[2])})
    print(result.get(timeout=60))
