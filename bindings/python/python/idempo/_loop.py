"""The running event loop and this process's id, without a system call per request.

On CPython before 3.12, ``asyncio.get_running_loop()`` (and everything that reaches it:
``asyncio.ensure_future``, ``asyncio.to_thread``, ``asyncio.current_task``) calls ``getpid()``
each time, so that a forked child never uses its parent's loop; 3.12 dropped that check and
resets the running loop in the child instead (``os.register_at_fork``). :func:`running_loop` does
what 3.12 does on every version: it remembers, per thread, the loop ``asyncio.get_running_loop()``
last returned, and returns it again only while that loop is the one running in this thread; a
forked child forgets it.

"Running in this thread" is read from the loop itself: asyncio's own loops
(``asyncio.BaseEventLoop``, whose ``run_forever`` is asyncio's) set ``_thread_id`` to the
thread's id before they become the thread's running loop and clear it after they stop being it,
and only one loop runs per thread. Any other loop (uvloop, a loop class with its own
``run_forever``) is asked ``asyncio.get_running_loop()`` every time, as before.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import weakref
from typing import Any, List, Optional

PID: List[int] = [os.getpid()]
"""This process's id, renewed in a forked child (``os.register_at_fork``): ``os.getpid()`` is a
system call."""

_get_ident = threading.get_ident
_KNOWN_RUN_FOREVER = frozenset(
    fn for fn in (
        asyncio.BaseEventLoop.run_forever,
        getattr(getattr(asyncio, "ProactorEventLoop", None), "run_forever", None),
    ) if fn is not None
)
"""``run_forever`` methods that keep ``_thread_id`` as :func:`running_loop` reads it (asyncio's
own; the proactor loop's calls the base one)."""


class _Last(threading.local):
    ref: "Optional[weakref.ref[asyncio.AbstractEventLoop]]" = None
    """The loop this thread's last :func:`running_loop` found running (asyncio's own kind),
    weakly: a finished loop is collected as before (its finalizers close what it held)."""


_LAST = _Last()


def _slow() -> asyncio.AbstractEventLoop:
    loop = asyncio.get_running_loop()  # RuntimeError when none runs (or it is the parent's)
    if getattr(type(loop), "run_forever", None) in _KNOWN_RUN_FOREVER:
        _LAST.ref = weakref.ref(loop)
    return loop


def _cached() -> asyncio.AbstractEventLoop:
    """``asyncio.get_running_loop()``, the same loop or the same ``RuntimeError``, without its
    ``getpid()`` while the thread's loop keeps running."""
    ref = _LAST.ref
    if ref is not None:
        loop: Any = ref()
        if loop is not None and loop._thread_id == _get_ident():
            return loop  # type: ignore[no-any-return]
    return _slow()


def _forget() -> None:
    """In a forked child: the parent's loop is not this process's (the forking thread is the
    child's only thread, so its slot is the only one left)."""
    _LAST.ref = None
    PID[0] = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget)

# The running event loop (RuntimeError when none runs in this thread): from 3.12,
# asyncio.get_running_loop itself; before, its cached twin.
if sys.version_info >= (3, 12):
    running_loop = asyncio.get_running_loop
else:
    running_loop = _cached
