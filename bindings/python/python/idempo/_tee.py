"""What a host records of a handler's response, shared by the WSGI, Django and ASGI hosts: the
:class:`~idempo._flow.HandlerResult` of a captured response (with the route's redaction), and the
record of a body teed to the client within core's capture limit (``spec/PROTOCOL.md`` §7.5)."""

from __future__ import annotations

from typing import List, Optional, Tuple

from idempo._flow import HandlerResult, new_handler_result
from idempo._host import RouteOptions, response_length
from idempo._idempo import BodyCapture


def handler_result(
    opts: RouteOptions,
    status: int,
    headers: List[Tuple[str, str]],
    body: bytes,
    truncated: bool,
    framework: bool = False,
) -> HandlerResult:
    """The handler's answer for the flow: the route's ``redact`` hook gives the body to store
    (not for a body that was not recorded whole)."""
    stored = None
    if opts.redact is not None and not truncated:
        stored = opts.redact(status, headers, body)
    return new_handler_result(status, headers, body, stored, framework, truncated)


class TeeRecord:
    """The record of a body teed to the client: each chunk offered to core's ``capture`` (kept,
    or everything dropped past the limit; nothing is kept without a capture, a pass-through),
    and the declared ``Content-Length`` counted down so that the chunk completing it is known
    (:meth:`last`: the record is written before that chunk is handed on)."""

    def __init__(
        self,
        opts: RouteOptions,
        status: int,
        headers: List[Tuple[str, str]],
        capture: Optional[BodyCapture],
    ) -> None:
        self.opts = opts
        self.status = status
        self.headers = headers
        self.capture = capture
        self.recorded: List[bytes] = []
        self.done = False
        self.remaining = response_length(headers)

    def last(self, chunk: bytes) -> bool:
        """True when ``chunk`` completes the declared ``Content-Length``."""
        if self.remaining is None:
            return False
        self.remaining -= len(chunk)
        return self.remaining <= 0

    def record(self, chunk: bytes) -> None:
        if self.capture is None:
            return
        step = self.capture.accept(len(chunk))
        if step == "record":
            self.recorded.append(chunk)
        elif step == "discard":
            self.recorded = []

    def result(self, complete: bool) -> HandlerResult:
        """The handler's answer once the body ended (``complete``) or was closed early."""
        self.done = True
        truncated = not complete or (self.capture is not None and self.capture.truncated)
        body = b"".join(self.recorded)
        self.recorded = []
        return handler_result(self.opts, self.status, self.headers, body, truncated)
