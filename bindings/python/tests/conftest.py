"""Shared fixtures: throwaway PostgreSQL and Redis servers, and every store variant.

The servers come from ``scripts/test-services.sh`` (once per session). Tests that need them are
skipped only when ``IDEMPO_SKIP_SERVICES=1``; otherwise a failure to start them fails the run.
If ``IDEMPO_TEST_PG_DSN`` and ``IDEMPO_TEST_REDIS_URL`` are already set, those servers are used.
"""

from __future__ import annotations

import os
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


@pytest.fixture(scope="session")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    if os.environ.get("IDEMPO_SKIP_SERVICES") == "1":
        pytest.skip("IDEMPO_SKIP_SERVICES=1: PostgreSQL/Redis tests skipped")
    dsn = os.environ.get("IDEMPO_TEST_PG_DSN")
    url = os.environ.get("IDEMPO_TEST_REDIS_URL")
    if dsn and url:
        yield Services(dsn, url)
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
        yield Services(env["IDEMPO_TEST_PG_DSN"], env["IDEMPO_TEST_REDIS_URL"])
    finally:
        subprocess.run(["bash", str(script), "stop", str(work)], capture_output=True, timeout=60)
