/**
 * Captures the response an Express handler writes (Express's `res` is node's `ServerResponse`),
 * for the middleware in `express.ts`.
 *
 * A body written whole with `res.end(body)` (`res.send`, `res.json`) is held until the flow
 * answers. A body streamed with `res.write` follows core's capture plan (`spec/PROTOCOL.md`
 * §7.5.1), asked at the first write: `tee` sends every chunk to the client at once and records at
 * most the plan's limit (`bodyTruncated` past it), `pass_through` sends and records nothing,
 * `buffer` holds it. The owner's `ended` gets `sent: true` when the client already has the
 * response.
 *
 * Express offers no hook for this, so `res.write`, `res.end`, `res.writeHead` and
 * `res.flushHeaders` are intercepted while the handler runs. Normally this happens once, on node's
 * `ServerResponse.prototype` (the first time a response is captured): each of the four looks for
 * an active capture of the response (the request's {@link ResponseCapture}, kept in a `WeakMap`)
 * and otherwise is node's own method, so the response object is not reshaped per request (Express
 * gives every response a shape of its own, so a property added to one is slow to add and to read). A response that carries its own `write`/`end`/... (set by a middleware
 * before idempo, e.g. compression) or is not a node `ServerResponse` gets them replaced on the
 * object itself instead, by functions shared by every request; no closure is made per request.
 */
import { ServerResponse } from 'node:http';
import native = require('../native');
import { headerPairs } from './headers';
import type { HandlerResult } from './session';

/** Each captured response's capture (see the module docs). */
const captures = new WeakMap<object, ResponseCapture>();

type Res = ServerResponse;
type Fn = (...a: unknown[]) => unknown;

/** What a capture reports to. */
export interface CaptureOwner {
  /** Core's capture plan for a streamed body, asked at the first `res.write`. */
  plan(status: number, headers: Array<[string, string]>): { kind: string; limit: number | null };
  /** The handler's response ended (`sent`: the client already has it). */
  ended(result: HandlerResult, sent: boolean): void;
}

const EMPTY = Buffer.alloc(0);

function toBuf(c: unknown, enc?: unknown): Buffer {
  return Buffer.isBuffer(c)
    ? c
    : c instanceof Uint8Array
      ? Buffer.from(c)
      : Buffer.from(String(c), (typeof enc === 'string' ? enc : 'utf8') as BufferEncoding);
}

function capWriteHead(this: Res, status: number, ...rest: unknown[]): Res {
  this.statusCode = status;
  const headers = rest.find((x) => typeof x === 'object' && x !== null) as Record<string, string> | undefined;
  if (headers && !Array.isArray(headers)) for (const [n, v] of Object.entries(headers)) this.setHeader(n, v);
  return this;
}

function capFlushHeaders(): undefined {
  return undefined;
}

const METHODS = ['write', 'end', 'writeHead', 'flushHeaders'] as const;

/** Node's own four methods, once `ServerResponse.prototype` carries the interception. */
let nodeMethods: Record<(typeof METHODS)[number], Fn> | undefined;

/** Intercepts the four methods on `ServerResponse.prototype` (once per process). */
function patchPrototype(): Record<(typeof METHODS)[number], Fn> {
  if (nodeMethods !== undefined) return nodeMethods;
  const proto = ServerResponse.prototype as unknown as Record<string, Fn>;
  const orig = { write: proto.write as Fn, end: proto.end as Fn, writeHead: proto.writeHead as Fn, flushHeaders: proto.flushHeaders as Fn };
  nodeMethods = orig;
  proto.write = function (this: Res, ...args: unknown[]) {
    const c = captures.get(this);
    return c !== undefined && c.active ? c.write(args[0], args[1], args[2]) : orig.write.apply(this, args);
  };
  proto.end = function (this: Res, ...args: unknown[]) {
    const c = captures.get(this);
    if (c === undefined || !c.active) return orig.end.apply(this, args);
    c.end(args[0], args[1], args[2]);
    return this;
  };
  proto.writeHead = function (this: Res, ...args: unknown[]) {
    const c = captures.get(this);
    return c !== undefined && c.active && c.holdsHead ? capWriteHead.apply(this, args as [number, ...unknown[]]) : orig.writeHead.apply(this, args);
  };
  proto.flushHeaders = function (this: Res, ...args: unknown[]) {
    const c = captures.get(this);
    return c !== undefined && c.active && c.holdsHead ? undefined : orig.flushHeaders.apply(this, args);
  };
  return orig;
}

/** Whether `res` takes node's methods from `ServerResponse.prototype` (nothing shadows them). */
function usesNodeMethods(res: object): boolean {
  const top = ServerResponse.prototype as object;
  for (let o: object | null = res; o !== null; o = Object.getPrototypeOf(o) as object | null) {
    if (o === top) return true;
    for (const m of METHODS) if (Object.hasOwn(o, m)) return false;
  }
  return false;
}

function capWrite(this: Res, chunk: unknown, enc?: unknown, cb?: unknown): boolean {
  return (captures.get(this) as ResponseCapture).write(chunk, enc, cb);
}

function capEnd(this: Res, chunk?: unknown, enc?: unknown, cb?: unknown): Res {
  (captures.get(this) as ResponseCapture).end(chunk, enc, cb);
  return this;
}

/** One response's capture (see the module docs). */
export class ResponseCapture {
  readonly #res: Res;
  readonly #owner: CaptureOwner;
  readonly #write: Fn;
  readonly #end: Fn;
  readonly #writeHead: Fn;
  readonly #flushHeaders: Fn;
  #chunks: Buffer[] = [];
  #ended = false;
  #mode: string | null = null;
  #counter: native.BodyCapture | null = null;
  #truncated = false;

  /** The capture is in force (until {@link ResponseCapture.restore}). */
  active = true;
  /** `writeHead`/`flushHeaders` are held (until a streamed body starts sending). */
  holdsHead = true;
  /** The four methods are intercepted on `ServerResponse.prototype`, not on this response. */
  readonly #shared: boolean;

  constructor(res: ServerResponse, owner: CaptureOwner) {
    const r = res as Res;
    this.#res = r;
    this.#owner = owner;
    this.#shared = usesNodeMethods(r);
    if (this.#shared) {
      const orig = patchPrototype();
      this.#write = orig.write;
      this.#end = orig.end;
      this.#writeHead = orig.writeHead;
      this.#flushHeaders = orig.flushHeaders;
      captures.set(r, this);
      return;
    }
    this.#write = r.write as Fn;
    this.#end = r.end as Fn;
    this.#writeHead = r.writeHead as Fn;
    this.#flushHeaders = r.flushHeaders as Fn;
    captures.set(r, this);
    const m = r as unknown as Record<string, unknown>;
    m.writeHead = capWriteHead;
    m.flushHeaders = capFlushHeaders;
    m.write = capWrite;
    m.end = capEnd;
  }

  /** Puts the response's own methods back. */
  restore(): void {
    this.active = false;
    if (this.#shared) return;
    const m = this.#res as unknown as Record<string, unknown>;
    m.write = this.#write;
    m.end = this.#end;
    m.writeHead = this.#writeHead;
    m.flushHeaders = this.#flushHeaders;
  }

  #record(b: Buffer): void {
    if (this.#mode === 'buffer' || this.#mode === null) {
      this.#chunks.push(b);
      return;
    }
    if (this.#counter === null) return;
    const step = this.#counter.accept(b.length);
    if (step === 'record') this.#chunks.push(b);
    else if (step === 'discard') {
      this.#chunks = [];
      this.#truncated = true;
    }
  }

  write(chunk: unknown, enc?: unknown, cb?: unknown): boolean {
    const res = this.#res;
    if (this.#mode === null) {
      const p = this.#owner.plan(res.statusCode, headerPairs(res.getHeaders()));
      this.#mode = p.kind;
      if (p.limit !== null) this.#counter = new native.BodyCapture(p.limit);
      if (this.#mode !== 'buffer') {
        // Sending now: node writes the head through `writeHead` (implicitly, on the first write).
        this.holdsHead = false;
        if (!this.#shared) {
          const m = res as unknown as Record<string, unknown>;
          m.writeHead = this.#writeHead;
          m.flushHeaders = this.#flushHeaders;
        }
      }
    }
    const b = chunk !== undefined && chunk !== null ? toBuf(chunk, enc) : EMPTY;
    this.#record(b);
    if (this.#mode !== 'buffer') return this.#write.call(res, chunk, enc, cb) as boolean;
    const done = typeof enc === 'function' ? enc : cb;
    if (typeof done === 'function') process.nextTick(done as () => void);
    return true;
  }

  end(chunk?: unknown, enc?: unknown, cb?: unknown): void {
    if (this.#ended) return;
    this.#ended = true;
    const res = this.#res;
    const hasChunk = chunk !== undefined && chunk !== null && typeof chunk !== 'function';
    if (hasChunk) this.#record(toBuf(chunk, enc));
    const headers = headerPairs(res.getHeaders());
    const sent = this.#mode !== null && this.#mode !== 'buffer';
    const chunks = this.#chunks;
    const body = chunks.length === 1 ? (chunks[0] as Buffer) : chunks.length === 0 ? EMPTY : Buffer.concat(chunks);
    const result: HandlerResult = { status: res.statusCode, headers, body };
    if (this.#truncated) result.bodyTruncated = true;
    if (sent) {
      // The client has the head and the chunks written so far: finish the response as is.
      this.#end.call(res, chunk, enc, cb);
      this.#owner.ended(result, true);
      return;
    }
    this.#owner.ended(result, false);
    const done = typeof chunk === 'function' ? chunk : typeof enc === 'function' ? enc : typeof cb === 'function' ? cb : undefined;
    if (done) process.nextTick(done as () => void);
  }
}
