"""The README's FastAPI and Starlette examples (issue 13): the files in ``bindings/python/examples``
are what the READMEs show, word for word; ``mypy --strict`` passes on them; and they serve."""

from __future__ import annotations

import asyncio
import re
import runpy
import subprocess
import sys
from pathlib import Path
from typing import List

import httpx
import pytest

from conftest import REPO

EXAMPLES = REPO / "bindings" / "python" / "examples"
FASTAPI = EXAMPLES / "fastapi_payments.py"
STARLETTE = EXAMPLES / "starlette_payments.py"
READMES = {
    REPO / "README.md": [FASTAPI],
    REPO / "bindings" / "python" / "README.md": [FASTAPI, STARLETTE],
}


def python_blocks(readme: Path) -> List[str]:
    return [m.group(1) for m in re.finditer(r"```python\n(.*?)```", readme.read_text(), re.S)]


@pytest.mark.parametrize("readme", list(READMES), ids=lambda p: str(p.relative_to(REPO)))
def test_the_readme_shows_the_example_files_verbatim(readme: Path) -> None:
    blocks = python_blocks(readme)
    for example in READMES[readme]:
        assert example.read_text() in blocks, f"{readme}: no ```python block equal to {example.name}"
    # The first Python example of each README is the FastAPI dependency one.
    assert blocks[0] == FASTAPI.read_text()


def test_mypy_strict_passes_on_the_examples() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", str(EXAMPLES)],
        capture_output=True, text=True, cwd=REPO / "bindings" / "python", check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("example", [FASTAPI, STARLETTE], ids=lambda p: p.name)
def test_the_examples_serve_one_charge_per_key_and_tenant(
        example: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the examples' SQLite file ("idempo.sqlite3") goes here
    app = runpy.run_path(str(example))["app"]

    async def main() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as c:
            body = {"account": "acct_1", "amount": 500}
            key = {"Idempotency-Key": "3f6c1e0a-77c4-4b2e"}
            a = {**key, "authorization": "Bearer sk_test_tenant_a"}
            b = {**key, "authorization": "Bearer sk_test_tenant_b"}
            first = await c.post("/payments", json=body, headers=a)
            assert first.status_code == 201, first.text
            replay = await c.post("/payments", json=body, headers=a)
            assert replay.headers["idempotent-replayed"] == "true"
            assert replay.json() == first.json()
            other = await c.post("/payments", json=body, headers=b)
            assert other.status_code == 201 and "idempotent-replayed" not in other.headers
            assert other.json()["charge_key"] != first.json()["charge_key"]
            anonymous = await c.post("/payments", json=body, headers=key)
            assert anonymous.status_code in (401, 500)  # FastAPI's 401 / scope-unresolved
            assert "idempotent-replayed" not in anonymous.headers

    asyncio.run(main())
