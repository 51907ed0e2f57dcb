"""The production topologies of the evidence suite, started by scripts/test-services.sh: PgBouncer
(transaction mode) in front of PostgreSQL, a PostgreSQL primary with a synchronous streaming
standby, and a Redis Cluster of three primaries with a replica each; plus the faults the
topology rows inject (``pg_ctl restart -m immediate``, a promotion, ``kill -9`` of a cluster
primary)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from evidence.lib.services import SERVICES, _as_pg, _pg_bindir


def _run(verb: str, d: Path, timeout: float = 180, extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    out = subprocess.run(["bash", str(SERVICES), verb, str(d)], capture_output=True, text=True,
                         check=False, timeout=timeout, env={**os.environ, **(extra or {})})
    if out.returncode != 0:
        raise RuntimeError(f"test-services {verb} failed: {out.stderr.strip()}")
    env: Dict[str, str] = {}
    for line in out.stdout.splitlines():
        k, _, v = line.partition("=")
        if v:
            env[k] = v
    return env


def _stop(d: Path) -> None:
    subprocess.run(["bash", str(SERVICES), "stop", str(d)], capture_output=True, check=False, timeout=120)
    shutil.rmtree(d, ignore_errors=True)


@dataclass
class Bouncer:
    """PostgreSQL with PgBouncer in transaction mode in front (``test-services.sh start``; the
    same call also starts Redis and the three-primary cluster, unused here). ``login_retry``:
    PgBouncer's ``server_login_retry`` in seconds (None: its default, 15 s)."""

    dir: Path
    env: Dict[str, str]
    login_retry: Optional[int] = None

    @classmethod
    def start(cls, login_retry: Optional[int] = None) -> "Bouncer":
        d = Path(tempfile.mkdtemp(prefix="idempo-evidence-bouncer."))
        extra = {"IDEMPO_PGBOUNCER_LOGIN_RETRY": str(login_retry)} if login_retry is not None else {}
        try:
            return cls(d, _run("start", d, extra=extra), login_retry)
        except BaseException:
            _stop(d)
            raise

    @property
    def direct_dsn(self) -> str:
        return self.env["IDEMPO_TEST_PG_DSN"]

    @property
    def dsn(self) -> str:
        """The DSN the apps use: PgBouncer's."""
        return self.env["IDEMPO_TEST_PGBOUNCER_DSN"]

    def pg_restart(self) -> float:
        """``pg_ctl restart -m immediate`` of the server behind PgBouncer (a crash and restart:
        every server connection breaks); returns the seconds it took."""
        f = self.dir / "pgdata"
        data = f.read_text().strip() if f.exists() else str(self.dir / "pg")
        t0 = time.monotonic()
        subprocess.run(
            _as_pg([f"{_pg_bindir()}/pg_ctl", "-D", data, "-l", f"{data}/server.log", "-m", "immediate",
                    "-w", "-t", "60", "restart"]),
            capture_output=True, check=True, timeout=120,
        )
        return time.monotonic() - t0

    def stop(self) -> None:
        _stop(self.dir)


@dataclass
class Pair:
    """A PostgreSQL primary with a synchronous streaming standby (``start-pair``); the apps use
    the multi-host DSN (``target_session_attrs=read-write``)."""

    dir: Path
    env: Dict[str, str]

    @classmethod
    def start(cls) -> "Pair":
        d = Path(tempfile.mkdtemp(prefix="idempo-evidence-pair."))
        try:
            return cls(d, _run("start-pair", d))
        except BaseException:
            _stop(d)
            raise

    @property
    def primary_dsn(self) -> str:
        return self.env["IDEMPO_TEST_PG_PRIMARY_DSN"]

    @property
    def dsn(self) -> str:
        return self.env["IDEMPO_TEST_PG_MULTIHOST_DSN"]

    def promote(self) -> float:
        """Stops the primary at once and promotes the standby (``test-services.sh promote``);
        returns the seconds until the standby is promoted."""
        t0 = time.monotonic()
        _run("promote", self.dir, timeout=120)
        return time.monotonic() - t0

    def stop(self) -> None:
        _stop(self.dir)


def _cli(port: int, *args: str) -> str:
    return subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(port), *args], capture_output=True,
                          text=True, check=False, timeout=10).stdout


@dataclass
class ClusterWithReplicas:
    """A Redis Cluster of three primaries with a replica each (``start-cluster-replicas``,
    cluster-node-timeout 2000 ms)."""

    dir: Path
    ports: List[int]

    @classmethod
    def start(cls) -> "ClusterWithReplicas":
        d = Path(tempfile.mkdtemp(prefix="idempo-evidence-cluster."))
        try:
            env = _run("start-cluster-replicas", d)
        except BaseException:
            _stop(d)
            raise
        ports = [int(n.rsplit(":", 1)[1]) for n in env["IDEMPO_TEST_REDIS_CLUSTER_NODES"].split(",")]
        return cls(d, ports)

    def nodes(self, via: int) -> List[Tuple[str, int, str, str, str]]:
        """(id, port, role, primary id, slots) of every node as ``via`` sees it; role ``master``,
        ``slave`` or ``fail`` (a node flagged as failed)."""
        out = []
        for line in _cli(via, "cluster", "nodes").splitlines():
            parts = line.split()
            if len(parts) < 8:
                continue
            port = int(parts[1].split("@")[0].rsplit(":", 1)[1])
            flags = parts[2].split(",")
            role = "fail" if "fail" in flags else ("master" if "master" in flags else "slave")
            out.append((parts[0], port, role, parts[3], " ".join(parts[8:])))
        return out

    def live_view(self) -> List[Tuple[str, int, str, str, str]]:
        """The cluster as the first node that answers sees it."""
        for port in self.ports:
            nodes = self.nodes(port)
            if nodes:
                return nodes
        raise RuntimeError("no Redis Cluster node answers")

    def seed(self) -> int:
        """The node the apps are given (they discover the others): a replica. (A RuntimeError,
        never StopIteration: this runs in asyncio.to_thread.)"""
        for _, p, role, _, _ in self.live_view():
            if role == "slave":
                return p
        raise RuntimeError("the Redis Cluster has no replica left")

    def kill_primary(self, spare: int) -> Tuple[int, float]:
        """``kill -9`` of a primary that has a live replica (never ``spare``, the apps' seed
        node); waits until the cluster flags it failed and is ``cluster_state:ok`` again (a
        replica owns its slots). Returns (killed port, seconds until then)."""
        nodes = self.nodes(spare)
        with_replica = {pid for _, _, role, pid, _ in nodes if role == "slave"}
        spare_primary = next((pid for _, p, _, pid, _ in nodes if p == spare), "")
        found = [(p, slots) for nid, p, role, _, slots in nodes
                 if role == "master" and slots and nid in with_replica and p != spare and nid != spare_primary]
        if not found:
            raise RuntimeError("no primary with a live replica left to kill")
        victim, owned = found[0]
        pid = int((self.dir / "redis-cluster" / f"{victim}.pid").read_text())
        t0 = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        until = t0 + 60
        while time.monotonic() < until:
            now = self.nodes(spare)
            if any(p != victim and role == "master" and slots == owned for _, p, role, _, slots in now) and \
                    "cluster_state:ok" in _cli(spare, "cluster", "info"):
                return victim, time.monotonic() - t0
            time.sleep(0.05)
        raise RuntimeError(f"no replica took over from {victim} within 60 s")

    def stop(self) -> None:
        _stop(self.dir)
