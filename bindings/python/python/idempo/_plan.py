"""Sans-IO plans: a step written once as a generator and driven sync or async.

A plan is a generator that yields the operations it needs (a SQL statement, a Lua script call,
an HTTP attempt, a pause) and receives each one's result, or has the operation's error thrown
into it; its return value is the step's result. :func:`drive` runs a plan with a blocking
executor, :func:`drive_async` with an awaitable one, so the sync and async forms of a store
primitive, of the server flow's store steps and of the client's retry loop keep only their IO.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Generator, TypeVar

Op = TypeVar("Op")
T = TypeVar("T")

Plan = Generator[Op, Any, T]
"""Yields operations, receives their results, returns the step's result."""


def drive(plan: "Plan[Op, T]", execute: Callable[[Op], Any]) -> T:
    """Runs ``plan``, executing every operation it yields with ``execute``."""
    try:
        op = next(plan)
        while True:
            try:
                result = execute(op)
            except Exception as exc:
                op = plan.throw(exc)
            else:
                op = plan.send(result)
    except StopIteration as stop:
        value: T = stop.value
        return value


async def drive_async(plan: "Plan[Op, T]", execute: Callable[[Op], Awaitable[Any]]) -> T:
    """Runs ``plan``, awaiting ``execute`` for every operation it yields."""
    try:
        op = next(plan)
        while True:
            try:
                result = await execute(op)
            except Exception as exc:
                op = plan.throw(exc)
            else:
                op = plan.send(result)
    except StopIteration as stop:
        value: T = stop.value
        return value
