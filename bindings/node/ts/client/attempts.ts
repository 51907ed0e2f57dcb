/**
 * The attempt loop of the retrying fetch client: one `Idempotency-Key` for every attempt, retries
 * exactly when core's retry policy says so (idempo's 409 in-flight, 408, 425, 429, 5xx except
 * 501, timeouts, connection errors; never after a 422, an application's own 409, or idempo's
 * outcome-unknown or response-not-retained 500), honouring `Retry-After`, cancellable with an
 * `AbortSignal`. Core tells idempo's problems from the application's answers
 * (`spec/KEYS.md` §3.5): an application's 422 (e.g. a validation error) is its answer, reported as
 * `client_error`, never as key reuse.
 */
import { generateKey, keyHeaderValue, parseRetryAfter, responseBodyNeeded, RetryPolicy } from '../core';
import type { AttemptOutcome, RetryDecision, RetryPolicyOptions } from '../core';
import { OutcomeUnknownError } from '../errors';
import type { PendingKeyStore } from './pending';

/** Options of {@link idempotentFetch}: `fetch`'s options plus the retry settings. */
export interface IdempotentFetchOptions extends RequestInit {
  /** The key of this operation (e.g. persisted before a crash); default a fresh one. With an
   * `intent`: the key to mint when nothing is pending (it must then equal the pending key). */
  key?: string;
  /**
   * A stable name for this user intent (e.g. `checkout-<cart id>`; `spec/KEYS.md` §3.6): the
   * intent's key is kept in `store` until the server gives a definitive answer, bound to this
   * request; concurrent calls for the intent share one attempt sequence and one answer, and a
   * different request under a pending intent rejects with `IntentChangedWhilePendingError`
   * (nothing sent). Without it, every call is its own operation with a fresh key.
   */
  intent?: string;
  /** Where pending intents live (default: one in-memory store per process; use
   * `FilePendingKeyStore` to survive restarts). */
  store?: PendingKeyStore;
  /** Header carrying the key (default `Idempotency-Key`). */
  headerName?: string;
  /** Core's retry policy, or its settings. */
  retry?: RetryPolicy | RetryPolicyOptions;
  /** Per-attempt timeout in ms (an attempt over it counts as a timeout and is retried). */
  attemptTimeoutMs?: number;
  /** The fetch implementation (default the global `fetch`). */
  fetch?: typeof fetch;
  /** Called before each retry (for logs and metrics). */
  onRetry?: (info: { attempt: number; delayMs: number; key: string; outcome: AttemptOutcome }) => void;
  /** Uniform [0, 1) samples for the backoff jitter (default `Math.random`). */
  random?: () => number;
  /** Called once when the policy stops with a response: core's stop reason (`success`,
   * `client_error` with `status`, `key_reused_with_different_request`, `response_not_retained`,
   * ...). */
  onStop?: (info: { reason: string; status: number | null; attempts: number; key: string }) => void;
}

/** Thrown when the policy stops after a timeout or a connection error. */
export class RetriesExhaustedError extends Error {
  readonly key: string;
  readonly attempts: number;
  readonly reason: string;
  constructor(key: string, attempts: number, reason: string, cause: unknown) {
    super(`request failed after ${attempts} attempt(s) (${reason})`, { cause });
    this.name = 'RetriesExhaustedError';
    this.key = key;
    this.attempts = attempts;
    this.reason = reason;
  }
}

/**
 * Thrown when the server answers idempo's outcome-unknown problem (500, type
 * `urn:idempo:problem:outcome-unknown`, recognised by core): an earlier attempt with `key` may
 * have taken effect and its outcome was not recorded. No further attempt is made (retrying this
 * key cannot change the answer); reconcile before using a new key. `code` is `OUTCOME_UNKNOWN`.
 */
export class FetchOutcomeUnknownError extends OutcomeUnknownError {
  /** The key every attempt carried. */
  readonly key: string;
  /** Attempts made, the last one included. */
  readonly attempts: number;
  /** The 500 answer (its body is still readable). */
  readonly response: Response;
  constructor(key: string, attempts: number, response: Response) {
    super(
      `outcome unknown after ${attempts} attempt(s): an earlier attempt with this key may have taken effect; reconcile before using a new key`,
      { reason: 'outcome_unknown' },
    );
    this.key = key;
    this.attempts = attempts;
    this.response = response;
  }
}

export function abortError(signal: AbortSignal): unknown {
  return signal.reason ?? new DOMException('The operation was aborted.', 'AbortError');
}

function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(abortError(signal));
    const onAbort = () => {
      clearTimeout(t);
      reject(abortError(signal as AbortSignal));
    };
    const t = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

export function replayableBody(body: RequestInit['body']): RequestInit['body'] {
  if (body === undefined || body === null) return body;
  if (typeof body === 'string' || body instanceof Uint8Array || body instanceof ArrayBuffer) return body;
  if (typeof URLSearchParams !== 'undefined' && body instanceof URLSearchParams) return body;
  if (typeof Blob !== 'undefined' && body instanceof Blob) return body;
  throw new TypeError('idempotentFetch needs a body it can send again (string, Buffer, ArrayBuffer, Blob, URLSearchParams)');
}

/**
 * One attempt sequence under one key (the loop behind `idempotentFetch`). `onSettle` is awaited
 * when core's stop settles an intent (`settlesIntent`), before the response is returned.
 */
export async function runAttempts(
  input: string | URL,
  init: IdempotentFetchOptions,
  onSettle?: () => Promise<void>,
): Promise<Response> {
  const { key: givenKey, headerName, retry, attemptTimeoutMs, fetch: fetchImpl, onRetry, onStop, random, signal, intent: _intent, store: _store, ...req } = init;
  const doFetch = fetchImpl ?? globalThis.fetch;
  const policy = retry instanceof RetryPolicy ? retry : new RetryPolicy(retry ?? {});
  const key = givenKey ?? generateKey();
  const headers = new Headers(req.headers);
  headers.set(headerName ?? 'Idempotency-Key', keyHeaderValue(key));
  const body = replayableBody(req.body);
  const rand = random ?? Math.random;
  const started = Date.now();
  for (let attempt = 1; ; attempt++) {
    if (signal?.aborted) throw abortError(signal);
    const ctrl = new AbortController();
    const onAbort = () => ctrl.abort(abortError(signal as AbortSignal));
    signal?.addEventListener('abort', onAbort, { once: true });
    let timedOut = false;
    const timer =
      attemptTimeoutMs !== undefined
        ? setTimeout(() => {
            timedOut = true;
            ctrl.abort(new DOMException('attempt timed out', 'TimeoutError'));
          }, attemptTimeoutMs)
        : undefined;
    let response: Response | undefined;
    let error: unknown;
    let outcome: AttemptOutcome;
    try {
      response = await doFetch(input, { ...req, body, headers, signal: ctrl.signal });
      const ra = response.headers.get('retry-after');
      const contentType = response.headers.get('content-type');
      // Core needs the body only to recognise idempo's own problems; read a clone then.
      const responseBody = responseBodyNeeded(response.status, contentType)
        ? new Uint8Array(await response.clone().arrayBuffer())
        : null;
      outcome = {
        kind: 'response',
        status: response.status,
        retryAfterMs: ra === null ? null : parseRetryAfter(ra, Date.now()),
        contentType,
        body: responseBody,
      };
    } catch (e) {
      if (signal?.aborted) throw abortError(signal);
      error = e;
      outcome = timedOut ? { kind: 'timeout' } : { kind: 'connection_error' };
    } finally {
      if (timer) clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
    }
    const decision: RetryDecision = policy.decide(attempt, Date.now() - started, outcome, rand());
    if (!decision.retry) {
      if (response && decision.reason === 'outcome_unknown') throw new FetchOutcomeUnknownError(key, attempt, response);
      if (response) {
        if (decision.settlesIntent && onSettle) await onSettle();
        onStop?.({ reason: decision.reason, status: decision.status ?? null, attempts: attempt, key });
        return response;
      }
      throw new RetriesExhaustedError(key, attempt, decision.reason, error);
    }
    // Free the connection of a response we will not read.
    if (response) await response.body?.cancel().catch(() => undefined);
    onRetry?.({ attempt, delayMs: decision.delayMs, key, outcome });
    await sleep(decision.delayMs, signal ?? undefined);
  }
}

