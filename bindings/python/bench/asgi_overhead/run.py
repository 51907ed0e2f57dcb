"""Added time per request of idempo on FastAPI, against the bare app (and the peer, when given).

Each round starts one uvicorn worker per variant pinned to cpu 0 (taskset), drives it with wrk
pinned to cpu 1 (16 connections, a fresh Idempotency-Key per request, or one key: replay), and the
variants interleave within every round so a loaded machine slows them alike. Prints req/s, p99 and
the added time per request (1/rps - 1/rps_bare, the server core being saturated), median of rounds.

    python run.py --rounds 3 --seconds 5 dep mw dep_sqlite peer
    PEER_PATH=/tmp/peer (an unpacked asgi-idempotency-header wheel) for the peer variant.
"""

import argparse
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PY = sys.executable


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start(name: str, port: int, tmp: str) -> subprocess.Popen:
    """``name`` is a variant of app.py, or ``variant@installed``: the same with the idempo
    installed in the virtualenv rather than the sources on PYTHONPATH, or ``variant@base``: with
    the sources at $IDEMPO_BASE_PYTHONPATH (a before/after run)."""
    variant, _, where = name.partition("@")
    env = dict(os.environ, IDEMPO_VARIANT=variant, IDEMPO_SQLITE=os.path.join(tmp, f"{variant}-{port}.db"))
    if where == "installed":
        env.pop("PYTHONPATH", None)
    elif where == "base":  # another checkout's sources (with its built extension)
        env["PYTHONPATH"] = os.environ["IDEMPO_BASE_PYTHONPATH"]
    if variant == "peer":
        env["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PEER_PATH", "/tmp/peer"), os.environ.get("PYTHONPATH")) if p)
    cmd = ["taskset", "-c", "0", PY, "-m", "uvicorn", "app:app", "--port", str(port),
           "--log-level", "warning", "--no-access-log", "--workers", "1"]
    proc = subprocess.Popen(cmd, cwd=HERE, env=env)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return proc
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{variant} did not start")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of the server process so far (robust to a loaded machine)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wrk(port: int, seconds: int, conns: int, mode: str, pid: int) -> tuple:
    env = dict(os.environ, KEY_MODE=mode)
    cpu0 = cpu_seconds(pid)
    out = subprocess.run(
        ["taskset", "-c", "1", "wrk", "-t1", f"-c{conns}", f"-d{seconds}s", "--latency",
         "-s", os.path.join(HERE, "fresh.lua"), f"http://127.0.0.1:{port}/payments"],
        env=env, capture_output=True, text=True, check=True).stdout
    cpu = cpu_seconds(pid) - cpu0
    done = int(re.search(r"(\d+) requests in", out).group(1))
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", out)
    scale = {"us": 1e-3, "ms": 1.0, "s": 1e3}[p99.group(2)]
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return (rps, float(p99.group(1)) * scale, int(non2xx.group(1)) if non2xx else 0,
            cpu / max(done, 1) * 1e6)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="*", default=["dep", "mw"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--conns", type=int, default=16)
    ap.add_argument("--mode", default="fresh", choices=["fresh", "replay"])
    args = ap.parse_args()
    variants = ["bare", *args.variants]
    results = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for v in variants:
                port = free_port()
                proc = start(v, port, tmp)
                try:
                    wrk(port, 1, args.conns, args.mode, proc.pid)  # warm-up
                    results[v].append(wrk(port, args.seconds, args.conns, args.mode, proc.pid))
                finally:
                    proc.send_signal(signal.SIGINT)
                    proc.wait(10)
                print(f"round {r} {v}: {results[v][-1]}", file=sys.stderr)
    bare = statistics.median(x[0] for x in results["bare"])
    bare_p99 = statistics.median(x[1] for x in results["bare"])
    print(f"mode={args.mode} conns={args.conns} rounds={args.rounds} seconds={args.seconds}")
    bare_cpu = statistics.median(x[3] for x in results["bare"])
    print(f"{'variant':20} {'req/s':>9} {'x bare':>7} {'p99 ms':>8} {'p99 x':>6} {'added us':>9}"
          f" {'cpu us/req':>10} {'added cpu us':>12} non2xx")
    for v in variants:
        rps = statistics.median(x[0] for x in results[v])
        p99 = statistics.median(x[1] for x in results[v])
        added = (1 / rps - 1 / bare) * 1e6
        bad = sum(x[2] for x in results[v])
        cpu = statistics.median(x[3] for x in results[v])
        print(f"{v:20} {rps:9.0f} {rps / bare:7.2f} {p99:8.2f} {p99 / bare_p99:6.2f} {added:9.1f}"
              f" {cpu:10.1f} {cpu - bare_cpu:12.1f} {bad}")


if __name__ == "__main__":
    main()
