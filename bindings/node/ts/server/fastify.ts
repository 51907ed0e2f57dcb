/**
 * Fastify integration: `await app.register(idempotencyPlugin, { store })`.
 *
 * The plugin keeps the raw body of JSON (and other) requests for the fingerprint, runs core's
 * flow in a `preHandler` hook (answering replays, 409, 422, 400, 503 itself), records the
 * handler's response in `onSend` (the stored copy is exactly what is sent), and reports handler
 * errors in `onError`. Route templates come from Fastify (`/payments/:id`). In transactional
 * mode the handler finds its open transaction in `request.idempotency.tx` or
 * `currentTransaction()`, and the reply is sent after `COMMIT`.
 */
import { PassThrough } from 'node:stream';
import type { Readable } from 'node:stream';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import native = require('../native');
import { admitKey, admitRest, Prepared } from './options';
import type { IdempotencyOptions } from './options';
import type { ExecutionContext, FlowEnd, HttpResponse, Session } from './session';
import { toHttp } from './session';
import { txStorage } from './tx';
import type { TxHolder } from './tx';

const STATE = Symbol('idempo.fastify');

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

type Req = FastifyRequest & {
  rawBody?: Buffer;
  idempotency?: ExecutionContext;
  [STATE]?: State;
  [BAD_JSON]?: Error;
  [OVER]?: boolean;
  [ADMISSION]?: native.Admission;
};

/** Stage 1 of core's admission, run when the body arrives (so a pass-through reads it whole). */
const ADMISSION = Symbol('idempo.fastify.admission');

const BAD_JSON = Symbol('idempo.fastify.badJson');
/** The body was longer than core's `maxRequestBodyBytes`: reading stopped at the first chunk past it. */
const OVER = Symbol('idempo.fastify.over');

/** Fastify's own answer for a body over the limit, for requests idempo does not protect. */
function tooLarge(): Error {
  return Object.assign(new Error('Request body is too large'), { statusCode: 413, code: 'FST_ERR_CTP_BODY_TOO_LARGE' });
}

/**
 * Reads a request body up to `limit` bytes. Past it, reading stops (the request is marked and its
 * connection closed after the answer): core's admission then answers in its order (a missing or
 * invalid key before the size), which Fastify's own `bodyLimit` check could not.
 */
function readLimited(req: Req, payload: NodeJS.ReadableStream, limit: number, done: (body: Buffer | null) => void): void {
  const chunks: Buffer[] = [];
  let size = 0;
  let finished = false;
  const finish = (body: Buffer | null) => {
    if (finished) return;
    finished = true;
    payload.removeListener('data', onData);
    payload.removeListener('end', onEnd);
    done(body);
  };
  const onData = (c: Buffer) => {
    size += c.length;
    if (size > limit) {
      req[OVER] = true;
      payload.pause();
      return finish(null);
    }
    chunks.push(c);
  };
  const onEnd = () => finish(Buffer.concat(chunks));
  payload.on('data', onData);
  payload.on('end', onEnd);
  payload.on('error', () => finish(null));
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

/** Reads a stream whole (transactional mode: the reply is sent only after `COMMIT`). */
async function readAll(stream: Readable): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const c of stream) parts.push(chunkBytes(c));
  return Buffer.concat(parts);
}

function replyHeaders(reply: FastifyReply): Array<[string, string]> {
  const out: Array<[string, string]> = [];
  for (const [n, v] of Object.entries(reply.getHeaders())) {
    if (v === undefined) continue;
    for (const one of Array.isArray(v) ? v : [v]) out.push([n.toLowerCase(), String(one)]);
  }
  return out;
}

function apply(reply: FastifyReply, r: HttpResponse): Buffer {
  for (const n of Object.keys(reply.getHeaders())) reply.removeHeader(n);
  reply.code(r.status);
  const grouped = new Map<string, string[]>();
  for (const [n, v] of r.headers) grouped.set(n, [...(grouped.get(n) ?? []), v]);
  for (const [n, v] of grouped) reply.header(n, v.length === 1 ? v[0] : v);
  return r.body;
}

/** Options of the Fastify plugin. */
export type FastifyIdempotencyOptions = IdempotencyOptions<FastifyRequest>;

async function plugin(app: FastifyInstance, options: FastifyIdempotencyOptions): Promise<void> {
  const p = new Prepared<FastifyRequest>(options);
  const emit = (st: { method: string; route: string; started: number }, outcome: string, status: number) =>
    p.events.emit('outcome', { outcome, route: st.route, method: st.method, status, durationMs: Date.now() - st.started });

  app.decorate('idempotencyEvents', p.events);
  app.removeContentTypeParser(['application/json']);
  const fastifyLimit = app.initialConfig.bodyLimit ?? 1024 * 1024;
  /** Runs core's key stage for a protected request and reads the body as far as it says: not at
   * all for a refusal, up to core's limit for a request with a key, and as Fastify would (its
   * `bodyLimit`) for a request idempo does not protect. */
  const readFor = (req: Req, payload: NodeJS.ReadableStream, done: (err: Error | null, body: Buffer | null) => void) => {
    const method = req.method.toUpperCase();
    const adm = p.methods.has(method) ? admitKey(p, req.headers[p.header], req.headers['content-length']) : undefined;
    if (adm !== undefined) req[ADMISSION] = adm;
    if (adm?.kind === 'refuse') {
      req[OVER] = true; // unread: the connection closes after the answer
      return done(null, null);
    }
    const guarded = adm?.kind === 'read_body';
    readLimited(req, payload, guarded ? (adm.bodyLimit as number) : fastifyLimit, (raw) => {
      if (raw === null && !guarded) return done(tooLarge(), null);
      done(null, raw);
    });
  };
  app.addContentTypeParser(/^application\/(json|[^;]+\+json)/, (req, payload, done) => {
    readFor(req as Req, payload, (err, raw) => {
      if (err) return done(err, undefined);
      if (raw === null) return done(null, undefined);
      (req as Req).rawBody = raw;
      if (raw.length === 0) return done(null, undefined);
      try {
        done(null, JSON.parse(raw.toString('utf8')));
      } catch (e) {
        // Protected requests: core's fingerprint answers 400 invalid_body with the exact reason.
        // Others get this error (400) in preHandler, as Fastify's own parser would answer.
        (req as Req)[BAD_JSON] = Object.assign(new Error(`Body is not valid JSON: ${(e as Error).message}`), { statusCode: 400 });
        done(null, undefined);
      }
    });
  });
  app.addContentTypeParser('*', (req, payload, done) => {
    readFor(req as Req, payload, (err, raw) => {
      if (err) return done(err, undefined);
      if (raw === null) return done(null, undefined);
      (req as Req).rawBody = raw;
      done(null, raw);
    });
  });

  app.addHook('preHandler', async (request, reply) => {
    const req = request as Req;
    const method = req.method.toUpperCase();
    const badJson = req[BAD_JSON];
    if (!p.methods.has(method)) {
      if (badJson) throw badJson;
      return;
    }
    const started = Date.now();
    const route = options.route ? options.route(req) : (req.routeOptions.url ?? req.url);
    const answer = (response: HttpResponse, outcome: string) => {
      emit({ method, route, started }, outcome, response.status);
      // An upload that was not read to its end: close the connection once the answer is out.
      if (req[OVER]) reply.header('connection', 'close');
      return reply.send(apply(reply, response));
    };
    // Core's admission, in core's order: the key first (when the body arrived, else now), then
    // the body, then the scope.
    const adm = req[ADMISSION] ?? admitKey(p, req.headers[p.header], req.headers['content-length']);
    if (adm.kind === 'pass_through') {
      if (badJson) throw badJson;
      return;
    }
    if (adm.kind === 'refuse') return answer(toHttp(adm.problem as native.HttpResponseData), adm.outcome ?? 'refused');
    const user = (req as FastifyRequest & { user?: unknown }).user;
    const admitted = await admitRest(p, adm, {
      req,
      method,
      route,
      target: req.url,
      contentType: req.headers['content-type'],
      headers: req.headers,
      body: req[OVER] ? null : (req.rawBody ?? Buffer.alloc(0)),
      authenticated: req.headers.authorization !== undefined || (user !== undefined && user !== null),
    });
    if (admitted.kind === 'unprotected') {
      if (badJson) throw badJson;
      return;
    }
    if (admitted.kind === 'respond') return answer(admitted.response, admitted.outcome);
    const a = await admitted.session.admit();
    if (a.kind === 'respond') {
      emit({ method, route, started }, a.outcome, a.response.status);
      return reply.send(apply(reply, a.response));
    }
    req.idempotency = a.context;
    const st: State = { session: admitted.session, done: false, started, route, method };
    if (a.context.tx !== undefined) st.holder = { tx: a.context.tx };
    req[STATE] = st;
  });

  // Transactional mode: the handler runs inside the storage (a callback hook, so the handler's
  // whole async chain starts from it and sees its transaction).
  app.addHook('preHandler', (request, _reply, done) => {
    const holder = (request as Req)[STATE]?.holder;
    if (holder) txStorage.run(holder, done);
    else done();
  });

  app.addHook('onError', async (request, _reply, error) => {
    const st = (request as Req)[STATE];
    if (!st || st.done || st.end) return;
    st.end = await st.session.fail(!p.isSideEffectFree(error));
    if (st.holder) st.holder.tx = null;
  });

  app.addHook('onSend', async (request, reply, payload) => {
    const st = (request as Req)[STATE];
    if (!st || st.done) return payload;
    st.done = true;
    let end = st.end;
    if (!end && isStream(payload)) {
      const headers = replyHeaders(reply);
      const plan = st.session.capturePlan(reply.statusCode, headers, true);
      if (plan.kind === 'buffer') {
        payload = await readAll(payload);
      } else {
        return tee(st, reply.statusCode, headers, payload, plan.limit);
      }
    }
    if (!end) {
      const live: HttpResponse = { status: reply.statusCode, headers: replyHeaders(reply), body: payloadBytes(payload) };
      const redacted = options.redact?.(live);
      end = await st.session.finish(redacted ? { ...live, bodyToStore: redacted } : live);
    }
    if (st.holder) st.holder.tx = null;
    if (end.kind === 'propagate') {
      emit(st, end.outcome, reply.statusCode);
      return payload;
    }
    emit(st, end.outcome, end.response.status);
    return apply(reply, end.response);
  });

  /**
   * Core's `tee` (or `pass_through`) plan for a streamed reply (`spec/PROTOCOL.md` §7.5.1): the
   * client gets every chunk as it streams; at most `limit` bytes are recorded (past it the record
   * is the response-not-retained problem), and the flow finishes when the stream ends (a stream
   * error is a handler failure), so the key never stays in flight.
   */
  function tee(st: State, status: number, headers: Array<[string, string]>, source: Readable, limit: number | null): PassThrough {
    const counter = limit === null ? null : new native.BodyCapture(limit);
    let chunks: Buffer[] = [];
    let truncated = false;
    const out = new PassThrough();
    source.on('data', (c: unknown) => {
      const b = chunkBytes(c);
      if (counter !== null) {
        const step = counter.accept(b.length);
        if (step === 'record') chunks.push(b);
        else if (step === 'discard') {
          chunks = [];
          truncated = true;
        }
      }
      if (!out.write(b)) {
        source.pause();
        out.once('drain', () => source.resume());
      }
    });
    const settle = (end: Promise<FlowEnd>) =>
      end.then(
        (e) => {
          if (st.holder) st.holder.tx = null;
          emit(st, e.outcome, e.kind === 'respond' ? e.response.status : 500);
        },
        () => undefined,
      );
    source.once('end', () => {
      out.end();
      const result = { status, headers, body: Buffer.concat(chunks), bodyTruncated: truncated };
      void settle(st.session.finish(result));
    });
    source.once('error', (err: unknown) => {
      out.destroy(err as Error);
      void settle(st.session.fail(!p.isSideEffectFree(err)));
    });
    return out;
  }
}

// Like fastify-plugin: the hooks apply to the context that registers the plugin.
(plugin as unknown as Record<symbol, unknown>)[Symbol.for('skip-override')] = true;
(plugin as unknown as Record<symbol, unknown>)[Symbol.for('fastify.display-name')] = 'idempo';

/** The Fastify plugin (see the module docs). */
export const idempotencyPlugin = plugin;
