import type BetterSqlite3 from 'better-sqlite3';
import { StoreUnavailableError } from '../errors';
import type { ClaimResult, ClockOverride, GetResult, IdempotencyStore, PurgeCounts, PurgeOptions, StoreRecord } from './types';
import { asBuffer, checkKeyAndToken } from './types';

/** The SQLite schema of `spec/STORAGE.md` §7 (§4.1 with SQLite types, `WITHOUT ROWID`). */
export const SQLITE_SCHEMA = `
CREATE TABLE IF NOT EXISTS idempo_record (
  scope_key   BLOB    PRIMARY KEY CHECK (length(scope_key) = 32),
  fingerprint TEXT    NOT NULL,
  state       INTEGER NOT NULL CHECK (state IN (1, 2, 3)),
  token       BLOB    NOT NULL CHECK (length(token) = 16),
  generation  INTEGER NOT NULL CHECK (generation >= 1),
  lease_until INTEGER,
  expires_at  INTEGER NOT NULL,
  response    BLOB
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idempo_record_expires_at ON idempo_record (expires_at);
`;

const CLOCK = `coalesce(@now, CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER))`;

const SQL = {
  claim: `
INSERT INTO idempo_record AS r
       (scope_key, fingerprint, state, token, generation, lease_until, expires_at, response)
VALUES (@scope, @fp, 1, @token, 1, ${CLOCK} + @lease, ${CLOCK} + max(@ttl, @lease), NULL)
ON CONFLICT (scope_key) DO UPDATE
   SET fingerprint = excluded.fingerprint, state = 1, token = excluded.token,
       generation = min(r.generation + 1, 2147483647),
       lease_until = excluded.lease_until, expires_at = excluded.expires_at, response = NULL
 WHERE r.expires_at <= excluded.lease_until - @lease
RETURNING generation, lease_until - @lease AS now_ms`,
  get: `
SELECT fingerprint, state, token, generation, lease_until, expires_at, response, ${CLOCK} AS now_ms
  FROM (SELECT 1) AS one LEFT JOIN idempo_record ON scope_key = @scope`,
  takeover: `
UPDATE idempo_record SET token = @new, lease_until = ${CLOCK} + @lease,
       expires_at = max(expires_at, ${CLOCK} + @lease)
 WHERE scope_key = @scope AND state = 1 AND token = @seen AND lease_until <= ${CLOCK}
RETURNING generation`,
  markUnknown: `
UPDATE idempo_record SET state = 3, lease_until = NULL, expires_at = ${CLOCK} + @ttl
 WHERE scope_key = @scope AND state = 1 AND token = @seen AND lease_until <= ${CLOCK}`,
  complete: `
UPDATE idempo_record SET state = 2, response = @response, lease_until = NULL, expires_at = ${CLOCK} + @ttl
 WHERE scope_key = @scope AND state = 1 AND token = @token`,
  release: `DELETE FROM idempo_record WHERE scope_key = @scope AND state = 1 AND token = @token`,
  renew: `
UPDATE idempo_record SET lease_until = ${CLOCK} + @lease, expires_at = max(expires_at, ${CLOCK} + @lease)
 WHERE scope_key = @scope AND state = 1 AND token = @token`,
  purge: `
DELETE FROM idempo_record WHERE scope_key IN (
  SELECT scope_key FROM idempo_record WHERE expires_at <= ${CLOCK} ORDER BY expires_at LIMIT @batch)
RETURNING state`,
} as const;

/** Options of {@link SqliteStore}. */
export interface SqliteStoreOptions {
  /** Database file (default `idempo.sqlite3`); ignored when `database` is given. */
  filename?: string;
  /** An open better-sqlite3 database to use (the store then does not close it). */
  database?: BetterSqlite3.Database;
  /** `busy_timeout` in ms (default 5000). */
  busyTimeoutMs?: number;
  /** Create the table and index if missing (default true). */
  createSchema?: boolean;
  /** Clock override for conformance runs only. */
  clock?: ClockOverride;
}

interface Row {
  fingerprint: string | null;
  state: number | null;
  token: Buffer | null;
  generation: number | null;
  lease_until: number | null;
  expires_at: number | null;
  response: Buffer | null;
  now_ms: number;
}

function toRecord(r: Row): StoreRecord | null {
  if (r.fingerprint === null) return null;
  return {
    fingerprint: r.fingerprint,
    state: r.state as 1 | 2 | 3,
    token: r.token as Buffer,
    generation: r.generation as number,
    leaseUntil: r.lease_until,
    expiresAt: r.expires_at as number,
    response: r.response,
  };
}

type Statements = { [K in keyof typeof SQL]: BetterSqlite3.Statement };

/**
 * The embedded default store (better-sqlite3): WAL, `synchronous=FULL`, `busy_timeout`, every
 * primitive in `BEGIN IMMEDIATE`, times from SQLite's clock (`julianday('now')`). One host only.
 */
export class SqliteStore implements IdempotencyStore {
  readonly kind = 'sqlite';
  readonly db: BetterSqlite3.Database;
  readonly #owned: boolean;
  readonly #stmts: Statements;
  readonly #clock: ClockOverride | undefined;
  readonly #tx: {
    claim: (p: Record<string, unknown>) => ClaimResult;
    purge: (p: Record<string, unknown>) => PurgeCounts;
  };

  constructor(options: SqliteStoreOptions = {}) {
    if (options.database) {
      this.db = options.database;
      this.#owned = false;
    } else {
      // Loaded lazily so the package works without better-sqlite3 when another store is used.
      // eslint-disable-next-line @typescript-eslint/no-require-imports
      const Database = require('better-sqlite3') as typeof BetterSqlite3;
      this.db = new Database(options.filename ?? 'idempo.sqlite3');
      this.#owned = true;
    }
    this.db.pragma('journal_mode = WAL');
    this.db.pragma('synchronous = FULL');
    this.db.pragma(`busy_timeout = ${Math.max(0, Math.floor(options.busyTimeoutMs ?? 5000))}`);
    const version = (this.db.prepare('SELECT sqlite_version() AS v').get() as { v: string }).v;
    const [maj, min] = version.split('.').map(Number);
    if ((maj ?? 0) < 3 || ((maj ?? 0) === 3 && (min ?? 0) < 35)) {
      throw new StoreUnavailableError(`SQLite ${version} lacks RETURNING (3.35.0 or later is required)`);
    }
    if (options.createSchema !== false) this.db.exec(SQLITE_SCHEMA);
    this.#clock = options.clock;
    const stmts = {} as Record<string, BetterSqlite3.Statement>;
    for (const [k, sql] of Object.entries(SQL)) stmts[k] = this.db.prepare(sql);
    this.#stmts = stmts as Statements;
    this.#stmts.get.safeIntegers(false);
    const claim = this.db.transaction((p: Record<string, unknown>): ClaimResult => {
      const ins = this.#stmts.claim.get(p) as { generation: number; now_ms: number } | undefined;
      if (ins) return { claimed: true, generation: ins.generation, nowMs: ins.now_ms };
      const row = this.#stmts.get.get(p) as Row;
      const record = toRecord(row);
      if (record === null) throw new StoreUnavailableError('claim conflicted but no row is visible');
      return { claimed: false, record, nowMs: row.now_ms };
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
  }

  #now(): number | null {
    return this.#clock ? this.#clock() : null;
  }

  /** Runs one write statement in `BEGIN IMMEDIATE`; returns the changed row count. */
  #write(stmt: BetterSqlite3.Statement, p: Record<string, unknown>): number {
    return this.db.transaction(() => stmt.run(p).changes).immediate();
  }

  #wrap<T>(f: () => T): Promise<T> {
    try {
      return Promise.resolve(f());
    } catch (e) {
      if (e instanceof RangeError || e instanceof StoreUnavailableError) return Promise.reject(e);
      return Promise.reject(new StoreUnavailableError(`SQLite error: ${(e as Error).message}`, { cause: e }));
    }
  }

  claim(scopeKey: Uint8Array, fingerprint: string, token: Uint8Array, leaseMs: number, ttlMs: number): Promise<ClaimResult> {
    return this.#wrap(() => {
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

  get(scopeKey: Uint8Array): Promise<GetResult> {
    return this.#wrap(() => {
      checkKeyAndToken(scopeKey);
      const row = this.#stmts.get.get({ scope: asBuffer(scopeKey), now: this.#now() }) as Row;
      return { record: toRecord(row), nowMs: row.now_ms };
    });
  }

  takeover(scopeKey: Uint8Array, seenToken: Uint8Array, newToken: Uint8Array, leaseMs: number): Promise<number | null> {
    return this.#wrap(() => {
      checkKeyAndToken(scopeKey, seenToken, newToken);
      const p = { scope: asBuffer(scopeKey), seen: asBuffer(seenToken), new: asBuffer(newToken), lease: leaseMs, now: this.#now() };
      const r = this.db.transaction(() => this.#stmts.takeover.get(p) as { generation: number } | undefined).immediate();
      return r ? r.generation : null;
    });
  }

  markUnknown(scopeKey: Uint8Array, seenToken: Uint8Array, ttlMs: number): Promise<boolean> {
    return this.#wrap(() => {
      checkKeyAndToken(scopeKey, seenToken);
      return this.#write(this.#stmts.markUnknown, { scope: asBuffer(scopeKey), seen: asBuffer(seenToken), ttl: ttlMs, now: this.#now() }) === 1;
    });
  }

  complete(scopeKey: Uint8Array, token: Uint8Array, response: Uint8Array, ttlMs: number): Promise<boolean> {
    return this.#wrap(() => {
      checkKeyAndToken(scopeKey, token);
      return (
        this.#write(this.#stmts.complete, { scope: asBuffer(scopeKey), token: asBuffer(token), response: asBuffer(response), ttl: ttlMs, now: this.#now() }) === 1
      );
    });
  }

  release(scopeKey: Uint8Array, token: Uint8Array): Promise<boolean> {
    return this.#wrap(() => {
      checkKeyAndToken(scopeKey, token);
      return this.#write(this.#stmts.release, { scope: asBuffer(scopeKey), token: asBuffer(token) }) === 1;
    });
  }

  renew(scopeKey: Uint8Array, token: Uint8Array, leaseMs: number): Promise<boolean> {
    return this.#wrap(() => {
      checkKeyAndToken(scopeKey, token);
      return this.#write(this.#stmts.renew, { scope: asBuffer(scopeKey), token: asBuffer(token), lease: leaseMs, now: this.#now() }) === 1;
    });
  }

  purgeExpired(options: PurgeOptions = {}): Promise<PurgeCounts> {
    return this.#wrap(() => this.#tx.purge({ batch: options.batch ?? 1000, now: this.#now() }));
  }

  close(): Promise<void> {
    if (this.#owned && this.db.open) this.db.close();
    return Promise.resolve();
  }
}
