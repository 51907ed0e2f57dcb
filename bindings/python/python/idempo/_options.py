"""The host and store options' defaults, from core (``idempo_core::options``; ``spec/OPTIONS.md``).

One table for every binding: a default changed in core changes here and in Node at once."""

from __future__ import annotations

import warnings
from typing import Any, Dict, Optional

from idempo._idempo import InvalidArgument, option_defaults

DEFAULTS: Dict[str, Dict[str, Any]] = option_defaults()
"""``DEFAULTS[owner][name]``: e.g. ``DEFAULTS["postgres_store"]["timeout_ms"]``."""


def default(owner: str, name: str) -> Any:
    """The default of option ``name`` of ``owner`` (``host``, ``postgres_store``, ...)."""
    return DEFAULTS[owner][name]


def renamed_seconds(
    what: str, old: str, seconds: Optional[float], new: str, ms: Optional[int]
) -> Optional[int]:
    """``ms`` or, from the former seconds-valued option ``old``, its value in milliseconds (with
    a :class:`DeprecationWarning` naming the new option); both given is refused."""
    if seconds is None:
        return ms
    if ms is not None:
        raise InvalidArgument(f"{what}: pass {new} (milliseconds) only; {old} is its former name")
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
        raise InvalidArgument(f"{what}: {old} must be a positive number of seconds")
    warnings.warn(
        f"{what}({old}={seconds!r}) is now {new}={round(seconds * 1000)} (milliseconds, "
        "as every duration in idempo)",
        DeprecationWarning,
        stacklevel=4,
    )
    return round(seconds * 1000)
