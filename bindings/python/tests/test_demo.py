"""The demo is part of the proof: it must pass end to end (real server process, crash included)."""

from __future__ import annotations

import subprocess
import sys


def test_demo_passes() -> None:
    proc = subprocess.run([sys.executable, "-m", "idempo.demo"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "demo passed: every intent charged exactly once" in proc.stdout
    assert "charges made: 5" in proc.stdout
