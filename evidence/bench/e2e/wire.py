"""Round trips on the wire: a TCP proxy in front of PostgreSQL, PgBouncer or Redis that counts
request/response turns.

A turn starts when the client sends after the server last spoke (or first), so a pipelined batch
of statements or commands written before any answer is one round trip, as the client waits for
it. Used only in the checking run (it adds latency), never in the measured rounds.

    proxy = CountingProxy.start("postgresql://postgres@127.0.0.1:5432/postgres")
    proxy.url   # the same URL through the proxy;  proxy.turns()   # turns so far, all connections
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Optional
from urllib.parse import urlsplit, urlunsplit


@dataclass
class CountingProxy:
    target_host: str
    target_port: int
    url: str = ""
    port: int = 0
    _turns: int = 0
    _loop: Optional[asyncio.AbstractEventLoop] = None
    _thread: Optional[threading.Thread] = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def start(cls, url: str) -> "CountingProxy":
        parts = urlsplit(url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 0
        p = cls(host, port)
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            p._loop = loop
            server = loop.run_until_complete(asyncio.start_server(p._serve, "127.0.0.1", 0))
            p.port = server.sockets[0].getsockname()[1]
            ready.set()
            loop.run_forever()
            server.close()
            tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for t in tasks:
                t.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.close()

        p._thread = threading.Thread(target=run, name="e2e-wire-proxy", daemon=True)
        p._thread.start()
        ready.wait(10)
        netloc = parts.netloc.rsplit(":", 1)[0] if parts.port else parts.netloc
        p.url = urlunsplit((parts.scheme, f"{netloc}:{p.port}", parts.path, parts.query, parts.fragment))
        return p

    def turns(self) -> int:
        with self._lock:
            return self._turns

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    async def _serve(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            sr, sw = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            cw.close()
            return
        state = {"server_spoke": True}

        async def pump(r: asyncio.StreamReader, w: asyncio.StreamWriter, from_client: bool) -> None:
            try:
                while True:
                    data = await r.read(1 << 16)
                    if not data:
                        break
                    if from_client and state["server_spoke"]:
                        with self._lock:
                            self._turns += 1
                        state["server_spoke"] = False
                    elif not from_client:
                        state["server_spoke"] = True
                    w.write(data)
                    await w.drain()
            except (OSError, ConnectionError):
                pass
            finally:
                w.close()

        await asyncio.gather(pump(cr, sw, True), pump(sr, cw, False))
