/**
 * Fastify integration: `await app.register(idempotencyPlugin, { store })`, before the routes.
 *
 * The plugin leaves the app's content-type parsers, body limits and prototype-poisoning settings
 * alone. On a protected route (a method in `methods`, and no `config: { idempotency: false }`):
 *
 * - `preParsing` runs core's key stage, reads the raw body (whatever its content type) up to
 *   core's `maxRequestBodyBytes`, fingerprints those bytes, and hands the same bytes on to the
 *   app's parser (Fastify's JSON and text parsers, or any the app added). A missing or invalid key,
 *   a body over the limit or one the fingerprint refuses is answered there with core's problem. A
 *   body whose bytes another reader consumed first is refused (500 `body-unavailable`), never
 *   fingerprinted as empty. A content type the app has no parser for still gets Fastify's 415.
 * - The scope stage and the claim run in a route-level `preHandler` placed after the app's own
 *   hooks (so `scope` sees `request.user` set by an `onRequest` or `preHandler` authentication),
 *   answering replays, 409, 422 and 503 itself. The route's `bodyLimit` is core's
 *   `maxRequestBodyBytes`.
 * - `onSend` records the reply through core's capture plan: a whole body is held until the flow
 *   answers; a stream (`reply.send(Readable)`) is teed to the client and recorded up to the limit
 *   (past it the record is the response-not-retained problem). The session ends, its heartbeat
 *   stopped, on every way out: the stream's end, its error, the client leaving mid-stream, a
 *   handler error (`onError`), a hijacked reply.
 *
 * Route templates come from Fastify (`/payments/:id`). In transactional mode the handler finds its
 * open transaction in `request.idempotency.tx` or `currentTransaction()`, and the reply is sent
 * after `COMMIT`.
 */
import { PassThrough, Readable as ReadableStream } from 'node:stream';
import type { Readable } from 'node:stream';
import type { FastifyInstance, FastifyReply, FastifyRequest, RouteOptions } from 'fastify';
import native = require('../native');
import { ConfigError } from '../errors';
import { admitBody, admitKey, admitKeyFacts, admitScopeEager, admitThroughGate, declaredLength, gateBodyStage, gateKeyStage, Prepared } from './options';
import type { Admitted, BodyFacts, GateFacts, IdempotencyOptions } from './options';
import type { Admission, ExecutionContext, FlowEnd, HandlerResult, HttpResponse, IdempotencyEvents, Session } from './session';
import { toHttp } from './session';
import { headerPairs } from './headers';
import { flatHeaders } from '../fingerprint';
import { txStorage } from './tx';
import type { TxHolder } from './tx';

/** A Fastify `preParsing` hook's callback. */
type ParsingDone = (err: Error | null, payload?: NodeJS.ReadableStream) => void;
/** A Fastify hook's callback. */
type HookDone = (err?: Error | null) => void;

/** Hands a hook's promise to its callback (a falsy rejection as Fastify reports it). */
function settled<T>(r: Promise<T>, done: (err: Error | null, value?: T) => void): void {
  r.then(
    (v) => done(null, v),
    (e: unknown) => done((e as Error) || new Error('idempo: a hook failed without an error')),
  );
}

declare module 'fastify' {
  interface FastifyInstance {
    /** The plugin's event emitter (outcomes, store errors, warnings) for metrics and logs. */
    idempotencyEvents: IdempotencyEvents;
  }
  interface FastifyRequest {
    /** Set by idempo's plugin while a protected handler runs (the claim's generation, the
     * downstream key, the lease's abort signal, the transaction in transactional mode);
     * `undefined` on unprotected routes and requests. */
    idempotency?: ExecutionContext;
  }
  interface FastifyContextConfig {
    /**
     * idempo's plugin on this route: `false` leaves the route unprotected; `true` asks for
     * protection and makes registering the route throw `ConfigError` when one of its methods is
     * not among the plugin's `methods` (never a silent no-op). Omitted: protected when its method
     * is.
     */
    idempotency?: boolean;
  }
}

const STATE = Symbol('idempo.fastify');
/** Core's admission of this request, from `preParsing` on. */
const ADMISSION = Symbol('idempo.fastify.admission');
/** The route carries idempo's route-level `preHandler` (registered after the plugin). */
const ROUTED = Symbol('idempo.fastify.routed');
/** The app's own body limit for the route (the route's `bodyLimit`, else the app's), kept for the
 * requests core does not read (no key on an optional-key route, an unprotected method). */
const APP_LIMIT = Symbol('idempo.fastify.appLimit');

interface State {
  session: Session;
  done: boolean;
  end?: FlowEnd;
  started: number;
  route: string;
  method: string;
  /** Transactional mode: what `currentTransaction()` answers (cleared when the flow ends). */
  holder?: TxHolder;
}

/** The body `preParsing` read and passed through core's key and body stages on the memory gate
 * (see {@link Prepared.memoryGate}): the scope stage admits it through the gate again. */
const GATED = Symbol('idempo.fastify.gated');
/** The gate's ticket for the body stage `preParsing` passed (see {@link gateBodyStage}). */
const TICKET = Symbol('idempo.fastify.ticket');

/** On the raw response of a request whose handler runs: its state and reply, for the `close`
 * listener (see `claimed`). */
const RAW_STATE = Symbol('idempo.fastify.rawState');
const RAW_REPLY = Symbol('idempo.fastify.rawReply');
type RawReply = FastifyReply['raw'] & { [RAW_STATE]?: State; [RAW_REPLY]?: FastifyReply };

type Req = FastifyRequest & {
  [STATE]?: State;
  [ADMISSION]?: native.Admission;
  [GATED]?: Buffer;
  [TICKET]?: number;
};

const NO_CONFIG: Record<string | symbol, unknown> = Object.freeze({});

/**
 * The key under which Fastify keeps a request's route context (whose `config` is what
 * `request.routeOptions.config` returns), found on the first request and checked against
 * `routeOptions` there: `null` when it is not found or does not check (the route's config is then
 * read through `routeOptions`, which Fastify builds anew on every read).
 */
let contextKey: symbol | null | undefined;

/** The route's `config` (Fastify puts the route's `url` and `method` in it), read without
 * building `routeOptions` where Fastify's route context is found. */
function routeConfigOf(req: FastifyRequest): Record<string | symbol, unknown> | undefined {
  const r = req as unknown as Record<symbol, { config?: Record<string | symbol, unknown> } | undefined>;
  if (contextKey === undefined) {
    const config = (req.routeOptions as unknown as { config?: Record<string | symbol, unknown> }).config;
    const key = Object.getOwnPropertySymbols(req).find((k) => k.description === 'fastify.context');
    contextKey = key !== undefined && config !== undefined && r[key]?.config === config ? key : null;
    return config;
  }
  if (contextKey !== null) return r[contextKey]?.config;
  return (req.routeOptions as unknown as { config?: Record<string | symbol, unknown> }).config;
}

/** Options of the Fastify plugin (`scope` and `route` get the `FastifyRequest`). */
export type FastifyIdempotencyOptions = IdempotencyOptions<FastifyRequest>;

/** Whether the request declares a body (`Content-Length` above 0, or `Transfer-Encoding`). */
function hasBody(req: FastifyRequest): boolean {
  const te = req.headers['transfer-encoding'];
  const cl = req.headers['content-length'];
  return te !== undefined || (cl !== undefined && cl !== '0');
}

/**
 * Reads a stream up to `limit` bytes: the bytes, or `null` as soon as it is known to be longer
 * (reading stops there: the connection is closed after the answer).
 */
function readLimited(payload: NodeJS.ReadableStream, limit: number): Promise<Buffer | null> {
  return new Promise((resolve, reject) => readLimitedThen(payload, limit, (e, raw) => (e ? reject(e) : resolve(raw))));
}

/** {@link readLimited}, calling `cb` when the stream ended, failed or went past `limit`. */
function readLimitedThen(payload: NodeJS.ReadableStream, limit: number, cb: (e: Error | null, raw: Buffer | null) => void): void {
  const chunks: Buffer[] = [];
  let size = 0;
  const cleanup = () => {
    payload.removeListener('data', onData);
    payload.removeListener('end', onEnd);
    payload.removeListener('error', onError);
  };
  const onData = (c: Buffer | string) => {
    const b = chunkBytes(c);
    size += b.length;
    if (size > limit) {
      cleanup();
      payload.pause();
      return cb(null, null);
    }
    chunks.push(b);
  };
  const onEnd = () => {
    cleanup();
    cb(null, chunks.length === 1 ? (chunks[0] as Buffer) : Buffer.concat(chunks));
  };
  const onError = (e: Error) => {
    cleanup();
    cb(e, null);
  };
  payload.on('data', onData);
  payload.on('end', onEnd);
  payload.on('error', onError);
}

/** The bytes idempo read, handed on to the app's content-type parser as a stream. */
class Replay extends ReadableStream {
  receivedEncodedLength?: number;

  constructor(raw: Buffer | null) {
    super();
    if (raw !== null && raw.length > 0) this.push(raw);
    this.push(null);
  }

  override _read(): void {}
}

function isStream(payload: unknown): payload is Readable {
  return typeof payload === 'object' && payload !== null && typeof (payload as { pipe?: unknown }).pipe === 'function';
}

function payloadBytes(payload: unknown): Buffer {
  if (payload === null || payload === undefined) return Buffer.alloc(0);
  if (Buffer.isBuffer(payload)) return payload;
  if (typeof payload === 'string') return Buffer.from(payload, 'utf8');
  if (payload instanceof Uint8Array) return Buffer.from(payload);
  return Buffer.from(String(payload), 'utf8');
}

function chunkBytes(c: unknown): Buffer {
  return Buffer.isBuffer(c) ? c : c instanceof Uint8Array ? Buffer.from(c) : Buffer.from(String(c), 'utf8');
}

function replyHeaders(reply: FastifyReply): Array<[string, string]> {
  return headerPairs(reply.getHeaders());
}

function apply(reply: FastifyReply, r: HttpResponse): Buffer {
  for (const n in reply.getHeaders()) reply.removeHeader(n);
  reply.code(r.status);
  const headers = r.headers;
  if (!repeatsName(headers)) {
    for (const [n, v] of headers) reply.header(n, v);
    return r.body;
  }
  // A name given more than once is set once, with all its values in order.
  const grouped = new Map<string, string | string[]>();
  for (const [n, v] of headers) {
    const had = grouped.get(n);
    if (had === undefined) grouped.set(n, v);
    else if (Array.isArray(had)) had.push(v);
    else grouped.set(n, [had, v]);
  }
  for (const [n, v] of grouped) reply.header(n, v);
  return r.body;
}

/** Whether a header name comes more than once (a response carries a few fields: no set). */
function repeatsName(headers: Array<[string, string]>): boolean {
  for (let i = 1; i < headers.length; i++) {
    const n = (headers[i] as [string, string])[0];
    for (let j = 0; j < i; j++) if ((headers[j] as [string, string])[0] === n) return true;
  }
  return false;
}

function toArray<T>(v: T | T[] | undefined | null): T[] {
  return v === undefined || v === null ? [] : Array.isArray(v) ? v : [v];
}

/** Fastify's own answer for a body over the app's limit (what its parser would throw). */
function tooLarge(): Error {
  return Object.assign(new Error('Request body is too large'), { statusCode: 413, code: 'FST_ERR_CTP_BODY_TOO_LARGE' });
}

/** An error standing for the client leaving before a streamed reply ended. */
function clientGone(): Error {
  return Object.assign(new Error('idempo: the client went away before the reply stream ended'), { code: 'ECONNRESET' });
}

async function plugin(app: FastifyInstance, options: FastifyIdempotencyOptions): Promise<void> {
  const p = new Prepared<FastifyRequest>(options);
  const limit = p.config.maxRequestBodyBytes;
  const emit = (st: { method: string; route: string; started: number }, outcome: string, status: number) => {
    if (p.events.listenerCount('outcome') > 0) p.events.emit('outcome', { outcome, route: st.route, method: st.method, status, durationMs: Date.now() - st.started });
  };

  if (!app.hasDecorator('idempotencyEvents')) app.decorate('idempotencyEvents', p.events);
  if (!app.hasRequestDecorator('idempotency')) app.decorateRequest('idempotency', undefined);

  const routeConfig = (req: FastifyRequest): Record<string | symbol, unknown> => routeConfigOf(req) ?? NO_CONFIG;
  const isProtected = (req: FastifyRequest): boolean => {
    const config = routeConfigOf(req);
    // Fastify's `is404`: a request no route matched has a context without a route url.
    return config?.url !== undefined && p.methods.has(req.method.toUpperCase()) && config.idempotency !== false;
  };
  const routeOf = (req: FastifyRequest): string => {
    if (options.route) return options.route(req);
    const url = routeConfigOf(req)?.url;
    return typeof url === 'string' ? url : req.url;
  };
  const bodyFacts = (req: FastifyRequest): Omit<BodyFacts, 'body'> => ({
    method: req.method.toUpperCase(),
    route: routeOf(req),
    target: req.url,
    contentType: req.headers['content-type'],
    headers: req.headers,
  });

  /** Sends core's answer; `close`: the upload was not read to its end. */
  const answer = (req: FastifyRequest, reply: FastifyReply, response: HttpResponse, outcome: string, close: boolean, started: number) => {
    if (p.events.listenerCount('outcome') > 0) emit({ method: req.method.toUpperCase(), route: routeOf(req), started }, outcome, response.status);
    const body = apply(reply, response);
    if (close) reply.header('connection', 'close');
    return reply.send(body);
  };

  /** Answers from `preParsing`, and resolves once the answer is out (so Fastify never goes on to
   * parse a body that was not read). */
  const answerEarly = (req: FastifyRequest, reply: FastifyReply, a: Admitted & { kind: 'respond' }, close: boolean, started: number) =>
    new Promise<void>((resolve) => {
      reply.raw.once('close', resolve);
      reply.raw.once('finish', resolve);
      answer(req, reply, a.response, a.outcome, close, started);
    });

  /** The route-level `preHandler` hooks (the transaction's stage only in transactional mode). */
  const stageHooks = p.o.transactional ? [scopeHook, txStage] : [scopeHook];

  // Which routes are protected, checked when each is registered (after the plugin).
  app.addHook('onRoute', (route: RouteOptions) => {
    const methods = toArray(route.method).map((m) => String(m).toUpperCase());
    const config = (route.config ?? {}) as Record<string | symbol, unknown>;
    const want = config.idempotency;
    const where = `${methods.join(',')} ${route.url}`;
    if (want !== undefined && typeof want !== 'boolean') {
      throw new ConfigError(`idempotencyPlugin: route ${where}: config.idempotency must be true or false, not ${JSON.stringify(want)}`);
    }
    if (want === true) {
      const left = methods.filter((m) => !p.methods.has(m));
      if (left.length > 0) {
        throw new ConfigError(
          `idempotencyPlugin: route ${where} asks for idempotency (config.idempotency: true) but ${left.join(', ')} ` +
            `is not among the protected methods (${[...p.methods].join(', ')}): add it to the plugin's \`methods\` option, ` +
            'or drop config.idempotency',
        );
      }
    }
    if (want === false || !methods.some((m) => p.methods.has(m))) return;
    // Core's maxRequestBodyBytes is the admission rule for the requests core reads (413
    // problem); the app's limit stays in force for the others (enforced in preParsing when the
    // route's own limit has to be raised to core's) and on every other route.
    const appLimit = route.bodyLimit ?? app.initialConfig.bodyLimit ?? 1024 * 1024;
    route.bodyLimit = Math.max(appLimit, limit);
    route.preHandler = [...toArray(route.preHandler), ...stageHooks] as RouteOptions['preHandler'];
    route.config = { ...config, [ROUTED]: true, [APP_LIMIT]: appLimit } as RouteOptions['config'];
  });

  /** A request core does not read, on a route whose bodyLimit was raised to core's: the app's
   * own limit, as Fastify's parser would apply it. */
  const appLimited = async (req: FastifyRequest, reply: FastifyReply, payload: NodeJS.ReadableStream): Promise<NodeJS.ReadableStream> => {
    const appLimit = routeConfig(req)[APP_LIMIT];
    if (typeof appLimit !== 'number' || appLimit >= limit || !hasBody(req)) return payload;
    const declared = Number(req.headers['content-length']);
    if (Number.isFinite(declared)) {
      if (declared <= appLimit) return payload;
      reply.header('connection', 'close');
      throw tooLarge();
    }
    const raw = await readLimited(payload, appLimit);
    if (raw === null) {
      reply.header('connection', 'close');
      throw tooLarge();
    }
    const replay = new PassThrough();
    replay.end(raw);
    return replay;
  };

  // Key, body size and fingerprint, on the raw bytes of every content type. A callback hook: the
  // memory gate's common case goes on from the body's end with no promise.
  app.addHook('preParsing', (request, reply, payload, fastifyDone) => {
    const req = request as Req;
    const done = fastifyDone as unknown as ParsingDone;
    if (isProtected(req)) {
      const started = Date.now();
      const rawKey = req.headers[p.header];
      // The memory gate takes one key field (a repeated header goes the ordinary way).
      const gate = typeof rawKey !== 'object' ? p.memoryGate() : undefined;
      if (gate !== undefined && gatedParsing(req, reply, payload, rawKey as string | undefined, gate.gate, started, done)) return;
      settled(parsing(req, reply, payload, rawKey, started), done);
      return;
    }
    settled(appLimited(req, reply, payload), done);
  });

  /** The memory gate's key and body stages in `preParsing`: false when the ordinary stages are
   * to run instead (a refused key, or a body another reader consumed first: they say how); else
   * `done` is called with the stream the app's parser reads. */
  function gatedParsing(
    req: Req,
    reply: FastifyReply,
    payload: NodeJS.ReadableStream,
    rawKey: string | undefined,
    gate: native.MemoryGate,
    started: number,
    done: ParsingDone,
  ): boolean {
    const read = payload as NodeJS.ReadableStream & { readableEnded?: boolean; readableDidRead?: boolean; receivedEncodedLength?: number };
    const declared = declaredLength(req.headers['content-length']);
    const k = gateKeyStage(gate, rawKey, declared);
    if (k === -1) {
      settled(appLimited(req, reply, payload), done);
      return true;
    }
    if (k < 0 || (hasBody(req) && (read.readableEnded === true || read.readableDidRead === true))) return false;
    readLimitedThen(read, k, (e, raw) => {
      if (e) return done(e);
      let replay: Replay | undefined;
      try {
        if (raw !== null) {
          const headers = p.fingerprinter.usesHeaders ? flatHeaders(req.headers) : null;
          const ticket = gateBodyStage(gate, rawKey, declared, req.method.toUpperCase(), req.url, raw, req.headers['content-type'] ?? null, headers);
          if (ticket !== 0) {
            req[GATED] = raw;
            req[TICKET] = ticket;
            replay = replayOf(raw, read);
          }
        }
      } catch (err) {
        return done(err as Error);
      }
      // Outside the try: what Fastify runs next is never reported as this hook's failure.
      if (replay !== undefined) return done(null, replay);
      // Refused (over the limit, or by the fingerprint): the ordinary stages on the same bytes.
      settled(
        refuseBody(req, reply, raw, started).then(() => payload),
        done,
      );
    });
    return true;
  }

  /** The ordinary `preParsing` stages (no memory gate, or one that refused the key). */
  async function parsing(req: Req, reply: FastifyReply, payload: NodeJS.ReadableStream, rawKey: string | string[] | undefined, started: number): Promise<NodeJS.ReadableStream> {
    const key = admitKeyFacts(p, rawKey, req.headers['content-length']);
    const adm = key.a;
    req[ADMISSION] = adm;
    const kind = key.kind;
    if (kind === 'pass_through') return appLimited(req, reply, payload);
    if (kind === 'refuse') {
      const problem = toHttp(adm.problem as native.HttpResponseData);
      await answerEarly(req, reply, { kind: 'respond', response: problem, outcome: adm.outcome ?? 'refused' }, hasBody(req), started);
      return payload;
    }
    const facts = bodyFacts(req);
    const read = payload as NodeJS.ReadableStream & { readableEnded?: boolean; readableDidRead?: boolean; receivedEncodedLength?: number };
    let refusal: Admitted | undefined;
    let raw: Buffer | null = null;
    if (hasBody(req) && (read.readableEnded === true || read.readableDidRead === true)) {
      refusal = admitBody(p, adm, {
        ...facts,
        body: null,
        unavailableFix:
          "The request stream was already read before idempo's preParsing hook (an onRequest hook, or a preParsing hook registered before the plugin, consumed it): register idempotencyPlugin before hooks that read the body.",
      });
    } else {
      raw = await readLimited(read, key.bodyLimit);
      refusal = admitBody(p, adm, { ...facts, body: raw });
    }
    if (refusal?.kind === 'respond') {
      await answerEarly(req, reply, refusal, raw === null, started);
      return payload;
    }
    return replayOf(raw, read);
  }

  /** The app's parser reads the same bytes. */
  function replayOf(raw: Buffer | null, read: { receivedEncodedLength?: number }): Replay {
    const replay = new Replay(raw);
    if (typeof read.receivedEncodedLength === 'number') replay.receivedEncodedLength = read.receivedEncodedLength;
    return replay;
  }

  /** A body the memory gate's key and body stages refused (`raw` null: over the limit): core's
   * problem from the ordinary stages, run on the same inputs. */
  async function refuseBody(req: Req, reply: FastifyReply, raw: Buffer | null, started: number): Promise<void> {
    const adm = admitKey(p, req.headers[p.header], req.headers['content-length']);
    req[ADMISSION] = adm;
    const refusal = adm.kind === 'read_body' ? admitBody(p, adm, { ...bodyFacts(req), body: raw }) : undefined;
    if (refusal?.kind !== 'respond') throw new Error(`idempo: the memory gate refused a body the admission admits (${adm.kind})`);
    await answerEarly(req, reply, refusal, raw === null, started);
  }

  /** {@link scopeStage} as a callback hook: the memory gate's common case goes on with no
   * promise. */
  function scopeHook(request: FastifyRequest, reply: FastifyReply, done: HookDone): void {
    let r: void | Promise<void>;
    try {
      r = scopeStage(request, reply);
    } catch (e) {
      done(e as Error);
      return;
    }
    if (r instanceof Promise) settled(r, done);
    else done();
  }

  /** The scope stage and the claim; on routes registered after the plugin it runs as the route's
   * last `preHandler`, after the app's hooks (authentication). Synchronous unless something is
   * awaited (a scope function's promise, a store). */
  function scopeStage(request: FastifyRequest, reply: FastifyReply): void | Promise<void> {
    const req = request as Req;
    if (req[STATE] !== undefined || reply.sent || !isProtected(req)) return;
    const started = Date.now();
    const method = req.method.toUpperCase();
    const route = routeOf(req);
    const user = (req as FastifyRequest & { user?: unknown }).user;
    const authenticated = req.headers.authorization !== undefined || (user !== undefined && user !== null);
    const gated = req[GATED];
    if (gated !== undefined) {
      // preParsing passed the key and body stages on the memory gate: the whole admission and
      // the claim through it (or the ordinary stages on the same bytes, when a store_op
      // listener came meanwhile).
      const gate = p.memoryGate();
      const rawKey = req.headers[p.header] as string | undefined;
      const f: GateFacts<FastifyRequest> = {
        req,
        method,
        route,
        target: req.url,
        contentType: req.headers['content-type'],
        headers: req.headers,
        body: gated,
        authenticated,
        key: rawKey,
        declared: declaredLength(req.headers['content-length']),
      };
      // preParsing's body stage, kept by the gate that passed it (one gate per plugin).
      const ticket = req[TICKET];
      if (ticket !== undefined) f.ticket = ticket;
      let admitted: Admitted | Promise<Admitted>;
      if (gate !== undefined) admitted = admitThroughGate(p, gate.gate, gate.mem, f);
      else {
        const a = admitKey(p, rawKey, req.headers['content-length']);
        admitted = admitBody(p, a, f) ?? admitScopeEager(p, a, f);
      }
      if (admitted instanceof Promise) return admitted.then((r) => admittedThen(req, reply, r, started, method, route));
      return admittedThen(req, reply, admitted, started, method, route);
    }
    const adm = req[ADMISSION] ?? admitKey(p, req.headers[p.header], req.headers['content-length']);
    req[ADMISSION] = adm;
    const kind = adm.kind;
    if (kind === 'pass_through') return;
    if (kind === 'refuse') {
      answer(req, reply, toHttp(adm.problem as native.HttpResponseData), adm.outcome ?? 'refused', hasBody(req), started);
      return;
    }
    if (kind === 'read_body') {
      // idempo's preParsing did not read this request's body: never fingerprint it as empty.
      const facts = bodyFacts(req);
      const r = admitBody(
        p,
        adm,
        hasBody(req)
          ? { ...facts, body: null, unavailableFix: "idempo's preParsing hook did not see this request's body: register idempotencyPlugin before the routes it protects." }
          : { ...facts, body: Buffer.alloc(0) },
      );
      if (r?.kind === 'respond') {
        answer(req, reply, r.response, r.outcome, false, started);
        return;
      }
    }
    // The same facts as bodyFacts(req), from the method and route already resolved above.
    const admitted = admitScopeEager(p, adm, {
      req,
      method,
      route,
      target: req.url,
      contentType: req.headers['content-type'],
      headers: req.headers,
      body: null,
      authenticated,
    });
    if (admitted instanceof Promise) return admitted.then((r) => admittedThen(req, reply, r, started, method, route));
    return admittedThen(req, reply, admitted, started, method, route);
  }

  /** Core's admission ended: its answer, or the handler runs with its session. */
  function admittedThen(req: Req, reply: FastifyReply, admitted: Admitted, started: number, method: string, route: string): void | Promise<void> {
    if (admitted.kind === 'unprotected') return;
    if (admitted.kind === 'respond' || admitted.kind === 'answered') {
      answer(req, reply, admitted.response, admitted.outcome, false, started);
      return;
    }
    const session = admitted.session;
    const a = session.admitEager();
    if (a instanceof Promise) return a.then((r) => claimed(req, reply, session, r, started, method, route));
    claimed(req, reply, session, a, started, method, route);
  }

  /** The claim's answer: sent, or the handler runs with its session. */
  function claimed(req: Req, reply: FastifyReply, session: Session, a: Admission, started: number, method: string, route: string): void {
    if (a.kind === 'respond') {
      answer(req, reply, a.response, a.outcome, false, started);
      return;
    }
    req.idempotency = a.context;
    const st: State = { session, done: false, started, route, method };
    if (a.context.tx !== undefined) st.holder = { tx: a.context.tx };
    req[STATE] = st;
    // A reply that never goes through onSend (hijacked): the flow ends when the response does
    // (one listener shared by every request, which finds the request's state on the response).
    const raw = reply.raw as RawReply;
    raw[RAW_STATE] = st;
    raw[RAW_REPLY] = reply;
    raw.on('close', rawClosed);
  }

  function rawClosed(this: RawReply): void {
    const st = this[RAW_STATE];
    const reply = this[RAW_REPLY];
    this[RAW_STATE] = undefined;
    this[RAW_REPLY] = undefined;
    if (st === undefined || reply === undefined || st.done || !reply.sent) return;
    st.done = true;
    void st.session.fail(true).then(
      (end) => {
        if (st.holder) st.holder.tx = null;
        emit(st, end.outcome, this.statusCode);
      },
      () => undefined,
    );
  }

  /** Transactional mode: the handler runs inside the storage (a callback hook, so the handler's
   * whole async chain starts from it and sees its transaction). */
  function txStage(request: FastifyRequest, _reply: FastifyReply, done: (err?: Error) => void): void {
    const holder = (request as Req)[STATE]?.holder;
    if (holder) txStorage.run(holder, done);
    else done();
  }

  // Routes registered before the plugin (no route-level hooks): the same stages as one app hook,
  // which runs before any preHandler the app adds later.
  app.addHook('preHandler', (request, reply, done) => {
    if (routeConfig(request)[ROUTED] === true) return done();
    if (!isProtected(request)) return txStage(request, reply, done);
    const route = routeOf(request);
    p.warnOnce(
      `unrouted:${route}`,
      `idempo: route ${request.method.toUpperCase()} ${route} was registered before idempotencyPlugin: its scope runs before your preHandler hooks. Register the plugin before the routes.`,
    );
    scopeHook(request, reply, (err) => {
      // As two hooks: the transaction's stage runs only when the scope stage sent nothing.
      if (err || reply.sent) done(err ?? undefined);
      else txStage(request, reply, done);
    });
  });

  app.addHook('onError', async (request, _reply, error) => {
    const st = (request as Req)[STATE];
    if (!st || st.done || st.end) return;
    st.end = await st.session.fail(!p.isSideEffectFree(error));
    if (st.holder) st.holder.tx = null;
  });

  app.addHook('onSend', (request, reply, payload, done) => {
    let r: unknown;
    try {
      r = onSend(request as Req, reply, payload);
    } catch (e) {
      done(e as Error);
      return;
    }
    if (r instanceof Promise) r.then((v: unknown) => done(null, v), (e: Error) => done(e));
    else done(null, r);
  });

  /** The onSend stage: the flow's end and the reply's payload (synchronous when the memory
   * store's completion ended the flow in the native call). */
  function onSend(req: Req, reply: FastifyReply, payload: unknown): unknown {
    const st = req[STATE];
    if (!st || st.done) return payload;
    st.done = true;
    const end = st.end;
    if (!end && isStream(payload)) {
      const headers = replyHeaders(reply);
      const plan = st.session.capturePlan(reply.statusCode, headers, true);
      if (plan.kind !== 'buffer') return tee(st, reply.statusCode, headers, payload, plan.limit);
      return held(st, reply, headers, payload, plan.limit as number);
    }
    if (end) return sent(st, reply, payload, end, undefined);
    const live = result(reply.statusCode, replyHeaders(reply), payloadBytes(payload), false);
    const r = st.session.finishEager(live);
    if (r instanceof Promise) return r.then((e) => sent(st, reply, payload, e, live));
    return sent(st, reply, payload, r, live);
  }

  /** The payload once the flow ended: the flow's response on the reply (the handler's own
   * response, `live`, is on it already). */
  function sent(st: State, reply: FastifyReply, payload: unknown, end: FlowEnd, live: HandlerResult | undefined): unknown {
    if (st.holder) st.holder.tx = null;
    if (end.kind === 'propagate') {
      emit(st, end.outcome, reply.statusCode);
      return payload;
    }
    emit(st, end.outcome, end.response.status);
    // The session hands back the very header list it was given only when core's answer is the
    // handler's response unchanged: the reply already carries that status and those headers.
    if (live !== undefined && end.response.headers === live.headers && end.response.status === reply.statusCode) return end.response.body;
    return apply(reply, end.response);
  }

  /** The handler's result as core takes it (with the redaction hook's stored body). */
  function result(status: number, headers: Array<[string, string]>, body: Buffer, truncated: boolean): HandlerResult {
    const live: HandlerResult = { status, headers, body };
    if (truncated) {
      live.bodyTruncated = true;
      return live;
    }
    const redacted = options.redact?.(live);
    return redacted ? { ...live, bodyToStore: redacted } : live;
  }

  function settle(st: State, end: Promise<FlowEnd>, status: number): void {
    void end.then(
      (e) => {
        if (st.holder) st.holder.tx = null;
        emit(st, e.outcome, e.kind === 'respond' ? e.response.status : status);
      },
      () => undefined,
    );
  }

  /**
   * Core's `tee` (or `pass_through`) plan for a streamed reply (`spec/PROTOCOL.md` §7.5.1): the
   * client gets every chunk as it streams (with the source's backpressure); at most `limit` bytes
   * are recorded (past it the record is the response-not-retained problem). The flow finishes
   * when the stream ends; a stream error, a source destroyed before its end, or the client
   * leaving first (the source is then destroyed) is a handler failure that may have had effects.
   * Either way the session ends and the key never stays in flight.
   */
  function tee(st: State, status: number, headers: Array<[string, string]>, source: Readable, recordLimit: number | null): PassThrough {
    const counter = recordLimit === null ? null : new native.BodyCapture(recordLimit);
    let chunks: Buffer[] = [];
    let over = false;
    const out = new PassThrough();
    const onData = (c: unknown) => {
      const b = chunkBytes(c);
      if (counter !== null) {
        const step = counter.accept(b.length);
        if (step === 'record') chunks.push(b);
        else if (step === 'discard') chunks = [];
      }
      if (!out.write(b)) source.pause();
    };
    const failed = (err: unknown) => {
      if (over) return;
      over = true;
      source.removeListener('data', onData);
      if (!out.destroyed) out.destroy(err as Error);
      if (!source.destroyed) source.destroy();
      settle(st, st.session.fail(!p.isSideEffectFree(err)), 500);
    };
    out.on('drain', () => source.resume());
    source.on('data', onData);
    source.once('end', () => {
      if (over) return;
      over = true;
      out.end();
      settle(st, st.session.finish(result(status, headers, Buffer.concat(chunks), counter?.truncated ?? false)), status);
    });
    source.once('error', failed);
    source.once('close', () => failed(new Error('idempo: the reply stream was destroyed before its end')));
    out.once('close', () => failed(clientGone()));
    return out;
  }

  /**
   * Core's `buffer` plan for a streamed reply (transactional mode: the reply goes out after
   * `COMMIT`): holds at most `limit` bytes (plus one chunk). A longer stream is finished as
   * truncated (core's response-not-retained outcome) and, when core answers with the handler's
   * response, the client gets the held bytes followed by the rest of the stream.
   */
  async function held(st: State, reply: FastifyReply, headers: Array<[string, string]>, source: Readable, recordLimit: number): Promise<unknown> {
    const status = reply.statusCode;
    const counter = new native.BodyCapture(recordLimit);
    const parts: Buffer[] = [];
    let failure: unknown;
    const ended = await new Promise<boolean>((resolve) => {
      const cleanup = () => {
        source.removeListener('data', onData);
        source.removeListener('end', onEnd);
        source.removeListener('error', onError);
      };
      const onData = (c: unknown) => {
        const b = chunkBytes(c);
        parts.push(b);
        if (counter.accept(b.length) === 'discard') {
          source.pause();
          cleanup();
          resolve(false);
        }
      };
      const onEnd = () => {
        cleanup();
        resolve(true);
      };
      const onError = (e: unknown) => {
        failure = e;
        cleanup();
        resolve(true);
      };
      source.on('data', onData);
      source.once('end', onEnd);
      source.once('error', onError);
    });
    const body = Buffer.concat(parts);
    const given = ended ? body : Buffer.alloc(0);
    const end =
      failure !== undefined
        ? await st.session.fail(!p.isSideEffectFree(failure))
        : await st.session.finish(result(status, headers, given, !ended));
    if (st.holder) st.holder.tx = null;
    if (end.kind === 'propagate') {
      emit(st, end.outcome, 500);
      throw failure;
    }
    emit(st, end.outcome, end.response.status);
    const own = end.response.status === status && end.response.body.equals(given);
    if (ended || !own) {
      if (!ended) source.destroy();
      return apply(reply, end.response);
    }
    // The handler's own response, longer than the record keeps: the held bytes, then the rest.
    apply(reply, end.response);
    reply.removeHeader('content-length');
    const out = new PassThrough();
    out.write(body);
    source.pipe(out);
    source.resume();
    out.once('close', () => source.destroy());
    return out;
  }
}

// Like fastify-plugin: the hooks apply to the context that registers the plugin.
(plugin as unknown as Record<symbol, unknown>)[Symbol.for('skip-override')] = true;
(plugin as unknown as Record<symbol, unknown>)[Symbol.for('fastify.display-name')] = 'idempo';

/** The Fastify plugin (see the module docs). */
export const idempotencyPlugin = plugin;
