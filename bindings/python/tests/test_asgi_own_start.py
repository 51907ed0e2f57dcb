"""A buffered response that core answers as it is goes out with the application's own
``http.response.start`` message; anything else gets one built from core's answer."""

from __future__ import annotations

import asyncio
from typing import Any, Dict, List

from idempo.asgi import IdempotencyMiddleware
from idempo.stores import MemoryStore

BODY = b'{"ok":true}'


def _run(start: Dict[str, Any], key: str, store: Any) -> List[Dict[str, Any]]:
    async def app(scope: Dict[str, Any], receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        await send(start)
        await send({"type": "http.response.body", "body": BODY})

    wrapped = IdempotencyMiddleware(app, store=store, public=True)
    sent: List[Dict[str, Any]] = []

    async def receive() -> Dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: Dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/p", "raw_path": b"/p",
             "query_string": b"", "headers": [(b"content-type", b"application/json"),
                                              (b"idempotency-key", key.encode())]}
    asyncio.run(wrapped(scope, receive, send))
    return sent


def _start(**extra: Any) -> Dict[str, Any]:
    return {"type": "http.response.start", "status": 201,
            "headers": [(b"content-type", b"application/json"),
                        (b"content-length", str(len(BODY)).encode())], **extra}


def test_the_applications_own_start_message_is_sent_when_nothing_changed() -> None:
    store = MemoryStore()
    start = _start()
    sent = _run(start, "own-0001", store)
    assert sent[0] is start
    assert sent[1] == {"type": "http.response.body", "body": BODY, "more_body": False}
    # The replay is core's answer (with Idempotent-Replayed): built anew.
    again = _run(_start(), "own-0001", store)
    assert again[0]["status"] == 201
    assert (b"idempotent-replayed", b"true") in again[0]["headers"]
    assert again[1]["body"] == BODY


def test_a_start_message_with_more_than_status_and_headers_is_built_anew() -> None:
    start = _start(trailers=False)
    sent = _run(start, "own-0002", MemoryStore())
    assert sent[0] is not start and "trailers" not in sent[0]
    assert sent[0]["status"] == 201 and sent[0]["headers"] == start["headers"]


def test_a_start_message_whose_headers_are_not_a_list_is_built_anew() -> None:
    start = _start()
    start["headers"] = tuple(start["headers"])
    sent = _run(start, "own-0003", MemoryStore())
    assert sent[0] is not start and sent[0]["headers"] == list(start["headers"])
