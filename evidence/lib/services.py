"""Throwaway PostgreSQL and Redis (via scripts/test-services.sh), plus stop/start of each server
for the outage scenarios (same port, same data), and uvicorn server processes."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "scripts" / "test-services.sh"


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


def _pg_bindir() -> str:
    exe = shutil.which("pg_ctl")
    if exe:
        return os.path.dirname(os.path.realpath(exe))
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    if not found:
        raise RuntimeError("PostgreSQL binaries not found (run scripts/setup.sh)")
    return found[-1]


def _as_pg(cmd: List[str]) -> List[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.getuid() == 0 else cmd


@dataclass
class Services:
    """PostgreSQL + Redis started by scripts/test-services.sh in a temporary directory."""

    dir: Path
    pg_dsn: str
    redis_url: str

    @classmethod
    def start(cls) -> "Services":
        d = Path(tempfile.mkdtemp(prefix="idempo-evidence-svc."))
        out = subprocess.run(
            ["bash", str(SERVICES), "start", str(d)], capture_output=True, text=True, check=False
        )
        if out.returncode != 0:
            raise RuntimeError(f"test-services start failed: {out.stderr.strip()}")
        env: Dict[str, str] = {}
        for line in (d / "env").read_text().splitlines():
            k, _, v = line.partition("=")
            env[k] = v
        return cls(d, env["IDEMPO_TEST_PG_DSN"], env["IDEMPO_TEST_REDIS_URL"])

    def stop(self) -> None:
        subprocess.run(["bash", str(SERVICES), "stop", str(self.dir)], capture_output=True, check=False)
        shutil.rmtree(self.dir, ignore_errors=True)

    # --- PostgreSQL outage -------------------------------------------------------------------
    @property
    def pg_data(self) -> str:
        f = self.dir / "pgdata"
        return f.read_text().strip() if f.exists() else str(self.dir / "pg")

    @property
    def pg_port(self) -> int:
        return int((self.dir / "pg.port").read_text())

    def pg_stop(self) -> None:
        subprocess.run(
            _as_pg([f"{_pg_bindir()}/pg_ctl", "-D", self.pg_data, "-m", "immediate", "-w", "stop"]),
            capture_output=True,
            check=True,
        )

    def pg_start(self) -> None:
        opts = (
            f"-p {self.pg_port} -k {self.pg_data} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c full_page_writes=off -c max_connections=200"
        )
        subprocess.run(
            _as_pg([f"{_pg_bindir()}/pg_ctl", "-D", self.pg_data, "-l", f"{self.pg_data}/server.log",
                    "-w", "-t", "30", "-o", opts, "start"]),
            capture_output=True,
            check=True,
        )

    def pg_pids(self) -> List[int]:
        """The postmaster and its children (for SIGSTOP: a hung server)."""
        pid_file = Path(self.pg_data) / "postmaster.pid"
        master = int(pid_file.read_text().splitlines()[0])
        return [master, *children(master)]

    # --- Redis outage ------------------------------------------------------------------------
    @property
    def redis_port(self) -> int:
        return int((self.dir / "redis.port").read_text())

    def redis_stop(self) -> None:
        subprocess.run(
            ["redis-cli", "-h", "127.0.0.1", "-p", str(self.redis_port), "shutdown", "nosave"],
            capture_output=True,
            check=False,
        )
        pid_file = self.dir / "redis.pid"
        for _ in range(200):
            if not pid_file.exists():
                break
            try:
                os.kill(int(pid_file.read_text()), 0)
            except (ProcessLookupError, ValueError):
                break
            time.sleep(0.02)

    def redis_start(self) -> None:
        subprocess.run(
            ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--maxmemory-policy", "noeviction", "--daemonize", "yes",
             "--pidfile", str(self.dir / "redis.pid"), "--logfile", str(self.dir / "redis.log"),
             "--dir", str(self.dir)],
            capture_output=True,
            check=True,
        )
        for _ in range(200):
            r = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(self.redis_port), "ping"],
                               capture_output=True, text=True, check=False)
            if "PONG" in r.stdout:
                return
            time.sleep(0.02)
        raise RuntimeError("redis did not come back")


def children(pid: int) -> List[int]:
    """Direct children of a process (from /proc)."""
    out = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            text = Path(stat).read_text()
        except OSError:
            continue
        ppid = int(text[text.rindex(")") + 2:].split()[1])
        if ppid == pid:
            out.append(int(stat.split("/")[2]))
    return out


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def hwm_kib(pid: int) -> int:
    """Peak resident set (VmHWM) of a process."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


@dataclass
class Server:
    """A uvicorn server running an ASGI app in worker processes (loopback only), or with ``node``
    set, a Node script started as ``node <app> <port>`` (a ``cluster`` primary whose children are
    the workers when ``workers`` > 1; it gets ``EV_WORKERS``)."""

    app: str
    env: Dict[str, str]
    workers: int = 2
    port: int = 0
    proc: Optional[subprocess.Popen[bytes]] = None
    log_path: str = ""
    extra: List[str] = field(default_factory=list)
    node: bool = False

    def start(self, timeout: float = 60.0) -> "Server":
        self.port = free_port()
        fd, self.log_path = tempfile.mkstemp(prefix="idempo-evidence-server.", suffix=".log")
        env = {**os.environ, **self.env, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
        listener: Optional[socket.socket] = None
        if self.node:
            # Like uvicorn's supervisor: the socket is bound and listening before any worker
            # exists, and the workers inherit it (connections wait while every worker is down).
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", 0))
            listener.listen(1024)
            self.port = int(listener.getsockname()[1])
            env["EV_WORKERS"] = str(self.workers)
            env["EV_LISTEN_FD"] = str(listener.fileno())
            cmd = ["node", self.app, str(self.port), *self.extra]
        else:
            cmd = [sys.executable, "-m", "uvicorn", self.app, "--host", "127.0.0.1", "--port",
                   str(self.port), "--workers", str(self.workers), "--no-access-log",
                   "--log-level", "warning", "--timeout-graceful-shutdown", "2", *self.extra]
        try:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=fd, stderr=fd, start_new_session=True,
                                         pass_fds=(listener.fileno(),) if listener is not None else ())
        finally:
            os.close(fd)
            if listener is not None:
                listener.close()  # the server process holds its own copy
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"server exited; log:\n{Path(self.log_path).read_text()[-3000:]}")
            if len(self.worker_pids()) >= (self.workers if self.workers > 1 else 0) and self._ping():
                return
            time.sleep(0.05)
        raise RuntimeError(f"server not ready; log:\n{Path(self.log_path).read_text()[-3000:]}")

    def _ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                return s.recv(64).startswith(b"HTTP/1.1 200")
        except OSError:
            return False

    def worker_pids(self) -> List[int]:
        """Worker processes (the server process itself when it runs a single worker)."""
        if self.proc is None:
            return []
        if self.workers <= 1:
            return [self.proc.pid]
        pids = []
        for pid in children(self.proc.pid):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state == "Z":  # a killed worker not yet reaped
                continue
            if self.node or (b"multiprocessing" in cmd and b"resource_tracker" not in cmd):
                pids.append(pid)
        return pids

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # stragglers in the group (workers)
        except ProcessLookupError:
            pass
        self.proc = None
        if self.log_path:
            os.unlink(self.log_path)
            self.log_path = ""

    def last_traceback(self, n: int = 12000) -> str:
        """The last Python traceback the server logged (a violation's cause), or ``""``."""
        text = self.log_tail(200_000)
        at = text.rfind("Traceback (most recent call last)")
        return text[at:at + n] if at >= 0 else ""

    def log_tail(self, n: int = 3000) -> str:
        try:
            return Path(self.log_path).read_text()[-n:]
        except OSError:
            return ""
