/**
 * Intents for the fetch client (`spec/KEYS.md` §3.6): one key per user intent, bound to its
 * request, single flight per intent. Core decides (mint / reuse / refuse, settle or keep); this
 * file stores records, shares one attempt sequence between concurrent callers, and sends.
 */
import { generateKey, intentDecideSend, intentRequestFingerprint } from '../core';
import type { PendingIntent } from '../core';
import { abortError, replayableBody, runAttempts } from './attempts';
import type { IdempotentFetchOptions } from './attempts';
import { MemoryPendingKeyStore } from './pending';
import type { PendingKeyStore } from './pending';

/** A send under an intent was refused locally; nothing was sent. */
export class IntentError extends Error {
  /** `INTENT_CHANGED_WHILE_PENDING` or `INTENT_KEY_DIFFERS_FROM_PENDING`. */
  readonly code: string;
  /** Core's snake_case code. */
  readonly reason: string;
  readonly intent: string;
  /** The intent's pending record (its key stays pending). */
  readonly pending: PendingIntent;
  readonly key: string;
  constructor(code: string, reason: string, intent: string, pending: PendingIntent, message: string) {
    super(message);
    this.name = new.target.name;
    this.code = code;
    this.reason = reason;
    this.intent = intent;
    this.pending = pending;
    this.key = pending.key;
  }
}

/**
 * The request differs from the one the intent's pending key was minted for (e.g. the amount
 * changed). The earlier attempt may have run: reconcile (check the resource), then
 * `store.remove(intent)` before sending the changed request, or use a new intent name.
 */
export class IntentChangedWhilePendingError extends IntentError {
  constructor(intent: string, pending: PendingIntent) {
    super(
      'INTENT_CHANGED_WHILE_PENDING',
      'intent_changed_while_pending',
      intent,
      pending,
      `intent ${JSON.stringify(intent)} has a pending key minted for a different request; nothing was sent: reconcile (the earlier attempt may have run), then remove the intent's record or use a new intent`,
    );
  }
}

/** The explicit `key` is not the intent's pending key. */
export class IntentKeyDiffersError extends IntentError {
  constructor(intent: string, pending: PendingIntent) {
    super(
      'INTENT_KEY_DIFFERS_FROM_PENDING',
      'intent_key_differs_from_pending',
      intent,
      pending,
      `the explicit key is not the pending key of intent ${JSON.stringify(intent)}; nothing was sent`,
    );
  }
}

interface Flight {
  record: Promise<PendingIntent>;
  result: Promise<Response> | null;
  settled: boolean;
  waiters: number;
  controller: AbortController;
}

const defaultStore = new MemoryPendingKeyStore();
const flightsByStore = new WeakMap<PendingKeyStore, Map<string, Flight>>();

function flightsOf(store: PendingKeyStore): Map<string, Flight> {
  let m = flightsByStore.get(store);
  if (!m) flightsByStore.set(store, (m = new Map()));
  return m;
}

/** `promise`, or the signal's reason when `signal` aborts first (the promise runs on). */
function until<T>(promise: Promise<T>, signal: AbortSignal | null | undefined): Promise<T> {
  if (!signal) return promise;
  if (signal.aborted) return Promise.reject(abortError(signal));
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(abortError(signal));
    signal.addEventListener('abort', onAbort, { once: true });
    promise.then(
      (v) => {
        signal.removeEventListener('abort', onAbort);
        resolve(v);
      },
      (e: unknown) => {
        signal.removeEventListener('abort', onAbort);
        reject(e);
      },
    );
  });
}

async function bodyBytes(body: RequestInit['body'], headers: Headers): Promise<Uint8Array> {
  if (body === undefined || body === null) return new Uint8Array();
  if (typeof body === 'string') return new TextEncoder().encode(body);
  if (body instanceof Uint8Array) return body;
  if (body instanceof ArrayBuffer) return new Uint8Array(body);
  if (body instanceof URLSearchParams) {
    if (!headers.has('content-type')) headers.set('content-type', 'application/x-www-form-urlencoded;charset=UTF-8');
    return new TextEncoder().encode(body.toString());
  }
  if (body instanceof Blob) {
    if (!headers.has('content-type') && body.type) headers.set('content-type', body.type);
    return new Uint8Array(await body.arrayBuffer());
  }
  throw new TypeError('an intent needs a body it can fingerprint and send again (string, Buffer, ArrayBuffer, Blob, URLSearchParams)');
}

/** `idempotentFetch` with `{ intent }`. */
export async function intentFetch(input: string | URL, init: IdempotentFetchOptions): Promise<Response> {
  const intent = init.intent as string;
  if (typeof intent !== 'string' || intent === '') throw new TypeError('intent must be a non-empty string');
  const store = init.store ?? defaultStore;
  const headers = new Headers(init.headers);
  const body = replayableBody(init.body);
  const bytes = await bodyBytes(body, headers);
  const target = input instanceof URL ? input.href : String(input);
  const fingerprint = intentRequestFingerprint(init.method ?? 'GET', target, headers.get('content-type'), bytes);
  const explicitKey = init.key ?? null;

  const flights = flightsOf(store);
  let flight = flights.get(intent);
  if (!flight) {
    const candidate: PendingIntent = { key: explicitKey ?? generateKey(), fingerprint, createdMs: Date.now() };
    flight = { record: store.getOrCreate(intent, candidate), result: null, settled: false, waiters: 0, controller: new AbortController() };
    flight.record.catch(() => undefined); // observed by every caller below
    flights.set(intent, flight);
  }
  const f = flight;
  f.waiters++;
  try {
    const record = await until(f.record, init.signal);
    const decision = intentDecideSend(record, fingerprint, explicitKey);
    if (decision === 'intent_changed_while_pending') throw new IntentChangedWhilePendingError(intent, record);
    if (decision === 'intent_key_differs_from_pending') throw new IntentKeyDiffersError(intent, record);
    if (!f.result) {
      const run = runAttempts(
        input,
        { ...init, headers, body, key: record.key, signal: f.controller.signal },
        () => store.remove(intent),
      );
      f.result = run.finally(() => {
        f.settled = true;
      });
      f.result.catch(() => undefined); // observed by every caller below
    }
    const response = await until(f.result, init.signal);
    // Every caller gets its own readable copy of the one answer.
    return response.clone();
  } finally {
    f.waiters--;
    if (f.waiters === 0) {
      if (flights.get(intent) === f) flights.delete(intent);
      // Nobody waits any more: stop the attempts (never after the answer: its body is still read).
      if (!f.settled) f.controller.abort(new DOMException('every caller of the intent went away', 'AbortError'));
    }
  }
}
