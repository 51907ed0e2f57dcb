"""A minimal asyncio HTTP/1.1 client with a keep-alive pool, for loopback load and fault tests.

It exists because the suites fire hundreds of concurrent requests and need exact control: raw
header bytes (hostile keys), streamed bodies, and a clear distinction between an answer and a
connection that died (a killed worker).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Dict, List, Optional, Sequence, Tuple, Union


class ConnectionDied(Exception):
    """The connection closed or reset before a full response arrived."""


@dataclass
class Reply:
    """One HTTP response."""

    status: int
    headers: Dict[str, str]
    body: bytes
    elapsed: float = 0.0

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def replayed(self) -> bool:
        return self.headers.get("idempotent-replayed") == "true"

    @property
    def problem_type(self) -> str:
        if not self.headers.get("content-type", "").startswith("application/problem+json"):
            return ""
        try:
            return str(self.json().get("type", ""))
        except ValueError:
            return ""


HeaderList = Sequence[Tuple[Union[str, bytes], Union[str, bytes]]]


def _b(v: Union[str, bytes]) -> bytes:
    return v if isinstance(v, bytes) else v.encode("latin-1")


@dataclass
class Client:
    """A pool of keep-alive connections to one loopback host:port."""

    host: str
    port: int
    timeout: float = 30.0
    max_idle: int = 512
    _idle: List[Tuple[asyncio.StreamReader, asyncio.StreamWriter]] = field(default_factory=list)

    async def _open(self) -> Tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._idle:
            return self._idle.pop()
        return await asyncio.open_connection(self.host, self.port, limit=1 << 22)

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for _, w in idle:
            w.close()
        for _, w in idle:
            try:
                await w.wait_closed()
            except (OSError, ConnectionError):
                pass

    async def request(
        self,
        method: str,
        path: str,
        *,
        headers: Optional[HeaderList] = None,
        body: Union[bytes, AsyncIterator[bytes], None] = None,
        body_length: Optional[int] = None,
        fresh: bool = False,
        timeout: Optional[float] = None,
    ) -> Reply:
        """Sends one request; raises :class:`ConnectionDied` if no complete answer came back.

        ``body`` may be an async iterator of chunks (sent with ``body_length`` as Content-Length);
        the send stops quietly if the server answers and closes early (e.g. 413)."""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        try:
            return await asyncio.wait_for(
                self._request(method, path, headers or [], body, body_length, fresh, t0),
                timeout or self.timeout,
            )
        except (ConnectionError, OSError, asyncio.IncompleteReadError) as exc:
            raise ConnectionDied(f"{type(exc).__name__}: {exc}") from exc

    async def _request(
        self,
        method: str,
        path: str,
        headers: HeaderList,
        body: Union[bytes, AsyncIterator[bytes], None],
        body_length: Optional[int],
        fresh: bool,
        t0: float,
    ) -> Reply:
        reader, writer = (
            await asyncio.open_connection(self.host, self.port, limit=1 << 22)
            if fresh
            else await self._open()
        )
        ok = False
        try:
            head = [f"{method} {path} HTTP/1.1".encode(), f"host: {self.host}:{self.port}".encode()]
            for n, v in headers:
                head.append(_b(n) + b": " + _b(v))
            if isinstance(body, (bytes, bytearray)):
                head.append(f"content-length: {len(body)}".encode())
            elif body is not None:
                assert body_length is not None
                head.append(f"content-length: {body_length}".encode())
            writer.write(b"\r\n".join(head) + b"\r\n\r\n")
            sender: Optional["asyncio.Task[None]"] = None
            if isinstance(body, (bytes, bytearray)):
                writer.write(body)
                await writer.drain()
            elif body is not None:
                sender = asyncio.ensure_future(_pump(writer, body))
            else:
                await writer.drain()
            try:
                reply = await _read_response(reader, method)
            finally:
                if sender is not None:
                    sender.cancel()
                    try:
                        await sender
                    except (asyncio.CancelledError, ConnectionError, OSError):
                        pass
            reply.elapsed = asyncio.get_running_loop().time() - t0
            keep = reply.headers.get("connection", "").lower() != "close" and sender is None
            ok = keep and not fresh and len(self._idle) < self.max_idle
            return reply
        finally:
            if ok:
                self._idle.append((reader, writer))
            else:
                writer.close()


async def _pump(writer: asyncio.StreamWriter, chunks: AsyncIterator[bytes]) -> None:
    try:
        async for chunk in chunks:
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, OSError):
        return


async def _read_response(reader: asyncio.StreamReader, method: str) -> Reply:
    while True:
        status_line = await reader.readuntil(b"\r\n")
        if not status_line.strip():
            raise ConnectionDied("empty status line")
        parts = status_line.decode("latin-1").split(" ", 2)
        status = int(parts[1])
        headers: Dict[str, str] = {}
        while True:
            line = await reader.readuntil(b"\r\n")
            if line == b"\r\n":
                break
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if 100 <= status < 200:
            continue
        break
    if method == "HEAD" or status in (204, 304):
        return Reply(status, headers, b"")
    if headers.get("transfer-encoding", "").lower() == "chunked":
        out = bytearray()
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":
                    pass
                break
            out += await reader.readexactly(size)
            await reader.readexactly(2)
        return Reply(status, headers, bytes(out))
    if "content-length" in headers:
        return Reply(status, headers, await reader.readexactly(int(headers["content-length"])))
    return Reply(status, headers, await reader.read())
