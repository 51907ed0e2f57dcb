"""Hostile input never crashes the extension: every failure is a typed idempo exception."""

from __future__ import annotations

import random

import pytest

import idempo
from idempo._idempo import Admission, Config, ServerFlow
from idempo.stores import Claimed, Existing, StoredRecord

SEEDS = [b'{"a":[1,2.5,"x\\u00e9"],"b":{"c":null}}', b'[1e400]', b'"\xed\xa0\x80"', b"\xef\xbb\xbf{}",
         b'{"a":1,"a":2}', b"[" * 200, b'"abc', b"9007199254740993"]


def mutations(rng: random.Random, n: int) -> list[bytes]:
    out = []
    for _ in range(n):
        base = bytearray(rng.choice(SEEDS))
        for _ in range(rng.randint(0, 4)):
            op = rng.randint(0, 2)
            pos = rng.randint(0, len(base))
            if op == 0:
                base.insert(pos, rng.randint(0, 255))
            elif op == 1 and base:
                del base[min(pos, len(base) - 1)]
            elif base:
                base[min(pos, len(base) - 1)] = rng.randint(0, 255)
        out.append(bytes(base))
    out += [bytes(rng.randint(0, 255) for _ in range(rng.randint(0, 64))) for _ in range(n)]
    return out


def test_random_bodies_keys_and_responses() -> None:
    rng = random.Random(1234)
    for data in mutations(rng, 1500):
        for call in (
            lambda: idempo.canonicalize(data, numbers="reject_precision_loss"),
            lambda: idempo.fingerprint("POST", "/x", data),
            lambda: idempo.parse_key(data),
            lambda: idempo.decode_response(data),
            lambda: Admission.start(Config(), [data], len(data)),
        ):
            try:
                call()
            except idempo.IdempotencyError:
                pass


def test_wrong_argument_types_are_python_errors() -> None:
    with pytest.raises(TypeError):
        idempo.canonicalize(123)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        idempo.fingerprint("POST", "/x", b"{}", headers=[("a",)])  # type: ignore[list-item]
    with pytest.raises(idempo.InvalidArgument):
        ServerFlow.start(b"short", "v1:aa", Config(), bytes(16))
    with pytest.raises(idempo.InvalidArgument):
        ServerFlow.start(bytes(32), "v1:aa", Config(), b"short")
    with pytest.raises(idempo.InvalidArgument):
        Config(lease_ms=10)
    with pytest.raises(idempo.InvalidArgument):
        Config(stored_headers=["set-cookie"])


def test_random_event_sequences_only_refuse_with_typed_errors() -> None:
    rng = random.Random(99)
    record = StoredRecord(bytes(32), "v1:aa", 1, bytes(16), 1, 2_000, 5_000, None)
    corrupt = StoredRecord(bytes(32), "v1:aa", 9, b"x", 0, None, -1, b"junk")
    events = [
        lambda f: f.store_event("claim", Claimed(1, 1_000)),
        lambda f: f.store_event("claim", Existing(record, rng.choice([1_000, 3_000, 9_000]))),
        lambda f: f.store_event("claim", Existing(corrupt, 1_000)),
        lambda f: f.store_event("get", (rng.choice([None, record, corrupt]), 3_000)),
        lambda f: f.store_event("takeover", rng.choice([None, 1])),
        lambda f: f.store_event(rng.choice(["mark_unknown", "complete", "release", "renew"]),
                                rng.random() < 0.5),
        lambda f: f.store_failed(),
        lambda f: f.handler_finished(rng.choice([200, 201, 409, 500, 99]), [("X", "y")], b"{}"),
        lambda f: f.handler_failed(rng.random() < 0.5),
        lambda f: f.heartbeat_due(),
    ]
    for _ in range(400):
        flow, _action = ServerFlow.start(bytes(32), "v1:aa", Config(lease_ms=1000), bytes(16))
        for _ in range(12):
            try:
                rng.choice(events)(flow)
            except idempo.IdempotencyError:
                pass
            except (TypeError, ValueError, OverflowError):
                pass  # a Python-level conversion refusal (e.g. status 99 is still a u16)
