"""Problem bodies in the API's own envelope: the ``problem_renderer`` hook every Python host takes.

Core answers idempo's refusals (400 missing or invalid key, 409 in flight, 413, 422 key reused,
500 outcome unknown / scope unresolved / response not retained, 503 store unavailable) as RFC 9457
``application/problem+json`` (``spec/PROTOCOL.md`` §10). An API whose clients expect their own
error format passes a renderer::

    def render(problem: idempo.Problem) -> tuple[bytes, str]:
        body = {"error": {"type": problem.slug, "message": problem.detail}}
        return json.dumps(body).encode(), "application/json"

    app.add_middleware(IdempotencyMiddleware, store=store, problem_renderer=render)

It receives every problem idempo answers (never the handler's own responses), including the
``response-not-retained`` record a replay carries, and returns the body and its content type; the
status and the other headers (``Retry-After``, ``Idempotent-Replayed``) stay core's. A renderer
that raises or returns something else is logged on the ``idempo`` logger and the RFC 9457 body is
sent. Note that idempo's own clients recognise its problems by their RFC 9457 ``type``: a renderer
that drops it makes them treat a 409 in-flight or a 422 key-reused as an ordinary answer.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Optional, Protocol, Tuple

if TYPE_CHECKING:  # _flow imports this module
    from idempo._flow import Response

log = logging.getLogger("idempo")

PROBLEM_CONTENT_TYPE = "application/problem+json"
"""The media type of core's problem bodies (``spec/PROTOCOL.md`` §10)."""

PROBLEM_TYPE_PREFIX = "urn:idempo:problem:"
"""Every idempo problem ``type`` starts with this (``spec/PROTOCOL.md`` §10)."""


@dataclass(frozen=True)
class Problem:
    """One problem idempo answers, as core wrote it."""

    type: str
    """The RFC 9457 type URI, ``urn:idempo:problem:<slug>``."""
    status: int
    title: str
    detail: str
    retry_after: Optional[int] = None
    """``Retry-After`` in seconds, for the problems that carry one (409, 503)."""
    code: Optional[str] = None
    """A stable snake_case reason some problems add (e.g. a key error's)."""

    @property
    def slug(self) -> str:
        """The type's last part: ``in-flight``, ``key-reused``, ``store-unavailable``, ..."""
        return self.type[len(PROBLEM_TYPE_PREFIX):]


class ProblemRenderer(Protocol):
    """``renderer(problem) -> (body, content_type)``."""

    def __call__(self, problem: Problem) -> Tuple[bytes, str]: ...


def check_renderer(renderer: Any) -> Optional[ProblemRenderer]:
    """The renderer a host was given (``None``: RFC 9457); anything not callable is a TypeError."""
    if renderer is not None and not callable(renderer):
        raise TypeError(
            f"problem_renderer must be a callable (problem) -> (body bytes, content type), "
            f"got {type(renderer).__name__}"
        )
    return renderer


def _header(headers: Any, name: str) -> Optional[str]:
    for n, v in headers:
        if n.lower() == name:
            return str(v)
    return None


def problem_of(response: "Response") -> Optional[Problem]:
    """The idempo problem a response carries (None: not one of idempo's problems)."""
    ctype = _header(response.headers, "content-type")
    if ctype is None or ctype.split(";", 1)[0].strip().lower() != PROBLEM_CONTENT_TYPE:
        return None
    try:
        data = json.loads(response.body)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    kind = data.get("type")
    if not isinstance(kind, str) or not kind.startswith(PROBLEM_TYPE_PREFIX):
        return None
    retry = _header(response.headers, "retry-after")
    code = data.get("code")
    return Problem(
        type=kind,
        status=response.status,
        title=str(data.get("title", "")),
        detail=str(data.get("detail", "")),
        retry_after=int(retry) if retry is not None and retry.strip().isdigit() else None,
        code=code if isinstance(code, str) else None,
    )


def render(response: "Response", renderer: Optional[ProblemRenderer]) -> "Response":
    """``response`` with its problem body rendered by ``renderer`` (unchanged without one, or
    when the response is not an idempo problem)."""
    if renderer is None:
        return response
    problem = problem_of(response)
    if problem is None:
        return response
    try:
        out = renderer(problem)
        body, content_type = out
        if not isinstance(body, (bytes, bytearray)) or not isinstance(content_type, str):
            raise TypeError(f"expected (bytes, str), got {type(out).__name__}")
    except Exception as exc:  # noqa: BLE001 - the RFC 9457 body is sent instead, logged
        log.error("idempo: problem_renderer failed on %s (%s); sent the RFC 9457 body",
                  problem.type, exc)
        return response
    headers = [(n, v) for n, v in response.headers
               if n.lower() not in ("content-type", "content-length")]
    headers.append(("content-type", content_type))
    return replace(response, headers=headers, body=bytes(body))
