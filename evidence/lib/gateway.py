"""The idempo-gateway binary (bindings/gateway) as a process of the evidence suites and of
`make bench-gateway`: a TOML configuration written to a file, a fixed loopback port (so a gateway
killed with SIGKILL restarts where its clients expect it), readiness on ``GET /healthz``, kill -9,
SIGSTOP/SIGCONT and graceful stop. Also the benchmark's Rust upstream
(bindings/gateway/examples/bench_upstream.rs).

    gw = Gateway(config_text, workdir).start()     # config_text: a TOML text with {listen}
    gw.port, gw.pid, gw.kill9(), gw.start(), gw.stop()
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, TypeVar

from evidence.lib.services import ROOT, free_port

P = TypeVar("P", bound="Proc")


def _target_dir() -> Path:
    return Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))


def binary(name: str = "idempo-gateway", example: bool = False) -> Path:
    """The built binary: ``IDEMPO_GATEWAY_BIN`` (for the gateway), else the release build, else the
    debug build. Raises when none exists (build it with ``cargo build --release -p idempo-gateway``)."""
    if name == "idempo-gateway" and os.environ.get("IDEMPO_GATEWAY_BIN"):
        return Path(os.environ["IDEMPO_GATEWAY_BIN"])
    sub = Path("examples") if example else Path()
    for profile in ("release", "debug"):
        p = _target_dir() / profile / sub / name
        if p.is_file():
            return p
    hint = f"--example {name}" if example else "--bin idempo-gateway"
    raise RuntimeError(f"{name} not built (cargo build --release -p idempo-gateway {hint})")


def http_ok(port: int, path: str) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".encode())
            return s.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


@dataclass
class Proc:
    """One server process on a fixed loopback port, logging to a file, in its own session."""

    cmd: List[str]
    port: int
    ready_path: str
    env: Optional[Dict[str, str]] = None
    proc: Optional["subprocess.Popen[bytes]"] = None
    log_path: str = ""

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def start(self: P, timeout: float = 30.0) -> P:
        if not self.log_path:
            fd, self.log_path = tempfile.mkstemp(prefix="idempo-gateway-proc.", suffix=".log")
            os.close(fd)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.cmd, cwd=ROOT, env={**os.environ, **(self.env or {})},
                                         stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.cmd[0]} exited ({self.proc.returncode}); log:\n{self.log_tail()}")
            if http_ok(self.port, self.ready_path):
                return self
            time.sleep(0.02)
        raise RuntimeError(f"{self.cmd[0]} not ready on port {self.port}; log:\n{self.log_tail()}")

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def kill9(self) -> None:
        """SIGKILL, then reap it."""
        if self.proc is not None:
            self.signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, grace: float = 10.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def close(self) -> None:
        self.stop()
        if self.log_path:
            Path(self.log_path).unlink(missing_ok=True)
            self.log_path = ""

    def log_tail(self, n: int = 3000) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")[-n:]
        except OSError:
            return ""


class Gateway(Proc):
    """``idempo-gateway serve --config FILE``; ``config`` is the TOML text with ``{listen}`` where
    the listen address goes (the port is chosen once and kept across restarts)."""

    def __init__(self, config: str, workdir: Path, port: int = 0, env: Optional[Dict[str, str]] = None) -> None:
        port = port or free_port()
        self.config_path = workdir / f"gateway-{port}.toml"
        self.config_path.write_text(config.replace("{listen}", f"127.0.0.1:{port}"))
        super().__init__([str(binary()), "serve", "--config", str(self.config_path)], port, "/healthz", env)


class BenchUpstream(Proc):
    """bindings/gateway/examples/bench_upstream.rs on a fixed port."""

    def __init__(self, port: int = 0, work_ms: float = 0.0) -> None:
        port = port or free_port()
        argv = [str(binary("bench_upstream", example=True)), str(port)]
        if work_ms:
            argv.append(f"{work_ms:g}")  # each POST waits this long before it answers
        super().__init__(argv, port, "/health")
