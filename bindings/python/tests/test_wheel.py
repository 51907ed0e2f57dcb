"""A wheel that installs without Rust: the abi3 wheel goes into a fresh virtualenv whose PATH has
no cargo or rustc, and serves a keyed request (then its replay) over a real socket.

The wheel is ``dist/``'s (``make dist``: manylinux2014, linked with zig) when there is one, else
one built here by maturin from the release build ``make python-setup`` already made (a second or
so: cargo finds nothing to compile; maturin's compliance check picks the tag the extension's
symbols allow). The sdist is checked to carry core's sources, so building from it compiles.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
import venv
from pathlib import Path
from typing import Dict, Iterator

import pytest

from conftest import REPO

PACKAGE = REPO / "bindings" / "python"

SERVE = textwrap.dedent(
    """
    import http.client, json, threading
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    import idempo
    from idempo.stores import MemoryStore
    from idempo.wsgi import IdempotencyMiddleware

    runs = []

    def app(environ, start_response):
        runs.append(environ["wsgi.input"].read())
        start_response("201 Created", [("Content-Type", "application/json")])
        return [json.dumps({"n": len(runs)}).encode()]

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args):
            pass

    server = make_server("127.0.0.1", 0, IdempotencyMiddleware(app, store=MemoryStore()),
                         handler_class=Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    answers = []
    for _ in range(2):
        conn = http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=10)
        conn.request("POST", "/pay", body=b'{"amount": 1}', headers={
            "Idempotency-Key": "wheel-key-0001", "Content-Type": "application/json"})
        r = conn.getresponse()
        answers.append([r.status, r.read().decode(), r.getheader("Idempotent-Replayed")])
        conn.close()
    server.shutdown()
    print(json.dumps({"answers": answers, "runs": len(runs), "module": idempo._idempo.__file__}))
    """
)


def _maturin() -> Path:
    found = Path(sys.executable).parent / "maturin"
    if not found.exists():
        pytest.fail("maturin is not installed in this virtualenv (make python-setup installs it)")
    return found


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dict[str, Path]]:
    """{"wheel": ..., "sdist": ...}: dist/'s, else built into a temporary folder."""
    made = REPO / "dist"
    wheels = sorted(made.glob("idempo-*-abi3-*.whl")) if made.is_dir() else []
    sdists = sorted(made.glob("idempo-*.tar.gz")) if made.is_dir() else []
    if wheels and sdists:
        yield {"wheel": wheels[-1], "sdist": sdists[-1]}
        return
    out = tmp_path_factory.mktemp("dist")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for args in (["build", "--release", "-o", str(out)], ["sdist", "-o", str(out)]):
        proc = subprocess.run([str(_maturin()), *args], cwd=PACKAGE, env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    yield {"wheel": next(out.glob("idempo-*.whl")), "sdist": next(out.glob("idempo-*.tar.gz"))}


def _no_rust_path() -> str:
    """PATH without any folder that holds cargo or rustc."""
    keep = [d for d in ("/usr/local/bin", "/usr/bin", "/bin")
            if not (Path(d, "cargo").exists() or Path(d, "rustc").exists())]
    return os.pathsep.join(keep)


def test_the_wheel_is_abi3_and_manylinux(dist: Dict[str, Path]) -> None:
    name = dist["wheel"].name
    assert "-cp39-abi3-" in name, name
    assert "manylinux" in name, f"{name}: not a manylinux wheel (maturin's compliance check)"


def test_the_wheel_installs_without_rust_and_serves_a_request(
    dist: Dict[str, Path], tmp_path: Path
) -> None:
    env_dir = tmp_path / "fresh"
    venv.EnvBuilder(with_pip=False, clear=True).create(env_dir)
    py = env_dir / "bin" / "python"
    path = f"{env_dir / 'bin'}{os.pathsep}{_no_rust_path()}"
    assert shutil.which("cargo", path=path) is None and shutil.which("rustc", path=path) is None
    env = {"PATH": path, "HOME": str(tmp_path), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    # This virtualenv's pip installs into the fresh one (``--python``): no ensurepip round.
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-index",
         "--no-deps", str(dist["wheel"])],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    proc = subprocess.run([str(py), "-c", SERVE], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    import json

    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["runs"] == 1
    (s1, b1, r1), (s2, b2, r2) = out["answers"]
    assert s1 == s2 == 201 and b1 == b2 and r1 is None and r2 == "true"
    assert str(out["module"]).startswith(str(env_dir)), out["module"]


def test_the_sdist_carries_the_sources_it_compiles(dist: Dict[str, Path]) -> None:
    with tarfile.open(dist["sdist"]) as tar:
        names = tar.getnames()
    root = names[0].split("/", 1)[0]
    for needed in ("pyproject.toml", "Cargo.toml", "core/src/lib.rs",
                   "bindings/python/src/lib.rs", "python/idempo/__init__.py"):
        assert f"{root}/{needed}" in names, needed
    assert not [n for n in names if n.endswith(".so")]


def test_the_readme_names_every_install_extra() -> None:
    """The README's extras table and pyproject.toml's optional-dependencies agree."""
    import re
    import tomllib

    extras = set(tomllib.loads((PACKAGE / "pyproject.toml").read_text())["project"]
                 ["optional-dependencies"]) - {"test"}
    readme = (PACKAGE / "README.md").read_text()
    table = readme.split("### Install extras", 1)[1].split("\n### ", 1)[0]
    named = set(re.findall(r"^\| `([a-z]+)` \|", table, flags=re.M))
    assert named == extras
