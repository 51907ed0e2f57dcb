"""The store recipes of ``spec/STORAGE.md``, read once from core (``idempo_core::recipes``).

The SQL and Lua texts live in one place, the Rust core, and every binding runs them as they are;
this module only looks them up (and, for psycopg, rewrites ``$n`` placeholders).
"""

from __future__ import annotations

import re
from types import MappingProxyType
from typing import Dict, Mapping, Sequence

from idempo._idempo import recipes as _native_recipes

RECIPES: Mapping[str, str] = MappingProxyType(dict(_native_recipes()))
"""Every recipe by name (``postgres_claim``, ``sqlite_get``, ``redis_complete``, …)."""

_PARAM = re.compile(r"\$(\d+)")


def recipe(name: str) -> str:
    """The recipe called ``name``; :class:`LookupError` if core has none by that name."""
    try:
        return RECIPES[name]
    except KeyError:
        raise LookupError(f"idempo core has no store recipe named {name!r}") from None


PRIMITIVES = ("claim", "get", "takeover", "mark_unknown", "complete", "release", "renew")
"""The primitives every store's recipes cover (purge is per store)."""


def family(store: str, names: Sequence[str]) -> Dict[str, str]:
    """``{name: recipe(f"{store}_{name}")}`` for each of ``names``."""
    return {name: recipe(f"{store}_{name}") for name in names}


def pyformat(sql: str) -> str:
    """A PostgreSQL recipe for psycopg: ``$n`` becomes ``%(pn)s`` and a literal ``%`` is doubled."""
    return _PARAM.sub(r"%(p\1)s", sql.replace("%", "%%"))
