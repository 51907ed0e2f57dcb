import { performance } from 'node:perf_hooks';
import type BetterSqlite3 from 'better-sqlite3';
import { StoreUnavailableError } from '../errors';
import type { CallOptions, ClaimResult, ClockOverride, GetResult, PurgeCounts, PurgeOptions, TransactionalStore, TransactionSession } from './types';
import { asBuffer, checkKeyAndToken } from './types';
import { recipe, recordFromRow } from './recipes';
import { sqliteSetupPauseMs } from '../native';
import type { RecipeRow } from './recipes';
import { statsFromRow } from './types';
import type { StoreStats } from './types';
import { defaultOf } from '../defaults';

/** The SQLite schema of `spec/STORAGE.md` §7 (§4.1 with SQLite types, `WITHOUT ROWID`). */
export const SQLITE_SCHEMA = recipe('sqlite_schema');

/** The statements of `spec/STORAGE.md` §7 (from core); named parameters `:scope`, `:now`, …. */
const SQL = {
  claim: recipe('sqlite_claim'),
  get: recipe('sqlite_get'),
  takeover: recipe('sqlite_takeover'),
  markUnknown: recipe('sqlite_mark_unknown'),
  complete: recipe('sqlite_complete'),
  release: recipe('sqlite_release'),
  renew: recipe('sqlite_renew'),
  purge: recipe('sqlite_purge'),
  stats: recipe('sqlite_stats'),
} as const;

/** True for better-sqlite3's `SQLITE_BUSY` and its extended codes (`SQLITE_BUSY_RECOVERY`, …). */
function isBusy(e: unknown): boolean {
  const code = typeof e === 'object' && e !== null ? (e as { code?: unknown }).code : undefined;
  return typeof code === 'string' && (code === 'SQLITE_BUSY' || code.startsWith('SQLITE_BUSY_'));
}

/**
 * Runs one step of the store's synchronous setup (constructor), retrying while SQLite refuses it
 * with `SQLITE_BUSY` until `boundMs` from the first attempt; the pauses (core's schedule: doubling, 1 ms up to 25 ms)
 * block, as the constructor does. Switching a fresh file to WAL needs an exclusive lock and SQLite
 * refuses it at once, without its busy handler, while another connection opens the same file.
 */
function setupStep<T>(boundMs: number, what: string, step: () => T): T {
  const since = performance.now();
  let refused = 0;
  const sleeper = new Int32Array(new SharedArrayBuffer(4));
  for (;;) {
    try {
      return step();
    } catch (e) {
      if (!isBusy(e)) {
        if (e instanceof RangeError || e instanceof StoreUnavailableError) throw e;
        throw new StoreUnavailableError(`SQLite: ${what} failed: ${(e as Error).message}`, { cause: e });
      }
      refused += 1;
      const waited = performance.now() - since;
      const pause = sqliteSetupPauseMs(refused, waited, boundMs);
      if (pause === null) {
        throw new StoreUnavailableError(`SQLite: ${what} found the database locked for ${Math.round(waited)} ms (busyTimeoutMs ${boundMs})`, { cause: e });
      }
      Atomics.wait(sleeper, 0, 0, pause);
    }
  }
}

/** The error a store call rejects with: argument errors as they are, the rest `STORE_UNAVAILABLE`. */
function storeError(e: unknown): Error {
  if (e instanceof RangeError || e instanceof StoreUnavailableError) return e;
  return new StoreUnavailableError(`SQLite error: ${(e as Error).message}`, { cause: e });
}

/**
 * The wait for a write lock held by another connection, off the event loop: core's doubling pauses
 * (`setTimeout`, 1 ms up to 25 ms, `idempo_core::busy`) between attempts, bounded by `busyTimeoutMs` from the first one.
 */
class BusyWait {
  readonly #since: number;
  readonly #boundMs: number;
  #refused = 0;

  /** `since`: `performance.now()` at the first attempt. */
  constructor(since: number, boundMs: number) {
    this.#since = since;
    this.#boundMs = boundMs;
  }

  /** Milliseconds since the first attempt. */
  get waitedMs(): number {
    return performance.now() - this.#since;
  }

  /**
   * Sleeps before the next attempt; false when the bound has passed, at once or after the sleep
   * (a late timer never starts an attempt past the bound, so the store's callers can rely on it).
   */
  async pause(): Promise<boolean> {
    this.#refused += 1;
    const ms = sqliteSetupPauseMs(this.#refused, this.waitedMs, Math.ceil(this.#boundMs));
    if (ms === null) return false;
    await new Promise<void>((resolve) => setTimeout(resolve, ms));
    return this.waitedMs < this.#boundMs;
  }

  /** The rejection once the bound has passed. */
  expired(cause: unknown): StoreUnavailableError {
    return new StoreUnavailableError(`SQLite: the database stayed locked for ${Math.round(this.waitedMs)} ms (busyTimeoutMs ${this.#boundMs})`, { cause });
  }
}

/** Options of {@link SqliteStore}. */
export interface SqliteStoreOptions {
  /** Database file (default `idempo.sqlite3`); ignored when `database` is given. */
  filename?: string;
  /** An open better-sqlite3 database to use (the store then does not close it). */
  database?: BetterSqlite3.Database;
  /**
   * How long a call waits for a write lock held by another connection or process, in ms (default
   * 5000), after which it fails with `STORE_UNAVAILABLE` (503). The wait never blocks the event
   * loop: the store's statements run with SQLite's `busy_timeout` at 0 and a refused one is retried
   * from a timer. The connection's `busy_timeout` outside the store's own statements (and during
   * the constructor's setup, which is synchronous) is this value.
   */
  busyTimeoutMs?: number;
  /** Create the table and index if missing (default true). */
  createSchema?: boolean;
  /**
   * Transactional mode: how long a request waits for another transactional request of this
   * process to finish with the connection (default 2000 ms). A claim that waits longer is answered
   * 409 with `Retry-After`; any other operation fails with `STORE_UNAVAILABLE` (503).
   */
  lockTimeoutMs?: number;
  /** Clock override for conformance runs only. */
  clock?: ClockOverride;
}

/** A primitive waiting for the next group commit. */
interface Pending {
  signal: AbortSignal | undefined;
  f: () => unknown;
  resolve: (v: unknown) => void;
  reject: (e: unknown) => void;
}

/** A primitive of a group whose caller gave up before it ran (it is not run). */
const ABANDONED = Symbol('abandoned');

/** A request waiting for the connection held by a transactional session. */
interface Waiter {
  wake: () => void;
}

type Statements = { [K in keyof typeof SQL]: BetterSqlite3.Statement };

/** What a {@link SqliteTransaction} needs from its store (kept off the public surface). */
interface SqliteInternals {
  stmts: Statements;
  /** Runs `f` with SQLite's `busy_timeout` at 0 (it fails at once with `SQLITE_BUSY` on a held lock). */
  noWait: <T>(f: () => T) => T;
  now: () => number | null;
  hold: (owner: object, deadline: number) => Promise<boolean>;
  free: (owner: object) => void;
}

/**
 * The embedded default store (better-sqlite3): WAL, `synchronous=FULL`, every primitive in `BEGIN
 * IMMEDIATE`, times from SQLite's clock (`julianday('now')`). One host only.
 *
 * better-sqlite3 is synchronous, so the store never lets SQLite wait for a lock: its statements run
 * with `busy_timeout` at 0, and one refused with `SQLITE_BUSY` (another connection holds the write
 * lock) is run again, whole (its `BEGIN IMMEDIATE` transaction included, so nothing is half
 * applied), after doubling pauses on a timer, until `busyTimeoutMs` from the first attempt; then
 * the call rejects with {@link StoreUnavailableError}. Other requests of the process go on meanwhile.
 *
 * Transactional mode (`transaction()`) runs the handler inside the store's own connection's
 * transaction; while one is open, the store's other operations of this process wait for it (at
 * most `lockTimeoutMs`), as SQLite has one writer anyway.
 */
export class SqliteStore implements TransactionalStore {
  readonly kind = 'sqlite';
  /**
   * The longest one call can take before failing by itself: the lock wait (`busyTimeoutMs`) plus,
   * when a transactional request of this process holds the connection, `lockTimeoutMs`.
   */
  get callTimeoutMs(): number {
    return this.busyTimeoutMs + this.lockTimeoutMs;
  }
  readonly db: BetterSqlite3.Database;
  readonly #owned: boolean;
  readonly #stmts: Statements;
  readonly #clock: ClockOverride | undefined;
  readonly #tx: {
    claim: (p: Record<string, unknown>) => ClaimResult;
    purge: (p: Record<string, unknown>) => PurgeCounts;
  };
  /** Transactional mode lock wait, ms. */
  readonly lockTimeoutMs: number;
  /** The bound on waiting for another connection's write lock, ms. */
  readonly busyTimeoutMs: number;
  /**
   * `PRAGMA busy_timeout` back to `busyTimeoutMs` after the store's own statements (which run at 0).
   * Run with `exec` each time: SQLite applies this pragma when it compiles it, so a prepared one
   * would change nothing when run again.
   */
  readonly #busyOn: string;
  /** The transactional session holding the connection, or null. */
  #holder: object | null = null;
  /** Primitives waiting for the next group commit. */
  #pending: Pending[] = [];
  /** Runs `f` in one `BEGIN IMMEDIATE` transaction (the group commit). */
  readonly #group: (f: () => void) => void;
  #waiters: Waiter[] = [];

  constructor(options: SqliteStoreOptions = {}) {
    const bt = options.busyTimeoutMs ?? defaultOf<number>('sqlite_store', 'busyTimeoutMs');
    if (!Number.isFinite(bt) || bt < 0) throw new RangeError(`busyTimeoutMs must be a number of ms >= 0, got ${bt}`);
    this.busyTimeoutMs = Math.floor(bt);
    if (options.database) {
      this.db = options.database;
      this.#owned = false;
    } else {
      // Loaded lazily so the package works without better-sqlite3 when another store is used.
      // eslint-disable-next-line @typescript-eslint/no-require-imports
      const Database = require('better-sqlite3') as typeof BetterSqlite3;
      const filename = options.filename ?? 'idempo.sqlite3';
      try {
        this.db = new Database(filename);
      } catch (e) {
        // better-sqlite3 throws a TypeError for a missing directory, a SqliteError otherwise.
        throw new StoreUnavailableError(`SQLite: cannot open ${JSON.stringify(filename)}: ${(e as Error).message} (does its directory exist, and may this process write there?)`, { cause: e });
      }
      this.#owned = true;
    }
    // The one-time setup below is synchronous (a constructor): it may wait up to busyTimeoutMs.
    this.db.pragma(`busy_timeout = ${this.busyTimeoutMs}`);
    const bound = this.busyTimeoutMs;
    const mode = setupStep(bound, `switching ${JSON.stringify(this.db.name)} to WAL`, () => this.db.pragma('journal_mode = WAL', { simple: true }));
    if (String(mode).toLowerCase() !== 'wal' && this.db.name !== ':memory:') {
      throw new StoreUnavailableError(`SQLite refused WAL mode for ${this.db.name} (journal_mode is ${String(mode)})`);
    }
    setupStep(bound, 'setting synchronous', () => this.db.pragma('synchronous = FULL'));
    const version = (this.db.prepare('SELECT sqlite_version() AS v').get() as { v: string }).v;
    const [maj, min] = version.split('.').map(Number);
    if ((maj ?? 0) < 3 || ((maj ?? 0) === 3 && (min ?? 0) < 35)) {
      throw new StoreUnavailableError(`SQLite ${version} lacks RETURNING (3.35.0 or later is required)`);
    }
    // One BEGIN IMMEDIATE transaction: in autocommit each DDL statement reads the schema before
    // taking the write lock, and SQLite refuses that upgrade at once (no busy wait) when another
    // connection (a worker process opening the same file) wrote in between.
    if (options.createSchema !== false) {
      setupStep(bound, 'creating the schema', () => this.db.transaction(() => this.db.exec(SQLITE_SCHEMA)).immediate());
    }
    this.#clock = options.clock;
    const stmts = {} as Record<string, BetterSqlite3.Statement>;
    for (const [k, sql] of Object.entries(SQL)) stmts[k] = this.db.prepare(sql);
    this.#stmts = stmts as Statements;
    this.#stmts.get.safeIntegers(false);
    this.#busyOn = `PRAGMA busy_timeout = ${this.busyTimeoutMs}`;
    const claim = this.db.transaction((p: Record<string, unknown>): ClaimResult => {
      const ins = this.#stmts.claim.get(p) as { generation: number; now_ms: number } | undefined;
      if (ins) return { claimed: true, generation: ins.generation, nowMs: ins.now_ms };
      const row = this.#stmts.get.get(p) as RecipeRow;
      const record = recordFromRow(row);
      if (record === null) throw new StoreUnavailableError('claim conflicted but no row is visible');
      return { claimed: false, record, nowMs: Number(row.now_ms) };
    });
    const purge = this.db.transaction((p: Record<string, unknown>): PurgeCounts => {
      const rows = this.#stmts.purge.all(p) as Array<{ state: number }>;
      const c: PurgeCounts = { inProgress: 0, completed: 0, outcomeUnknown: 0 };
      for (const r of rows) {
        if (r.state === 1) c.inProgress++;
        else if (r.state === 2) c.completed++;
        else c.outcomeUnknown++;
      }
      return c;
    });
    this.#tx = { claim: (p) => claim.immediate(p), purge: (p) => purge.immediate(p) };
    const group = this.db.transaction((f: () => void) => f());
    this.#group = (f) => group.immediate(f);
    const lt = options.lockTimeoutMs ?? defaultOf<number>('sqlite_store', 'lockTimeoutMs');
    if (!Number.isFinite(lt) || lt <= 0) throw new RangeError(`lockTimeoutMs must be a positive number of ms, got ${lt}`);
    this.lockTimeoutMs = lt;
  }

  /** Waits for the next release of the connection; false past `deadline`. */
  #waitRelease(deadline: number): Promise<boolean> {
    const left = deadline - Date.now();
    if (left <= 0) return Promise.resolve(false);
    return new Promise<boolean>((resolve) => {
      const w: Waiter = {
        wake: () => {
          clearTimeout(t);
          resolve(true);
        },
      };
      const t = setTimeout(() => {
        this.#waiters = this.#waiters.filter((x) => x !== w);
        resolve(false);
      }, left);
      this.#waiters.push(w);
    });
  }

  /**
   * Takes the connection for a transactional session, waiting at most until `deadline`. The
   * check and the take happen in one synchronous step, so two sessions never both hold it.
   */
  async #hold(owner: object, deadline: number): Promise<boolean> {
    for (;;) {
      if (this.#holder === null) {
        this.#holder = owner;
        return true;
      }
      if (!(await this.#waitRelease(deadline))) return false;
    }
  }

  #free(owner: object): void {
    if (this.#holder !== owner) return;
    this.#holder = null;
    for (const w of this.#waiters.splice(0)) w.wake();
  }

  #now(): number | null {
    return this.#clock ? this.#clock() : null;
  }

  /** Runs one write statement in `BEGIN IMMEDIATE`; returns the changed row count. */
  #write(stmt: BetterSqlite3.Statement, p: Record<string, unknown>): number {
    return this.db.transaction(() => stmt.run(p).changes).immediate();
  }

  /** Runs `f` with `busy_timeout` at 0: a lock held elsewhere fails it at once (`SQLITE_BUSY`). */
  #noWait<T>(f: () => T): T {
    this.db.exec('PRAGMA busy_timeout = 0');
    try {
      return f();
    } finally {
      this.db.exec(this.#busyOn);
    }
  }

  /**
   * Runs one primitive `f` (synchronous, atomic) in the next group commit (see
   * {@link SqliteStore.#flush}), or, while a transactional request of this process holds the
   * connection, after it frees it.
   */
  #wrap<T>(signal: AbortSignal | undefined, f: () => T): Promise<T> {
    if (this.#holder !== null) return this.#wrapLater(signal, f, null, null);
    return new Promise<T>((resolve, reject) => {
      this.#pending.push({ signal, f, resolve: resolve as (v: unknown) => void, reject });
      if (this.#pending.length === 1) setImmediate(this.#flush);
    });
  }

  /**
   * Group commit: the primitives that arrived during one turn of the event loop run in one
   * `BEGIN IMMEDIATE` transaction, so their commit is one synchronous disk write instead of one
   * each (with `synchronous=FULL`, the disk's flush rate bounds the requests a second and every
   * request queued behind the others' flushes). Each primitive keeps its own statement-level
   * atomicity (its own `BEGIN IMMEDIATE` becomes a savepoint) and is answered only after the
   * group's `COMMIT`. A group that fails in any way (a primitive's error, the write lock held by
   * another connection, a failed commit) is rolled back whole and its primitives run one by one
   * as before, each in its own transaction, so a failure answers only its own primitive.
   */
  readonly #flush = (): void => {
    const batch = this.#pending;
    this.#pending = [];
    if (batch.length === 1 || this.#holder !== null || !this.db.open) {
      for (const op of batch) this.#runOne(op);
      return;
    }
    const out: unknown[] = [];
    try {
      this.#noWait(() =>
        this.#group(() => {
          for (const op of batch) out.push(op.signal?.aborted ? ABANDONED : op.f());
        }),
      );
    } catch {
      for (const op of batch) this.#runOne(op);
      return;
    }
    for (let i = 0; i < batch.length; i++) {
      const op = batch[i] as Pending;
      const v = out[i];
      if (v === ABANDONED) op.reject(new StoreUnavailableError('SQLite: the caller gave up on this call; it was not applied', { cause: op.signal?.reason }));
      else op.resolve(v);
    }
  };

  /** One primitive in its own transaction: at once, or on the slow path while another
   * connection holds the write lock or a transactional request holds the connection. */
  #runOne(op: Pending): void {
    if (this.#holder !== null) {
      this.#wrapLater(op.signal, op.f, null, null).then(op.resolve, op.reject);
      return;
    }
    if (op.signal?.aborted) {
      op.reject(new StoreUnavailableError('SQLite: the caller gave up on this call; it was not applied', { cause: op.signal.reason }));
      return;
    }
    const since = performance.now();
    try {
      op.resolve(this.#noWait(op.f));
    } catch (e) {
      if (isBusy(e)) this.#wrapLater(op.signal, op.f, new BusyWait(since, this.busyTimeoutMs), e).then(op.resolve, op.reject);
      else op.reject(storeError(e));
    }
  }

  /**
   * The slow path of {@link SqliteStore.#wrap}: `busy` is set once an attempt met `SQLITE_BUSY`.
   * Once `signal` aborts (the caller gave up), no further attempt starts.
   */
  async #wrapLater<T>(signal: AbortSignal | undefined, f: () => T, busy: BusyWait | null, cause: unknown): Promise<T> {
    const abandoned = (): StoreUnavailableError =>
      new StoreUnavailableError('SQLite: the caller gave up on this call; it was not applied', { cause: signal?.reason });
    for (;;) {
      if (busy !== null && !(await busy.pause())) throw busy.expired(cause);
      if (signal?.aborted) throw abandoned();
      if (this.#holder !== null) {
        // Never run inside a transactional request's transaction: wait until it ends.
        const deadline = Date.now() + this.lockTimeoutMs;
        while (this.#holder !== null) {
          if (!(await this.#waitRelease(deadline))) {
            throw new StoreUnavailableError(`SQLite: a transactional request held the connection for over ${this.lockTimeoutMs} ms`);
          }
          if (signal?.aborted) throw abandoned();
        }
      }
      const since = performance.now();
      try {
        return this.#noWait(f);
      } catch (e) {
        if (!isBusy(e)) throw storeError(e);
        busy ??= new BusyWait(since, this.busyTimeoutMs);
        cause = e;
      }
    }
  }

  /** A transactional session for one request (see {@link SqliteTransaction}). */
  transaction(): SqliteTransaction {
    return new SqliteTransaction(this, {
      stmts: this.#stmts,
      noWait: (f) => this.#noWait(f),
      now: () => this.#now(),
      hold: (owner, deadline) => this.#hold(owner, deadline),
      free: (owner) => this.#free(owner),
    });
  }

  claim(scopeKey: Uint8Array, fingerprint: string, token: Uint8Array, leaseMs: number, ttlMs: number, options?: CallOptions): Promise<ClaimResult> {
    return this.#wrap(options?.signal, () => {
      checkKeyAndToken(scopeKey, token);
      return this.#tx.claim({
        scope: asBuffer(scopeKey),
        fp: fingerprint,
        token: asBuffer(token),
        lease: leaseMs,
        ttl: ttlMs,
        now: this.#now(),
      });
    });
  }

  get(scopeKey: Uint8Array, options?: CallOptions): Promise<GetResult> {
    return this.#wrap(options?.signal, () => {
      checkKeyAndToken(scopeKey);
      const row = this.#stmts.get.get({ scope: asBuffer(scopeKey), now: this.#now() }) as RecipeRow;
      return { record: recordFromRow(row), nowMs: Number(row.now_ms) };
    });
  }

  takeover(scopeKey: Uint8Array, seenToken: Uint8Array, newToken: Uint8Array, leaseMs: number, options?: CallOptions): Promise<number | null> {
    return this.#wrap(options?.signal, () => {
      checkKeyAndToken(scopeKey, seenToken, newToken);
      const p = { scope: asBuffer(scopeKey), seen: asBuffer(seenToken), new: asBuffer(newToken), lease: leaseMs, now: this.#now() };
      const r = this.db.transaction(() => this.#stmts.takeover.get(p) as { generation: number } | undefined).immediate();
      return r ? r.generation : null;
    });
  }

  markUnknown(scopeKey: Uint8Array, seenToken: Uint8Array, ttlMs: number, options?: CallOptions): Promise<boolean> {
    return this.#wrap(options?.signal, () => {
      checkKeyAndToken(scopeKey, seenToken);
      return this.#write(this.#stmts.markUnknown, { scope: asBuffer(scopeKey), seen: asBuffer(seenToken), ttl: ttlMs, now: this.#now() }) === 1;
    });
  }

  complete(scopeKey: Uint8Array, token: Uint8Array, response: Uint8Array, ttlMs: number, options?: CallOptions): Promise<boolean> {
    return this.#wrap(options?.signal, () => {
      checkKeyAndToken(scopeKey, token);
      return (
        this.#write(this.#stmts.complete, { scope: asBuffer(scopeKey), token: asBuffer(token), response: asBuffer(response), ttl: ttlMs, now: this.#now() }) === 1
      );
    });
  }

  release(scopeKey: Uint8Array, token: Uint8Array, options?: CallOptions): Promise<boolean> {
    return this.#wrap(options?.signal, () => {
      checkKeyAndToken(scopeKey, token);
      return this.#write(this.#stmts.release, { scope: asBuffer(scopeKey), token: asBuffer(token) }) === 1;
    });
  }

  renew(scopeKey: Uint8Array, token: Uint8Array, leaseMs: number, options?: CallOptions): Promise<boolean> {
    return this.#wrap(options?.signal, () => {
      checkKeyAndToken(scopeKey, token);
      return this.#write(this.#stmts.renew, { scope: asBuffer(scopeKey), token: asBuffer(token), lease: leaseMs, now: this.#now() }) === 1;
    });
  }

  purgeExpired(options: PurgeOptions = {}): Promise<PurgeCounts> {
    return this.#wrap(undefined, () => this.#tx.purge({ batch: options.batch ?? defaultOf<number>('purge', 'batch'), now: this.#now() }));
  }

  /**
   * The database's figures for metrics (`spec/STORAGE.md` §4.7): records by state, expired
   * records and the purge lag, the file's size in bytes. A read: takes no write lock.
   */
  stats(): Promise<StoreStats> {
    return this.#wrap(undefined, () => statsFromRow(this.#stmts.stats.get({ now: this.#now() }) as Record<string, unknown>));
  }

  close(): Promise<void> {
    if (this.#owned && this.db.open) this.db.close();
    return Promise.resolve();
  }
}

/**
 * One request's transactional session on a {@link SqliteStore} (`store.transaction()`): `claim`
 * waits for the connection (at most `lockTimeoutMs`, else an in-flight answer: 409), runs `BEGIN
 * IMMEDIATE` and the claim; the handler writes through {@link SqliteTransaction.tx} (the store's
 * better-sqlite3 database) inside that transaction; the later primitives (`complete` included) write
 * inside it, `commit()` runs `COMMIT` when core asks for it (`spec/PROTOCOL.md` §7.6), `release`
 * rolls back. `BEGIN IMMEDIATE` never blocks the event loop: while another connection holds the
 * write lock it is retried on a timer (the connection is free for the process's other requests
 * between attempts); a lock still held after `busyTimeoutMs` also counts as in flight.
 */
export class SqliteTransaction implements TransactionSession {
  readonly kind = 'sqlite';
  readonly store: SqliteStore;
  readonly #i: SqliteInternals;
  #open = false;
  #committed = false;

  constructor(store: SqliteStore, internals: SqliteInternals) {
    this.store = store;
    this.#i = internals;
  }

  /** The better-sqlite3 database with the transaction open (null outside it). */
  get tx(): BetterSqlite3.Database | null {
    return this.#open ? this.store.db : null;
  }

  get committed(): boolean {
    return this.#committed;
  }

  #run<T>(f: () => T): Promise<T> {
    try {
      return Promise.resolve(f());
    } catch (e) {
      // A failed statement ends the transaction: nothing of it survives.
      this.#end(false);
      if (e instanceof RangeError || e instanceof StoreUnavailableError) return Promise.reject(e);
      return Promise.reject(new StoreUnavailableError(`SQLite error: ${(e as Error).message}`, { cause: e }));
    }
  }

  #end(commit: boolean): void {
    if (!this.#open) return;
    const db = this.store.db;
    this.#open = false;
    try {
      if (db.inTransaction) db.exec(commit ? 'COMMIT' : 'ROLLBACK');
      if (commit) this.#committed = true;
    } finally {
      if (db.inTransaction) {
        try {
          db.exec('ROLLBACK');
        } catch {
          /* nothing open */
        }
      }
      this.#i.free(this);
    }
  }

  /** Waits for the connection, `BEGIN IMMEDIATE`, then primitive 1 inside the transaction. */
  async claim(scopeKey: Uint8Array, fingerprint: string, token: Uint8Array, leaseMs: number, ttlMs: number): Promise<ClaimResult> {
    checkKeyAndToken(scopeKey, token);
    const now = () => this.#i.now() ?? Date.now();
    if (!this.#open) {
      const deadline = Date.now() + this.store.lockTimeoutMs;
      let busy: BusyWait | null = null;
      for (;;) {
        if (!(await this.#i.hold(this, deadline))) return { claimed: false, locked: true, nowMs: now() };
        const since = performance.now();
        try {
          this.#i.noWait(() => this.store.db.exec('BEGIN IMMEDIATE'));
          break;
        } catch (e) {
          this.#i.free(this);
          if (!isBusy(e)) throw new StoreUnavailableError(`SQLite error: ${(e as Error).message}`, { cause: e });
          busy ??= new BusyWait(since, this.store.busyTimeoutMs);
          if (!(await busy.pause())) return { claimed: false, locked: true, nowMs: now() };
        }
      }
      this.#open = true;
    }
    return this.#run(() => {
      const p = { scope: asBuffer(scopeKey), fp: fingerprint, token: asBuffer(token), lease: leaseMs, ttl: ttlMs, now: this.#i.now() };
      const ins = this.#i.stmts.claim.get(p) as { generation: number; now_ms: number } | undefined;
      if (ins) return { claimed: true as const, generation: ins.generation, nowMs: ins.now_ms };
      const row = this.#i.stmts.get.get(p) as RecipeRow;
      const record = recordFromRow(row);
      if (record === null) throw new StoreUnavailableError('claim conflicted but no row is visible');
      return { claimed: false as const, record, nowMs: Number(row.now_ms) };
    });
  }

  /** Primitive 2 (inside the transaction while it is open). */
  get(scopeKey: Uint8Array): Promise<GetResult> {
    if (!this.#open) return this.store.get(scopeKey);
    return this.#run(() => {
      checkKeyAndToken(scopeKey);
      const row = this.#i.stmts.get.get({ scope: asBuffer(scopeKey), now: this.#i.now() }) as RecipeRow;
      return { record: recordFromRow(row), nowMs: Number(row.now_ms) };
    });
  }

  /** Primitive 3 inside the transaction. */
  takeover(scopeKey: Uint8Array, seenToken: Uint8Array, newToken: Uint8Array, leaseMs: number): Promise<number | null> {
    if (!this.#open) return Promise.reject(new StoreUnavailableError('no open transaction (it ended or never began)'));
    return this.#run(() => {
      checkKeyAndToken(scopeKey, seenToken, newToken);
      const p = { scope: asBuffer(scopeKey), seen: asBuffer(seenToken), new: asBuffer(newToken), lease: leaseMs, now: this.#i.now() };
      const r = this.#i.stmts.takeover.get(p) as { generation: number } | undefined;
      return r ? r.generation : null;
    });
  }

  /** Primitive 4 inside the transaction. */
  markUnknown(scopeKey: Uint8Array, seenToken: Uint8Array, ttlMs: number): Promise<boolean> {
    if (!this.#open) return Promise.reject(new StoreUnavailableError('no open transaction (it ended or never began)'));
    return this.#run(() => {
      checkKeyAndToken(scopeKey, seenToken);
      return this.#i.stmts.markUnknown.run({ scope: asBuffer(scopeKey), seen: asBuffer(seenToken), ttl: ttlMs, now: this.#i.now() }).changes === 1;
    });
  }

  /** Primitive 5 inside the transaction (the `COMMIT` is core's separate `commit`). */
  complete(scopeKey: Uint8Array, token: Uint8Array, response: Uint8Array, ttlMs: number): Promise<boolean> {
    if (!this.#open) return Promise.reject(new StoreUnavailableError('no open transaction (it ended or never began)'));
    return this.#run(() => {
      checkKeyAndToken(scopeKey, token);
      return (
        this.#i.stmts.complete.run({ scope: asBuffer(scopeKey), token: asBuffer(token), response: asBuffer(response), ttl: ttlMs, now: this.#i.now() })
          .changes === 1
      );
    });
  }

  /** `ROLLBACK`: the claim and the handler's writes vanish together (false, and nothing deleted,
   * without an open transaction). */
  release(scopeKey: Uint8Array, token: Uint8Array): Promise<boolean> {
    if (!this.#open) return Promise.resolve(false);
    return this.#run(() => {
      checkKeyAndToken(scopeKey, token);
      this.#end(false);
      return true;
    });
  }

  /** Primitive 7 inside the transaction. */
  renew(scopeKey: Uint8Array, token: Uint8Array, leaseMs: number): Promise<boolean> {
    if (!this.#open) return Promise.reject(new StoreUnavailableError('no open transaction (it ended or never began)'));
    return this.#run(() => {
      checkKeyAndToken(scopeKey, token);
      return this.#i.stmts.renew.run({ scope: asBuffer(scopeKey), token: asBuffer(token), lease: leaseMs, now: this.#i.now() }).changes === 1;
    });
  }

  purgeExpired(options?: PurgeOptions): Promise<PurgeCounts> {
    return this.store.purgeExpired(options);
  }

  /** `COMMIT` (core's `commit`); a failure, or no open transaction, rejects (fails closed). */
  commit(): Promise<void> {
    if (!this.#open) return Promise.reject(new StoreUnavailableError('no open transaction (it ended or never began)'));
    return this.#run(() => this.#end(true));
  }

  /** Rolls back what is still open and frees the connection. */
  close(): Promise<void> {
    try {
      this.#end(false);
    } catch {
      /* the rollback failed: SQLite ends the transaction with the statement */
    }
    return Promise.resolve();
  }
}
