/**
 * The host loop around core's sans-IO server flow: executes store operations, runs heartbeats and
 * reports the handler's end. It makes no protocol decision; every branch follows an action that
 * core returned.
 */
import { randomBytes } from 'node:crypto';
import { EventEmitter } from 'node:events';
import native = require('../native');
import { fromNative } from '../errors';
import type { CallOptions, IdempotencyStore, StoreRecord, TransactionSession } from '../stores/types';
import { memoryInline } from '../stores/memory';
import { cancelBeat, scheduleBeat } from './heartbeat';
import type { MemoryInline } from '../stores/memory';

/** A response as the host sends it. */
export interface HttpResponse {
  status: number;
  headers: Array<[string, string]>;
  body: Buffer;
}

/** What the handler produced. */
export interface HandlerResult extends HttpResponse {
  /** The redaction hook's output: stored and replayed instead of `body`. */
  bodyToStore?: Buffer;
  /** The framework rejected the request before the handler ran (e.g. Fastify's schema
   * validation): never stored, whatever the status (`spec/PROTOCOL.md` §9). */
  framework?: boolean;
  /** The host stopped recording the body at core's capture limit (`BodyCapture`): `body` is a
   * prefix and the record becomes the response-not-retained problem (§7.5). */
  bodyTruncated?: boolean;
}

/** Given to the handler while it runs. */
export interface ExecutionContext {
  /** The record's generation. */
  generation: number;
  /** Key for downstream side effects (same across a takeover re-run; new per generation). */
  downstreamKey: string;
  /** Aborted when another request took the key over (the lease was lost). */
  signal: AbortSignal;
  /**
   * Transactional mode only: the connection with the request's transaction open (a `pg` client,
   * or the better-sqlite3 database). Write through it; idempo commits with the record.
   */
  tx?: unknown;
}

/** Events emitted for metrics and logs (never request bodies or raw keys). */
export interface IdempotencyEventMap {
  /** How a request ended: core's outcome name (`stored`, `replayed`, `in_flight`, ...). */
  outcome: [{ outcome: string; route: string; method: string; status: number; durationMs: number }];
  /** A store operation failed (the flow fails closed). */
  store_error: [{ op: string; error: unknown; route: string }];
  /**
   * Every store primitive the flow asked for (`op` is core's name: `claim`, `get`, `takeover`,
   * `complete`, ...), with its duration as the request saw it and whether it failed.
   */
  store_op: [{ route: string; op: string; durationMs: number; failed: boolean }];
  /** A request took over an expired lease and runs the handler again (policy `re_run`). */
  takeover: [{ route: string }];
  /** A stored row was refused as corrupt (treated as a store failure). */
  corrupt_record: [{ message: string }];
  /** The lease was lost to a takeover while the handler ran (once per request: at a heartbeat
   * or when the completion found the key taken over). */
  lease_lost: [{ route: string }];
  /** A configuration smell, reported once per route (e.g. authenticated requests but no `scope`). */
  warning: [{ message: string }];
  /** A request refused with 500 `scope-unresolved`: core's log line (written to stderr when
   * nothing listens). */
  scope_unresolved: [{ route: string; method: string; message: string }];
  /** A request refused with 500 `body-unavailable` (it had a body whose bytes another reader
   * consumed first): core's log line (written to stderr when nothing listens). */
  body_unavailable: [{ route: string; method: string; message: string }];
  /**
   * The background cleanup of a claim whose answer was lost ended (see `Session`): `applied`
   * when it released the claim (or expired the taken-over lease), after `attempts` tries.
   */
  cleanup: [{ route: string; op: string; applied: boolean; attempts: number }];
}

/** The event emitter of an idempotency integration. */
export class IdempotencyEvents extends EventEmitter<IdempotencyEventMap> {}

/** The end of a flow. */
export type FlowEnd =
  | { kind: 'respond'; response: HttpResponse; outcome: string }
  | { kind: 'propagate'; outcome: string };

/** The admission result: run the handler, or answer now. */
export type Admission = { kind: 'run'; context: ExecutionContext } | { kind: 'respond'; response: HttpResponse; outcome: string };

function toRow(r: StoreRecord): native.RecordRowData {
  const row: native.RecordRowData = {
    fingerprint: r.fingerprint,
    state: r.state,
    token: r.token,
    generation: r.generation,
    expiresAt: r.expiresAt,
  };
  if (r.leaseUntil !== null) row.leaseUntil = r.leaseUntil;
  if (r.response !== null) row.response = r.response;
  return row;
}

/** Converts core's response data. */
export function toHttp(h: native.HttpResponseData): HttpResponse {
  return { status: h.status, headers: h.headers as Array<[string, string]>, body: h.body };
}

/** Fencing tokens per draw of the random pool. */
const POOL_TOKENS = 256;
let pool = Buffer.alloc(0);
let poolAt = 0;

/**
 * 16 fresh random bytes for a flow's fencing token, cut from a pooled `crypto.randomBytes` draw
 * (one draw per 256 flows; a pool is never reused once handed out, so every token is distinct
 * randomness, like `crypto.randomUUID()`'s own pool).
 */
function entropy(): Buffer {
  if (poolAt + 16 > pool.length) {
    pool = randomBytes(16 * POOL_TOKENS);
    poolAt = 0;
  }
  const b = pool.subarray(poolAt, poolAt + 16);
  poolAt += 16;
  return b;
}

function withTimeout<T>(call: (options: CallOptions) => Promise<T>, ms: number, what: string): Promise<T> {
  if (!(ms > 0) || !Number.isFinite(ms)) return call({});
  // The store sees the host give up (its own retries stop: nothing applies after the 503).
  const giveUp = new AbortController();
  let timer: NodeJS.Timeout | undefined;
  const t = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      const e = new Error(`store ${what} timed out after ${ms} ms`);
      giveUp.abort(e);
      reject(e);
    }, ms);
  });
  return Promise.race([call({ signal: giveUp.signal }), t]).finally(() => clearTimeout(timer));
}

const LEASE_SIGNAL = Symbol('idempo.leaseSignal');

/**
 * The {@link ExecutionContext} of a handler. Its `signal` is made when first read: most handlers
 * never read it, and an `AbortController` per request is measurable.
 */
class Context implements ExecutionContext {
  readonly generation: number;
  readonly downstreamKey: string;
  declare tx?: unknown;
  readonly #session: Session;

  constructor(generation: number, downstreamKey: string, session: Session) {
    this.generation = generation;
    this.downstreamKey = downstreamKey;
    this.#session = session;
  }

  /** Aborted when another request took the key over (the lease was lost). */
  get signal(): AbortSignal {
    return this.#session[LEASE_SIGNAL]();
  }
}

/** Options of one session. */
export interface SessionOptions {
  store: IdempotencyStore;
  config: native.FlowConfig;
  scope: Buffer;
  fingerprint: string;
  storeTimeoutMs: number;
  events: IdempotencyEvents;
  route: string;
  /** Transactional mode: this request's session (it replaces `store` for every primitive). */
  tx?: TransactionSession;
  /** The request's partition for a store that holds partitions to quotas (`store.partitioned`). */
  partition?: Buffer;
}

/** What {@link Session} takes from {@link admitInMemory}: the flow it made and its claim's answer. */
interface Preadmitted {
  /** The flow (`continue`), or the admission or gate slot holding it (`run`: see
   * `Admission.takeFlow`, `MemoryGate.take`). */
  flow: native.ServerFlow | native.Admission | GateSlot;
  /** `memoryInline(store)` when the caller already has it. */
  mem?: MemoryInline;
  /** The handler runs (`run`), or the flow goes on from its `start()` action (`continue`). */
  run: { generation: number; downstreamKey: string; heartbeatMs: number | undefined } | 'continue';
}

/** `Admission.scopeInMemory`'s facts (layout in its docs), read right after each call. */
const MEMORY_FACTS = Buffer.alloc(128);

/** How {@link admitInMemory} ended. */
export type MemoryAdmitted =
  | { kind: 'refused' }
  | { kind: 'answered'; response: HttpResponse; outcome: string }
  | { kind: 'session'; session: Session };

/** The string at `at` of an answer's buffer (u32 LE length, UTF-8 bytes), and the offset after it. */
function readString(b: Buffer, at: number): [string, number] {
  const n = b.readUInt32LE(at);
  return [b.toString('utf8', at + 4, at + 4 + n), at + 4 + n];
}

/**
 * Core's scope stage, then the flow with its claim run on the memory store, in one native call
 * (`Admission.scopeInMemory`): for exactly idempo's `MemoryStore` (`mem`, see `memoryInline`) with
 * no `store_op` listener and no transaction. `refused`: the admission's getters say how; `answered`:
 * core's answer (a replay, 409, 422...) ready to send, with no session; else the session, whose
 * `admitEager()` gives the claim's answer. `warn` is called with the admission's warning.
 */
export function admitInMemory(
  adm: native.Admission,
  mem: MemoryInline,
  rule: native.ScopeRule,
  f: { method: string; route: string; authenticated: boolean },
  returned: native.ScopeReturn,
  o: Omit<SessionOptions, 'scope' | 'fingerprint' | 'partition' | 'tx'>,
  warn: (message: string) => void,
): MemoryAdmitted {
  const facts = MEMORY_FACTS;
  let r: native.ServerFlow | Buffer | null;
  try {
    r = adm.scopeInMemory(rule, f.method, f.route, f.authenticated, returned, o.config, mem.core, mem.now(), entropy(), o.store.partitioned === true, facts);
  } catch (e) {
    throw fromNative(e);
  }
  const kind = facts[0];
  if (kind === 0) return { kind: 'refused' };
  if (facts[1] === 1 && adm.warning) warn(adm.warning);
  if (kind === 2 && Buffer.isBuffer(r)) return answered(facts, r);
  let run: Preadmitted['run'] = 'continue';
  let flow: native.ServerFlow | native.Admission;
  if (kind === 3 && r instanceof native.ServerFlow) flow = r;
  else if (kind === 1 && r === null) {
    // The flow stays in the admission until a step other than the memory completion needs it.
    flow = adm;
    run = runFacts(facts);
  } else throw new Error(`idempo: Admission.scopeInMemory wrote an unknown result ${kind}`);
  // The session needs no scope or fingerprint of its own: the flow holds them.
  return { kind: 'session', session: new Session({ ...o, scope: EMPTY, fingerprint: '' }, { flow, run }) };
}

/** Core's answer written by `scopeInMemory` or `MemoryGate` (result 2): ready to send. */
function answered(facts: Buffer, r: Buffer): { kind: 'answered'; response: HttpResponse; outcome: string } {
  const count = facts.readUInt32LE(4);
  const [outcome, first] = readString(r, 0);
  let at = first;
  const headers: Array<[string, string]> = [];
  for (let i = 1; i < count; i += 2) {
    const [n, next] = readString(r, at);
    const [v, after] = readString(r, next);
    headers.push([n, v]);
    at = after;
  }
  const response = { status: facts.readUInt16LE(2), headers, body: r.subarray(facts.readUInt32LE(8)) };
  return { kind: 'answered', response, outcome };
}

/** The run-the-handler facts (result 1). */
function runFacts(facts: Buffer): Exclude<Preadmitted['run'], 'continue'> {
  const hb = facts.readDoubleLE(16);
  return {
    generation: facts.readUInt32LE(12),
    downstreamKey: facts.toString('latin1', 32, 32 + facts.readUInt32LE(24)),
    heartbeatMs: Number.isNaN(hb) ? undefined : hb,
  };
}

/** A flow the memory gate keeps for a session (`MemoryGate.finish`, `MemoryGate.take`). */
export interface GateSlot {
  gate: native.MemoryGate;
  slot: number;
  tag: number;
}

/** How {@link admitThroughGate} ended. */
export type GateAdmitted =
  | MemoryAdmitted
  /** The route's scope function is to be called: the request is held in `slot`. */
  | { kind: 'scope'; slot: number; tag: number };

/** Random bytes handed to a gate per refill (256 flows). */
const GATE_ENTROPY = 16 * POOL_TOKENS;

/**
 * Runs a {@link MemoryGate} step (`MemoryGate.admit` or `MemoryGate.scope`, given as `call`) and
 * reads its facts: a refusal (`refused`: the ordinary admission says how), core's answer, the
 * request held for its scope function, or the session (whose `admitEager()` gives the claim's
 * answer). `warn` is called with the admission's warning.
 */
export function gateStep(
  gate: native.MemoryGate,
  mem: MemoryInline,
  call: (facts: Buffer) => native.ServerFlow | Buffer | null,
  o: SessionOptions,
  warn: (message: string) => void,
): GateAdmitted {
  const facts = MEMORY_FACTS;
  let r: native.ServerFlow | Buffer | null;
  try {
    r = call(facts);
    if (facts[0] === 4) {
      // The gate's random bytes ran out (nothing ran): a fresh draw, then the same step.
      gate.refill(randomBytes(GATE_ENTROPY));
      r = call(facts);
    }
  } catch (e) {
    throw fromNative(e);
  }
  const kind = facts[0];
  if (kind === 0) return { kind: 'refused' };
  if (kind === 5) return { kind: 'scope', slot: facts.readUInt32LE(4), tag: facts.readUInt32LE(28) };
  if (facts[1] === 1) {
    const w = gate.warning;
    if (w) warn(w);
  }
  if (kind === 2 && Buffer.isBuffer(r)) return answered(facts, r);
  let pre: Preadmitted;
  if (kind === 3 && r instanceof native.ServerFlow) pre = { flow: r, run: 'continue', mem };
  else if (kind === 1 && r === null) {
    pre = { flow: { gate, slot: facts.readUInt32LE(4), tag: facts.readUInt32LE(28) }, run: runFacts(facts), mem };
  } else throw new Error(`idempo: MemoryGate wrote an unknown result ${kind}`);
  // `o` carries no scope or fingerprint of its own: the flow holds them.
  return { kind: 'session', session: new Session(o, pre) };
}

const EMPTY = Buffer.alloc(0);

/**
 * One request's flow. Events are fed one at a time through a promise chain, so a heartbeat
 * renew and the handler's end never interleave.
 */
export class Session {
  /** The flow, once this session holds it (see {@link Session.#flow}). */
  #own: native.ServerFlow | undefined;
  /** The admission holding the flow (`Admission.scopeInMemory`), until it is taken out. */
  #adm: native.Admission | undefined;
  /** The memory gate's slot holding the flow (`MemoryGate.admit`), until it is taken out. */
  #slot: GateSlot | undefined;
  readonly #o: SessionOptions;
  /** The last serialized step (made on the first one: most memory-store sessions have none). */
  #chain: Promise<unknown> | undefined;
  #heartbeatMs: number | undefined;
  /** This session's heartbeat, while one is scheduled (on the process's shared timers). */
  #beat: (() => void) | undefined;
  /** Aborted when the lease is lost; made when the handler first reads `signal` (or then). */
  #abort: AbortController | undefined;
  #ended = false;
  #lostReported = false;
  readonly #store: IdempotencyStore;
  /** The store is exactly idempo's own `MemoryStore` (no subclass, methods not overridden): its
   * primitives never block, so they get no deadline, and while nothing listens to `store_op`
   * the common ones run inside the flow's native calls (see {@link Session.#inline}). */
  readonly #mem: MemoryInline | undefined;
  /** Serialized steps queued or running: at 0, a synchronous step may run at once. */
  #running = 0;
  /** A store failure (or corrupt row) was fed: only then can the flow have a cleanup. */
  #mayCleanup = false;
  /** Counts a serialized step out (made on the first step). */
  #settled: (() => void) | undefined;
  /** The claim's answer when the flow was made by {@link admitInMemory} (taken by `admitEager`). */
  #pre: Preadmitted['run'] | undefined;

  constructor(o: SessionOptions, pre?: Preadmitted) {
    this.#o = o;
    this.#store = o.tx ?? o.store;
    this.#mem = o.tx ? undefined : (pre?.mem ?? memoryInline(o.store));
    if (pre !== undefined) {
      if (pre.flow instanceof native.ServerFlow) this.#own = pre.flow;
      else if (pre.flow instanceof native.Admission) this.#adm = pre.flow;
      else this.#slot = pre.flow;
      this.#pre = pre.run;
      return;
    }
    try {
      this.#own = new native.ServerFlow(o.config, o.scope, o.fingerprint, entropy());
    } catch (e) {
      throw fromNative(e);
    }
  }

  /** The flow: taken out of the admission that kept it the first time a step needs it. */
  get #flow(): native.ServerFlow {
    if (this.#own !== undefined) return this.#own;
    let flow: native.ServerFlow;
    const slot = this.#slot;
    try {
      flow = slot !== undefined ? slot.gate.take(slot.slot, slot.tag) : (this.#adm as native.Admission).takeFlow();
    } catch (e) {
      throw fromNative(e);
    }
    this.#own = flow;
    this.#adm = undefined;
    this.#slot = undefined;
    return flow;
  }

  /** Serializes a step on the flow. */
  #serial<T>(f: () => Promise<T>): Promise<T> {
    this.#running++;
    const settled = (this.#settled ??= () => {
      this.#running--;
    });
    const next = (this.#chain ?? Promise.resolve()).then(f, f);
    this.#chain = next.then(settled, settled);
    return next;
  }

  #feed(f: () => native.FlowAction): native.FlowAction {
    try {
      const a = f();
      if (a.corrupt !== undefined) {
        this.#mayCleanup = true;
        this.#o.events.emit('corrupt_record', { message: a.corrupt });
      }
      return a;
    } catch (e) {
      throw fromNative(e);
    }
  }

  /**
   * The memory store's primitives may run inside the flow's native calls now: the store is
   * exactly idempo's `MemoryStore`, no step is queued, and nothing listens to `store_op` (a
   * listener gets every primitive through the ordinary host loop, which times each one).
   */
  #inline(): MemoryInline | undefined {
    const mem = this.#mem;
    return mem !== undefined && this.#running === 0 && this.#o.events.listenerCount('store_op') === 0 ? mem : undefined;
  }

  async #execStore(a: native.FlowAction): Promise<native.FlowAction> {
    if (this.#o.events.listenerCount('store_op') === 0) return this.#execStoreOp(a, () => undefined);
    const started = performance.now();
    let failed = false;
    try {
      return await this.#execStoreOp(a, () => {
        failed = true;
      });
    } finally {
      this.#o.events.emit('store_op', { route: this.#o.route, op: a.op ?? '', durationMs: performance.now() - started, failed });
    }
  }

  async #execStoreOp(a: native.FlowAction, fail: () => void): Promise<native.FlowAction> {
    const s = this.#store;
    // The memory store never blocks: no deadline (and no timer) on its calls.
    const ms = this.#mem !== undefined ? 0 : this.#o.storeTimeoutMs;
    const op = a.op ?? '';
    const scope = a.scope as Buffer;
    try {
      switch (op) {
        case 'claim': {
          const partition = this.#o.partition;
          const r = await withTimeout(
            (o) => s.claim(scope, a.fingerprint as string, a.token as Buffer, a.leaseMs as number, a.ttlMs as number, partition ? { ...o, partition } : o),
            ms,
            op,
          );
          if (r.claimed) return this.#feed(() => this.#flow.claimed(r.generation, r.nowMs));
          if ('locked' in r) return this.#feed(() => this.#flow.locked(r.nowMs));
          return this.#feed(() => this.#flow.existing(toRow(r.record), r.nowMs));
        }
        case 'get': {
          const r = await withTimeout((o) => s.get(scope, o), ms, op);
          return this.#feed(() => this.#flow.got(r.record === null ? null : toRow(r.record), r.nowMs));
        }
        case 'takeover': {
          const g = await withTimeout((o) => s.takeover(scope, a.seenToken as Buffer, a.newToken as Buffer, a.leaseMs as number, o), ms, op);
          return this.#feed(() => this.#flow.tookOver(g));
        }
        case 'mark_unknown': {
          const ok = await withTimeout((o) => s.markUnknown(scope, a.seenToken as Buffer, a.ttlMs as number, o), ms, op);
          return this.#feed(() => this.#flow.markedUnknown(ok));
        }
        case 'complete': {
          const ok = await withTimeout((o) => s.complete(scope, a.token as Buffer, a.response as Buffer, a.ttlMs as number, o), ms, op);
          return this.#feed(() => this.#flow.completed(ok));
        }
        case 'release': {
          const ok = await withTimeout((o) => s.release(scope, a.token as Buffer, o), ms, op);
          return this.#feed(() => this.#flow.released(ok));
        }
        case 'renew': {
          const ok = await withTimeout((o) => s.renew(scope, a.token as Buffer, a.leaseMs as number, o), ms, op);
          return this.#feed(() => this.#flow.renewed(ok));
        }
        case 'commit': {
          // Transactional mode only: the session's COMMIT; a failure feeds StoreFailed (core
          // answers 503, outcome not_committed).
          const tx = this.#o.tx;
          if (!tx) throw new Error('idempo: core asked for a commit outside a transactional session');
          await withTimeout(() => tx.commit(), ms, op);
          return this.#feed(() => this.#flow.committed());
        }
        default:
          throw new Error(`unknown store op ${op}`);
      }
    } catch (error) {
      if ((error as { code?: string }).code === 'FLOW_ERROR') throw error;
      fail();
      this.#o.events.emit('store_error', { op, error, route: this.#o.route });
      this.#mayCleanup = true;
      return this.#feed(() => this.#flow.storeFailed());
    }
  }

  /** Executes store actions until the flow wants something else. */
  async #settle(a: native.FlowAction): Promise<native.FlowAction> {
    let cur = a;
    let tookOver = false;
    while (cur.type === 'store') {
      tookOver = cur.op === 'takeover';
      cur = await this.#execStore(cur);
    }
    if (tookOver && cur.type === 'run_handler') this.#o.events.emit('takeover', { route: this.#o.route });
    if (cur.type === 'lease_lost') {
      this.#leaseLost();
      (this.#abort ??= new AbortController()).abort(new Error('idempotency lease lost to a takeover'));
      cur = { type: 'wait' };
    }
    return cur;
  }

  #leaseLost(): void {
    if (this.#lostReported) return;
    this.#lostReported = true;
    this.#o.events.emit('lease_lost', { route: this.#o.route });
  }

  async #end(a: native.FlowAction): Promise<FlowEnd> {
    const end = this.#ending(a);
    // Core committed (or rolled back) what the outcome needs; whatever a store failure left
    // open is rolled back here, and the connection goes back.
    await this.#o.tx?.close();
    this.#startCleanup();
    return end;
  }

  /** The flow's end as the host sends it (the synchronous part of {@link Session.#end}).
   * `live`: the handler's response, for an action that says it is the one to send (`a.live`). */
  #ending(a: native.FlowAction, live?: HttpResponse): FlowEnd {
    this.#stopHeartbeat();
    this.#ended = true;
    let end: FlowEnd;
    if (a.type === 'respond' && a.live === true && live !== undefined) {
      end = { kind: 'respond', response: { status: live.status, headers: live.headers, body: live.body }, outcome: a.outcome ?? '' };
    } else if (a.type === 'respond') end = { kind: 'respond', response: toHttp(a.http as native.HttpResponseData), outcome: a.outcome ?? '' };
    else if (a.type === 'propagate_error') end = { kind: 'propagate', outcome: a.outcome ?? '' };
    else throw new Error(`idempo: the flow ended with an unexpected action ${a.type}`);
    if (end.outcome === 'lease_lost') this.#leaseLost();
    return end;
  }

  #startCleanup(): void {
    // Only a store failure (a claim or takeover whose answer was lost) leaves a cleanup.
    const cleanup = this.#mayCleanup ? this.#flow.cleanup : undefined;
    // Started on the next turn of the event loop, once the response is on its way: a
    // synchronous store (better-sqlite3 waiting on a locked file) would otherwise hold the 503.
    if (cleanup) setImmediate(() => void this.#cleanup(cleanup));
  }

  /**
   * Core's cleanup of a claim (or takeover) whose answer was lost: the statement may still be
   * applied by a store that resumes, holding the key for nobody. A detached promise, started
   * after the response is decided: runs the token-fenced op, retries as core says (unref'd
   * timers, so it never keeps the process alive), never throws, reports its end as `cleanup`.
   */
  async #cleanup(c: native.FlowCleanup): Promise<void> {
    const a = c.action;
    const op = a.op ?? '';
    const started = Date.now();
    let attempts = 0;
    let applied = false;
    try {
      for (;;) {
        let result: boolean | null;
        try {
          const call = (o: CallOptions): Promise<boolean> =>
            op === 'renew'
              ? this.#o.store.renew(a.scope as Buffer, a.token as Buffer, a.leaseMs as number, o)
              : this.#o.store.release(a.scope as Buffer, a.token as Buffer, o);
          result = (await withTimeout(call, this.#o.storeTimeoutMs, op)) === true;
        } catch {
          result = null;
        }
        attempts++;
        applied = result === true;
        const delay = this.#flow.cleanupNext(attempts - 1, Math.max(0, Date.now() - started), result);
        if (delay === null || delay === undefined) break;
        await new Promise<void>((r) => setTimeout(r, delay).unref?.());
      }
    } catch {
      // A background cleanup never throws; what it did is reported below.
    }
    try {
      this.#o.events.emit('cleanup', { route: this.#o.route, op, applied, attempts });
    } catch {
      // A throwing listener must not become an unhandled rejection.
    }
  }

  /** Runs a step; on a failure the transaction (if any) is rolled back before rethrowing. */
  async #guarded<T>(f: () => Promise<T>): Promise<T> {
    try {
      return await f();
    } catch (e) {
      await this.#o.tx?.close();
      throw e;
    }
  }

  /** Claims the key: run the handler, or answer at once (replay, 409, 422, 503...). */
  admit(): Promise<Admission> {
    let r: Admission | Promise<Admission>;
    try {
      r = this.admitEager();
    } catch (e) {
      return Promise.reject(e);
    }
    return r instanceof Promise ? r : Promise.resolve(r);
  }

  /**
   * {@link Session.admit}, answered synchronously when the claim ran inside the flow's native
   * call and needs no further step (the memory store's common answers), else its promise. A
   * failure of the synchronous part is thrown.
   */
  admitEager(): Admission | Promise<Admission> {
    const pre = this.#pre;
    if (pre !== undefined) {
      // The claim already ran inside Admission.scopeInMemory.
      this.#pre = undefined;
      if (pre !== 'continue') return this.#runWith(pre.generation, pre.downstreamKey, pre.heartbeatMs);
      return this.#serial(() => this.#guarded(async () => this.#admittedAsync(await this.#settle(this.#feed(() => this.#flow.start())))));
    }
    const mem = this.#inline();
    if (mem !== undefined) {
      // The memory store: the claim runs inside the flow's first native call, and the common
      // answers (run the handler, replay, 409, 422) need no further step.
      const a = this.#feed(() => this.#flow.startInMemory(mem.core, mem.now(), this.#o.partition));
      if (a.type === 'run_handler' || a.type === 'respond') return this.#admittedSync(a);
      return this.#serial(() => this.#guarded(async () => this.#admittedAsync(await this.#settle(a))));
    }
    return this.#serial(() => this.#guarded(async () => this.#admittedAsync(await this.#settle(this.#feed(() => this.#flow.start())))));
  }

  /** The lease's signal (see {@link Context}). */
  [LEASE_SIGNAL](): AbortSignal {
    return (this.#abort ??= new AbortController()).signal;
  }

  /** The admission after the claim's last store step (`a` runs the handler or answers). */
  #admittedSync(a: native.FlowAction): Admission {
    if (a.type === 'run_handler') return this.#run(a);
    const end = this.#ending(a);
    this.#startCleanup();
    if (end.kind !== 'respond') throw new Error('idempo: admission ended without a response');
    return end;
  }

  async #admittedAsync(a: native.FlowAction): Promise<Admission> {
    if (a.type === 'run_handler') return this.#run(a);
    const end = await this.#end(a);
    if (end.kind !== 'respond') throw new Error('idempo: admission ended without a response');
    return end;
  }

  #run(a: native.FlowAction): Admission {
    return this.#runWith(a.generation as number, a.downstreamKey as string, a.heartbeatMs);
  }

  #runWith(generation: number, downstreamKey: string, heartbeatMs: number | undefined): Admission {
    // Without heartbeats nothing would take a flow out of the gate's slot for a request that
    // never ends (its session dropped): it is taken out now.
    if (heartbeatMs === undefined && this.#slot !== undefined) void this.#flow;
    this.#heartbeatMs = heartbeatMs;
    this.#scheduleHeartbeat();
    const context = new Context(generation, downstreamKey, this);
    if (this.#o.tx) context.tx = this.#o.tx.tx;
    return { kind: 'run' as const, context };
  }

  #scheduleHeartbeat(): void {
    const ms = this.#heartbeatMs;
    if (ms === undefined || this.#ended) return;
    const beat = (this.#beat ??= () => this.#heartbeat());
    scheduleBeat(ms, beat);
  }

  #heartbeat(): void {
    void this.#serial(async () => {
      if (this.#ended) return;
      const a = await this.#settle(this.#feed(() => this.#flow.heartbeatDue()));
      if (a.type !== 'wait') throw new Error(`idempo: heartbeat led to ${a.type}`);
      this.#scheduleHeartbeat();
    }).catch((error: unknown) => this.#o.events.emit('store_error', { op: 'renew', error, route: this.#o.route }));
  }

  #stopHeartbeat(): void {
    if (this.#beat !== undefined && this.#heartbeatMs !== undefined) cancelBeat(this.#heartbeatMs, this.#beat);
  }

  /**
   * Core's capture plan for the handler's response (`spec/PROTOCOL.md` §7.5.1): `pass_through`
   * (send as it comes, record nothing), `buffer` (hold it until the flow answers) or `tee` (send
   * as it streams, record at most `limit` bytes with a {@link BodyCapture}).
   */
  capturePlan(status: number, headers: Array<[string, string]>, streaming: boolean): { kind: string; limit: number | null } {
    const plan = this.#o.config.capturePlan(status, headers, streaming, false);
    return { kind: plan.kind, limit: plan.limit ?? null };
  }

  /** The handler returned: record it (per core's policy) and get the response to send. */
  finish(result: HandlerResult): Promise<FlowEnd> {
    let r: FlowEnd | Promise<FlowEnd>;
    try {
      r = this.finishEager(result);
    } catch (e) {
      return Promise.reject(e);
    }
    return r instanceof Promise ? r : Promise.resolve(r);
  }

  /**
   * {@link Session.finish}, answered synchronously when the completion ran inside the flow's
   * native call and the flow ended there (the memory store's common case), else its promise. A
   * failure of the synchronous part is thrown.
   */
  finishEager(result: HandlerResult): FlowEnd | Promise<FlowEnd> {
    this.#stopHeartbeat();
    const mem = this.#inline();
    if (mem !== undefined && !this.#ended) {
      // The memory store: the completion (or release) runs inside the same native call.
      let r: string | native.FlowAction;
      const adm = this.#own === undefined ? this.#adm : undefined;
      const slot = this.#own === undefined ? this.#slot : undefined;
      try {
        if (slot !== undefined) {
          let headers = '';
          for (const [n, v] of result.headers) headers += `${n}\n${v}\n`;
          const out = slot.gate.finish(
            slot.slot,
            slot.tag,
            mem.core,
            mem.now(),
            result.status,
            headers,
            result.body,
            result.bodyToStore ?? null,
            result.framework ?? false,
            result.bodyTruncated ?? false,
          );
          r = out;
        } else {
        const args = [
          mem.core,
          mem.now(),
          result.status,
          result.headers,
          result.body,
          result.bodyToStore ?? null,
          result.framework ?? false,
          result.bodyTruncated ?? false,
        ] as const;
        r = adm !== undefined ? adm.finishInMemory(...args) : this.#flow.handlerFinishedInMemory(...args);
        }
      } catch (e) {
        // The gate gives its slot up on a failure: nothing is left to take out.
        this.#slot = undefined;
        throw fromNative(e);
      }
      if (typeof r === 'string') {
        // Core answers with the handler's own response, unchanged: only the outcome came back.
        const end = this.#ending({ type: 'respond', live: true, outcome: r }, result);
        this.#startCleanup();
        return end;
      }
      const a = this.#feed(() => r as native.FlowAction);
      if (a.type === 'respond' || a.type === 'propagate_error') {
        const end = this.#ending(a, result);
        this.#startCleanup();
        return end;
      }
      return this.#serial(() => this.#guarded(async () => this.#end(await this.#settle(a))));
    }
    return this.#serial(() =>
      this.#guarded(async () => {
        const a = this.#feed(() =>
          this.#flow.handlerFinished(
            result.status,
            result.headers,
            result.body,
            result.bodyToStore ?? null,
            result.framework ?? false,
            result.bodyTruncated ?? false,
          ),
        );
        return this.#end(await this.#settle(a));
      }),
    );
  }

  /**
   * The handler threw. `maybeSideEffect`: it may have acted before failing (in transactional mode
   * core rolls back whatever it says).
   */
  fail(maybeSideEffect: boolean): Promise<FlowEnd> {
    this.#stopHeartbeat();
    return this.#serial(() =>
      this.#guarded(async () => {
        const a = this.#feed(() => this.#flow.handlerFailed(maybeSideEffect));
        return this.#end(await this.#settle(a));
      }),
    );
  }
}
