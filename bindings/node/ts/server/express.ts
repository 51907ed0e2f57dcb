/**
 * Express integration: `app.post('/payments', idempotency({ store }), handler)`.
 *
 * The middleware reads the raw body (so the fingerprint covers the exact bytes), parses JSON
 * bodies into `req.body`, runs core's flow and, when core says "run the handler", calls `next()`
 * while capturing the response; the captured response goes through the flow (stored per policy)
 * before it is sent.
 *
 * Handler errors need no extra middleware. A thrown error (Express 4 `next(err)`, a synchronous
 * throw, or an Express 5 rejected promise) is reported to the flow by an error tap the middleware
 * adds after the route's handlers the first time it runs: core releases the key when the error is
 * side-effect free, otherwise records outcome-unknown; the error then continues to your error
 * handlers. A 5xx that an error handler (or Express's default one) writes while the handler's
 * response is being captured follows the response caching policy (released, or stored with
 * `storeServerErrors`). `idempotencyErrorHandler()` is kept for compatibility and is optional.
 *
 * Transactional mode (`transactional: true`): the handler finds its open transaction in
 * `req.idempotency.tx` or `currentTransaction()`; the captured response is sent after `COMMIT`.
 */
import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from 'node:http';
// Express's request type (@types/express). Optional for users: the published declarations mark this
// import `@ts-ignore` (scripts/optional-types.cjs), so without @types/express it is `any`.
import type { Request as ExpressRequest } from 'express';
import { Readable } from 'node:stream';
import { ConfigError } from '../errors';
import { admitKeyFacts, admitRestEager, admitThroughGate, declaredLength, gateKeyStage, Prepared } from './options';
import type { Admitted, GateFacts, IdempotencyOptions } from './options';
import type { MemoryInline } from '../stores/memory';
import native = require('../native');
import type { Admission, ExecutionContext, FlowEnd, HandlerResult, HttpResponse, Session } from './session';
import { IdempotencyEvents, toHttp } from './session';
import { ResponseCapture } from './express-capture';
import type { CaptureOwner } from './express-capture';
import { txStorage } from './tx';
import type { TxHolder } from './tx';

declare global {
  // Module augmentation of Express's `Request` (its global `Express.Request`, which
  // express-serve-static-core's `Request` extends); needs no Express types to be present.
  // eslint-disable-next-line @typescript-eslint/no-namespace
  namespace Express {
    interface Request {
      /**
       * Set by `idempotency()` on the requests it protects, before the handler runs: the
       * generation, the `downstreamKey` for side effects, the lease `signal` and, in transactional
       * mode, `tx`. Undefined on requests it does not protect.
       */
      idempotency: ExecutionContext;
      /** The exact request bytes: read by `idempotency()`, or kept by `keepRawBody`. */
      rawBody?: Buffer;
    }
  }
}

type Next = (err?: unknown) => void;
interface Req extends IncomingMessage {
  body?: unknown;
  rawBody?: Buffer;
  idempotency?: ExecutionContext;
  route?: { path?: unknown; methods?: Record<string, boolean> };
  app?: { get?: (setting: string) => unknown };
  baseUrl?: string;
  originalUrl?: string;
  path?: string;
  _body?: boolean;
}
type Res = ServerResponse;

/** Each protected request's state, for the error tap. A `WeakMap`, not a property: Express gives
 * every request a shape of its own, so a property added to one is slow to add. */
const states = new WeakMap<object, RequestState>();

/** Routes and apps that already carry the error tap. */
const tapped = new WeakSet<object>();

/** The Express layer stack of a route (Express 4 and 5 share this shape). */
interface RouteLike {
  stack?: Array<{ constructor: new (path: string, options: object, fn: ErrorHandler) => { method?: string } }>;
}
interface AppLike {
  use?: (fn: ErrorHandler) => unknown;
}

/** Reports a handler error to the flow, then lets it continue. */
function errorTap(err: unknown, req: IncomingMessage, res: ServerResponse, next: Next): void {
  const st = states.get(req);
  if (!st || st.done) {
    next(err);
    return;
  }
  st.onError(err, res, next);
}

/**
 * Adds the error tap after the handlers of the route this request matched (route-level mounting:
 * `app.post(path, idempotency(...), handler)`), or at the end of the app's stack when the
 * middleware is mounted with `app.use` (there, an error handler of yours that renders the error
 * first makes its 5xx follow the caching policy instead). Once per route or app.
 */
function installErrorTap(req: Req): void {
  const route = req.route as (RouteLike & object) | undefined;
  if (route && Array.isArray(route.stack) && route.stack.length > 0) {
    if (tapped.has(route)) return;
    tapped.add(route);
    // A layer without a method is visited for every method the route dispatches; it is not
    // registered through `route.all()`, which would make the route claim every method.
    const Layer = route.stack[0]!.constructor;
    const layer = new Layer('/', {}, errorTap);
    layer.method = undefined;
    route.stack.push(layer as never);
    return;
  }
  const app = (req as Req & { app?: AppLike & object }).app;
  if (app && typeof app.use === 'function' && !tapped.has(app)) {
    tapped.add(app);
    app.use(errorTap);
  }
}

interface RequestState {
  done: boolean;
  /** Reports a handler error to the flow and continues as core decides. */
  onError(err: unknown, res: Res, next: Next): void;
}

/**
 * Reads the request body, at most `limit` bytes. Resolves `null` as soon as the body is known to be
 * larger (a `Content-Length` over the limit, or the first chunk past it) and stops reading, so a
 * hostile upload costs at most the limit plus one chunk.
 */
export function readBody(req: IncomingMessage, limit: number): Promise<Buffer | null> {
  return readDeclared(req, req.headers['content-length'], limit);
}

/** {@link readBody} with the request's `Content-Length` field already read (each read of a
 * property of an Express request is a slow lookup: its shape is new on every request). */
function readDeclared(req: IncomingMessage, contentLength: string | undefined, limit: number): Promise<Buffer | null> {
  const declared = Number(contentLength);
  if (Number.isFinite(declared) && declared > limit) return Promise.resolve(null);
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const onData = (c: Buffer) => {
      size += c.length;
      if (size <= limit) {
        chunks.push(c);
        return;
      }
      cleanup();
      req.pause();
      resolve(null);
    };
    const onEnd = () => {
      cleanup();
      resolve(chunks.length === 1 ? (chunks[0] as Buffer) : Buffer.concat(chunks));
    };
    const onError = (e: Error) => {
      cleanup();
      reject(e);
    };
    const cleanup = () => {
      req.off('data', onData);
      req.off('end', onEnd);
      req.off('error', onError);
    };
    req.on('data', onData);
    req.on('end', onEnd);
    req.on('error', onError);
  });
}

/**
 * A `verify` hook for Express's body parsers that keeps the exact request bytes in `req.rawBody`:
 * `app.use(express.json({ verify: keepRawBody }))`. Needed only when a parser runs before
 * `idempotency()` (an `app.use(express.json())` above the protected routes): the middleware then
 * fingerprints `req.rawBody`. Without it such a request is refused with 500 `body-unavailable`.
 */
export function keepRawBody(req: IncomingMessage, _res: ServerResponse, buf: Buffer): void {
  (req as Req).rawBody = Buffer.from(buf);
}

/** What the 500 `body-unavailable` problem (core's) says to do. */
const BODY_FIX =
  'Mount idempotency() before the body parsers (they still parse after it), or keep the raw bytes with the parser\'s verify hook: express.json({ verify: keepRawBody }) (keepRawBody is exported by idempo).';

/** True when the request declares no body (`Content-Length: 0`, or neither it nor `Transfer-Encoding`). */
function declaresNoBody(req: IncomingMessage): boolean {
  const cl = req.headers['content-length'];
  if (req.headers['transfer-encoding'] !== undefined) return false;
  return cl === undefined || /^\s*0+\s*$/.test(cl);
}

/**
 * Puts the bytes idempo read back into the request stream, so body parsers mounted after the
 * middleware (`express.json()`, `urlencoded()`, `text()`, `raw()`, Express 4 and 5) parse the same
 * bytes as if idempo had never read them. The request gets a fresh readable state whose `_read`
 * gives `body`, then the end, the first time anything reads (`read()`, `data` listeners, `pipe`,
 * an async iterator; node's own drain once the response is out): a request whose handler reads
 * only `req.body` never goes through the stream's buffering for nothing.
 */
function replayBody(req: IncomingMessage, body: Buffer): void {
  const fresh = new Readable({ read() {}, autoDestroy: false });
  const r = req as unknown as { _readableState: unknown; _read: (n: number) => void };
  r._readableState = (fresh as unknown as { _readableState: unknown })._readableState;
  let given = false;
  r._read = function (this: IncomingMessage) {
    if (given) return;
    given = true;
    if (body.length > 0) this.push(body);
    this.push(null);
  };
}

/** Express's routing settings that decide which paths reach one handler. */
function routing(req: Req): { strict: boolean; caseSensitive: boolean } {
  const app = req.app;
  if (app === undefined || typeof app.get !== 'function') return { strict: false, caseSensitive: false };
  return { strict: app.get('strict routing') === true, caseSensitive: app.get('case sensitive routing') === true };
}

/** A path without its trailing slashes, unless the app routes strictly (`/payments/` == `/payments`). */
function trimSlash(path: string, strict: boolean): string {
  if (strict || path.charCodeAt(path.length - 1) !== 47 /* '/' */) return path;
  const t = path.replace(/\/+$/, '');
  return t === '' ? '/' : t;
}

/**
 * The route identity (scope, `spec/KEYS.md` §2) and the request target (fingerprint) of a request.
 * Mounted per route: the matched route template (`/payments/:id`). Mounted with `app.use`: the path,
 * normalised the way Express's router matches it (trailing slash unless `strict routing`, case
 * unless `case sensitive routing`), so `/payments`, `/payments/` and `/PAYMENTS`, which reach one
 * handler, share one key. The target keeps its case (it may carry parameters) and drops a trailing
 * slash only where the router ignores it.
 */
function identity(req: Req): { route: string; target: string } {
  const { strict, caseSensitive } = routing(req);
  const original = req.originalUrl ?? req.url ?? '/';
  const q = original.indexOf('?');
  const target = q < 0 ? trimSlash(original, strict) : trimSlash(original.slice(0, q), strict) + original.slice(q);
  const template = req.route?.path;
  if (template !== undefined && template !== null) {
    return { route: trimSlash((req.baseUrl ?? '') + String(template), strict), target };
  }
  const path = trimSlash((req.baseUrl ?? '') + (req.path ?? (q < 0 ? original : original.slice(0, q))), strict);
  return { route: caseSensitive ? path : path.toLowerCase(), target };
}

/** Routes already told they are mounted on a method idempo does not protect. */
const misMounted = new WeakSet<object>();

/**
 * Mounted on a route none of whose methods is protected (`app.put(path, idempotency(), h)` with the
 * default methods): a configuration error, never a silent no-op. Returns the error, or null.
 */
function unprotectedRoute(req: Req, methods: Set<string>, events: IdempotencyEvents): ConfigError | null {
  const r = req.route;
  if (!r || typeof r !== 'object' || !r.methods || r.methods._all) return null;
  const routeMethods = Object.keys(r.methods).filter((m) => r.methods![m]).map((m) => m.toUpperCase());
  if (routeMethods.some((m) => methods.has(m))) return null;
  const path = (req.baseUrl ?? '') + String(r.path);
  const message =
    `idempotency(): mounted on ${routeMethods.join(', ')} ${path}, a method it does not protect ` +
    `(protected: ${[...methods].join(', ')}), so it would do nothing; ` +
    `add the method to \`methods\` (e.g. methods: ['POST', 'PATCH', '${routeMethods[0] ?? 'PUT'}']) or remove the middleware from this route`;
  if (!misMounted.has(r)) {
    misMounted.add(r);
    if (events.listenerCount('warning') > 0) events.emit('warning', { message });
    else console.warn(message);
  }
  return new ConfigError(message);
}

/** `req.body` from a JSON body (undefined when it does not parse). */
function parseJson(req: Req, body: Buffer): void {
  try {
    req.body = JSON.parse(body.toString('utf8'));
  } catch {
    req.body = undefined;
  }
}

/**
 * The request as it would be without idempo: its body readable again (`refill`) and the deferred
 * JSON parse done (`unparsed`), for the handlers that run next.
 */
function restoreRequest(req: Req, refill: Buffer | null, unparsed: Buffer | null): void {
  if (refill !== null) replayBody(req, refill);
  if (unparsed !== null) parseJson(req, unparsed);
}

/** The last content type {@link isJson} read, and its answer (one service sends one type). */
let lastType: string | undefined;
let lastJson = false;

function isJson(ct: string | undefined): boolean {
  if (!ct) return false;
  if (ct === lastType) return lastJson;
  const essence = (ct.split(';')[0] ?? '').trim().toLowerCase();
  lastJson = essence === 'application/json' || essence.endsWith('+json');
  lastType = ct;
  return lastJson;
}

function send(res: Res, r: HttpResponse): void {
  for (const name of res.getHeaderNames()) res.removeHeader(name);
  res.statusCode = r.status;
  for (const [n, v] of r.headers) res.appendHeader(n, v);
  res.setHeader('content-length', String(r.body.length));
  res.end(r.body);
}

/** Sends a refusal; when the rest of the upload was never read, the connection closes once the
 * answer is out. */
function refuse(req: Req, res: Res, consumed: boolean, response: HttpResponse): void {
  if (!consumed && !req.readableEnded) {
    res.on('finish', () => req.destroy());
    send(res, { ...response, headers: [...response.headers, ['connection', 'close']] });
    return;
  }
  send(res, response);
}

/** {@link send} for a response whose status and headers are already on `res`. */
function sendBody(res: Res, body: Buffer): void {
  res.setHeader('content-length', String(body.length));
  res.end(body);
}

/** An Express middleware with its event emitter attached. */
export interface IdempotencyMiddleware {
  (req: IncomingMessage, res: ServerResponse, next: Next): void;
  /** Outcome, store-error and lease events for metrics. */
  events: IdempotencyEvents;
}

/** Express middleware making the route's handler idempotent (see the module docs). */
export function idempotency(options: IdempotencyOptions<ExpressRequest>): IdempotencyMiddleware {
  const p = new Prepared<ExpressRequest>(options);
  const emitOutcome = (method: string, route: string, outcome: string, status: number, started: number) => {
    if (p.events.listenerCount('outcome') > 0) p.events.emit('outcome', { outcome, route, method, status, durationMs: Date.now() - started });
  };

  /**
   * One protected request from the handler on: its capture, its error report and its end. A
   * class, so a request costs one object (its methods are shared).
   */
  class Guarded implements RequestState, CaptureOwner {
    done = false;
    /** The handler's response was captured: the flow already has the handler's end. */
    captured = false;
    /** The response was teed or passed through: the client already has it. */
    sent = false;
    /** Transactional mode: what `currentTransaction()` answers (cleared when the flow ends). */
    holder: TxHolder | undefined;
    capture: ResponseCapture | undefined;
    /** The handler's captured response, as given to the flow. */
    live: HandlerResult | undefined;
    /** The error being reported (`onError`), handed on to `next` once the flow ends. */
    err: unknown;
    errNext: Next | undefined;

    constructor(
      readonly session: Session,
      readonly res: Res,
      readonly next: Next,
      readonly started: number,
      readonly method: string,
      readonly route: string,
    ) {}

    plan(status: number, headers: Array<[string, string]>): { kind: string; limit: number | null } {
      return this.session.capturePlan(status, headers, true);
    }

    ended(handled: HandlerResult, sent: boolean): void {
      this.captured = true;
      this.sent = sent;
      const redacted = handled.bodyTruncated ? undefined : options.redact?.(handled);
      const result = redacted ? { ...handled, bodyToStore: redacted } : handled;
      this.live = handled;
      let end: FlowEnd | Promise<FlowEnd>;
      try {
        end = this.session.finishEager(result);
      } catch (e) {
        // As a rejected finish: reported on the next turn, never into the handler's res.end().
        void Promise.resolve().then(() => this.#broken(e));
        return;
      }
      // The memory store's common case ends here, in the handler's own res.end() as without
      // idempo (no promise, no closure).
      if (end instanceof Promise) end.then(this.#finished, (e: unknown) => this.#broken(e));
      else this.#onEnd(end);
    }

    onError(err: unknown, _res: Res, n: Next): void {
      // An error after the response was written (e.g. `res.json(x); throw e`): the flow has
      // the response already; the error goes on to the error handlers untouched.
      if (this.captured) {
        n(err);
        return;
      }
      this.err = err;
      this.errNext = n;
      this.session.fail(!p.isSideEffectFree(err)).then(
        (end: FlowEnd) => this.#failed(end),
        (e: unknown) => this.#brokenAfterError(e),
      );
    }

    #close(): void {
      this.done = true;
      this.capture?.restore();
      if (this.holder) this.holder.tx = null;
    }

    #finishWith(end: FlowEnd, next: Next, err?: unknown): void {
      this.#close();
      if (end.kind === 'respond') {
        emitOutcome(this.method, this.route, end.outcome, end.response.status, this.started);
        // A teed or passed-through response is already with the client. The session hands back
        // the very header list it was given only when core's answer is the handler's response
        // unchanged: the response object already carries that status and those headers.
        const live = this.live;
        if (this.sent) return;
        if (live !== undefined && end.response.headers === live.headers && end.response.status === this.res.statusCode) {
          sendBody(this.res, end.response.body);
        } else send(this.res, end.response);
      } else {
        emitOutcome(this.method, this.route, end.outcome, 500, this.started);
        next(err);
      }
    }

    get #finished(): (end: FlowEnd) => void {
      return (end) => this.#onEnd(end);
    }

    #onEnd(end: FlowEnd): void {
      try {
        this.#finishWith(end, this.next);
      } catch (e) {
        this.#broken(e);
      }
    }

    #broken(e: unknown): void {
      this.#close();
      this.next(e);
    }

    #failed(end: FlowEnd): void {
      try {
        this.#finishWith(end, this.errNext as Next, this.err);
      } catch (e) {
        this.#brokenAfterError(e);
      }
    }

    #brokenAfterError(e: unknown): void {
      this.#close();
      (this.errNext as Next)(e);
    }
  }

  /**
   * The handler runs: its capture and error report (`a` is the claim's answer, `session` its
   * flow; `refill`/`unparsed` as in {@link afterBody}).
   */
  function run(req: Req, res: Res, next: Next, session: Session, a: Admission, refill: Buffer | null, unparsed: Buffer | null, started: number, method: string, route: string): void {
    if (a.kind === 'respond') {
      emitOutcome(method, route, a.outcome, a.response.status, started);
      send(res, a.response);
      return;
    }
    restoreRequest(req, refill, unparsed);
    req.idempotency = a.context;
    const st = new Guarded(session, res, next, started, method, route);
    states.set(req, st);
    installErrorTap(req);
    st.capture = new ResponseCapture(res, st);
    if (a.context.tx !== undefined) {
      // Transactional: the handler (and everything it awaits) sees its transaction.
      const holder: TxHolder = { tx: a.context.tx };
      st.holder = holder;
      txStorage.run(holder, () => next());
      return;
    }
    next();
  }

  /** The request once its body is known: the rest of core's admission, then the handler or
   * core's answer. `fast`: the key stage ran through the memory gate (`key` the field it read). */
  function afterBody(
    req: Req,
    res: Res,
    next: Next,
    headers: IncomingHttpHeaders,
    body: Buffer | null,
    consumed: boolean,
    unavailableFix: string | undefined,
    adm: native.Admission | undefined,
    fast: { gate: native.MemoryGate; mem: MemoryInline; key: string | undefined; declared: number | null } | undefined,
    started: number,
    method: string,
    route: string,
    target: string,
  ): void {
    const ct = headers['content-type'];
    // Parsers mounted after the middleware read these bytes again; with none, a JSON body is
    // parsed here (other types stay in `req.rawBody`): before the admission when a `scope`
    // function may read `req.body`, else only once the request goes on past the middleware (a
    // replay, a 409 or a 422 answered here never parses it).
    let unparsed: Buffer | null = null;
    if (body !== null && !consumed) {
      req.rawBody = body;
      if (body.length > 0 && req.body === undefined && isJson(ct)) {
        if (options.scope) parseJson(req, body);
        else unparsed = body;
      }
    }
    // Parsers after the middleware read the bytes again from the request stream, refilled only
    // when something downstream can read it (not for a replay, a 409 or a 422 answered here).
    const refill = body !== null && !consumed ? body : null;
    const user = (req as Req & { user?: unknown }).user;
    const facts: GateFacts<ExpressRequest> = {
      req: req as unknown as ExpressRequest,
      method,
      route,
      target,
      contentType: ct,
      headers,
      body,
      authenticated: headers.authorization !== undefined || (user !== undefined && user !== null),
      key: fast?.key,
      declared: fast?.declared ?? null,
    };
    if (unavailableFix !== undefined) facts.unavailableFix = unavailableFix;
    let admitted: Admitted | Promise<Admitted>;
    try {
      if (fast !== undefined && body !== null && unavailableFix === undefined) {
        // The memory store: core's whole admission and the claim in one native call.
        admitted = admitThroughGate(p, fast.gate, fast.mem, facts);
      } else {
        const a = adm ?? admitKeyFacts(p, fast?.key, headers['content-length']).a;
        admitted = admitRestEager(p, a, facts);
      }
    } catch (e) {
      // The error handlers see the request as it would be without idempo (its body readable
      // again, the deferred parse done), as on every other failure.
      restoreRequest(req, refill, unparsed);
      throw e;
    }
    if (admitted instanceof Promise) {
      admitted.then(
        (r) => admittedThen(req, res, next, r, consumed, refill, unparsed, started, method, route),
        (e: unknown) => {
          restoreRequest(req, refill, unparsed);
          next(e);
        },
      ).catch(next);
      return;
    }
    admittedThen(req, res, next, admitted, consumed, refill, unparsed, started, method, route);
  }

  function admittedThen(
    req: Req,
    res: Res,
    next: Next,
    admitted: Admitted,
    consumed: boolean,
    refill: Buffer | null,
    unparsed: Buffer | null,
    started: number,
    method: string,
    route: string,
  ): void {
    if (admitted.kind === 'answered') {
      // Core's answer to the claim (the memory store's combined call): as a session's below.
      emitOutcome(method, route, admitted.outcome, admitted.response.status, started);
      send(res, admitted.response);
      return;
    }
    if (admitted.kind !== 'session') {
      if (refill !== null) replayBody(req, refill);
      if (admitted.kind === 'unprotected') {
        if (unparsed !== null) parseJson(req, unparsed);
        next();
        return;
      }
      emitOutcome(method, route, admitted.outcome, admitted.response.status, started);
      refuse(req, res, consumed, admitted.response);
      return;
    }
    const session = admitted.session;
    let a: Admission | Promise<Admission>;
    try {
      a = session.admitEager();
    } catch (e) {
      restoreRequest(req, refill, unparsed);
      throw e;
    }
    if (a instanceof Promise) {
      a.then(
        (r) => run(req, res, next, session, r, refill, unparsed, started, method, route),
        (e: unknown) => {
          restoreRequest(req, refill, unparsed);
          next(e);
        },
      ).catch(next);
      return;
    }
    run(req, res, next, session, a, refill, unparsed, started, method, route);
  }

  const mw = (req: Req, res: Res, next: Next): void => {
    const started = Date.now();
    const method = (req.method ?? 'GET').toUpperCase();
    if (!p.methods.has(method)) {
      next(unprotectedRoute(req, p.methods, p.events) ?? undefined);
      return;
    }
    const ident = identity(req);
    const route = options.route ? options.route(req as never) : ident.route;
    // Core's admission, in core's order: the key first, then the body, then the scope.
    // Read once: a property of an Express request is a slow lookup (a new shape per request).
    const headers = req.headers;
    const rawKey = headers[p.header];
    // The memory gate takes one key field (a repeated header goes the ordinary way).
    const gate = typeof rawKey !== 'object' ? p.memoryGate() : undefined;
    let fast: { gate: native.MemoryGate; mem: MemoryInline; key: string | undefined; declared: number | null } | undefined;
    let adm: native.Admission | undefined;
    let kind: string;
    let limit = 0;
    if (gate !== undefined) {
      const declared = declaredLength(headers['content-length']);
      const k = gateKeyStage(gate.gate, rawKey as string | undefined, declared);
      kind = k === -1 ? 'pass_through' : k === -2 ? 'refuse' : 'read_body';
      limit = k;
      fast = { gate: gate.gate, mem: gate.mem, key: rawKey as string | undefined, declared };
    } else {
      const key = admitKeyFacts(p, rawKey, headers['content-length']);
      adm = key.a;
      kind = key.kind;
      limit = key.bodyLimit;
    }
    if (kind === 'pass_through') {
      next();
      return;
    }
    // A body parser mounted before the middleware read the stream (Express 4's sets `_body`).
    const consumed = req.readableEnded || req._body === true || (req.complete && !req.readable);
    if (kind === 'refuse') {
      // Through the gate, the ordinary key stage gives the problem (the same core call).
      const a = adm ?? admitKeyFacts(p, rawKey, headers['content-length']).a;
      const problem = toHttp(a.problem as native.HttpResponseData);
      emitOutcome(method, route, a.outcome ?? 'refused', problem.status, started);
      refuse(req, res, consumed, problem);
      return;
    }
    if (consumed) {
      // Only bytes a parser kept (`keepRawBody`) can be fingerprinted; a body whose bytes are gone
      // is refused by core (500 body-unavailable), never fingerprinted as empty.
      let body: Buffer | null;
      let unavailableFix: string | undefined;
      if (Buffer.isBuffer(req.rawBody)) body = req.rawBody.length > limit ? null : req.rawBody;
      else if (declaresNoBody(req)) body = Buffer.alloc(0);
      else {
        body = Buffer.alloc(0);
        unavailableFix = BODY_FIX;
      }
      afterBody(req, res, next, headers, body, true, unavailableFix, adm, fast, started, method, route, ident.target);
      return;
    }
    // A promise's reaction (not a listener of the request's `end` event, whose emitter goes on
    // to check the stream's state that replayBody() replaces), in the middleware's async
    // context: the handler sees the AsyncLocalStorage stores the middlewares before it entered.
    readDeclared(req, headers['content-length'], limit).then((body) => {
      try {
        afterBody(req, res, next, headers, body, false, undefined, adm, fast, started, method, route, ident.target);
      } catch (e) {
        next(e);
      }
    }, next);
  };
  const wrapped = ((req: IncomingMessage, res: ServerResponse, next: Next) => {
    try {
      mw(req as Req, res, next);
    } catch (e) {
      next(e);
    }
  }) as IdempotencyMiddleware;
  wrapped.events = p.events;
  return wrapped;
}

type ErrorHandler = (err: unknown, req: IncomingMessage, res: ServerResponse, next: Next) => void;

/**
 * Express error middleware reporting handler errors to the flow.
 *
 * @deprecated Optional since the middleware reports handler errors itself; kept so existing apps
 * that mount it after their routes (`app.use(idempotencyErrorHandler())`) keep working. An error
 * already reported passes through untouched.
 */
export function idempotencyErrorHandler(): ErrorHandler {
  return errorTap;
}
