"""spec/vectors/intent through the Python binding (spec/KEYS.md §3.6)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict

import pytest

import idempo
from idempo._idempo import intent_decide_send, intent_request_fingerprint

VECTORS = Path(__file__).resolve().parents[3] / "spec" / "vectors" / "intent"


def cases(name: str) -> Any:
    doc = json.loads((VECTORS / name).read_text())
    assert doc["cases"]
    return doc["cases"]


def fp(r: Dict[str, Any]) -> str:
    return intent_request_fingerprint(r["method"], r["target"], r["content_type"], r["body"].encode())


@pytest.mark.parametrize("case", cases("fingerprint.json"), ids=lambda c: c["name"])
def test_fingerprint(case: Dict[str, Any]) -> None:
    if "error" in case:
        with pytest.raises(idempo.CanonicalizationError) as info:
            fp(case["a"])
        assert info.value.code == case["error"]  # type: ignore[attr-defined]
        return
    assert (fp(case["a"]) == fp(case["b"])) is case["same"]


@pytest.mark.parametrize("case", cases("send.json"), ids=lambda c: c["name"])
def test_send(case: Dict[str, Any]) -> None:
    p = case["pending"]
    pending = None if p is None else (p["key"], p["fingerprint"], p["created_ms"])
    if "error" in case:
        with pytest.raises(idempo.InvalidArgument) as info:
            intent_decide_send(pending, case["request"], case["explicit_key"])
        assert info.value.code == case["error"]  # type: ignore[attr-defined]
        return
    assert intent_decide_send(pending, case["request"], case["explicit_key"]) == case["expect"]


@pytest.mark.parametrize("case", cases("settle.json"), ids=lambda c: c["name"])
def test_settle(case: Dict[str, Any]) -> None:
    o = case["outcome"]
    outcome = o["status"] if o["kind"] == "response" else o["kind"]
    advice = idempo.RetryPolicy().decide(
        case["attempt"], case["elapsed_ms"], outcome, 0.5, retry_after_ms=o.get("retry_after_ms")
    )
    assert not advice.retry
    assert advice.reason == case["reason"]
    assert advice.status == case.get("status")
    assert advice.settles_intent is case["settles_intent"]
