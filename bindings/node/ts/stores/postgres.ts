import type * as PG from 'pg';
import { StoreUnavailableError } from '../errors';
import type { ClaimResult, ClockOverride, GetResult, PurgeCounts, PurgeOptions, TransactionalStore, TransactionSession } from './types';
import { asBuffer, checkKeyAndToken } from './types';
import { recipe, recordFromRow } from './recipes';
import { renameRecipe } from '../native';
import type { RecipeRow } from './recipes';
import { statsFromRow } from './types';
import type { StoreStats } from './types';
import { defaultOf } from '../defaults';

/** A recipe with its table and index renamed, whole words only (core's `rename_table_and_index`). */
function named(sql: string, table: string, index = 'idempo_record_expires_at'): string {
  return renameRecipe(sql, table, index);
}

/** The PostgreSQL schema of `spec/STORAGE.md` §4.1 (for `schema`-qualified tables see `postgresSchema`). */
export function postgresSchema(table = 'idempo_record', index = 'idempo_record_expires_at'): string {
  return named(recipe('postgres_schema'), table, index);
}

/** The DDL of `spec/STORAGE.md` §4.1, verbatim names. */
export const POSTGRES_SCHEMA = postgresSchema();

/** Claim rounds before a contention error. */
const CLAIM_ROUNDS = 3;

/** A row of the claim recipe: `claimed`, then the columns of a `get` row. */
interface ClaimRow extends RecipeRow {
  claimed: boolean;
}

/** The claim statement's answer (`spec/STORAGE.md` §4.3); null when it returned no row or a
 * record no longer live: claim again. */
function claimAnswer(row: ClaimRow | undefined): ClaimResult | null {
  if (row === undefined) return null;
  const nowMs = Number(row.now_ms);
  if (row.claimed) return { claimed: true as const, generation: Number(row.generation), nowMs };
  const record = recordFromRow(row);
  return record !== null && record.expiresAt > nowMs ? { claimed: false as const, record, nowMs } : null;
}

/** The statements of `spec/STORAGE.md` §4.3 (from core) on table `t`. */
function recipes(t: string) {
  const q = (name: string): string => named(recipe(`postgres_${name}`), t);
  return {
    claim: q('claim'),
    get: q('get'),
    takeover: q('takeover'),
    markUnknown: q('mark_unknown'),
    complete: q('complete'),
    completeRecord: q('complete_returning'),
    release: q('release'),
    renew: q('renew'),
    purge: q('purge'),
    stats: q('stats'),
  };
}

/** The pool interface the store uses (a `pg.Pool`). */
export type PgPoolLike = Pick<PG.Pool, 'query'> & Partial<Pick<PG.Pool, 'end' | 'connect' | 'on'>>;

/** Options of {@link PostgresStore}. */
export interface PostgresStoreOptions {
  /** A `pg.Pool` (or anything with `query`); the store does not end it. */
  pool?: PgPoolLike;
  /**
   * A connection string; the store creates and owns a pool. Several servers (a primary and its
   * standbys, `spec/STORAGE.md` §4.6): a libpq-style multi-host URL
   * (`postgresql://u@a:5432,b:5432/db?target_session_attrs=read-write`) or a list of connection
   * strings. The store then opens its connections on the first server, in order, that accepts
   * writes (`SHOW transaction_read_only` is `off`, as libpq's `target_session_attrs=read-write`),
   * and moves on when that server stops answering or turns read-only, so it follows a promotion.
   */
  connectionString?: string | readonly string[];
  /** Schema holding the table (default: the search path). */
  schema?: string;
  /**
   * Client-side deadline of every store operation in ms, getting a connection included (default
   * 2000). Past it the operation fails with `STORE_UNAVAILABLE` (503 + `Retry-After`, the handler
   * never runs) and the connection is destroyed, never reused. Needs a `pg.Pool` (with `connect`);
   * with a bare `query` object only the wait is bounded.
   */
  timeoutMs?: number;
  /** Transactional mode: how long a duplicate waits for the first request's row lock before it
   * is answered 409 (`SET LOCAL lock_timeout`, default 2000 ms). */
  lockTimeoutMs?: number;
  /** Transactional mode: `SET LOCAL idle_in_transaction_session_timeout` (default 60000 ms), so a
   * hung handler cannot hold the row lock forever. */
  idleInTransactionTimeoutMs?: number;
  /** The deadline of one `purgeExpired` batch (up to `batch` rows deleted; default 30000 ms). */
  purgeTimeoutMs?: number;
  /** Called with errors of idle pool connections (e.g. a server restart); they never crash the
   * process: the pool drops the connection and opens a new one on demand. */
  onPoolError?: (err: Error) => void;
  /** Clock override for conformance runs only. */
  clock?: ClockOverride;
}

/** A checked-out pool connection (pg's `PoolClient`), with the internals read to check liveness. */
type Client = PG.PoolClient & {
  _ending?: boolean;
  _ended?: boolean;
  _queryable?: boolean;
  connection?: { stream?: { destroyed?: boolean; destroy?: () => void; resetAndDestroy?: () => void } };
};

/** Connections found dead (closed by the server while idle) before one is live. */
const ACQUIRE_ATTEMPTS = 3;

function dead(c: Client): boolean {
  return c._ending === true || c._ended === true || c._queryable === false || c.connection?.stream?.destroyed === true;
}

/** A timer promise for the remaining time to `deadline`. */
function timer(deadline: number): { promise: Promise<'timeout'>; clear: () => void } {
  let t: NodeJS.Timeout | undefined;
  const promise = new Promise<'timeout'>((resolve) => {
    t = setTimeout(() => resolve('timeout'), Math.max(0, deadline - Date.now()));
  });
  return { promise, clear: () => clearTimeout(t) };
}

/**
 * Whether a failed connection can go back to the pool: only after a plain SQL error answered by
 * the server (a SQLSTATE outside the connection, operator-intervention and internal classes).
 */
function reusable(e: unknown): boolean {
  const code = (e as { code?: unknown }).code;
  if (typeof code !== 'string' || !/^[0-9A-Z]{5}$/.test(code)) return false;
  // 25006: the server is read-only (a standby, or a demoted primary): another connection may find
  // the new primary (with several servers, see FailoverPool).
  return code !== '25006' && !['08', '57', '58', 'XX'].includes(code.slice(0, 2));
}

/**
 * The single-host URLs of a libpq-style multi-host URL (`postgresql://u@a:1,b:2/db?...`), in
 * order; any other string is returned alone. `target_session_attrs` is dropped: with several
 * servers the store always looks for the one that accepts writes (node-postgres does not know
 * the parameter).
 */
function splitHosts(url: string): string[] {
  const m = /^(postgres(?:ql)?:\/\/)([^@/?#]*@)?([^/?#]*)(.*)$/.exec(url);
  if (m === null || !m[3]?.includes(',')) return [url];
  const [, scheme, auth = '', hosts = '', rest = ''] = m;
  const tail = rest.replace(/([?&])target_session_attrs=[^&#]*&?/, '$1').replace(/[?&]$/, '');
  return hosts.split(',').filter(Boolean).map((h) => `${scheme}${auth}${h}${tail}`);
}

/**
 * A pool over several servers for a primary that may move (`connectionString` with several
 * hosts): one `pg.Pool` per server; connections come from the server that last proved writable,
 * and every new connection is checked (`SHOW transaction_read_only`) before its first use. When
 * that server refuses connections or is read-only, the next one is tried, in order. Statements
 * on a connection whose server died fail as before (503, the connection destroyed); the next
 * connection finds the new primary.
 */
class FailoverPool {
  readonly #pools: PG.Pool[];
  readonly #unchecked = new WeakSet<PG.PoolClient>();
  readonly #listeners: ((err: Error) => void)[] = [];
  readonly #names: string[];
  #current = 0;

  constructor(pg: typeof PG, urls: readonly string[]) {
    this.#names = urls.map((u) => u.replace(/\/\/[^@/]*@/, '//'));
    this.#pools = urls.map((connectionString) => {
      const p = new pg.Pool({ connectionString });
      p.on('connect', (c) => this.#unchecked.add(c));
      p.on('error', (err) => {
        for (const f of this.#listeners) f(err);
      });
      return p;
    });
  }

  on(event: 'error', f: (err: Error) => void): this {
    if (event === 'error') this.#listeners.push(f);
    return this;
  }

  async connect(): Promise<PG.PoolClient> {
    const n = this.#pools.length;
    const why: string[] = [];
    for (let i = 0; i < n; i++) {
      const at = (this.#current + i) % n;
      let c: PG.PoolClient;
      try {
        c = await (this.#pools[at] as PG.Pool).connect();
      } catch (e) {
        why.push(`${this.#names[at]}: ${(e as Error).message}`);
        continue;
      }
      if (this.#unchecked.has(c)) {
        try {
          const r = await c.query('SHOW transaction_read_only');
          if ((r.rows[0] as { transaction_read_only?: string } | undefined)?.transaction_read_only !== 'off') {
            c.release(new Error('read-only server'));
            why.push(`${this.#names[at]}: read-only (a standby)`);
            continue;
          }
        } catch (e) {
          c.release(e as Error);
          why.push(`${this.#names[at]}: ${(e as Error).message}`);
          continue;
        }
        this.#unchecked.delete(c);
      }
      this.#current = at;
      return c;
    }
    throw new StoreUnavailableError(`PostgreSQL: no server accepts writes (${why.join('; ')})`);
  }

  async query(sql: string, params?: unknown[]): Promise<PG.QueryResult> {
    const c = await this.connect();
    try {
      const r = await c.query(sql, params);
      c.release();
      return r;
    } catch (e) {
      c.release(reusable(e) ? undefined : (e as Error));
      throw e;
    }
  }

  async end(): Promise<void> {
    await Promise.all(this.#pools.map((p) => p.end()));
  }
}

function ms(name: string, v: number | undefined, d: number): number {
  if (v === undefined) return d;
  if (!Number.isFinite(v) || v <= 0) throw new RangeError(`${name} must be a positive number of ms, got ${v}`);
  return v;
}

function quoteIdent(s: string): string {
  return `"${s.replace(/"/g, '""')}"`;
}

/**
 * The authority: PostgreSQL via `pg`. Every primitive is one autocommit statement (Read
 * Committed) with times from `clock_timestamp()`; a claim that finds a row reads it in a new
 * statement. Never put the table in `UNLOGGED` mode.
 */
export class PostgresStore implements TransactionalStore {
  readonly kind = 'postgres';
  readonly #pool: PgPoolLike;
  readonly #owned: boolean;
  readonly #sql: ReturnType<typeof recipes>;
  readonly #table: string;
  readonly #schema: string | undefined;
  readonly #clock: ClockOverride | undefined;
  /** Deadline of one operation, ms. */
  /** The longest one call takes before failing by itself: `timeoutMs` (one deadline per call). */
  get callTimeoutMs(): number {
    return this.timeoutMs;
  }
  readonly timeoutMs: number;
  /** Transactional mode lock wait, ms. */
  readonly lockTimeoutMs: number;
  /** Transactional mode idle limit, ms. */
  readonly idleInTransactionTimeoutMs: number;
  /** The deadline of one `purgeExpired` batch, ms. */
  readonly purgeTimeoutMs: number;
  readonly #onPoolError: (err: Error) => void;

  constructor(options: PostgresStoreOptions) {
    if (options.pool) {
      this.#pool = options.pool;
      this.#owned = false;
    } else if (options.connectionString && options.connectionString.length > 0) {
      // eslint-disable-next-line @typescript-eslint/no-require-imports
      const pg = require('pg') as typeof PG;
      const urls = typeof options.connectionString === 'string' ? splitHosts(options.connectionString) : [...options.connectionString];
      this.#pool = urls.length === 1 ? new pg.Pool({ connectionString: urls[0] }) : (new FailoverPool(pg, urls) as unknown as PgPoolLike);
      this.#owned = true;
    } else {
      throw new TypeError('PostgresStore needs a pool or a connectionString');
    }
    this.#schema = options.schema;
    this.#table = options.schema ? `${quoteIdent(options.schema)}.idempo_record` : 'idempo_record';
    this.#sql = recipes(this.#table);
    this.#clock = options.clock;
    const d = (name: string): number => defaultOf<number>('postgres_store', name);
    this.timeoutMs = ms('timeoutMs', options.timeoutMs, d('timeoutMs'));
    this.lockTimeoutMs = ms('lockTimeoutMs', options.lockTimeoutMs, d('lockTimeoutMs'));
    this.idleInTransactionTimeoutMs = ms('idleInTransactionTimeoutMs', options.idleInTransactionTimeoutMs, d('idleInTransactionTimeoutMs'));
    this.purgeTimeoutMs = ms('purgeTimeoutMs', options.purgeTimeoutMs, d('purgeTimeoutMs'));
    this.#onPoolError = options.onPoolError ?? (() => undefined);
    // An idle connection the server closed (restart, terminated backend) makes the pool emit
    // 'error' after dropping it; without a listener Node would crash the process.
    if (typeof this.#pool.on === 'function') this.#pool.on('error', (err: Error) => this.#onPoolError(err));
  }

  /** The SQL recipes (for the transactional session). */
  get sql(): ReturnType<typeof recipes> {
    return this.#sql;
  }

  /** The clock override value, or null (the database clock). */
  nowOverride(): number | null {
    return this.#now();
  }

  /**
   * A live connection from the pool within `deadline` (unix ms). A connection the server closed
   * while it sat idle is dropped before any statement is sent; one that arrives after the
   * deadline is destroyed, never used.
   */
  async acquire(deadline: number): Promise<Client> {
    const pool = this.#pool;
    if (typeof pool.connect !== 'function') throw new TypeError('PostgresStore: this operation needs a pg.Pool (with connect)');
    for (let attempt = 0; attempt < ACQUIRE_ATTEMPTS; attempt++) {
      const pending = (pool.connect as () => Promise<Client>).call(pool);
      const t = timer(deadline);
      const got = await Promise.race([pending, t.promise]).finally(t.clear);
      if (got === 'timeout') {
        pending.then((late) => this.discard(late, new Error('connected after the deadline')), () => undefined);
        throw new StoreUnavailableError(`PostgreSQL did not give a connection within ${this.timeoutMs} ms`);
      }
      if (!dead(got)) {
        got.on('error', this.#clientError);
        return got;
      }
      this.discard(got, new Error('connection closed by the server while idle'));
    }
    throw new StoreUnavailableError(`PostgreSQL: ${ACQUIRE_ATTEMPTS} dead connections in a row`);
  }

  /** Errors of a checked-out connection (e.g. a restart between two statements of a transaction). */
  readonly #clientError = (err: Error): void => this.#onPoolError(err);

  /** Gives a connection back to the pool. */
  giveBack(c: Client): void {
    c.off('error', this.#clientError);
    c.release();
  }

  /** Destroys a connection: its socket is closed and the pool forgets it. */
  discard(c: Client, why: Error): void {
    c.off('error', this.#clientError);
    // The socket first: `release(err)` ends the client politely, which a frozen server never
    // answers. Reset rather than close it (RST, not FIN) where the socket can: the server then
    // finds the connection reset. (A statement its kernel already received is still delivered
    // to it first, so one sent just before a freeze may yet run: see the README's faults.)
    const stream = c.connection?.stream;
    if (typeof stream?.resetAndDestroy === 'function') stream.resetAndDestroy();
    else stream?.destroy?.();
    // A connection is destroyed at most once; the pool throws when released twice.
    try {
      c.release(why);
    } catch {
      /* already released */
    }
  }

  /**
   * Runs `f` on `c` within `deadline`; past it the connection is destroyed and
   * `STORE_UNAVAILABLE` thrown. The caller gives the connection back (or discards it) on success.
   */
  async guard<T>(c: Client, f: Promise<T>, deadline: number): Promise<T> {
    const t = timer(deadline);
    f.catch(() => undefined); // a late failure after the deadline is expected, not unhandled
    const r = await Promise.race([f, t.promise]).finally(t.clear);
    if (r === 'timeout') {
      this.discard(c, new Error('deadline exceeded'));
      throw new StoreUnavailableError(`PostgreSQL did not answer within ${this.timeoutMs} ms (connection discarded)`);
    }
    return r as T;
  }

  /**
   * Creates the table and index of `spec/STORAGE.md` §4.1 if missing (and the schema, if set), in
   * one transaction after the advisory lock of §4.1, so workers starting together against an
   * empty database wait for each other instead of failing. One simple-protocol query (the
   * statements run as one implicit transaction, also behind a transaction-mode pooler).
   */
  async createSchema(): Promise<void> {
    const ddl = [recipe('postgres_schema_lock')];
    if (this.#schema) ddl.push(`CREATE SCHEMA IF NOT EXISTS ${quoteIdent(this.#schema)};`);
    ddl.push(postgresSchema(this.#table));
    await this.#q(async () => {
      await this.#pool.query(ddl.join('\n'));
    });
  }

  #now(): number | null {
    return this.#clock ? this.#clock() : null;
  }

  async #q<T>(f: () => Promise<T>): Promise<T> {
    try {
      return await f();
    } catch (e) {
      if (e instanceof RangeError || e instanceof StoreUnavailableError) throw e;
      throw new StoreUnavailableError(`PostgreSQL error: ${(e as Error).message}`, { cause: e });
    }
  }

  /** One statement within the deadline, on a pool connection (see {@link PostgresStore.timeoutMs}). */
  async #rows<R>(sql: string, params: unknown[], timeoutMs = this.timeoutMs): Promise<{ rows: R[]; rowCount: number }> {
    const deadline = Date.now() + timeoutMs;
    if (typeof this.#pool.connect !== 'function') {
      // A bare `query` object: only the wait can be bounded.
      const q = this.#pool.query(sql, params);
      const t = timer(deadline);
      q.catch(() => undefined);
      const r = await Promise.race([q, t.promise]).finally(t.clear);
      if (r === 'timeout') throw new StoreUnavailableError(`PostgreSQL did not answer within ${timeoutMs} ms`);
      return { rows: r.rows as R[], rowCount: r.rowCount ?? 0 };
    }
    const c = await this.acquire(deadline);
    let r: PG.QueryResult;
    try {
      r = await this.guard(c, c.query(sql, params), deadline);
    } catch (e) {
      if (e instanceof StoreUnavailableError) throw e; // the guard discarded the connection
      if (reusable(e)) this.giveBack(c);
      else this.discard(c, e as Error);
      throw e;
    }
    this.giveBack(c);
    return { rows: r.rows as R[], rowCount: r.rowCount ?? 0 };
  }

  claim(scopeKey: Uint8Array, fingerprint: string, token: Uint8Array, leaseMs: number, ttlMs: number): Promise<ClaimResult> {
    checkKeyAndToken(scopeKey, token);
    return this.#q(async () => {
      // One statement claims or reads the live row (spec/STORAGE.md §4.3); no row: the
      // conflicting row was not in its snapshot, or vanished: claim again. Bounded: contention
      // past that is a store failure (503).
      for (let round = 0; round < CLAIM_ROUNDS; round++) {
        const r = await this.#rows<ClaimRow>(this.#sql.claim, [
          asBuffer(scopeKey),
          fingerprint,
          asBuffer(token),
          leaseMs,
          ttlMs,
          this.#now(),
        ]);
        const answer = claimAnswer(r.rows[0]);
        if (answer !== null) return answer;
      }
      throw new StoreUnavailableError(`claim contention: the row kept vanishing after ${CLAIM_ROUNDS} rounds`);
    });
  }

  get(scopeKey: Uint8Array): Promise<GetResult> {
    checkKeyAndToken(scopeKey);
    return this.#q(async () => {
      const r = await this.#rows<RecipeRow>(this.#sql.get, [asBuffer(scopeKey), this.#now()]);
      const row = r.rows[0] as RecipeRow;
      return { record: recordFromRow(row), nowMs: Number(row.now_ms) };
    });
  }

  takeover(scopeKey: Uint8Array, seenToken: Uint8Array, newToken: Uint8Array, leaseMs: number): Promise<number | null> {
    checkKeyAndToken(scopeKey, seenToken, newToken);
    return this.#q(async () => {
      const r = await this.#rows<{ generation: number }>(this.#sql.takeover, [
        asBuffer(scopeKey),
        asBuffer(seenToken),
        asBuffer(newToken),
        leaseMs,
        this.#now(),
      ]);
      return r.rows[0] ? Number(r.rows[0].generation) : null;
    });
  }

  markUnknown(scopeKey: Uint8Array, seenToken: Uint8Array, ttlMs: number): Promise<boolean> {
    checkKeyAndToken(scopeKey, seenToken);
    return this.#q(async () => {
      const r = await this.#rows(this.#sql.markUnknown, [asBuffer(scopeKey), asBuffer(seenToken), ttlMs, this.#now()]);
      return r.rowCount === 1;
    });
  }

  complete(scopeKey: Uint8Array, token: Uint8Array, response: Uint8Array, ttlMs: number): Promise<boolean> {
    checkKeyAndToken(scopeKey, token);
    return this.#q(async () => {
      const r = await this.#rows(this.#sql.complete, [
        asBuffer(scopeKey),
        asBuffer(token),
        asBuffer(response),
        ttlMs,
        this.#now(),
      ]);
      return r.rowCount === 1;
    });
  }

  /** Primitive 5 returning the completed row and the store's `now` (null when not applied). */
  completeRecord(scopeKey: Uint8Array, token: Uint8Array, response: Uint8Array, ttlMs: number): Promise<GetResult | null> {
    checkKeyAndToken(scopeKey, token);
    return this.#q(async () => {
      const r = await this.#rows<RecipeRow>(this.#sql.completeRecord, [
        asBuffer(scopeKey),
        asBuffer(token),
        asBuffer(response),
        ttlMs,
        this.#now(),
      ]);
      const row = r.rows[0];
      return row ? { record: recordFromRow(row), nowMs: Number(row.now_ms) } : null;
    });
  }

  release(scopeKey: Uint8Array, token: Uint8Array): Promise<boolean> {
    checkKeyAndToken(scopeKey, token);
    return this.#q(async () => (await this.#rows(this.#sql.release, [asBuffer(scopeKey), asBuffer(token)])).rowCount === 1);
  }

  renew(scopeKey: Uint8Array, token: Uint8Array, leaseMs: number): Promise<boolean> {
    checkKeyAndToken(scopeKey, token);
    return this.#q(async () => {
      const r = await this.#rows(this.#sql.renew, [asBuffer(scopeKey), asBuffer(token), leaseMs, this.#now()]);
      return r.rowCount === 1;
    });
  }

  purgeExpired(options: PurgeOptions = {}): Promise<PurgeCounts> {
    return this.#q(async () => {
      const r = await this.#rows<{ in_progress: string; completed: string; outcome_unknown: string }>(
        this.#sql.purge,
        [options.batch ?? defaultOf<number>('purge', 'batch'), this.#now()],
        this.purgeTimeoutMs,
      );
      const c = r.rows[0];
      return {
        inProgress: Number(c?.in_progress ?? 0),
        completed: Number(c?.completed ?? 0),
        outcomeUnknown: Number(c?.outcome_unknown ?? 0),
      };
    });
  }

  /**
   * The table's figures for metrics (`spec/STORAGE.md` §4.7): records by state, expired records
   * and the purge lag, size in bytes. Reads the whole table.
   */
  stats(): Promise<StoreStats> {
    return this.#q(async () => {
      const r = await this.#rows<Record<string, unknown>>(this.#sql.stats, [this.#now()]);
      return statsFromRow(r.rows[0] ?? {});
    });
  }

  /** A transactional session for one request (see {@link PostgresTransaction}). */
  transaction(): PostgresTransaction {
    return new PostgresTransaction(this);
  }

  async close(): Promise<void> {
    if (this.#owned && this.#pool.end) await this.#pool.end();
  }
}

/**
 * One request's transactional session on a {@link PostgresStore} (`store.transaction()`,
 * `spec/STORAGE.md` §4.4): the primitives run on one dedicated connection inside one transaction.
 * `claim` opens it (`BEGIN; SET LOCAL lock_timeout; SET LOCAL
 * idle_in_transaction_session_timeout`), the later primitives (`complete` included) write inside it,
 * `commit()` runs `COMMIT` when core asks for it (`spec/PROTOCOL.md` §7.6), `release` rolls back. A claim that waits on a duplicate's row lock past `lockTimeoutMs` (SQLSTATE 55P03) reports
 * an in-flight record (409). Every statement keeps the store's deadline.
 */
export class PostgresTransaction implements TransactionSession {
  readonly kind = 'postgres';
  readonly store: PostgresStore;
  #client: Client | null = null;
  #committed = false;

  constructor(store: PostgresStore) {
    this.store = store;
  }

  /** The `pg` client with the transaction open (null outside it). */
  get tx(): PG.PoolClient | null {
    return this.#client;
  }

  get committed(): boolean {
    return this.#committed;
  }

  async #begin(): Promise<void> {
    const s = this.store;
    const deadline = Date.now() + s.timeoutMs;
    const c = await s.acquire(deadline);
    this.#client = c;
    await this.#call(
      `BEGIN; SET LOCAL lock_timeout = '${Math.ceil(s.lockTimeoutMs)}ms'; ` +
        `SET LOCAL idle_in_transaction_session_timeout = '${Math.ceil(s.idleInTransactionTimeoutMs)}ms'`,
      undefined,
      s.timeoutMs,
    );
  }

  /** One statement in the transaction; any failure ends it (rolled back, or the connection destroyed). */
  async #call<R>(sql: string, params: unknown[] | undefined, timeoutMs: number): Promise<{ rows: R[]; rowCount: number }> {
    const c = this.#client;
    if (c === null) throw new StoreUnavailableError('the transaction is not open');
    try {
      const r = await this.store.guard(c, params === undefined ? c.query(sql) : c.query(sql, params), Date.now() + timeoutMs);
      const last = Array.isArray(r) ? r[r.length - 1] : r;
      return { rows: (last?.rows ?? []) as R[], rowCount: last?.rowCount ?? 0 };
    } catch (e) {
      if (e instanceof StoreUnavailableError) {
        this.#client = null; // the guard destroyed the connection: the server rolls back
      } else {
        await this.#end(false, !reusable(e));
      }
      throw e;
    }
  }

  async #end(commit: boolean, discard = false): Promise<void> {
    const c = this.#client;
    if (c === null) return;
    if (discard) {
      this.#client = null;
      this.store.discard(c, new Error('transaction aborted'));
      return;
    }
    try {
      await this.store.guard(c, c.query(commit ? 'COMMIT' : 'ROLLBACK'), Date.now() + this.store.timeoutMs);
      if (commit) this.#committed = true;
    } catch (e) {
      this.#client = null;
      if (!(e instanceof StoreUnavailableError)) this.store.discard(c, e as Error);
      throw e;
    }
    this.#client = null;
    this.store.giveBack(c);
  }

  #q<T>(f: () => Promise<T>): Promise<T> {
    return f().catch((e: unknown) => {
      if (e instanceof RangeError || e instanceof StoreUnavailableError) throw e;
      throw new StoreUnavailableError(`PostgreSQL error: ${(e as Error).message}`, { cause: e });
    });
  }

  /** `BEGIN` (first call), then primitive 1 inside the transaction. */
  claim(scopeKey: Uint8Array, fingerprint: string, token: Uint8Array, leaseMs: number, ttlMs: number): Promise<ClaimResult> {
    checkKeyAndToken(scopeKey, token);
    return this.#q(async () => {
      const s = this.store;
      if (this.#client === null) await this.#begin();
      for (let round = 0; round < CLAIM_ROUNDS; round++) {
        let r: { rows: ClaimRow[]; rowCount: number };
        try {
          r = await this.#call<ClaimRow>(
            s.sql.claim,
            [asBuffer(scopeKey), fingerprint, asBuffer(token), leaseMs, ttlMs, s.nowOverride()],
            s.timeoutMs + s.lockTimeoutMs,
          );
        } catch (e) {
          if ((e as { code?: unknown }).code === '55P03') {
            // lock_timeout: a duplicate's transaction holds the row (the transaction already ended).
            return { claimed: false, locked: true, nowMs: s.nowOverride() ?? Date.now() };
          }
          throw e;
        }
        const answer = claimAnswer(r.rows[0]);
        if (answer !== null) return answer;
      }
      throw new StoreUnavailableError(`claim contention: the row kept vanishing after ${CLAIM_ROUNDS} rounds`);
    });
  }

  /** Primitive 2 (inside the transaction while it is open). */
  get(scopeKey: Uint8Array): Promise<GetResult> {
    if (this.#client === null) return this.store.get(scopeKey);
    checkKeyAndToken(scopeKey);
    return this.#q(async () => {
      const r = await this.#call<RecipeRow>(this.store.sql.get, [asBuffer(scopeKey), this.store.nowOverride()], this.store.timeoutMs);
      const row = r.rows[0] as RecipeRow;
      return { record: recordFromRow(row), nowMs: Number(row.now_ms) };
    });
  }

  /** Primitive 3 inside the transaction. */
  takeover(scopeKey: Uint8Array, seenToken: Uint8Array, newToken: Uint8Array, leaseMs: number): Promise<number | null> {
    if (this.#client === null) return Promise.reject(new StoreUnavailableError('no open transaction (it ended or never began)'));
    checkKeyAndToken(scopeKey, seenToken, newToken);
    return this.#q(async () => {
      const r = await this.#call<{ generation: number }>(
        this.store.sql.takeover,
        [asBuffer(scopeKey), asBuffer(seenToken), asBuffer(newToken), leaseMs, this.store.nowOverride()],
        this.store.timeoutMs,
      );
      return r.rows[0] ? Number(r.rows[0].generation) : null;
    });
  }

  /** Primitive 4 inside the transaction. */
  markUnknown(scopeKey: Uint8Array, seenToken: Uint8Array, ttlMs: number): Promise<boolean> {
    if (this.#client === null) return Promise.reject(new StoreUnavailableError('no open transaction (it ended or never began)'));
    checkKeyAndToken(scopeKey, seenToken);
    return this.#q(async () => {
      const r = await this.#call(this.store.sql.markUnknown, [asBuffer(scopeKey), asBuffer(seenToken), ttlMs, this.store.nowOverride()], this.store.timeoutMs);
      return r.rowCount === 1;
    });
  }

  /** Primitive 5 inside the transaction (the `COMMIT` is core's separate `commit`). */
  complete(scopeKey: Uint8Array, token: Uint8Array, response: Uint8Array, ttlMs: number): Promise<boolean> {
    if (this.#client === null) return Promise.reject(new StoreUnavailableError('no open transaction (it ended or never began)'));
    checkKeyAndToken(scopeKey, token);
    return this.#q(async () => {
      const r = await this.#call(
        this.store.sql.complete,
        [asBuffer(scopeKey), asBuffer(token), asBuffer(response), ttlMs, this.store.nowOverride()],
        this.store.timeoutMs,
      );
      return r.rowCount === 1;
    });
  }

  /** `ROLLBACK`: the claim and the handler's writes vanish together (false, and nothing deleted,
   * without an open transaction). */
  release(scopeKey: Uint8Array, token: Uint8Array): Promise<boolean> {
    if (this.#client === null) return Promise.resolve(false);
    checkKeyAndToken(scopeKey, token);
    return this.#q(async () => {
      await this.#end(false);
      return true;
    });
  }

  /** Primitive 7 inside the transaction. */
  renew(scopeKey: Uint8Array, token: Uint8Array, leaseMs: number): Promise<boolean> {
    if (this.#client === null) return Promise.reject(new StoreUnavailableError('no open transaction (it ended or never began)'));
    checkKeyAndToken(scopeKey, token);
    return this.#q(async () => {
      const r = await this.#call(this.store.sql.renew, [asBuffer(scopeKey), asBuffer(token), leaseMs, this.store.nowOverride()], this.store.timeoutMs);
      return r.rowCount === 1;
    });
  }

  purgeExpired(options?: PurgeOptions): Promise<PurgeCounts> {
    return this.store.purgeExpired(options);
  }

  /** `COMMIT` (core's `commit`); a failure, or no open transaction, rejects (fails closed). */
  commit(): Promise<void> {
    if (this.#client === null) return Promise.reject(new StoreUnavailableError('no open transaction (it ended or never began)'));
    return this.#q(() => this.#end(true));
  }

  /** Rolls back what is still open and gives the connection back. */
  async close(): Promise<void> {
    try {
      await this.#end(false);
    } catch {
      // #end destroyed the connection: the server rolls back on its own.
    }
  }
}
