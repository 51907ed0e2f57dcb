/**
 * Request fingerprints, computed by core: `v1:<hex>` (SHA-256) or `h1:<hex>` (HMAC-SHA256) over
 * the method, route template, chosen headers, content-type class and canonical JSON body.
 */
import native = require('./native');
import type { ExternalObject } from './native';
import { fromNative } from './errors';
import type { NumberMode } from './core';

/** Header input: a Node-style header object or `[name, value]` pairs. */
export type HeaderInput =
  | Record<string, string | string[] | number | undefined>
  | Iterable<[string, string]>;

/** Fingerprint settings (share them across every service that uses one store). */
export interface FingerprinterOptions {
  /** Header names that take part (case-insensitive). Default: none. */
  headers?: string[];
  /** RFC 6901 pointers of JSON values to leave out (e.g. `/client_timestamp`). */
  exclude?: string[];
  /** `'reject_precision_loss'` (default) or `'rfc'`. */
  numbers?: NumberMode;
  /** HMAC key (`h1:` fingerprints); must not be empty. */
  hmacKey?: Uint8Array | string;
  /** Maximum JSON body size in bytes (default 8 MiB). */
  maxInputBytes?: number;
}

/** One request to fingerprint. */
export interface FingerprintRequest {
  /** HTTP method (case-insensitive). */
  method: string;
  /** Route template (`/payments/{id}`), not the concrete path. */
  route: string;
  /** Raw body bytes (or text, encoded as UTF-8). */
  body: Uint8Array | string;
  /** Request headers (read only when header names are configured). */
  headers?: HeaderInput;
  /** Content type; default `application/json`. `null`: no content type (raw body). */
  contentType?: string | null;
}

const EMPTY = Buffer.alloc(0);

/** Route-bound handles a Fingerprinter keeps for `fingerprint()` (route templates are few). */
const MAX_ROUTE_HANDLES = 256;

function bodyBytes(body: Uint8Array | string | undefined | null): Uint8Array {
  if (body == null) return EMPTY;
  return typeof body === 'string' ? Buffer.from(body, 'utf8') : body;
}

/** Headers as the flat `[name, value, ...]` list native calls take. */
export function flatHeaders(headers: HeaderInput | undefined): string[] {
  const out: string[] = [];
  if (headers == null) return out;
  if (Symbol.iterator in headers) {
    for (const [n, v] of headers as Iterable<[string, string]>) out.push(n, String(v));
    return out;
  }
  for (const [n, v] of Object.entries(headers)) {
    if (v === undefined) continue;
    if (Array.isArray(v)) for (const one of v) out.push(n, one);
    else out.push(n, String(v));
  }
  return out;
}

/** A prepared fingerprint configuration; build once and reuse on hot paths. */
export class Fingerprinter {
  readonly #inner: native.Fingerprinter;
  /** The same configuration as a handle: the JSON hot path calls a plain native function. */
  readonly #handle: ExternalObject<'FingerprinterHandle'>;
  readonly #usesHeaders: boolean;
  /** method -> route template -> route-bound handle: the framing head is computed once. */
  readonly #routes = new Map<string, Map<string, ExternalObject<'RouteHandle'>>>();
  #routeHandles = 0;
  /** The last route used, checked before the maps (a service calls one route many times). */
  #lastMethod: string | undefined;
  #lastRoute: string | undefined;
  #lastHandle: ExternalObject<'RouteHandle'> | undefined;

  constructor(options: FingerprinterOptions = {}) {
    const o: native.FingerprinterOptions = {};
    if (options.headers) o.headerNames = options.headers;
    if (options.exclude) o.exclude = options.exclude;
    if (options.numbers) o.numbers = options.numbers;
    if (options.maxInputBytes !== undefined) o.maxInputBytes = options.maxInputBytes;
    if (options.hmacKey !== undefined) {
      o.hmacKey = typeof options.hmacKey === 'string' ? Buffer.from(options.hmacKey, 'utf8') : Buffer.from(options.hmacKey);
    }
    try {
      this.#inner = new native.Fingerprinter(o);
    } catch (e) {
      throw fromNative(e);
    }
    this.#usesHeaders = this.#inner.usesHeaders;
    this.#handle = this.#inner.handle();
  }

  /** Whether request headers take part in the fingerprint (internal: the host passes none otherwise). */
  get usesHeaders(): boolean {
    return this.#usesHeaders;
  }

  /** The native handle of this configuration (for core's admission; internal). */
  get nativeHandle(): ExternalObject<'FingerprinterHandle'> {
    return this.#handle;
  }

  /** The fingerprint text of one request. A bad JSON body throws `CanonicalizationError`. */
  fingerprint(req: FingerprintRequest): string {
    try {
      if (!this.#usesHeaders && req.contentType === undefined && typeof req.body !== 'string') {
        const route = this.#routeHandle(req.method, req.route);
        if (route !== undefined) return native.routeFingerprint(route, req.body);
        return native.fingerprintJsonWith(this.#handle, req.method, req.route, req.body);
      }
      return this.#inner.fingerprint(
        req.method,
        req.route,
        bodyBytes(req.body),
        req.contentType === undefined ? 'application/json' : req.contentType,
        this.#usesHeaders ? flatHeaders(req.headers) : undefined,
      );
    } catch (e) {
      throw fromNative(e);
    }
  }

  /** The kept route-bound handle for (method, route), made on first use; `undefined` when the
   * arguments are not strings or the cache is full (the caller takes the unbound path). */
  #routeHandle(method: unknown, route: unknown): ExternalObject<'RouteHandle'> | undefined {
    if (method === this.#lastMethod && route === this.#lastRoute) return this.#lastHandle;
    if (typeof method !== 'string' || typeof route !== 'string') return undefined;
    let byRoute = this.#routes.get(method);
    let handle = byRoute?.get(route);
    if (handle === undefined) {
      if (this.#routeHandles >= MAX_ROUTE_HANDLES) return undefined;
      if (byRoute === undefined) {
        byRoute = new Map();
        this.#routes.set(method, byRoute);
      }
      handle = this.#inner.routeHandle(method, route);
      byRoute.set(route, handle);
      this.#routeHandles += 1;
    }
    this.#lastMethod = method;
    this.#lastRoute = route;
    this.#lastHandle = handle;
    return handle;
  }

  /**
   * Binds (method, route template): the returned function fingerprints JSON bodies for that route
   * with only the body crossing into native code (requires no configured header names).
   */
  forRoute(method: string, route: string): (body: Uint8Array | string) => string {
    if (this.#usesHeaders) throw new TypeError('forRoute() needs a Fingerprinter without header names');
    // A handle and a plain function: cheaper per call than a method on a native instance.
    const handle = this.#inner.routeHandle(method, route);
    const routeFingerprint = native.routeFingerprint;
    return (body: Uint8Array | string) => {
      const bytes = typeof body === 'string' ? Buffer.from(body, 'utf8') : body;
      if (!(bytes instanceof Uint8Array)) {
        throw new TypeError(`body must be a Buffer, Uint8Array or string, got ${body === null ? 'null' : typeof body}`);
      }
      try {
        return routeFingerprint(handle, bytes);
      } catch (e) {
        throw fromNative(e);
      }
    };
  }

  /** Hot path: a JSON body, no configured headers; positional arguments, no object. */
  fingerprintJson(method: string, route: string, body: Uint8Array): string {
    try {
      return native.fingerprintJsonWith(this.#handle, method, route, body);
    } catch (e) {
      throw fromNative(e);
    }
  }
}

let defaultFingerprinter: Fingerprinter | undefined;

/** Options of the one-shot {@link fingerprint}: the request plus the settings. */
export interface FingerprintInput extends FingerprintRequest, Omit<FingerprinterOptions, 'headers'> {
  /** Header names that take part (the request's headers go in `headers`). */
  headerNames?: string[];
}

/**
 * The fingerprint of one request. With default settings a shared {@link Fingerprinter} is used;
 * with custom settings one is prepared per call (keep a `Fingerprinter` for hot paths).
 */
export function fingerprint(input: FingerprintInput): string {
  const custom =
    input.headerNames !== undefined ||
    input.exclude !== undefined ||
    input.numbers !== undefined ||
    input.hmacKey !== undefined ||
    input.maxInputBytes !== undefined;
  if (!custom) {
    defaultFingerprinter ??= new Fingerprinter();
    return defaultFingerprinter.fingerprint(input);
  }
  const opts: FingerprinterOptions = {};
  if (input.headerNames !== undefined) opts.headers = input.headerNames;
  if (input.exclude !== undefined) opts.exclude = input.exclude;
  if (input.numbers !== undefined) opts.numbers = input.numbers;
  if (input.hmacKey !== undefined) opts.hmacKey = input.hmacKey;
  if (input.maxInputBytes !== undefined) opts.maxInputBytes = input.maxInputBytes;
  return new Fingerprinter(opts).fingerprint(input);
}
