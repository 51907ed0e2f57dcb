"""A PostgreSQL job table worked by ``SELECT ... FOR UPDATE SKIP LOCKED``: each job's handler
runs once, even when a worker dies after the handler and before it marks the job done (the job
becomes visible again after ``VISIBILITY_S`` and its redelivery replays the stored result).

The key is the job's id. The record lives in the same database (``PostgresStore``).

Run:  python pg_job_queue.py postgresql://localhost/postgres
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Dict, List, Optional

import psycopg
from psycopg.types.json import Jsonb

from idempo.functions import CallInFlight, idempotent_function
from idempo.stores import PostgresStore

VISIBILITY_S = 30

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id bigserial PRIMARY KEY,
    payload jsonb NOT NULL,
    done boolean NOT NULL DEFAULT false,
    visible_at timestamptz NOT NULL DEFAULT now(),
    result jsonb
)
"""


def enqueue(conn: psycopg.Connection[Any], payload: Dict[str, Any]) -> int:
    row = conn.execute("INSERT INTO jobs (payload) VALUES (%s) RETURNING id",
                       (Jsonb(payload),)).fetchone()
    conn.commit()
    assert row is not None
    return int(row[0])


def take(conn: psycopg.Connection[Any]) -> Optional[tuple[int, Dict[str, Any]]]:
    """Takes the next visible job and hides it for ``VISIBILITY_S`` (committed at once, so a
    worker that dies leaves it to be taken again later)."""
    row = conn.execute(
        "UPDATE jobs SET visible_at = now() + make_interval(secs => %s) WHERE id = ("
        " SELECT id FROM jobs WHERE NOT done AND visible_at <= now()"
        " ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id, payload",
        (VISIBILITY_S,),
    ).fetchone()
    conn.commit()
    return None if row is None else (int(row[0]), dict(row[1]))


def make_handler(store: PostgresStore, sent: List[int]) -> Callable[[int, Dict[str, Any]], Dict[str, Any]]:
    """The idempotent job handler, keyed by job id; ``sent`` stands for the side effect."""

    @idempotent_function(store=store, key=lambda job_id, payload: str(job_id),
                         payload=lambda job_id, payload: payload, name="jobs.send_invoice")
    def send_invoice(job_id: int, payload: Dict[str, Any]) -> Dict[str, Any]:
        sent.append(job_id)
        return {"invoice": payload["invoice"], "sent": True}

    return send_invoice


def work_once(conn: psycopg.Connection[Any], handler: Callable[[int, Dict[str, Any]], Dict[str, Any]]) -> Optional[int]:
    """Handles one job; returns its id (None: no job visible)."""
    job = take(conn)
    if job is None:
        return None
    job_id, payload = job
    try:
        result = handler(job_id, payload)
    except CallInFlight:
        return job_id  # another worker runs it; it becomes visible again later
    conn.execute("UPDATE jobs SET done = true, result = %s WHERE id = %s", (Jsonb(result), job_id))
    conn.commit()
    return job_id


def main(dsn: str) -> None:
    store = PostgresStore(dsn)
    store.create_schema()
    with psycopg.connect(dsn) as conn:
        conn.execute(SCHEMA)
        conn.commit()
        sent: List[int] = []
        handler = make_handler(store, sent)
        while work_once(conn, handler) is not None:
            pass


if __name__ == "__main__":
    main(sys.argv[1])
