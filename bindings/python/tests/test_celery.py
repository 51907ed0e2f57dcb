"""The Celery example (examples/celery_payments.py) under a real Celery worker (prefork pool,
two processes) on the project's real Redis: payments enqueued many times and retried by Celery
charge and mail once each, results round-trip as the example's Pydantic receipt, the same
payment id with other data fails with ``PayloadMismatch``, and a pool process killed mid-charge
(``acks_late``: the broker delivers the task again) ends as the takeover policy says."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, Iterator, List

import pytest
import redis

from idempo.functions import CallOutcomeUnknown, PayloadMismatch

from storekit import _flush_redis

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CELERY = Path(sys.executable).with_name("celery")


class Worker:
    """``celery -A celery_payments worker`` in its own process group, its log in a file."""

    def __init__(self, url: str, log: Path, env: Dict[str, str]) -> None:
        self.log = log
        self._log_file = log.open("w")
        self.proc = subprocess.Popen(
            [str(CELERY), "-A", "celery_payments", "worker", "--pool", "prefork", "-c", "2",
             "--without-heartbeat", "--without-gossip", "--without-mingle", "--loglevel", "INFO"],
            cwd=EXAMPLES, env={**os.environ, "IDEMPO_CELERY_REDIS_URL": url, **env},
            stdout=subprocess.DEVNULL, stderr=self._log_file, start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while " ready." not in log.read_text():
            assert self.proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGQUIT)  # cold shutdown: retries in hand are dropped
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self._log_file.close()


@pytest.fixture
def payments(services: Any) -> Iterator[ModuleType]:
    """The example module as a producer (its Celery app on the test Redis), on a flushed Redis."""
    _flush_redis(services.redis_url)
    os.environ["IDEMPO_CELERY_REDIS_URL"] = services.redis_url
    sys.path.insert(0, str(EXAMPLES))
    try:
        sys.modules.pop("celery_payments", None)
        yield importlib.import_module("celery_payments")
    finally:
        sys.path.remove(str(EXAMPLES))
        sys.modules.pop("celery_payments", None)
        os.environ.pop("IDEMPO_CELERY_REDIS_URL", None)


def provider_calls(client: "redis.Redis") -> List[Dict[str, Any]]:
    return [json.loads(c) for c in client.lrange("provider:calls", 0, -1)]


def test_duplicated_and_retried_tasks_charge_and_mail_once(
    payments: ModuleType, services: Any, tmp_path: Path
) -> None:
    client: "redis.Redis" = redis.Redis.from_url(services.redis_url)
    worker = Worker(services.redis_url, tmp_path / "worker.log",
                    {"PAYMENTS_RECEIPTS_FLAKY": "1", "PAYMENTS_LEASE_MS": "5000"})
    try:
        # 10 payments, each enqueued 4 times (a producer that retried its delay()).
        sent = [payments.charge_payment.delay({"payment_id": f"p-{n}", "cents": 100 + n})
                for _ in range(4) for n in range(10)]
        results = [r.get(timeout=25) for r in sent]
        by_payment: Dict[str, Any] = {}
        for r in results:
            receipt = payments.Receipt.model_validate(r)  # the stored Receipt, round-tripped
            assert by_payment.setdefault(receipt.payment_id, r) == r
            assert receipt.cents == 100 + int(receipt.payment_id[2:])
        assert sorted(by_payment) == sorted(f"p-{n}" for n in range(10))
        calls = provider_calls(client)
        assert sorted(c["payment_id"] for c in calls) == sorted(by_payment)  # one charge each
        assert client.hlen("provider:charges") == 10
        # Each first receipt was refused, its task retried by Celery (self.retry): the retry
        # replayed the charge and mailed once more; every other delivery replayed both steps.
        assert sorted(x.decode() for x in client.lrange("receipts:sent", 0, -1)) == sorted(by_payment)
        assert {int(v) for v in client.hgetall("receipts:attempts").values()} == {2}
        # The same payment id with other data: the typed mismatch, rebuilt from the result backend.
        with pytest.raises(PayloadMismatch) as mismatch:
            payments.charge_payment.delay({"payment_id": "p-3", "cents": 999}).get(timeout=25)
        assert mismatch.value.key == "p-3"
        assert len(provider_calls(client)) == 10
    finally:
        worker.stop()
        client.close()


def test_pool_process_killed_mid_charge_is_redelivered_and_not_charged_again(
    payments: ModuleType, services: Any, tmp_path: Path
) -> None:
    client: "redis.Redis" = redis.Redis.from_url(services.redis_url)
    worker = Worker(services.redis_url, tmp_path / "worker.log",
                    {"PAYMENTS_PROVIDER_DELAY_S": "60", "PAYMENTS_LEASE_MS": "2000"})
    try:
        first = payments.charge_payment.delay({"payment_id": "p-kill", "cents": 500})
        deadline = time.monotonic() + 20
        while not provider_calls(client):
            assert time.monotonic() < deadline, worker.log.read_text()
            time.sleep(0.05)
        # A duplicate while the first runs: the other pool process gets CallInFlight, retries.
        duplicate = payments.charge_payment.delay({"payment_id": "p-kill", "cents": 500})
        time.sleep(0.5)
        os.kill(provider_calls(client)[0]["pid"], signal.SIGKILL)  # the pool process mid-charge
        # acks_late + task_reject_on_worker_lost: the task is delivered again; while the lease
        # lasts it is in flight (retried), then outcome-unknown: failed, never charged again.
        for result in (first, duplicate):
            with pytest.raises(CallOutcomeUnknown) as unknown:
                result.get(timeout=25)
            assert unknown.value.key == "p-kill"
        assert len(provider_calls(client)) == 1
        assert client.hlen("provider:charges") == 1
        assert "WorkerLostError" in worker.log.read_text()
    finally:
        worker.stop()
        client.close()


def test_whole_worker_killed_mid_charge_re_run_charges_once(
    payments: ModuleType, services: Any, tmp_path: Path
) -> None:
    """kill -9 of the worker and its pool: the unacknowledged task comes back after the broker's
    visibility timeout, to a new worker; under ``re_run`` it charges again with the same
    downstream key, which the provider deduplicates: one charge, and the task's result."""
    client: "redis.Redis" = redis.Redis.from_url(services.redis_url)
    policy = {"PAYMENTS_LEASE_MS": "2000", "PAYMENTS_VISIBILITY_S": "2", "PAYMENTS_TAKEOVER": "re_run"}
    doomed = Worker(services.redis_url, tmp_path / "doomed.log", {**policy, "PAYMENTS_PROVIDER_DELAY_S": "60"})
    survivor = None
    try:
        result = payments.charge_payment.delay({"payment_id": "p-crash", "cents": 700})
        deadline = time.monotonic() + 20
        while not provider_calls(client):
            assert time.monotonic() < deadline, doomed.log.read_text()
            time.sleep(0.05)
        os.killpg(doomed.proc.pid, signal.SIGKILL)
        doomed.proc.wait(timeout=10)
        survivor = Worker(services.redis_url, tmp_path / "survivor.log", policy)
        receipt = payments.Receipt.model_validate(result.get(timeout=25))
        assert receipt.payment_id == "p-crash" and receipt.cents == 700
        calls = provider_calls(client)
        assert len(calls) == 2 and calls[0]["pid"] != calls[1]["pid"]
        assert calls[0]["idempotency_key"] == calls[1]["idempotency_key"]
        assert client.hlen("provider:charges") == 1  # charged once
        again = payments.charge_payment.delay({"payment_id": "p-crash", "cents": 700})
        assert again.get(timeout=25) == receipt.model_dump(mode="json")  # replayed
        assert len(provider_calls(client)) == 2
    finally:
        doomed.stop()
        if survivor is not None:
            survivor.stop()
        client.close()
