"""Type stubs for the ``idempo._idempo`` extension module (checked by ``mypy.stubtest``)."""

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, final

__all__ = [
    # idempotent function calls (src/call.rs)
    "Call",
    "CallAnswer",
    "call_answer",
    "call_raised",
    "call_returned",
    "call_wait_delay",
    "Action",
    "Admission",
    "BodyCapture",
    "CanonicalizationError",
    "Cleanup",
    "Config",
    "FingerprintError",
    "Fingerprinter",
    "IdempotencyError",
    "InlineMemory",
    "InvalidArgument",
    "InvalidKey",
    "KeyInUse",
    "KeyReusedWithDifferentRequest",
    "LeaseLost",
    "MemoryStoreCore",
    "MissingKey",
    "OutcomeUnknown",
    "RecordCorrupt",
    "RequestTooLarge",
    "RetryAdvice",
    "RetryPolicy",
    "RouteFingerprinter",
    "STORE_LATENCY_BUCKETS",
    "ScopeRule",
    "ServerFlow",
    "StoreUnavailable",
    "asgi_response_headers",
    "asgi_start_headers",
    "asgi_target",
    "body_problem",
    "cache_fill_px",
    "cache_servable",
    "canonicalize",
    "decode_response",
    "encode_response",
    "fingerprint",
    "generate_key",
    "intent_decide_send",
    "intent_request_fingerprint",
    "key_header_value",
    "memory_partition",
    "parse_key",
    "parse_key_details",
    "parse_retry_after",
    "option_defaults",
    "recipes",
    "redis_cluster_node_refusal",
    "redis_config_get_refusal",
    "redis_hash_row",
    "redis_policy_refusal",
    "response_body_needed",
    "scope_id",
    "sqlite_setup_pause_ms",
    "unavailable_problem",
]

_Bytes = bytes | bytearray | str
_Headers = Mapping[str, str] | Iterable[tuple[str | bytes, str | bytes]]
_Numbers = Literal["reject_precision_loss", "rfc"]

class IdempotencyError(Exception): ...

class InvalidKey(IdempotencyError):
    code: str
    offset: int | None

class MissingKey(IdempotencyError): ...

class CanonicalizationError(IdempotencyError):
    code: str
    offset: int
    pointer: str | None
    problem: Action

class FingerprintError(IdempotencyError):
    code: str

class KeyInUse(IdempotencyError):
    retry_after: float | None

class KeyReusedWithDifferentRequest(IdempotencyError): ...
class OutcomeUnknown(IdempotencyError): ...

class StoreUnavailable(IdempotencyError):
    retry_after: float | None

class LeaseLost(IdempotencyError): ...
class RecordCorrupt(IdempotencyError): ...
class RequestTooLarge(IdempotencyError): ...

class InvalidArgument(IdempotencyError):
    code: str

STORE_LATENCY_BUCKETS: tuple[float, ...]
"""Histogram bounds (seconds) of ``idempo_store_operation_duration_seconds`` (core's)."""

def asgi_response_headers(raw: object) -> tuple[list[tuple[str, str]], bool] | None: ...
def asgi_start_headers(headers: object, body_len: int) -> list[tuple[bytes, bytes]] | None: ...
def asgi_target(scope: object) -> str | None: ...
def canonicalize(
    data: _Bytes,
    *,
    numbers: _Numbers | None = None,
    exclude: Iterable[str] | None = None,
    max_input_bytes: int | None = None,
    max_depth: int | None = None,
    max_members: int | None = None,
) -> bytes: ...
def fingerprint(
    method: str,
    route: str,
    body: _Bytes,
    headers: _Headers | None = None,
    exclude: Iterable[str] | None = None,
    content_type: str | None = ...,
    hmac_key: bytes | None = None,
    numbers: _Numbers | None = None,
) -> str: ...
@final
class Fingerprinter:
    def __new__(
        cls,
        *,
        header_names: Iterable[str] | None = None,
        exclude: Iterable[str] | None = None,
        hmac_key: bytes | None = None,
        numbers: _Numbers | None = None,
        max_input_bytes: int | None = None,
        max_depth: int | None = None,
        max_members: int | None = None,
    ) -> Fingerprinter: ...
    @property
    def header_names(self) -> list[str]: ...
    def for_route(self, method: str, route: str) -> RouteFingerprinter: ...
    def fingerprint(
        self,
        method: str,
        route: str,
        body: _Bytes,
        headers: _Headers | None = None,
        content_type: str | None = ...,
    ) -> str: ...

@final
class RouteFingerprinter:
    @property
    def method(self) -> str: ...
    @property
    def route(self) -> str: ...
    def fingerprint(self, body: _Bytes) -> str: ...
    def __call__(self, body: _Bytes) -> str: ...

def parse_key(
    value: _Bytes, *, strict: bool = False, min_len: int = 8, max_len: int = 128
) -> str: ...
def parse_key_details(
    value: _Bytes, *, strict: bool = False, min_len: int = 8, max_len: int = 128
) -> tuple[str, str, int, str]: ...
def key_header_value(key: str) -> str: ...
def generate_key(entropy: bytes | None = None) -> str: ...
def scope_id(principal: str, method: str, route: str, key: str | bytes) -> bytes: ...
def parse_retry_after(value: str | bytes, now_ms: int) -> int | None: ...
def response_body_needed(status: int, content_type: str | None = None) -> bool: ...
def intent_request_fingerprint(
    method: str, target: str, content_type: str | None, body: _Bytes
) -> str: ...
def intent_decide_send(
    pending: tuple[str, str, int] | None,
    request_fingerprint: str,
    explicit_key: str | None = None,
) -> Literal[
    "mint", "reuse", "intent_changed_while_pending", "intent_key_differs_from_pending"
]: ...
def recipes() -> dict[str, str]: ...
def sqlite_setup_pause_ms(refused: int, waited_ms: int, bound_ms: int) -> int | None: ...
def redis_cluster_node_refusal(cluster_enabled: bool) -> str | None: ...
def redis_policy_refusal(policies: list[tuple[str, str | None]]) -> str | None: ...
def redis_config_get_refusal(error: str) -> str | None: ...
def redis_hash_row(
    flat: list[bytes],
) -> tuple[str, int, bytes, int, int | None, int, bytes | None] | None: ...
def option_defaults() -> dict[str, dict[str, Any]]: ...
def memory_partition(principal: str) -> bytes: ...
def cache_servable(state: int, expires_at: int, now_ms: int) -> bool: ...
def cache_fill_px(
    state: int, expires_at: int, cache_ttl_ms: int, read_now_ms: int, elapsed_ms: int
) -> int | None: ...

_Row = tuple[str, int, bytes, int, int | None, int, bytes | None]

@final
class InlineMemory:
    def __new__(
        cls,
        core: MemoryStoreCore,
        lock: Any,
        step: Any,
        partition: bytes | None = None,
        store: Any = None,
    ) -> InlineMemory: ...

@final
class MemoryStoreCore:
    def __new__(
        cls,
        max_entries: int,
        max_bytes: int,
        max_entries_per_partition: int | None = None,
        max_bytes_per_partition: int | None = None,
    ) -> MemoryStoreCore: ...
    def __len__(self) -> int: ...
    @property
    def bytes_used(self) -> int: ...
    @property
    def max_entries_per_partition(self) -> int: ...
    def claim(
        self,
        scope_key: bytes,
        fingerprint: str,
        token: bytes,
        lease_ms: int,
        ttl_ms: int,
        now_ms: int,
        partition: bytes | None = None,
    ) -> tuple[bool, int, _Row | None]: ...
    def get(self, scope_key: bytes) -> _Row | None: ...
    def takeover(
        self, scope_key: bytes, seen_token: bytes, new_token: bytes, lease_ms: int, now_ms: int
    ) -> int | None: ...
    def mark_unknown(self, scope_key: bytes, seen_token: bytes, ttl_ms: int, now_ms: int) -> bool: ...
    def complete(
        self, scope_key: bytes, token: bytes, response: bytes, ttl_ms: int, now_ms: int
    ) -> bool: ...
    def release(self, scope_key: bytes, token: bytes) -> bool: ...
    def renew(self, scope_key: bytes, token: bytes, lease_ms: int, now_ms: int) -> bool: ...
    def purge_expired(self, batch: int, now_ms: int) -> tuple[int, int, int]: ...
@final
class RetryAdvice:
    @property
    def retry(self) -> bool: ...
    @property
    def delay_ms(self) -> int | None: ...
    @property
    def reason(self) -> str | None: ...
    @property
    def status(self) -> int | None: ...
    @property
    def settles_intent(self) -> bool: ...

@final
class RetryPolicy:
    def __new__(
        cls,
        *,
        max_attempts: int = 5,
        base_delay_ms: int = 500,
        max_delay_ms: int = 10000,
        max_elapsed_ms: int = 60000,
        jitter: Literal["equal", "full"] = "equal",
    ) -> RetryPolicy: ...
    @property
    def max_attempts(self) -> int: ...
    @property
    def max_elapsed_ms(self) -> int: ...
    def decide(
        self,
        attempt: int,
        elapsed_ms: int,
        outcome: int
        | Literal[
            "timeout",
            "connection_error",
            "outcome_unknown",
            "key_reused",
            "in_flight",
            "response_not_retained",
        ],
        jitter: float,
        retry_after_ms: int | None = None,
        *,
        content_type: str | None = None,
        body: bytes | None = None,
    ) -> RetryAdvice: ...

@final
class Config:
    """Core's per-route policy. Every option is one of core's flat option set; ``None`` (each
    default) means core's default (``Config.default()`` in core: lease 30 s, heartbeat every
    third of the lease, ``heartbeat_ms=0`` turns it off; takeover ``"outcome_unknown"``; TTL 24 h;
    key required, 8..128 characters, both forms; transient statuses 408/409/425/429; 1 MiB
    stored bodies; 1 MiB request bodies; ...)."""

    def __new__(
        cls,
        *,
        lease_ms: int | None = None,
        heartbeat_ms: int | None = None,
        takeover: Literal["outcome_unknown", "re_run"] | None = None,
        ttl_ms: int | None = None,
        key_required: bool | None = None,
        key_min_len: int | None = None,
        key_max_len: int | None = None,
        key_strict: bool | None = None,
        transient_statuses: list[int] | None = None,
        store_server_errors: bool | None = None,
        max_stored_body_bytes: int | None = None,
        stored_headers: Iterable[str] | None = None,
        redact: bool | None = None,
        in_flight_retry_after_ms: int | None = None,
        unavailable_retry_after_ms: int | None = None,
        max_store_rounds: int | None = None,
        cleanup_budget_ms: int | None = None,
        max_request_body_bytes: int | None = None,
        transactional: bool | None = None,
    ) -> Config: ...
    @property
    def lease_ms(self) -> int: ...
    @property
    def heartbeat_ms(self) -> int | None: ...
    @property
    def ttl_ms(self) -> int: ...
    @property
    def key_required(self) -> bool: ...
    @property
    def key_min_len(self) -> int: ...
    @property
    def key_max_len(self) -> int: ...
    @property
    def key_strict(self) -> bool: ...
    @property
    def takeover(self) -> str: ...
    @property
    def transient_statuses(self) -> list[int]: ...
    @property
    def store_server_errors(self) -> bool: ...
    @property
    def stored_headers(self) -> list[str]: ...
    @property
    def max_stored_body_bytes(self) -> int: ...
    @property
    def max_request_body_bytes(self) -> int: ...
    @property
    def redact(self) -> bool: ...
    @property
    def in_flight_retry_after_ms(self) -> int: ...
    @property
    def unavailable_retry_after_ms(self) -> int: ...
    @property
    def max_store_rounds(self) -> int: ...
    @property
    def cleanup_budget_ms(self) -> int: ...
    @property
    def transactional(self) -> bool: ...

    def capture_plan(
        self,
        status: int,
        headers: _Headers,
        streaming: bool = False,
        framework: bool = False,
    ) -> tuple[str, int | None]: ...
@final
class ScopeRule:
    def __new__(
        cls, *, function: bool, public: bool = False, empty_scope_is_anonymous: bool = False
    ) -> ScopeRule: ...
    @property
    def function(self) -> bool: ...

@final
class Admission:
    @staticmethod
    def start(
        config: Config, key_fields: list[bytes], declared_length: int | None = None
    ) -> Admission: ...
    @staticmethod
    def start_asgi(
        config: Config, raw: object, key_name: bytes, fingerprinted: frozenset[bytes]
    ) -> Admission | None: ...
    def body(
        self,
        fingerprinter: Fingerprinter,
        method: str,
        target: str,
        body: bytes,
        headers: _Headers | None = None,
        content_type: str | None = None,
        *,
        over_limit: bool = False,
    ) -> None: ...
    def scope(
        self,
        rule: ScopeRule,
        method: str,
        route: str,
        *,
        authenticated: bool,
        returned: object | None = None,
        raised: str | None = None,
    ) -> None: ...
    def admit(
        self,
        fingerprinter: Fingerprinter,
        rule: ScopeRule,
        method: str,
        target: str,
        route: str,
        body: bytes,
        headers: _Headers | None = None,
        content_type: str | None = None,
        over_limit: bool = False,
        authenticated: bool | None = None,  # required: TypeError without it (None)
        scope_function: Callable[[Any], object] | None = None,
        scope_argument: object | None = None,
    ) -> tuple[str, bytes, str, bytes, str | None] | None: ...
    @property
    def kind(self) -> str: ...
    @property
    def problem(self) -> Action | None: ...
    @property
    def log(self) -> str | None: ...
    @property
    def warning(self) -> str | None: ...
    @property
    def body_limit(self) -> int | None: ...
    @property
    def key(self) -> str | None: ...
    @property
    def scope_id(self) -> bytes | None: ...
    @property
    def fingerprint(self) -> str | None: ...
    @property
    def partition(self) -> bytes | None: ...
    @property
    def authorization(self) -> bool: ...

@final
class Action:
    @property
    def kind(self) -> str: ...
    @property
    def op(self) -> str | None: ...
    @property
    def args(self) -> tuple[object, ...]: ...
    @property
    def status(self) -> int | None: ...
    @property
    def headers(self) -> list[tuple[str, str]]: ...
    @property
    def body(self) -> bytes | None: ...
    @property
    def outcome(self) -> str | None: ...
    @property
    def handler_ran(self) -> bool: ...
    @property
    def token(self) -> bytes | None: ...
    @property
    def generation(self) -> int | None: ...
    @property
    def downstream_key(self) -> str | None: ...
    @property
    def heartbeat_ms(self) -> int | None: ...
    def fill_response(self, fields: dict[str, Any]) -> None: ...

@final
class ServerFlow:
    @staticmethod
    def start(
        scope: bytes,
        fingerprint: str,
        config: Config,
        entropy: bytes,
        memory: InlineMemory | None = None,
    ) -> tuple[ServerFlow, Action]: ...
    def store_result(self, result: object) -> Action: ...
    def store_event(self, op: str, result: object) -> Action: ...
    def store_failed(self) -> Action: ...
    def handler_finished(
        self,
        status: int,
        headers: _Headers,
        body: _Bytes,
        body_to_store: _Bytes | None = None,
        framework: bool = False,
        body_truncated: bool = False,
        memory: InlineMemory | None = None,
    ) -> Action: ...
    def handler_failed(
        self, maybe_side_effect: bool = True, *, memory: InlineMemory | None = None
    ) -> Action: ...
    def heartbeat_due(self) -> Action: ...
    @property
    def token(self) -> bytes: ...
    @property
    def generation(self) -> int | None: ...
    @property
    def finished(self) -> bool: ...
    @property
    def corrupt_record(self) -> str | None: ...
    @property
    def cleanup(self) -> Cleanup | None: ...

@final
class BodyCapture:
    def __new__(cls, limit: int) -> BodyCapture: ...
    def accept(self, length: int) -> Literal["record", "discard", "skip"]: ...
    @property
    def truncated(self) -> bool: ...

@final
class Cleanup:
    @property
    def action(self) -> Action: ...
    @property
    def budget_ms(self) -> int: ...
    @property
    def max_delay_ms(self) -> int: ...
    def next(self, attempt: int, elapsed_ms: int, applied: bool | None) -> int | None: ...

def body_problem(error: CanonicalizationError) -> Action: ...
def unavailable_problem(config: Config) -> Action: ...
def encode_response(status: int, headers: _Headers, body: _Bytes) -> bytes: ...
def decode_response(data: bytes) -> tuple[int, list[tuple[str, str]], bytes]: ...

# Idempotent function calls (src/call.rs; idempo.functions)

@final
class Call:
    def __new__(cls, name: str) -> Call: ...
    @property
    def name(self) -> str: ...
    def scope(self, principal: str, key: str) -> bytes: ...
    def fingerprint(self, fingerprinter: Fingerprinter, payload: _Bytes) -> str: ...

@final
class CallAnswer:
    @property
    def kind(
        self,
    ) -> Literal[
        "returned",
        "stored_error",
        "propagate",
        "not_retained",
        "in_flight",
        "mismatch",
        "outcome_unknown",
        "unavailable",
        "foreign",
    ]: ...
    @property
    def serializer(self) -> str | None: ...
    @property
    def body(self) -> bytes | None: ...
    @property
    def replayed(self) -> bool: ...
    @property
    def retry_after_ms(self) -> int | None: ...
    @property
    def outcome(self) -> str: ...
    @property
    def status(self) -> int | None: ...

def call_returned(serializer: str, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]: ...
def call_raised(
    disposition: str, body: bytes
) -> tuple[Literal["finished"], int, list[tuple[str, str]], bytes] | tuple[Literal["failed"], bool]: ...
def call_answer(action: object) -> CallAnswer: ...
def call_wait_delay(
    attempt: int, retry_after_ms: int, elapsed_ms: int, budget_ms: int, jitter: int
) -> int | None: ...
