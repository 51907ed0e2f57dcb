"""idempo: make HTTP POST safe to retry.

The decisions (canonical JSON, fingerprints, keys, scopes, the key state machine and the client
retry policy) are made by the Rust core through the ``idempo._idempo`` extension; this package adds
the host parts: stores (``idempo.stores``), ASGI/WSGI integrations (``idempo.asgi``,
``idempo.wsgi``) and a retrying httpx client (``idempo.client``).
"""

from __future__ import annotations

from idempo._flow import Execution, HandlerResult, Hooks, Response, logging_hooks
from idempo._host import UnscopedKeyWarning, idempotent
from idempo._render import Problem, ProblemRenderer
from idempo.functions import (  # idempotent functions and message consumers
    CallInFlight,
    CallOutcomeUnknown,
    PayloadMismatch,
    StoredError,
    current_call,
    idempotent_call,
    idempotent_call_async,
    idempotent_function,
)
from idempo.stores._tx import (
    NoTransaction,
    Transaction,
    TransactionalUnsupported,
    current_transaction,
)
from idempo._idempo import (
    Config,
    CanonicalizationError,
    FingerprintError,
    Fingerprinter,
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
    RetryAdvice,
    RetryPolicy,
    RouteFingerprinter,
    StoreUnavailable,
    canonicalize,
    decode_response,
    encode_response,
    fingerprint,
    generate_key,
    key_header_value,
    parse_key,
    parse_key_details,
    parse_retry_after,
    response_body_needed,
    scope_id,
)

__all__ = [
    # idempotent functions and message consumers (idempo.functions)
    "CallInFlight",
    "CallOutcomeUnknown",
    "PayloadMismatch",
    "StoredError",
    "current_call",
    "idempotent_call",
    "idempotent_call_async",
    "idempotent_function",
    "CanonicalizationError",
    "Config",
    "Execution",
    "HandlerResult",
    "Hooks",
    "Problem",
    "ProblemRenderer",
    "Response",
    "UnscopedKeyWarning",
    "idempotent",
    "current_transaction",
    "NoTransaction",
    "Transaction",
    "TransactionalUnsupported",
    "logging_hooks",
    "FingerprintError",
    "Fingerprinter",
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
    "RetryAdvice",
    "RetryPolicy",
    "RouteFingerprinter",
    "StoreUnavailable",
    "canonicalize",
    "decode_response",
    "encode_response",
    "fingerprint",
    "generate_key",
    "key_header_value",
    "parse_key",
    "parse_key_details",
    "parse_retry_after",
    "response_body_needed",
    "scope_id",
]
