"""Shared fixtures: throwaway PostgreSQL, PgBouncer and Redis servers, and every store variant.

The servers come from ``scripts/test-services.sh`` (once per session). Tests that need them are
skipped only when ``IDEMPO_SKIP_SERVICES=1``; otherwise a failure to start them fails the run.
If ``IDEMPO_TEST_PG_DSN``, ``IDEMPO_TEST_PGBOUNCER_DSN``, ``IDEMPO_TEST_REDIS_URL`` and
``IDEMPO_TEST_REDIS_CLUSTER_NODES`` are already set, those servers are used (PgBouncer runs in
transaction pooling mode in front of PostgreSQL; the Redis Cluster has three primaries).
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parents[3]
VECTORS = REPO / "spec" / "vectors"


@dataclass(frozen=True)
class Services:
    pg_dsn: str
    redis_url: str
    pgbouncer_dsn: str
    """PgBouncer in transaction pooling mode in front of ``pg_dsn``'s server."""
    redis_cluster_nodes: str
    """A three-primary Redis Cluster: its nodes as ``host:port,host:port,host:port``."""


@pytest.fixture(scope="session")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    if os.environ.get("IDEMPO_SKIP_SERVICES") == "1":
        pytest.skip("IDEMPO_SKIP_SERVICES=1: PostgreSQL/Redis tests skipped")
    dsn = os.environ.get("IDEMPO_TEST_PG_DSN")
    url = os.environ.get("IDEMPO_TEST_REDIS_URL")
    bouncer = os.environ.get("IDEMPO_TEST_PGBOUNCER_DSN")
    cluster = os.environ.get("IDEMPO_TEST_REDIS_CLUSTER_NODES")
    if dsn and url and bouncer and cluster:
        yield Services(dsn, url, bouncer, cluster)
        return
    work = tmp_path_factory.mktemp("services")
    script = REPO / "scripts" / "test-services.sh"
    proc = subprocess.run(
        ["bash", str(script), "start", str(work)], capture_output=True, text=True, timeout=120
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"could not start PostgreSQL/Redis (set IDEMPO_SKIP_SERVICES=1 to skip those tests):\n"
            f"{proc.stdout}{proc.stderr}"
        )
    env = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    try:
        yield Services(
            env["IDEMPO_TEST_PG_DSN"],
            env["IDEMPO_TEST_REDIS_URL"],
            env["IDEMPO_TEST_PGBOUNCER_DSN"],
            env["IDEMPO_TEST_REDIS_CLUSTER_NODES"],
        )
    finally:
        subprocess.run(["bash", str(script), "stop", str(work)], capture_output=True, timeout=60)


@dataclass(frozen=True)
class PgServer:
    """A PostgreSQL server of the test's own (fault tests stop and restart it)."""

    dsn: str
    data: Path

    def _pg(self, *args: str) -> None:
        bindir = Path(
            sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name))[-1]
        )
        cmd = [str(bindir / args[0]), *args[1:]]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, timeout=60)

    def pids(self) -> list[int]:
        """The postmaster and all its children."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        out = subprocess.run(
            ["pgrep", "-P", str(postmaster)], capture_output=True, text=True, check=False
        ).stdout
        return [postmaster, *(int(p) for p in out.split())]

    def freeze(self) -> list[int]:
        """SIGSTOPs every server process: the kernel still ACKs TCP, nothing answers."""
        pids = self.pids()
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        return pids

    def thaw(self, pids: list[int]) -> None:
        for pid in reversed(pids):
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def restart(self) -> None:
        """``pg_ctl restart`` (fast mode): every existing connection is terminated."""
        self._pg("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "-m", "fast", "restart",
                 "-l", str(self.data / "server.log"))


@pytest.fixture(scope="module")
def own_pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgServer]:
    """A throwaway PostgreSQL server for this module alone (never the shared one)."""
    if os.environ.get("IDEMPO_SKIP_SERVICES") == "1":
        pytest.skip("IDEMPO_SKIP_SERVICES=1: PostgreSQL tests skipped")
    work = tmp_path_factory.mktemp("own-pg")
    script = REPO / "scripts" / "test-services.sh"
    proc = subprocess.run(
        ["bash", str(script), "start", str(work)], capture_output=True, text=True, timeout=120
    )
    if proc.returncode != 0:
        raise RuntimeError(f"could not start PostgreSQL:\n{proc.stdout}{proc.stderr}")
    env = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    pgdata = work / "pgdata"
    data = Path(pgdata.read_text().strip()) if pgdata.exists() else work / "pg"
    server = PgServer(env["IDEMPO_TEST_PG_DSN"], data)
    try:
        yield server
    finally:
        try:
            server.thaw(server.pids())
        except (OSError, ValueError):
            pass
        subprocess.run(["bash", str(script), "stop", str(work)], capture_output=True, timeout=60)
