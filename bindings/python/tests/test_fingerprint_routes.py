"""The all-defaults ``idempo.fingerprint`` keeps route bindings keyed by its string objects: its
answers must be those of a prepared Fingerprinter for every kind of call (many routes past the
cache's size, equal but distinct strings, str and large bodies, bad bodies)."""

from __future__ import annotations

import pytest

import idempo

BODY = b'{"b":[1,2.50,"x"],"a":{"d":null,"c":true}}'
REFERENCE = idempo.Fingerprinter()


def reference(method: str, route: str, body: "bytes | str") -> str:
    return REFERENCE.fingerprint(method, route, body)


def test_repeated_and_many_routes_match_the_prepared_fingerprinter() -> None:
    for i in range(100):
        method = "post" if i % 3 == 0 else "POST"
        route = f"/r/{i}"
        first = idempo.fingerprint(method, route, BODY)
        assert first == idempo.fingerprint(method, route, BODY)
        assert first == reference(method, route, BODY)
    # Distinct objects with equal text (the cache keys on identity) and other routes differ.
    route = "".join(["/r/", "7"])
    assert idempo.fingerprint("POST", route, BODY) == reference("POST", "/r/7", BODY)
    assert idempo.fingerprint("POST", "/r/1", BODY) != idempo.fingerprint("POST", "/r/2", BODY)


def test_str_large_and_bad_bodies_behave_as_before() -> None:
    route = "/payments"
    text = BODY.decode()
    assert idempo.fingerprint("POST", route, text) == reference("POST", route, BODY)
    assert idempo.fingerprint("POST", route, bytearray(BODY)) == reference("POST", route, BODY)
    large = ('{"items":[' + ",".join(f'{{"n":{i},"s":"{"x" * 20}"}}' for i in range(2000)) + "]}").encode()
    assert len(large) > 16 * 1024
    assert idempo.fingerprint("POST", route, large) == reference("POST", route, large)
    assert idempo.fingerprint("POST", route, large.decode()) == reference("POST", route, large)
    with pytest.raises(idempo.CanonicalizationError) as err:
        idempo.fingerprint("POST", route, b'{"a":1,"a":2}')
    assert err.value.code == "duplicate_member"
    with pytest.raises(TypeError):
        idempo.fingerprint("POST", route, 5)  # type: ignore[arg-type]
