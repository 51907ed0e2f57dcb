/**
 * A `fetch` wrapper for one logical operation, or for one user intent (`{ intent }`): see
 * `runAttempts` (the retry loop) and `intentFetch` (single flight and the pending key).
 */
import { parseRetryAfter } from '../core';
import {
  IdempoError,
  IdempotencyKeyInUseError,
  IdempotencyKeyInvalidError,
  IdempotencyKeyMissingError,
  IdempotencyKeyReusedError,
  OutcomeUnknownError,
  StoreUnavailableError,
} from '../errors';
import { runAttempts } from './attempts';
import type { IdempotentFetchOptions } from './attempts';
import { intentFetch } from './intent';

export { RetriesExhaustedError, FetchOutcomeUnknownError } from './attempts';
export type { IdempotentFetchOptions } from './attempts';

/**
 * Sends the request, retrying with the same key as core's policy decides. Resolves with the
 * final `Response` (success or a non-retryable status such as 422, which means "new operation,
 * new key"); rejects with `RetriesExhaustedError` when the last attempt had no response, with
 * `FetchOutcomeUnknownError` on idempo's outcome-unknown answer, with
 * `IntentChangedWhilePendingError` for a changed request under a pending intent, or with the
 * signal's reason when aborted.
 */
export function idempotentFetch(input: string | URL, init: IdempotentFetchOptions = {}): Promise<Response> {
  if (init.intent !== undefined) return intentFetch(input, init);
  return runAttempts(input, init);
}

/** A fetch function bound to default options (each call is one logical operation, one key). */
export function createIdempotentFetch(defaults: IdempotentFetchOptions = {}) {
  return (input: string | URL, init: IdempotentFetchOptions = {}): Promise<Response> =>
    idempotentFetch(input, { ...defaults, ...init, headers: { ...headersObject(defaults.headers), ...headersObject(init.headers) } });
}

function headersObject(h: HeadersInit | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  if (h) new Headers(h).forEach((v, k) => {
    out[k] = v;
  });
  return out;
}

const PROBLEM_TYPES: Record<string, (detail: string, retryAfterMs?: number) => IdempoError> = {
  'urn:idempo:problem:missing-key': (d) => new IdempotencyKeyMissingError(d),
  'urn:idempo:problem:invalid-key': (d) => new IdempotencyKeyInvalidError(d),
  'urn:idempo:problem:in-flight': (d, ra) => new IdempotencyKeyInUseError(d, ra === undefined ? {} : { retryAfterMs: ra }),
  'urn:idempo:problem:key-reused': (d) => new IdempotencyKeyReusedError(d),
  'urn:idempo:problem:outcome-unknown': (d) => new OutcomeUnknownError(d),
  'urn:idempo:problem:store-unavailable': (d, ra) => new StoreUnavailableError(d, ra === undefined ? {} : { retryAfterMs: ra }),
  'urn:idempo:problem:contention': (d, ra) => new StoreUnavailableError(d, ra === undefined ? {} : { retryAfterMs: ra }),
};

/**
 * The typed error for an idempo problem+json response (409 in use, 422 reused, outcome unknown,
 * 503, 400 missing/invalid key), or null for any other response. Reads a clone of the body.
 */
export async function idempotencyErrorFromResponse(res: Response): Promise<IdempoError | null> {
  if (!/application\/problem\+json/i.test(res.headers.get('content-type') ?? '')) return null;
  let problem: { type?: unknown; detail?: unknown };
  try {
    problem = (await res.clone().json()) as { type?: unknown; detail?: unknown };
  } catch {
    return null;
  }
  const make = typeof problem.type === 'string' ? PROBLEM_TYPES[problem.type] : undefined;
  if (!make) return null;
  const ra = res.headers.get('retry-after');
  const retryAfterMs = ra === null ? undefined : (parseRetryAfter(ra, Date.now()) ?? undefined);
  return make(typeof problem.detail === 'string' ? problem.detail : `HTTP ${res.status}`, retryAfterMs);
}
