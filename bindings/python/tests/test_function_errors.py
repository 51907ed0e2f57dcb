"""The typed errors of idempo.functions survive pickling and a rebuild from their ``args``: a
process pool, or a Celery prefork worker handing a task's error to its parent, pickles it, and
Celery's JSON result backend rebuilds ``cls(*args)``. Each must come back as the same class with
the same attributes and message."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

import idempo
from idempo.functions import (
    CallInFlight,
    CallOutcomeUnknown,
    CallStoreUnavailable,
    PayloadMismatch,
    ResultNotRetained,
    StoredError,
)

ERRORS = [
    PayloadMismatch("charge: key 'k' was used with a different payload", "k"),
    CallInFlight("charge: key 'k' is in flight", "k", 1.5),
    CallOutcomeUnknown("charge: key 'k': outcome unknown", "k"),
    CallStoreUnavailable("charge: key 'k': store unavailable", "k", 2.0, "store_unavailable"),
    ResultNotRetained("charge: key 'k': result not retained", "k"),
    StoredError("k", "CardDeclined", "card declined"),
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_typed_errors_pickle_and_rebuild_from_args(error: Any) -> None:
    for back in (pickle.loads(pickle.dumps(error)), type(error)(*error.args)):
        assert type(back) is type(error)
        assert str(back) == str(error)
        assert vars(back) == vars(error)
        assert isinstance(back, idempo.IdempotencyError)
    assert str(error).startswith(("charge: ", "CardDeclined: "))
