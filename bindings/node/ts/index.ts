/**
 * idempo for Node.js: safe retries of HTTP POST with an `Idempotency-Key`.
 *
 * Every decision comes from the Rust core (through the native addon); this package adds the
 * stores, the Express/Fastify integration and the retrying `fetch` client.
 */
export * from './errors';
export {
  canonicalize,
  parseKey,
  parseKeyDetailed,
  generateKey,
  keyHeaderValue,
  scopeId,
  scopeIdHex,
  RetryPolicy,
  parseRetryAfter,
  responseBodyNeeded,
  encodeResponse,
  decodeResponse,
} from './core';
export type {
  CanonicalizeOptions,
  NumberMode,
  ParseKeyOptions,
  ParsedKey,
  RetryPolicyOptions,
  AttemptOutcome,
  RetryDecision,
  StoredResponse,
} from './core';
export { nativeVersion } from './native';
export { Fingerprinter, fingerprint } from './fingerprint';
export type { FingerprinterOptions, FingerprintRequest, FingerprintInput, HeaderInput } from './fingerprint';
export * from './stores/index';
export * from './server/index';
export {
  idempotentFetch,
  createIdempotentFetch,
  RetriesExhaustedError,
  FetchOutcomeUnknownError,
  idempotencyErrorFromResponse,
} from './client/fetch';
export type { IdempotentFetchOptions } from './client/fetch';
export { prometheusMetrics, openTelemetryMetrics, STORE_LATENCY_BUCKETS } from './metrics';
export { OPTION_DEFAULTS } from './defaults';
export type { OptionValue } from './defaults';
export type { PrometheusMetricsOptions, PrometheusRegistryLike, MeterLike, StopMetrics } from './metrics';
export { IntentError, IntentChangedWhilePendingError, IntentKeyDiffersError } from './client/intent';
export { MemoryPendingKeyStore, FilePendingKeyStore, PendingKeyFileError } from './client/pending';
export type { PendingKeyStore, PendingIntent, FilePendingKeyStoreOptions } from './client/pending';
export { intentRequestFingerprint, intentDecideSend } from './core';
export type { IntentSendDecision } from './core';
// Idempotent functions and message consumers (ts/functions.ts)
export {
  idempotent,
  idempotentMethod,
  currentCall,
  jsonSerializer,
  PayloadMismatchError,
  CallInFlightError,
  CallOutcomeUnknownError,
  CallStoreUnavailableError,
  StoredCallError,
} from './functions';
export type { IdempotentOptions, CallContext, Serializer, ErrorDisposition } from './functions';
