"""Smoke test of the `make bench-e2e` harness (`make bench-e2e-smoke`, about 1.5 minutes, so not in
`make test`): quick mode prints the table with every variant in both modes, and every idempo
variant and peer passes the dedup check (one key sent twice runs the handler once; a replay
burst runs it zero times). The figures are not checked: speed is printed, never asserted."""

from __future__ import annotations

import contextlib
import io
import re

from evidence.bench.e2e import run


def test_quick_run_prints_every_variant_and_every_dedup_check_passes() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert run.main(["--quick"]) == 0
    text = out.getvalue()
    expected = run.variants(services=False)
    for v in expected:
        for mode in ("fresh", "replay"):
            row = re.search(rf"^{re.escape(v.framework)}\s+{re.escape(v.name)}\s+{mode}\s+(\d+)\s", text, re.M)
            assert row is not None, f"no {mode} row for {v.key}:\n{text}"
            assert int(row.group(1)) > 0, f"{v.key} {mode}: no request answered"
    for v in expected:
        if v.role == "bare":
            continue
        line = re.search(rf"^\s+{re.escape(v.key)}\s+(\S+)\s+handler runs during a \d+-request replay burst: (\d+)$",
                         text, re.M)
        assert line is not None, f"no dedup check line for {v.key}:\n{text}"
        assert line.group(1) == "ok" and line.group(2) == "0", f"{v.key} does not deduplicate:\n{line.group(0)}"
    assert "did not deduplicate" not in text and "left out" not in text
    assert "commits/s" in text


def test_the_dedup_check_reports_a_variant_that_runs_the_handler_twice() -> None:
    # The bare app ignores the key: posing as an idempo variant, it must be reported, not passed.
    impostor = run.Variant("FastAPI", "bare posing as idempo", "bare", "idempo", "memory")
    run.check(impostor, run.Stores(run.DATA), 1.0)
    assert impostor.dedup.startswith("FAILED: ran 2x"), impostor.dedup
    assert impostor.counts["replay"]["handler"] > 0
