"""Type stubs for the ``idempo._idempo`` extension module (checked by ``mypy.stubtest``)."""

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

class IdempotencyError(Exception): ...
class InvalidKey(IdempotencyError):
    code: str
class MissingKey(IdempotencyError): ...
class CanonicalizationError(IdempotencyError):
    code: str
    offset: int
    pointer: str | None
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
class InvalidArgument(IdempotencyError): ...
