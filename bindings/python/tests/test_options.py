"""One option vocabulary (``spec/OPTIONS.md``): every host and store option the vector lists for
Python exists under that name with core's default, and the former seconds-valued PostgreSQL
options still work with a warning that names the new one."""

from __future__ import annotations

import inspect
import json
import warnings
from typing import Any, Dict, List

import pytest
from conftest import VECTORS

import idempo
from idempo import stores
from idempo._host import HOST_DEFAULTS
from idempo._idempo import option_defaults

ROWS: List[Dict[str, Any]] = json.loads((VECTORS / "options" / "defaults.json").read_text())["options"]
PYTHON_ROWS = [r for r in ROWS if "python" in r["bindings"]]
CLASSES = {
    "memory_store": stores.MemoryStore,
    "sqlite_store": stores.SQLiteStore,
    "postgres_store": stores.PostgresStore,
    "redis_store": stores.RedisStore,
    "cached_store": stores.CachedStore,
}


def test_core_defaults_are_the_vector() -> None:
    got = option_defaults()
    for row in ROWS:
        value = got[row["owner"]][row["name"]]
        assert (list(value) if isinstance(value, tuple) else value) == row["default"], row
    assert sum(len(v) for v in got.values()) == len(ROWS)


def _effective(row: Dict[str, Any]) -> Any:
    """The default a Python user gets for the option, read from the public surface."""
    owner, name = row["owner"], row["name"]
    if owner == "host":
        return HOST_DEFAULTS[name]  # type: ignore[literal-required]
    if owner == "purge":
        return inspect.signature(stores.MemoryStore.purge_expired).parameters[name].default
    if owner == "postgres_store":
        store = stores.PostgresStore("postgresql://127.0.0.1:1/none")  # never connects
        try:
            return getattr(store, name) if name != "connect_timeout_ms" else (
                inspect.signature(stores.PostgresStore).parameters[name].default)
        finally:
            store.close()
    param = inspect.signature(CLASSES[owner]).parameters[name]
    return param.default


@pytest.mark.parametrize("row", PYTHON_ROWS, ids=lambda r: f"{r['owner']}.{r['name']}")
def test_every_option_has_its_name_and_core_default(row: Dict[str, Any]) -> None:
    value = _effective(row)
    if isinstance(value, bytes):
        value = value.decode()
    if isinstance(value, tuple):
        value = list(value)
    assert value == row["default"]


@pytest.mark.parametrize("owner", sorted(CLASSES))
def test_duration_options_are_milliseconds(owner: str) -> None:
    params = inspect.signature(CLASSES[owner]).parameters
    former = {"timeout", "connect_timeout", "lock_timeout", "idle_in_transaction_timeout", "purge_timeout"}
    for name in params:
        if "timeout" in name or name.endswith("ttl") or name.endswith("grace"):
            assert name.endswith("_ms") or name in former, f"{owner}({name}=...) is not in milliseconds"


def test_former_seconds_names_warn_and_convert() -> None:
    with pytest.warns(DeprecationWarning, match=r"timeout_ms=1500"):
        store = stores.PostgresStore("postgresql://127.0.0.1:1/none", timeout=1.5)
    assert store.timeout_ms == 1500 and store.timeout == 1.5
    store.close()
    with pytest.warns(DeprecationWarning, match=r"lock_timeout_ms=250"):
        store = stores.PostgresStore("postgresql://127.0.0.1:1/none", lock_timeout=0.25)
    assert store.lock_timeout_ms == 250
    store.close()
    with pytest.raises(idempo.InvalidArgument, match="timeout_ms"):
        stores.PostgresStore("postgresql://127.0.0.1:1/none", timeout=1.0, timeout_ms=1000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        store = stores.AsyncPostgresStore("postgresql://127.0.0.1:1/none", timeout_ms=750,
                                          connect_timeout_ms=3000)
    assert store.timeout == 0.75 and store._connect_timeout == 3  # noqa: SLF001 - libpq's seconds


def test_a_retention_no_longer_than_the_lease_is_refused() -> None:
    """spec/PROTOCOL.md §6: records that expire with their lease make every takeover policy moot."""
    with pytest.raises(idempo.InvalidArgument, match=r"ttl_ms \(30000 ms\) must be longer than lease_ms"):
        idempo.Config(lease_ms=30_000, ttl_ms=30_000)
    with pytest.raises(idempo.InvalidArgument, match="raise ttl_ms or shorten lease_ms"):
        idempo.Config(ttl_ms=10_000)
    assert idempo.Config(lease_ms=5_000, ttl_ms=5_001) is not None
