"""spec/vectors/machine/: core's server flow driven through the Python binding, step by step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
from conftest import VECTORS

import idempo
from idempo._idempo import Action, Config, ServerFlow
from idempo.stores import Claimed, Existing, Locked, StoredRecord

SCRIPTS = sorted((VECTORS / "machine").glob("*.json"))


def config_of(c: Dict[str, Any]) -> Config:
    return Config(
        lease_ms=c["lease_ms"],
        heartbeat_ms=0 if c["heartbeat_ms"] is None else c["heartbeat_ms"],
        takeover=c["takeover"],
        ttl_ms=c["ttl_ms"],
        transient_statuses=c["transient_statuses"],
        store_server_errors=c["store_server_errors"],
        max_stored_body_bytes=c["max_body_bytes"],
        stored_headers=c["stored_headers"],
        in_flight_retry_after_ms=c["in_flight_retry_after_ms"],
        unavailable_retry_after_ms=c["unavailable_retry_after_ms"],
        max_store_rounds=c["max_store_rounds"],
        key_required=c.get("key_required", True),
        redact=c.get("redact", False),
        cleanup_budget_ms=c.get("cleanup_budget_ms", 30_000),
        transactional=c.get("transactional", False),
    )


def record_of(r: Optional[Dict[str, Any]], scope: bytes) -> Optional[StoredRecord]:
    if r is None:
        return None
    resp = r["response"]
    return StoredRecord(
        scope_key=scope,
        fingerprint=r["fingerprint"],
        state=r["state"],
        token=bytes.fromhex(r["token"]),
        generation=r["generation"],
        lease_until=r["lease_until_ms"],
        expires_at=r["expires_at_ms"],
        response=None if resp is None else idempo.encode_response(
            resp["status"], [tuple(h) for h in resp["headers"]], resp["body"].encode("utf-8")),
    )


def feed(flow: ServerFlow, ev: Dict[str, Any], scope: bytes) -> Action:
    t = ev["type"]
    if t == "claimed":
        return flow.store_event("claim", Claimed(ev["generation"], ev["now_ms"]))
    if t == "existing":
        rec = record_of(ev["record"], scope)
        assert rec is not None
        return flow.store_event("claim", Existing(rec, ev["now_ms"]))
    if t == "got":
        return flow.store_event("get", (record_of(ev["record"], scope), ev["now_ms"]))
    if t == "took_over":
        return flow.store_event("takeover", ev["generation"])
    ops = {"marked_unknown": "mark_unknown", "completed": "complete", "released": "release",
           "renewed": "renew"}
    if t in ops:
        return flow.store_event(ops[t], ev["applied"])
    if t == "committed":
        return flow.store_event("commit", None)
    if t == "locked":
        return flow.store_event("claim", Locked(ev["now_ms"]))
    if t == "store_failed":
        return flow.store_failed()
    if t == "handler_finished":
        bts = ev.get("body_to_store")
        return flow.handler_finished(
            ev["status"], [tuple(h) for h in ev["headers"]], ev["body"].encode("utf-8"),
            None if bts is None else bts.encode("utf-8"),
            framework=ev.get("origin", "handler") == "framework",
            body_truncated=ev.get("body_truncated", False))
    if t == "handler_failed":
        return flow.handler_failed(ev["maybe_side_effect"])
    if t == "heartbeat_due":
        return flow.heartbeat_due()
    raise AssertionError(f"unknown event {t!r}")


ARG_NAMES = {
    "claim": ["fingerprint", "token", "lease_ms", "ttl_ms"],
    "get": [],
    "takeover": ["seen_token", "new_token", "lease_ms"],
    "mark_unknown": ["seen_token", "ttl_ms"],
    "complete": ["token", "response_hex", "ttl_ms"],
    "release": ["token"],
    "renew": ["token", "lease_ms"],
    "commit": [],
}


def check(action: Action, want: Dict[str, Any], scope: bytes, where: str) -> None:
    kind = want["action"]
    assert action.kind == kind, f"{where}: {action!r} != {want}"
    if kind == "store":
        assert action.op == want["op"], where
        args = list(action.args)
        assert args[0] == scope, where
        for name, got in zip(ARG_NAMES[want["op"]], args[1:]):
            expected = want[name]
            if name.endswith("token") or name == "response_hex":
                assert got.hex() == expected, f"{where}: {name}"
            else:
                assert got == expected, f"{where}: {name}"
    elif kind == "run_handler":
        assert action.token is not None and action.token.hex() == want["token"], where
        assert action.generation == want["generation"], where
        assert action.downstream_key == want["downstream_key"], where
        assert action.heartbeat_ms == want["heartbeat_ms"], where
    elif kind == "respond":
        assert action.outcome == want["outcome"], where
        assert action.status == want["status"], where
        assert action.headers == [tuple(h) for h in want["headers"]], where
        assert action.body is not None
        if "problem" in want:
            body = json.loads(action.body)
            assert body["type"] == want["problem"]["type"], where
            assert body["status"] == want["problem"]["status"], where
            assert isinstance(body["title"], str) and isinstance(body["detail"], str)
        else:
            assert action.body == want["body"].encode("utf-8"), where
    elif kind == "propagate_error":
        assert action.outcome == want["outcome"], where


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_machine_script(path: Path) -> None:
    sc = json.loads(path.read_text(encoding="utf-8"))
    scope = bytes.fromhex(sc["scope"])
    flow, first = ServerFlow.start(
        scope, sc["fingerprint"], config_of(sc["config"]), bytes.fromhex(sc["entropy"]))
    steps: List[Dict[str, Any]] = sc["steps"]
    check(first, steps[0]["expect"], scope, "start")
    for i, step in enumerate(steps[1:], 1):
        where = f"{sc['name']} step {i} {step['event']['type']}"
        want = step["expect"]
        if "error" in want:
            with pytest.raises(idempo.InvalidArgument) as exc:
                feed(flow, step["event"], scope)
            assert exc.value.code == want["error"], where
        else:
            check(feed(flow, step["event"], scope), want, scope, where)
            if flow.finished:
                check_cleanup(flow, want.get("cleanup"), scope, where)
    for i, cs in enumerate(sc.get("cleanup_steps", [])):
        cleanup = flow.cleanup
        assert cleanup is not None, "cleanup_steps need a cleanup"
        ev = cs["event"]
        applied = None if ev["type"] == "store_failed" else ev["applied"]
        got = cleanup.next(cs["attempt"], cs["elapsed_ms"], applied)
        expected = None if cs["expect"] == "done" else cs["expect"]["retry_after_ms"]
        assert got == expected, f"{sc['name']} cleanup step {i}"


def check_cleanup(
    flow: ServerFlow, want: Optional[Dict[str, Any]], scope: bytes, where: str
) -> None:
    """A finished flow's cleanup: absent in the script means none."""
    cleanup = flow.cleanup
    if want is None:
        assert cleanup is None, f"{where}: unexpected {cleanup!r}"
        return
    assert cleanup is not None, f"{where}: no cleanup"
    assert cleanup.budget_ms == want["budget_ms"], where
    op = {k: v for k, v in want.items() if k != "budget_ms"}
    check(cleanup.action, {"action": "store", **op}, scope, where)


def test_machine_scripts_present() -> None:
    assert len(SCRIPTS) >= 10
    assert sum(p.stem.startswith("tx_") for p in SCRIPTS) >= 12
