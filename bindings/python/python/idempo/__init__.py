"""idempo: make HTTP POST safe to retry.

The decisions (canonical JSON, fingerprints, keys, scopes, the key state machine and the client
retry policy) are made by the Rust core through the ``idempo._idempo`` extension; this package adds
the host parts: stores (``idempo.stores``), ASGI/WSGI integrations (``idempo.asgi``,
``idempo.wsgi``) and a retrying httpx client (``idempo.client``).
"""

from __future__ import annotations

from idempo._idempo import (
    CanonicalizationError,
    FingerprintError,
    IdempotencyError,
    InvalidArgument,
    InvalidKey,
    KeyInUse,
    KeyReusedWithDifferentRequest,
    LeaseLost,
    MissingKey,
    OutcomeUnknown,
    RecordCorrupt,
    RequestTooLarge,
    StoreUnavailable,
)

__all__ = [
    "CanonicalizationError",
    "FingerprintError",
    "IdempotencyError",
    "InvalidArgument",
    "InvalidKey",
    "KeyInUse",
    "KeyReusedWithDifferentRequest",
    "LeaseLost",
    "MissingKey",
    "OutcomeUnknown",
    "RecordCorrupt",
    "RequestTooLarge",
    "StoreUnavailable",
]
