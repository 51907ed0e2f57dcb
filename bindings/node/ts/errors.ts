/**
 * Errors thrown by idempo. Every error is an `IdempoError` (an `Error`) with a stable `code`;
 * match on `code` or on the subclass.
 */

/** Every stable error code. */
export type IdempoErrorCode =
  | 'IDEMPOTENCY_KEY_INVALID'
  | 'IDEMPOTENCY_KEY_MISSING'
  | 'IDEMPOTENCY_KEY_IN_USE'
  | 'IDEMPOTENCY_KEY_REUSED'
  | 'CANONICALIZATION_ERROR'
  | 'FINGERPRINT_ERROR'
  | 'OUTCOME_UNKNOWN'
  | 'STORE_UNAVAILABLE'
  | 'LEASE_LOST'
  | 'RECORD_CORRUPT'
  | 'CONFIG_INVALID'
  | 'INVALID_ARGUMENT'
  | 'FLOW_ERROR'
  | 'TRANSACTIONAL_UNSUPPORTED'
  | 'NO_TRANSACTION';

/** Extra fields an error may carry. */
export interface IdempoErrorDetails {
  /** Core's snake_case reason code (e.g. `duplicate_member`, `too_short`). */
  reason?: string;
  /** Byte offset of the problem in the input, where core reports one. */
  offset?: number;
  /** JSON Pointer of the offending value (canonicalization), or null when not inside a value. */
  pointer?: string | null;
  /** Suggested wait before a retry, in ms (in-use, store unavailable). */
  retryAfterMs?: number;
  /** The underlying error. */
  cause?: unknown;
}

/** Base class of every idempo error. */
export class IdempoError extends Error {
  /** The stable code. */
  readonly code: IdempoErrorCode;
  /** Core's snake_case reason code, when core gave one. */
  readonly reason: string | undefined;

  constructor(code: IdempoErrorCode, message: string, details: IdempoErrorDetails = {}) {
    super(message, details.cause === undefined ? undefined : { cause: details.cause });
    this.name = new.target.name;
    this.code = code;
    this.reason = details.reason;
  }
}

/** The `Idempotency-Key` value is malformed or out of bounds (HTTP 400). */
export class IdempotencyKeyInvalidError extends IdempoError {
  /** Byte offset of the offending character, when known. */
  readonly offset: number | undefined;
  constructor(message: string, details: IdempoErrorDetails = {}) {
    super('IDEMPOTENCY_KEY_INVALID', message, details);
    this.offset = details.offset;
  }
}

/** The route requires an `Idempotency-Key` and the request has none (HTTP 400). */
export class IdempotencyKeyMissingError extends IdempoError {
  constructor(message = 'this route requires an Idempotency-Key header', details: IdempoErrorDetails = {}) {
    super('IDEMPOTENCY_KEY_MISSING', message, details);
  }
}

/** Another request with the same key is still running (HTTP 409). */
export class IdempotencyKeyInUseError extends IdempoError {
  /** Suggested wait before retrying with the same key. */
  readonly retryAfterMs: number | undefined;
  constructor(message = 'a request with this Idempotency-Key is in progress', details: IdempoErrorDetails = {}) {
    super('IDEMPOTENCY_KEY_IN_USE', message, details);
    this.retryAfterMs = details.retryAfterMs;
  }
}

/** The key was already used for a different request (HTTP 422): use a new key. */
export class IdempotencyKeyReusedError extends IdempoError {
  constructor(message = 'this Idempotency-Key was used for a different request', details: IdempoErrorDetails = {}) {
    super('IDEMPOTENCY_KEY_REUSED', message, details);
  }
}

/** A JSON body is not valid I-JSON or exceeds a limit. */
export class CanonicalizationError extends IdempoError {
  /** Byte offset of the first offending byte. */
  readonly offset: number;
  /** JSON Pointer of the value concerned; null when the error is not inside a value. */
  readonly pointer: string | null;
  constructor(message: string, details: IdempoErrorDetails = {}) {
    super('CANONICALIZATION_ERROR', message, details);
    this.offset = details.offset ?? 0;
    this.pointer = details.pointer ?? null;
  }
}

/** A fingerprint could not be computed (bad configuration, header or exclusion). */
export class FingerprintError extends IdempoError {
  constructor(message: string, details: IdempoErrorDetails = {}) {
    super('FINGERPRINT_ERROR', message, details);
  }
}

/**
 * An earlier execution with this key may have acted and its outcome was not recorded (idempo's
 * 500 `outcome-unknown`). Retrying the key cannot change the answer: reconcile (check the
 * resource's state) before using a new key; do not mint one blindly.
 */
export class OutcomeUnknownError extends IdempoError {
  constructor(message = 'the outcome of the earlier request with this key is unknown', details: IdempoErrorDetails = {}) {
    super('OUTCOME_UNKNOWN', message, details);
  }
}

/** The store failed or timed out; idempo fails closed (HTTP 503, handler not run). */
export class StoreUnavailableError extends IdempoError {
  /** Suggested wait before retrying. */
  readonly retryAfterMs: number | undefined;
  constructor(message: string, details: IdempoErrorDetails = {}) {
    super('STORE_UNAVAILABLE', message, details);
    this.retryAfterMs = details.retryAfterMs;
  }
}

/** Another request took the key over after this execution's lease expired. */
export class LeaseLostError extends IdempoError {
  constructor(message = 'the lease on this key was lost to a takeover', details: IdempoErrorDetails = {}) {
    super('LEASE_LOST', message, details);
  }
}

/** A stored record violates the storage contract. */
export class RecordCorruptError extends IdempoError {
  constructor(message: string, details: IdempoErrorDetails = {}) {
    super('RECORD_CORRUPT', message, details);
  }
}

/** A configuration value was rejected. */
export class ConfigError extends IdempoError {
  constructor(message: string, details: IdempoErrorDetails = {}) {
    super('CONFIG_INVALID', message, details);
  }
}

/** An argument is outside its documented domain. */
export class InvalidArgumentError extends IdempoError {
  constructor(message: string, details: IdempoErrorDetails = {}) {
    super('INVALID_ARGUMENT', message, details);
  }
}

/** The server flow rejected an event (a bug in the host loop). */
export class FlowError extends IdempoError {
  constructor(message: string, details: IdempoErrorDetails = {}) {
    super('FLOW_ERROR', message, details);
  }
}

/**
 * `transactional: true` was asked of a store that cannot run the handler inside its transaction
 * (only `PostgresStore` and `SqliteStore` can).
 */
export class TransactionalUnsupportedError extends IdempoError {
  constructor(message: string, details: IdempoErrorDetails = {}) {
    super('TRANSACTIONAL_UNSUPPORTED', message, details);
  }
}

/** `currentTransaction()` was called outside a handler running in transactional mode. */
export class NoTransactionError extends IdempoError {
  constructor(
    message = 'no idempo transaction here: the route is not transactional, or this code does not run inside its handler',
    details: IdempoErrorDetails = {},
  ) {
    super('NO_TRANSACTION', message, details);
  }
}

interface NativeErrorShape {
  code?: unknown;
  message?: unknown;
  reason?: unknown;
  offset?: unknown;
  pointer?: unknown;
  retryAfterMs?: unknown;
}

/**
 * Converts an error thrown by the native addon into the matching `IdempoError` subclass. Errors
 * that are not from the addon (e.g. a `TypeError` for a wrong argument type) are returned as is.
 */
export function fromNative(err: unknown): unknown {
  if (typeof err !== 'object' || err === null || err instanceof IdempoError) return err;
  const e = err as NativeErrorShape;
  const message = typeof e.message === 'string' ? e.message : String(err);
  const details: IdempoErrorDetails = { cause: err };
  if (typeof e.reason === 'string') details.reason = e.reason;
  if (typeof e.offset === 'number') details.offset = e.offset;
  if (typeof e.pointer === 'string' || e.pointer === null) details.pointer = e.pointer;
  if (typeof e.retryAfterMs === 'number') details.retryAfterMs = e.retryAfterMs;
  switch (e.code) {
    case 'IDEMPOTENCY_KEY_INVALID':
      return new IdempotencyKeyInvalidError(message, details);
    case 'CANONICALIZATION_ERROR':
      return new CanonicalizationError(message, details);
    case 'FINGERPRINT_ERROR':
      return new FingerprintError(message, details);
    case 'STORE_UNAVAILABLE':
      return new StoreUnavailableError(message, details);
    case 'RECORD_CORRUPT':
      return new RecordCorruptError(message, details);
    case 'CONFIG_INVALID':
      return new ConfigError(message, details);
    case 'INVALID_ARGUMENT':
      return new InvalidArgumentError(message, details);
    case 'FLOW_ERROR':
      return new FlowError(message, details);
    default:
      return err;
  }
}
