import type * as PG from 'pg';
import { StoreUnavailableError } from '../errors';
import type { ClaimResult, ClockOverride, GetResult, IdempotencyStore, PurgeCounts, PurgeOptions, StoreRecord } from './types';
import { asBuffer, checkKeyAndToken } from './types';

/** The PostgreSQL schema of `spec/STORAGE.md` §4.1 (for `schema`-qualified tables see `postgresSchema`). */
export function postgresSchema(table = 'idempo_record', index = 'idempo_record_expires_at'): string {
  return `CREATE TABLE IF NOT EXISTS ${table} (
  scope_key   bytea    PRIMARY KEY CHECK (octet_length(scope_key) = 32),
  fingerprint text     NOT NULL,
  state       smallint NOT NULL CHECK (state IN (1, 2, 3)),
  token       bytea    NOT NULL CHECK (octet_length(token) = 16),
  generation  integer  NOT NULL CHECK (generation >= 1),
  lease_until bigint,
  expires_at  bigint   NOT NULL,
  response    bytea
);
CREATE INDEX IF NOT EXISTS ${index} ON ${table} (expires_at);`;
}

/** The DDL of `spec/STORAGE.md` §4.1, verbatim names. */
export const POSTGRES_SCHEMA = postgresSchema();

/** Claim/read rounds before a contention error. */
const CLAIM_ROUNDS = 3;

const CLOCK = `(extract(epoch FROM clock_timestamp()) * 1000)::bigint`;

function recipes(t: string) {
  return {
    claim: `
WITH c AS (SELECT coalesce($6::bigint, ${CLOCK}) AS now)
INSERT INTO ${t} AS r
       (scope_key, fingerprint, state, token, generation, lease_until, expires_at, response)
SELECT $1::bytea, $2::text, 1, $3::bytea, 1, c.now + $4::bigint, c.now + greatest($5::bigint, $4::bigint), NULL FROM c
ON CONFLICT (scope_key) DO UPDATE
   SET fingerprint = EXCLUDED.fingerprint, state = 1, token = EXCLUDED.token,
       generation = least(r.generation + 1, 2147483647),
       lease_until = EXCLUDED.lease_until, expires_at = EXCLUDED.expires_at, response = NULL
 WHERE r.expires_at <= EXCLUDED.lease_until - $4::bigint
RETURNING r.generation, r.lease_until - $4::bigint AS now_ms`,
    get: `
SELECT fingerprint, state, token, generation, lease_until, expires_at, response,
       coalesce($2::bigint, ${CLOCK}) AS now_ms
  FROM (SELECT 1) AS one LEFT JOIN ${t} ON scope_key = $1::bytea`,
    takeover: `
WITH c AS (SELECT coalesce($5::bigint, ${CLOCK}) AS now)
UPDATE ${t} SET token = $3::bytea, lease_until = c.now + $4::bigint,
       expires_at = greatest(expires_at, c.now + $4::bigint)
  FROM c
 WHERE scope_key = $1::bytea AND state = 1 AND token = $2::bytea AND lease_until <= c.now
RETURNING generation`,
    markUnknown: `
WITH c AS (SELECT coalesce($4::bigint, ${CLOCK}) AS now)
UPDATE ${t} SET state = 3, lease_until = NULL, expires_at = c.now + $3::bigint
  FROM c
 WHERE scope_key = $1::bytea AND state = 1 AND token = $2::bytea AND lease_until <= c.now`,
    complete: `
WITH c AS (SELECT coalesce($5::bigint, ${CLOCK}) AS now)
UPDATE ${t} SET state = 2, response = $3::bytea, lease_until = NULL, expires_at = c.now + $4::bigint
  FROM c
 WHERE scope_key = $1::bytea AND state = 1 AND token = $2::bytea`,
    completeRecord: `
WITH c AS (SELECT coalesce($5::bigint, ${CLOCK}) AS now)
UPDATE ${t} SET state = 2, response = $3::bytea, lease_until = NULL, expires_at = c.now + $4::bigint
  FROM c
 WHERE scope_key = $1::bytea AND state = 1 AND token = $2::bytea
RETURNING fingerprint, state, token, generation, lease_until, expires_at, response, c.now AS now_ms`,
    release: `DELETE FROM ${t} WHERE scope_key = $1::bytea AND state = 1 AND token = $2::bytea`,
    renew: `
WITH c AS (SELECT coalesce($4::bigint, ${CLOCK}) AS now)
UPDATE ${t} SET lease_until = c.now + $3::bigint, expires_at = greatest(expires_at, c.now + $3::bigint)
  FROM c
 WHERE scope_key = $1::bytea AND state = 1 AND token = $2::bytea`,
    purge: `
WITH c AS (SELECT coalesce($2::bigint, ${CLOCK}) AS now),
     doomed AS (
       SELECT scope_key FROM ${t}, c WHERE expires_at <= c.now
        ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED),
     gone AS (DELETE FROM ${t} r USING doomed WHERE r.scope_key = doomed.scope_key
              RETURNING r.state)
SELECT count(*) FILTER (WHERE state = 1) AS in_progress,
       count(*) FILTER (WHERE state = 2) AS completed,
       count(*) FILTER (WHERE state = 3) AS outcome_unknown
  FROM gone`,
  };
}

/** Options of {@link PostgresStore}. */
export interface PostgresStoreOptions {
  /** A `pg.Pool` (or anything with `query`); the store does not end it. */
  pool?: Pick<PG.Pool, 'query'> & Partial<Pick<PG.Pool, 'end'>>;
  /** A connection string; the store creates and owns a pool. */
  connectionString?: string;
  /** Schema holding the table (default: the search path). */
  schema?: string;
  /** Clock override for conformance runs only. */
  clock?: ClockOverride;
}

interface PgRow {
  fingerprint: string | null;
  state: number | null;
  token: Buffer | null;
  generation: number | null;
  lease_until: string | null;
  expires_at: string | null;
  response: Buffer | null;
  now_ms: string;
}

function toRecord(r: PgRow): StoreRecord | null {
  if (r.fingerprint === null) return null;
  return {
    fingerprint: r.fingerprint,
    state: Number(r.state) as 1 | 2 | 3,
    token: r.token as Buffer,
    generation: Number(r.generation),
    leaseUntil: r.lease_until === null ? null : Number(r.lease_until),
    expiresAt: Number(r.expires_at),
    response: r.response,
  };
}

function quoteIdent(s: string): string {
  return `"${s.replace(/"/g, '""')}"`;
}

/**
 * The authority: PostgreSQL via `pg`. Every primitive is one autocommit statement (Read
 * Committed) with times from `clock_timestamp()`; a claim that finds a row reads it in a new
 * statement. Never put the table in `UNLOGGED` mode.
 */
export class PostgresStore implements IdempotencyStore {
  readonly kind = 'postgres';
  readonly #pool: Pick<PG.Pool, 'query'> & Partial<Pick<PG.Pool, 'end'>>;
  readonly #owned: boolean;
  readonly #sql: ReturnType<typeof recipes>;
  readonly #table: string;
  readonly #schema: string | undefined;
  readonly #clock: ClockOverride | undefined;

  constructor(options: PostgresStoreOptions) {
    if (options.pool) {
      this.#pool = options.pool;
      this.#owned = false;
    } else if (options.connectionString) {
      // eslint-disable-next-line @typescript-eslint/no-require-imports
      const pg = require('pg') as typeof PG;
      this.#pool = new pg.Pool({ connectionString: options.connectionString });
      this.#owned = true;
    } else {
      throw new TypeError('PostgresStore needs a pool or a connectionString');
    }
    this.#schema = options.schema;
    this.#table = options.schema ? `${quoteIdent(options.schema)}.idempo_record` : 'idempo_record';
    this.#sql = recipes(this.#table);
    this.#clock = options.clock;
  }

  /** Creates the table and index of `spec/STORAGE.md` §4.1 if missing (and the schema, if set). */
  async createSchema(): Promise<void> {
    await this.#q(async () => {
      if (this.#schema) await this.#pool.query(`CREATE SCHEMA IF NOT EXISTS ${quoteIdent(this.#schema)}`);
      await this.#pool.query(postgresSchema(this.#table));
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

  async #rows<R>(sql: string, params: unknown[]): Promise<{ rows: R[]; rowCount: number }> {
    const r = await this.#pool.query(sql, params);
    return { rows: r.rows as R[], rowCount: r.rowCount ?? 0 };
  }

  claim(scopeKey: Uint8Array, fingerprint: string, token: Uint8Array, leaseMs: number, ttlMs: number): Promise<ClaimResult> {
    checkKeyAndToken(scopeKey, token);
    return this.#q(async () => {
      // Claim, then read the live row in a new statement; if it vanished in between (released
      // or purged), claim again. Bounded: contention past that is a store failure (503).
      for (let round = 0; round < CLAIM_ROUNDS; round++) {
        const ins = await this.#rows<{ generation: number; now_ms: string }>(this.#sql.claim, [
          asBuffer(scopeKey),
          fingerprint,
          asBuffer(token),
          leaseMs,
          ttlMs,
          this.#now(),
        ]);
        const first = ins.rows[0];
        if (first) return { claimed: true as const, generation: Number(first.generation), nowMs: Number(first.now_ms) };
        const got = await this.#rows<PgRow>(this.#sql.get, [asBuffer(scopeKey), this.#now()]);
        const row = got.rows[0] as PgRow;
        const record = toRecord(row);
        if (record !== null) return { claimed: false as const, record, nowMs: Number(row.now_ms) };
      }
      throw new StoreUnavailableError(`claim contention: the row kept vanishing after ${CLAIM_ROUNDS} rounds`);
    });
  }

  get(scopeKey: Uint8Array): Promise<GetResult> {
    checkKeyAndToken(scopeKey);
    return this.#q(async () => {
      const r = await this.#rows<PgRow>(this.#sql.get, [asBuffer(scopeKey), this.#now()]);
      const row = r.rows[0] as PgRow;
      return { record: toRecord(row), nowMs: Number(row.now_ms) };
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
      const r = await this.#rows<PgRow>(this.#sql.completeRecord, [
        asBuffer(scopeKey),
        asBuffer(token),
        asBuffer(response),
        ttlMs,
        this.#now(),
      ]);
      const row = r.rows[0];
      return row ? { record: toRecord(row), nowMs: Number(row.now_ms) } : null;
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
      const r = await this.#rows<{ in_progress: string; completed: string; outcome_unknown: string }>(this.#sql.purge, [
        options.batch ?? 1000,
        this.#now(),
      ]);
      const c = r.rows[0];
      return {
        inProgress: Number(c?.in_progress ?? 0),
        completed: Number(c?.completed ?? 0),
        outcomeUnknown: Number(c?.outcome_unknown ?? 0),
      };
    });
  }

  async close(): Promise<void> {
    if (this.#owned && this.#pool.end) await this.#pool.end();
  }
}
