/**
 * Thin wrappers over the native addon: argument conversion and error mapping only. Every decision
 * (canonical form, key validity, scope id, retry delay, response encoding) is made by core.
 */
import { randomBytes } from 'node:crypto';
import native = require('./native');
import { fromNative } from './errors';

/** Number handling of canonicalization. */
export type NumberMode = 'rfc' | 'reject_precision_loss';

/** Options of {@link canonicalize}. */
export interface CanonicalizeOptions {
  /** `'rfc'` (default, RFC 8785 rounding) or `'reject_precision_loss'`. */
  numbers?: NumberMode;
  /** Maximum input size in bytes (default 8 MiB). */
  maxInputBytes?: number;
  /** Maximum nesting depth (default 128). */
  maxDepth?: number;
  /** Maximum number of members and elements (default 100000). */
  maxMembers?: number;
  /** RFC 6901 pointers of values to leave out (e.g. `/client_timestamp`). */
  exclude?: string[];
}

/**
 * The RFC 8785 (JCS) canonical form of a JSON text. Throws `CanonicalizationError` (with
 * `offset`, `pointer`, `reason`) for input that is not strict I-JSON.
 */
export function canonicalize(data: Uint8Array | string, options?: CanonicalizeOptions): Buffer {
  try {
    return typeof data === 'string'
      ? native.canonicalizeString(data, options)
      : native.canonicalizeBytes(data, options);
  } catch (e) {
    throw fromNative(e);
  }
}

/** Options of {@link parseKey}. */
export interface ParseKeyOptions {
  /** Minimum length in characters (default 8). */
  minLen?: number;
  /** Maximum length in characters (default 128, at most 255). */
  maxLen?: number;
  /** Accept only the quoted sf-string form (default false). */
  strict?: boolean;
}

/** A parsed key and how it was sent. */
export interface ParsedKey {
  /** The key text. */
  key: string;
  /** `'sf_string'` (quoted) or `'bare'` (token). */
  form: string;
  /** Number of RFC 9651 parameters after the sf-string (validated, then ignored). */
  ignoredParameters: number;
}

/**
 * Parses an `Idempotency-Key` header value (an RFC 8941 sf-string, or a bare token unless
 * `strict`) and returns the key. Throws `IdempotencyKeyInvalidError` (with `reason`, `offset`).
 * A string is taken as UTF-8 text; pass a `Uint8Array` for raw header bytes.
 */
export function parseKey(value: string | Uint8Array, options?: ParseKeyOptions): string {
  try {
    return typeof value === 'string' ? native.parseKey(value, options) : native.parseKeyBytes(value, options).key;
  } catch (e) {
    throw fromNative(e);
  }
}

/** {@link parseKey} with the form and ignored parameters; takes the raw header bytes. */
export function parseKeyDetailed(value: Uint8Array | string, options?: ParseKeyOptions): ParsedKey {
  try {
    const bytes = typeof value === 'string' ? Buffer.from(value, 'utf8') : value;
    return native.parseKeyBytes(bytes, options);
  } catch (e) {
    throw fromNative(e);
  }
}

/** A fresh random key (128 bits from `crypto.randomBytes`, formatted by core). */
export function generateKey(): string {
  return native.generateKey(randomBytes(16));
}

/** The header value to send for `key` (its quoted sf-string form). */
export function keyHeaderValue(key: string): string {
  try {
    return native.keyHeaderValue(key);
  } catch (e) {
    throw fromNative(e);
  }
}

/**
 * The 32-byte record key of (principal, method, route template, key): a length-prefixed SHA-256,
 * so `('a:b', 'c')` and `('a', 'b:c')` differ. Use `''` as principal when there is none.
 */
export function scopeId(principal: string, method: string, route: string, key: string): Buffer {
  return native.scopeId(principal, method, route, key);
}

/** {@link scopeId} as 64 lowercase hex characters. */
export function scopeIdHex(principal: string, method: string, route: string, key: string): string {
  return native.scopeIdHex(principal, method, route, key);
}

/** Retry policy settings (defaults from core: 5 attempts, 500 ms base, 10 s cap, 60 s budget). */
export interface RetryPolicyOptions {
  maxAttempts?: number;
  baseDelayMs?: number;
  maxDelayMs?: number;
  maxElapsedMs?: number;
  jitter?: 'equal' | 'full';
}

/** How one attempt ended. */
export type AttemptOutcome =
  | {
      kind: 'response';
      status: number;
      retryAfterMs?: number | null;
      /** The response's `Content-Type`; with `body`, core recognises idempo's own problems
       * (409 in-flight, 422 key-reused, 500 outcome-unknown and response-not-retained). */
      contentType?: string | null;
      /** The response body; needed only when {@link responseBodyNeeded} is true. */
      body?: Uint8Array | null;
    }
  | { kind: 'timeout' }
  | { kind: 'connection_error' }
  /** idempo's outcome-unknown answer: core stops with reason `outcome_unknown`. */
  | { kind: 'outcome_unknown' }
  /** idempo's key-reused 422: core stops with `key_reused_with_different_request`. */
  | { kind: 'key_reused' }
  /** idempo's response-not-retained 500: core stops with `response_not_retained`. */
  | { kind: 'response_not_retained' }
  /** idempo's in-flight 409: retried (its `Retry-After` is a floor). */
  | { kind: 'in_flight'; retryAfterMs?: number | null };

/** Core's answer after an attempt. */
export type RetryDecision =
  | { retry: true; delayMs: number }
  | {
      retry: false;
      reason: string;
      status?: number;
      /** Whether this stop settles a pending intent (its record is removed) or leaves its key
       * pending (core's rule, `spec/KEYS.md` §3.6). */
      settlesIntent: boolean;
    };

/** The client retry policy of core (which outcomes to retry, backoff with jitter, budgets). */
export class RetryPolicy {
  readonly #inner: native.RetryPolicy;

  constructor(options: RetryPolicyOptions = {}) {
    try {
      this.#inner = new native.RetryPolicy(options);
    } catch (e) {
      throw fromNative(e);
    }
  }

  /**
   * What to do after attempt `attempt` (1-based), `elapsedMs` after the first attempt started.
   * `jitter` is a uniform sample in [0, 1) (default `Math.random()`).
   */
  decide(attempt: number, elapsedMs: number, outcome: AttemptOutcome, jitter: number = Math.random()): RetryDecision {
    let input: native.AttemptOutcomeInput = { kind: outcome.kind };
    if (outcome.kind === 'response') {
      input = { kind: 'response', status: outcome.status };
      if (outcome.retryAfterMs != null) input.retryAfterMs = outcome.retryAfterMs;
      if (outcome.contentType != null) input.contentType = outcome.contentType;
      if (outcome.body != null) input.body = Buffer.from(outcome.body.buffer, outcome.body.byteOffset, outcome.body.byteLength);
    } else if (outcome.kind === 'in_flight' && outcome.retryAfterMs != null) {
      input.retryAfterMs = outcome.retryAfterMs;
    }
    let d: native.RetryDecisionOutput;
    try {
      d = this.#inner.decide(attempt, elapsedMs, input, jitter);
    } catch (e) {
      throw fromNative(e);
    }
    if (d.retry) return { retry: true, delayMs: d.delayMs ?? 0 };
    return d.status === undefined
      ? { retry: false, reason: d.reason ?? 'unknown', settlesIntent: d.settlesIntent }
      : { retry: false, reason: d.reason ?? 'unknown', status: d.status, settlesIntent: d.settlesIntent };
  }
}

/** The pending record of one client intent (`spec/KEYS.md` §3.6). */
export interface PendingIntent {
  /** The key sent with every attempt of the intent. */
  key: string;
  /** Core's fingerprint (`v1:…`) of the request the key was minted for. */
  fingerprint: string;
  /** When the record was created, in unix ms. */
  createdMs: number;
}

/** Core's answer for a send under an intent. */
export type IntentSendDecision = 'mint' | 'reuse' | 'intent_changed_while_pending' | 'intent_key_differs_from_pending';

/**
 * The fingerprint that binds a client request to its intent's key: core's v1 fingerprint of the
 * method, the target URL, the `Content-Type` and the body (JSON canonically). Throws
 * `CanonicalizationError` for a body declared JSON that core refuses.
 */
export function intentRequestFingerprint(method: string, target: string, contentType: string | null | undefined, body: Uint8Array): string {
  try {
    return native.intentRequestFingerprint(method, target, contentType ?? undefined, body);
  } catch (e) {
    throw fromNative(e);
  }
}

/** Core's decision for a send under an intent whose record is `pending` (null: none stored). */
export function intentDecideSend(pending: PendingIntent | null, requestFingerprint: string, explicitKey?: string | null): IntentSendDecision {
  try {
    return native.intentDecideSend(pending, requestFingerprint, explicitKey ?? undefined) as IntentSendDecision;
  } catch (e) {
    throw fromNative(e);
  }
}

/**
 * Whether core looks at the body of a response with this status and `Content-Type` (a 500
 * `application/problem+json`) to recognise idempo's outcome-unknown problem: read a body only then.
 */
export function responseBodyNeeded(status: number, contentType: string | null | undefined): boolean {
  try {
    return native.responseBodyNeeded(status, contentType ?? undefined);
  } catch (e) {
    throw fromNative(e);
  }
}

/** Parses a `Retry-After` value into ms from `nowMs` (default now); null when invalid. */
export function parseRetryAfter(value: string, nowMs: number = Date.now()): number | null {
  try {
    return native.parseRetryAfter(value, nowMs);
  } catch (e) {
    throw fromNative(e);
  }
}

/** A response as stored for replays. */
export interface StoredResponse {
  status: number;
  headers: Array<[string, string]>;
  body: Buffer;
}

/** Encodes a response into the versioned `response` column (shared with every idempo binding). */
export function encodeResponse(response: StoredResponse): Buffer {
  try {
    return native.encodeResponse(response);
  } catch (e) {
    throw fromNative(e);
  }
}

/** Decodes a `response` column; throws `RecordCorruptError` on malformed bytes. */
export function decodeResponse(encoded: Uint8Array): StoredResponse {
  try {
    const r = native.decodeResponse(encoded);
    return { status: r.status, headers: r.headers as Array<[string, string]>, body: r.body };
  } catch (e) {
    throw fromNative(e);
  }
}
