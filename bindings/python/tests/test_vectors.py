"""The shared vectors in spec/vectors/, run through the Python package, byte for byte."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Dict, List

import pytest
from conftest import VECTORS

import idempo


def cases(kind: str, name: str) -> List[Dict[str, Any]]:
    data = json.loads((VECTORS / kind / name).read_text(encoding="utf-8"))
    found: List[Dict[str, Any]] = data["cases"]
    assert found, f"{kind}/{name} has no cases"
    return found


def ids(items: List[Dict[str, Any]]) -> List[str]:
    return [c["name"] for c in items]


def raw_input(case: Dict[str, Any]) -> bytes:
    if "input_hex" in case:
        return bytes.fromhex(case["input_hex"])
    return case["input"].encode("utf-8")


KEY_PARSE = cases("key", "parse.json")


@pytest.mark.parametrize("case", KEY_PARSE, ids=ids(KEY_PARSE))
def test_key_parse(case: Dict[str, Any]) -> None:
    opts = case["options"]
    expect = case["expect"]
    kwargs = {"strict": opts["strict"], "min_len": opts["min_len"], "max_len": opts["max_len"]}
    if "error" in expect:
        with pytest.raises(idempo.InvalidKey) as exc:
            idempo.parse_key_details(raw_input(case), **kwargs)
        assert exc.value.code == expect["error"]
        if "offset" in expect:
            assert exc.value.offset == expect["offset"]
        assert isinstance(exc.value, idempo.IdempotencyError)
    else:
        key, form, params, header = idempo.parse_key_details(raw_input(case), **kwargs)
        assert key == expect["key"]
        assert form == expect["form"]
        assert params == expect["ignored_parameters"]
        assert header == expect["header_value"]
        assert idempo.parse_key(raw_input(case), **kwargs) == key
        assert idempo.key_header_value(key) == header


KEY_OPTIONS = cases("key", "options.json")


@pytest.mark.parametrize("case", KEY_OPTIONS, ids=ids(KEY_OPTIONS))
def test_key_options(case: Dict[str, Any]) -> None:
    value = "\"" + "k" * max(case["min_len"], 1) + "\""
    if case["expect"] == "ok":
        assert idempo.parse_key(value, min_len=case["min_len"], max_len=case["max_len"])
    else:
        with pytest.raises(idempo.InvalidArgument) as exc:
            idempo.parse_key(value, min_len=case["min_len"], max_len=case["max_len"])
        assert exc.value.code == case["expect"]


KEY_GENERATE = cases("key", "generate.json")


@pytest.mark.parametrize("case", KEY_GENERATE, ids=ids(KEY_GENERATE))
def test_key_generate(case: Dict[str, Any]) -> None:
    assert idempo.generate_key(bytes.fromhex(case["entropy_hex"])) == case["key"]


def test_generate_key_uses_fresh_entropy() -> None:
    keys = {idempo.generate_key() for _ in range(200)}
    assert len(keys) == 200
    for k in keys:
        assert idempo.parse_key(k, strict=False) == k and len(k) == 36
    with pytest.raises(idempo.InvalidArgument):
        idempo.generate_key(b"short")


SCOPE = cases("scope", "scope.json")


@pytest.mark.parametrize("case", SCOPE, ids=ids(SCOPE))
def test_scope(case: Dict[str, Any]) -> None:
    sid = idempo.scope_id(case["principal"], case["method"], case["route"], case["key"])
    assert sid.hex() == case["scope_hex"]


RETRY_CONFIG = cases("retry", "config.json")


def policy(spec: Dict[str, Any]) -> idempo.RetryPolicy:
    return idempo.RetryPolicy(**spec)


@pytest.mark.parametrize("case", RETRY_CONFIG, ids=ids(RETRY_CONFIG))
def test_retry_config(case: Dict[str, Any]) -> None:
    if case["expect"] == "ok":
        assert policy(case["policy"]).max_attempts == case["policy"]["max_attempts"]
    else:
        with pytest.raises(idempo.InvalidArgument) as exc:
            policy(case["policy"])
        assert exc.value.code == case["expect"]


def _retry_cases() -> List[Any]:
    data = json.loads((VECTORS / "retry" / "decide.json").read_text(encoding="utf-8"))
    out = []
    for group in data["groups"]:
        for case in group["cases"]:
            out.append(pytest.param(group["policy"], case, id=f"{group['name']}/{case['name']}"))
    assert out
    return out


def _jitter(value: Any) -> float:
    if isinstance(value, str):
        return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}[value]
    return float(value)


@pytest.mark.parametrize(("spec", "case"), _retry_cases())
def test_retry_decide(spec: Dict[str, Any], case: Dict[str, Any]) -> None:
    p = policy(spec)
    outcome = case["outcome"]
    if outcome["kind"] == "response":
        args: Any = outcome["status"]
    else:
        args = outcome["kind"]
    expect = case["expect"]
    call = lambda: p.decide(  # noqa: E731
        case["attempt"],
        case["elapsed_ms"],
        args,
        _jitter(case["jitter"]),
        retry_after_ms=outcome.get("retry_after_ms"),
    )
    if "error" in expect:
        with pytest.raises(idempo.InvalidArgument) as exc:
            call()
        assert exc.value.code == expect["error"]
        return
    advice = call()
    if "retry" in expect:
        assert advice.retry and advice.delay_ms == expect["retry"]
    else:
        assert not advice.retry and advice.reason == expect["stop"]
        assert advice.status == expect.get("status")


RETRY_OUTCOME = cases("retry", "outcome.json")


@pytest.mark.parametrize("case", RETRY_OUTCOME, ids=ids(RETRY_OUTCOME))
def test_retry_outcome(case: Dict[str, Any]) -> None:
    # from_response through decide: outcome_unknown stops with that reason; any other response
    # decides exactly as its bare status (and Retry-After) does.
    p = idempo.RetryPolicy()
    status, ct, body = case["status"], case["content_type"], case["body"].encode()
    ra = case.get("retry_after_ms")
    advice = p.decide(1, 0, status, 0.5, retry_after_ms=ra, content_type=ct, body=body)
    stops = {"outcome_unknown": "outcome_unknown", "key_reused": "key_reused_with_different_request",
             "response_not_retained": "response_not_retained"}
    if case["expect"] in stops:
        assert idempo.response_body_needed(status, ct)
        assert not advice.retry and advice.reason == stops[case["expect"]]
    elif case["expect"] == "in_flight":
        assert idempo.response_body_needed(status, ct)
        bare = p.decide(1, 0, "in_flight", 0.5, retry_after_ms=ra)
        assert bare.retry and (advice.retry, advice.delay_ms) == (True, bare.delay_ms)
    else:
        assert case["expect"] == "response", case["name"]
        bare = p.decide(1, 0, status, 0.5, retry_after_ms=ra)
        assert (advice.retry, advice.delay_ms, advice.reason, advice.status) == (
            bare.retry, bare.delay_ms, bare.reason, bare.status)


RETRY_AFTER = cases("retry", "retry_after.json")


@pytest.mark.parametrize("case", RETRY_AFTER, ids=ids(RETRY_AFTER))
def test_retry_after(case: Dict[str, Any]) -> None:
    assert idempo.parse_retry_after(case["value"], case["now_ms"]) == case["expect_ms"]


def test_vectors_dir_is_the_shared_one() -> None:
    assert (VECTORS / "key" / "parse.json").is_file()
    assert Path(__file__).resolve().parents[2].name == "bindings"


def _canonical_cases() -> List[Any]:
    out = []
    for path in sorted((VECTORS / "canonical").glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        for case in data["cases"]:
            out.append(pytest.param(case, id=f"{path.stem}/{case['name']}"))
    assert out
    return out


@pytest.mark.parametrize("case", _canonical_cases())
def test_canonical(case: Dict[str, Any]) -> None:
    kwargs: Dict[str, Any] = {"numbers": case["mode"], **case.get("limits", {})}
    if "exclude" in case:
        kwargs["exclude"] = case["exclude"]
    data = raw_input(case)
    if "error" in case:
        with pytest.raises(idempo.CanonicalizationError) as exc:
            idempo.canonicalize(data, **kwargs)
        err = case["error"]
        assert (exc.value.code, exc.value.offset, exc.value.pointer) == (
            err["code"], err["offset"], err["pointer"])
    else:
        assert idempo.canonicalize(data, **kwargs) == case["output"].encode("utf-8")


FINGERPRINT = cases("fingerprint", "fingerprint.json")


@pytest.mark.parametrize("case", FINGERPRINT, ids=ids(FINGERPRINT))
def test_fingerprint(case: Dict[str, Any]) -> None:
    cfg = case["config"]
    req = case["request"]
    body = bytes.fromhex(req["body_hex"]) if "body_hex" in req else req["body"].encode("utf-8")
    hmac_key = bytes.fromhex(cfg["hmac_key_hex"]) if "hmac_key_hex" in cfg else None
    headers = [tuple(h) for h in req["headers"]]

    def compute() -> str:
        fp = idempo.Fingerprinter(
            header_names=cfg.get("header_names"),
            exclude=cfg.get("exclude"),
            hmac_key=hmac_key,
            numbers=cfg.get("numbers", "reject_precision_loss"),
        )
        return fp.fingerprint(req["method"], req["route"], body, headers,
                              content_type=req["content_type"])

    if "error" in case:
        err = case["error"]
        with pytest.raises((idempo.CanonicalizationError, idempo.FingerprintError,
                            idempo.InvalidArgument)) as exc:
            compute()
        assert exc.value.code == err["code"]
        if "offset" in err:
            assert exc.value.offset == err["offset"]  # type: ignore[union-attr]
            assert exc.value.pointer == err["pointer"]  # type: ignore[union-attr]
        return
    assert compute() == case["fingerprint"]
    if not cfg and not headers:
        # the one-shot function agrees with the prepared Fingerprinter
        assert idempo.fingerprint(req["method"], req["route"], body,
                                  content_type=req["content_type"]) == case["fingerprint"]
    if not cfg.get("header_names") and req["content_type"] == "application/json":
        # the route-bound hot path agrees too
        bound = idempo.Fingerprinter(
            exclude=cfg.get("exclude"),
            hmac_key=hmac_key,
            numbers=cfg.get("numbers", "reject_precision_loss"),
        ).for_route(req["method"], req["route"])
        assert bound(body) == bound.fingerprint(body) == case["fingerprint"]


def test_header_shapes_agree() -> None:
    """Headers as a list, a tuple, a generator, a dict or any object with ``items()`` frame the
    same pairs; an empty list or tuple is no headers."""
    fp = idempo.Fingerprinter(header_names=["X-Tenant", "X-Region"])
    pairs = [("x-tenant", "acme"), ("X-Region", "eu")]

    class Items:
        def items(self) -> List[Any]:
            return list(pairs)

    want = fp.fingerprint("POST", "/p", b"{}", pairs)
    for shape in (tuple(pairs), (p for p in pairs), dict(pairs), Items()):
        assert fp.fingerprint("POST", "/p", b"{}", shape) == want  # type: ignore[arg-type]
    none = fp.fingerprint("POST", "/p", b"{}")
    assert none != want
    empties: List[Any] = [[], (), {}, None]
    for empty in empties:
        assert fp.fingerprint("POST", "/p", b"{}", empty) == none
