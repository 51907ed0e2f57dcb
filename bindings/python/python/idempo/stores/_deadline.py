"""Client-side deadlines for database sockets.

A frozen database server (its processes stopped, say) still has a kernel that acknowledges TCP,
so a blocked read never ends and server-side timeouts enforce nothing. The :class:`Watchdog` is one
daemon thread per process that shuts down the socket of any operation that overran its deadline:
the blocked driver read then sees end-of-file at once, the operation fails, and the store discards
the connection (it is never reused); closing it then resets the connection (``SO_LINGER`` 0). Arming and disarming take one lock and no system call.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import threading
import time
from typing import Dict, Optional


class Ticket:
    """One armed deadline; ``fired`` is true once the watchdog broke the socket."""

    __slots__ = ("fd", "deadline", "fired")

    def __init__(self, fd: int, deadline: float) -> None:
        self.fd = fd
        self.deadline = deadline
        self.fired = False


_ABORT_ON_CLOSE = struct.pack("ii", 1, 0)
"""``struct linger {l_onoff = 1, l_linger = 0}``: closing the socket resets the connection."""


def break_socket(fd: int) -> None:
    """Shuts a socket down in both directions (through a duplicate, so the owner's descriptor
    stays valid until the owner closes it), set first to reset the connection when the owner
    closes it (``SO_LINGER`` on, 0 s: an RST rather than an orderly close), so a server that
    resumes after a freeze finds the connection reset and, usually, drops a statement it had
    not read yet instead of running it for a client that gave up."""
    try:
        dup = socket.socket(fileno=os.dup(fd))
    except OSError:
        return
    try:
        try:
            dup.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _ABORT_ON_CLOSE)
        except OSError:
            pass  # not a TCP socket (a Unix socket): the shutdown alone still breaks the read
        dup.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        dup.close()


def idle_socket_is_dead(fd: int) -> bool:
    """True when an idle connection's socket has something to read.

    An idle database connection (no query outstanding) must have nothing to read: readable means
    end-of-file or a FATAL message from a server that restarted or terminated the backend. One
    ``poll`` with a zero timeout, no round trip.
    """
    try:
        readable, _, errored = select.select([fd], [], [fd], 0)
    except (OSError, ValueError):
        return True
    return bool(readable or errored)


class Watchdog:
    """Breaks the sockets of operations that overran their deadline (see the module docs).

    The thread ticks every :attr:`TICK` seconds while deadlines are armed (a deadline fires at
    most one tick late) and parks after a second with nothing armed; arming wakes it only when
    it is parked or the new deadline is due before its next tick, so steady traffic costs no
    thread switch per operation.
    """

    TICK = 0.05
    PARK_AFTER = 1.0

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._armed: Dict[int, Ticket] = {}
        self._wake_at = float("inf")
        self._thread: Optional[threading.Thread] = None
        self._pid = 0

    def after_fork(self) -> None:
        """Forgets the parent's thread and lock in a forked child (the lock may have been held
        by the parent's watchdog thread at the fork)."""
        self._cond = threading.Condition(threading.Lock())
        self._armed = {}
        self._wake_at = float("inf")
        self._thread = None

    def arm(self, fd: int, timeout: float) -> Ticket:
        """Starts a deadline ``timeout`` seconds from now on socket ``fd``."""
        ticket = Ticket(fd, time.monotonic() + timeout)
        with self._cond:
            if self._thread is None or self._pid != os.getpid():
                # First use, or a forked child (threads do not survive fork).
                self._armed.clear()
                self._wake_at = float("inf")
                self._pid = os.getpid()
                self._thread = threading.Thread(
                    target=self._run, name="idempo-watchdog", daemon=True
                )
                self._thread.start()
            self._armed[id(ticket)] = ticket
            if ticket.deadline < self._wake_at:
                self._cond.notify()
        return ticket

    def disarm(self, ticket: Ticket) -> bool:
        """Stops a deadline; returns True when it had already fired (the socket is broken)."""
        with self._cond:
            self._armed.pop(id(ticket), None)
            return ticket.fired

    def _run(self) -> None:
        cond = self._cond
        idle_since: Optional[float] = None
        with cond:
            while True:
                now = time.monotonic()
                for ticket in [t for t in self._armed.values() if t.deadline <= now]:
                    ticket.fired = True
                    del self._armed[id(ticket)]
                    break_socket(ticket.fd)
                if self._armed:
                    idle_since = None
                    first = min(t.deadline for t in self._armed.values())
                    self._wake_at = min(first, now + self.TICK)
                elif idle_since is None or now - idle_since < self.PARK_AFTER:
                    idle_since = now if idle_since is None else idle_since
                    self._wake_at = now + self.TICK
                else:
                    self._wake_at = float("inf")  # parked until the next arm
                wait = None if self._wake_at == float("inf") else max(0.0, self._wake_at - now)
                cond.wait(wait)


WATCHDOG = Watchdog()
"""The process-wide watchdog every PostgreSQL store uses."""

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=WATCHDOG.after_fork)
