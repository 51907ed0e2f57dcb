//! The store recipes of `spec/STORAGE.md`: SQL for PostgreSQL and SQLite, Lua for Redis.
//!
//! Pure data, written once here and read by every binding (Python through
//! `idempo._idempo.recipes()`, Node through the native `recipes()`), so the stores of different
//! languages that share one table or one Redis run the very same statements. Each item names the
//! section of `spec/STORAGE.md` it implements and its parameters in order.
//!
//! Conventions:
//!
//! - PostgreSQL texts use positional parameters `$1…$n` with explicit casts (`$4::bigint`), so
//!   drivers that send untyped parameters (node-postgres) and typed ones (psycopg) get the same
//!   plan. The table is `idempo_record`; a host that puts it in another schema replaces the whole
//!   word `idempo_record` (never the index name `idempo_record_expires_at`): [`rename_table`]
//!   ([`rename_table_and_index`] renames the index too).
//! - SQLite texts use named parameters `:name` (accepted by Python's `sqlite3` and by
//!   better-sqlite3); `:now` is the clock override and `NULL` in production.
//! - Redis scripts are [`REDIS_PRELUDE`] followed by a body; `KEYS[1]` is the record key and the
//!   last `ARGV` is the clock override (`''` in production, `spec/STORAGE.md` §6).
//!
//! The test module checks that every recipe the spec prints appears there verbatim, up to white
//! space, parameter casts and `IF NOT EXISTS`, so the spec and this module cannot drift apart.

/// The PostgreSQL clock in unix milliseconds (`spec/STORAGE.md` §4.2).
macro_rules! pg_clock {
    () => {
        "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
    };
}

/// The SQLite clock in unix milliseconds, overridden by `:now` (`spec/STORAGE.md` §7, §6).
macro_rules! sqlite_clock {
    () => {
        "coalesce(:now, CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER))"
    };
}

/// The Lua prelude every Redis script starts with (`spec/STORAGE.md` §5.2).
macro_rules! lua_prelude {
    () => {
        "local function clock()
  local o = ARGV[#ARGV]
  if o ~= '' then return tonumber(o) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function int(n) return string.format('%d', n) end
"
    };
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL (spec/STORAGE.md §4)
// ---------------------------------------------------------------------------------------------

/// §4.2: the PostgreSQL clock expression (unix ms, once per statement); no parameters.
pub const POSTGRES_NOW: &str = pg_clock!();

/// §4.1: the table and its expiry index (idempotent DDL, two statements separated by `;`); no
/// parameters.
pub const POSTGRES_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS idempo_record (
  scope_key   bytea    PRIMARY KEY CHECK (octet_length(scope_key) = 32),
  fingerprint text     NOT NULL,
  state       smallint NOT NULL CHECK (state IN (1, 2, 3)),
  token       bytea    NOT NULL CHECK (octet_length(token) = 16),
  generation  integer  NOT NULL CHECK (generation >= 1),
  lease_until bigint,
  expires_at  bigint   NOT NULL,
  response    bytea
);
CREATE INDEX IF NOT EXISTS idempo_record_expires_at ON idempo_record (expires_at);";

/// §4.1: the first statement of the transaction that creates the schema: a transaction-scoped
/// advisory lock, so hosts starting together run the DDL one after another (two concurrent
/// `CREATE TABLE IF NOT EXISTS` can both miss the table and one fails with a unique violation on
/// `pg_type`); no parameters. Works behind a transaction-mode pooler (the lock ends with the
/// transaction).
pub const POSTGRES_SCHEMA_LOCK: &str =
    "SELECT pg_advisory_xact_lock(hashtext('idempo.create_schema'));";

/// §4.3 claim (primitive 1): `$1` scope_key, `$2` fingerprint, `$3` token, `$4` lease_ms,
/// `$5` ttl_ms, `$6` now override. One round trip whether it claims or finds a live record: one
/// row (`claimed`, `fingerprint`, `state`, `token`, `generation`, `lease_until`, `expires_at`,
/// `response`, `now_ms`; the columns after `claimed` are shaped like [`POSTGRES_GET`]'s). Claimed:
/// `claimed` true, `generation` and `now_ms` set, the record columns NULL. A live record:
/// `claimed` false and the record as the conflict arm locked it (`FOR SHARE` reads that version,
/// not the statement's older snapshot). Zero rows: the conflicting row is not in this statement's
/// snapshot (an inserter committed after it began) or vanished: run the claim again.
pub const POSTGRES_CLAIM: &str = concat!(
    "WITH c AS (SELECT coalesce($6::bigint, ",
    pg_clock!(),
    ") AS now),
     claimed AS (
       INSERT INTO idempo_record AS r
              (scope_key, fingerprint, state, token, generation, lease_until, expires_at, response)
       SELECT $1::bytea, $2::text, 1, $3::bytea, 1, c.now + $4::bigint, c.now + greatest($5::bigint, $4::bigint), NULL FROM c
       ON CONFLICT (scope_key) DO UPDATE
          SET fingerprint = EXCLUDED.fingerprint, state = 1, token = EXCLUDED.token,
              generation = least(r.generation + 1, 2147483647),
              lease_until = EXCLUDED.lease_until, expires_at = EXCLUDED.expires_at, response = NULL
        WHERE r.expires_at <= EXCLUDED.lease_until - $4::bigint
       RETURNING r.generation, r.lease_until - $4::bigint AS now_ms),
     live AS (
       SELECT fingerprint, state, token, generation, lease_until, expires_at, response
         FROM idempo_record
        WHERE scope_key = $1::bytea AND NOT EXISTS (SELECT FROM claimed)
          FOR SHARE)
SELECT true AS claimed, NULL::text AS fingerprint, NULL::smallint AS state, NULL::bytea AS token,
       generation, NULL::bigint AS lease_until, NULL::bigint AS expires_at, NULL::bytea AS response,
       now_ms
  FROM claimed
UNION ALL
SELECT false, l.fingerprint, l.state, l.token, l.generation, l.lease_until, l.expires_at, l.response,
       c.now
  FROM live l, c"
);

/// §4.3 get (primitive 2): `$1` scope_key, `$2` now override. Always one row: the record's
/// columns (`fingerprint`, `state`, `token`, `generation`, `lease_until`, `expires_at`,
/// `response`, all NULL when absent) and `now_ms`.
pub const POSTGRES_GET: &str = concat!(
    "SELECT fingerprint, state, token, generation, lease_until, expires_at, response,
       coalesce($2::bigint, ",
    pg_clock!(),
    ") AS now_ms
  FROM (SELECT 1) AS one LEFT JOIN idempo_record ON scope_key = $1::bytea"
);

/// §4.3 takeover (primitive 3): `$1` scope_key, `$2` seen_token, `$3` new_token, `$4` lease_ms,
/// `$5` now override. Returns the `generation` when applied, no row otherwise.
pub const POSTGRES_TAKEOVER: &str = concat!(
    "WITH c AS (SELECT coalesce($5::bigint, ",
    pg_clock!(),
    ") AS now)
UPDATE idempo_record SET token = $3::bytea, lease_until = c.now + $4::bigint,
       expires_at = greatest(expires_at, c.now + $4::bigint)
  FROM c
 WHERE scope_key = $1::bytea AND state = 1 AND token = $2::bytea AND lease_until <= c.now
RETURNING generation"
);

/// §4.3 mark_unknown (primitive 4): `$1` scope_key, `$2` seen_token, `$3` ttl_ms, `$4` now
/// override. Applied when the row count is 1.
pub const POSTGRES_MARK_UNKNOWN: &str = concat!(
    "WITH c AS (SELECT coalesce($4::bigint, ",
    pg_clock!(),
    ") AS now)
UPDATE idempo_record SET state = 3, lease_until = NULL, expires_at = c.now + $3::bigint
  FROM c
 WHERE scope_key = $1::bytea AND state = 1 AND token = $2::bytea AND lease_until <= c.now"
);

/// The `WITH … WHERE` part shared by [`POSTGRES_COMPLETE`] and [`POSTGRES_COMPLETE_RETURNING`].
macro_rules! pg_complete {
    () => {
        concat!(
            "WITH c AS (SELECT coalesce($5::bigint, ",
            pg_clock!(),
            ") AS now)
UPDATE idempo_record SET state = 2, response = $3::bytea, lease_until = NULL, expires_at = c.now + $4::bigint
  FROM c
 WHERE scope_key = $1::bytea AND state = 1 AND token = $2::bytea"
        )
    };
}

/// §4.3 complete (primitive 5): `$1` scope_key, `$2` token, `$3` response, `$4` ttl_ms, `$5` now
/// override. Applied when the row count is 1.
pub const POSTGRES_COMPLETE: &str = pg_complete!();

/// [`POSTGRES_COMPLETE`] returning the completed record for a cache in front of PostgreSQL
/// (§9): same parameters; one row (`fingerprint`, `state`, `token`, `generation`,
/// `lease_until`, `expires_at`, `response`, `now_ms`) when applied, none otherwise.
pub const POSTGRES_COMPLETE_RETURNING: &str = concat!(
    pg_complete!(),
    "
RETURNING fingerprint, state, token, generation, lease_until, expires_at, response, c.now AS now_ms"
);

/// §4.3 release (primitive 6): `$1` scope_key, `$2` token. Applied when the row count is 1.
pub const POSTGRES_RELEASE: &str =
    "DELETE FROM idempo_record WHERE scope_key = $1::bytea AND state = 1 AND token = $2::bytea";

/// §4.3 renew (primitive 7): `$1` scope_key, `$2` token, `$3` lease_ms, `$4` now override.
/// Applied when the row count is 1.
pub const POSTGRES_RENEW: &str = concat!(
    "WITH c AS (SELECT coalesce($4::bigint, ",
    pg_clock!(),
    ") AS now)
UPDATE idempo_record SET lease_until = c.now + $3::bigint, expires_at = greatest(expires_at, c.now + $3::bigint)
  FROM c
 WHERE scope_key = $1::bytea AND state = 1 AND token = $2::bytea"
);

/// §4.3 purge_expired (primitive 8): `$1` batch, `$2` now override. One row of counts
/// (`in_progress`, `completed`, `outcome_unknown`).
pub const POSTGRES_PURGE: &str = concat!(
    "WITH c AS (SELECT coalesce($2::bigint, ",
    pg_clock!(),
    ") AS now),
     doomed AS (
       SELECT scope_key FROM idempo_record, c WHERE expires_at <= c.now
        ORDER BY expires_at LIMIT $1::bigint FOR UPDATE SKIP LOCKED),
     gone AS (DELETE FROM idempo_record r USING doomed WHERE r.scope_key = doomed.scope_key
              RETURNING r.state)
SELECT count(*) FILTER (WHERE state = 1) AS in_progress,
       count(*) FILTER (WHERE state = 2) AS completed,
       count(*) FILTER (WHERE state = 3) AS outcome_unknown
  FROM gone"
);

/// §4.7 stats (metrics of the purge process): `$1` now override. One row: `in_progress`,
/// `completed`, `outcome_unknown` (records by state), `expired` (records due for purge),
/// `purge_lag_ms` (age of the oldest expired record, NULL when none), `size_bytes` (table and
/// indexes) and `now_ms`. Counting by state reads the whole table; the lag uses the expiry index.
pub const POSTGRES_STATS: &str = concat!(
    "WITH c AS (SELECT coalesce($1::bigint, ",
    pg_clock!(),
    ") AS now)
SELECT count(r.state) FILTER (WHERE r.state = 1) AS in_progress,
       count(r.state) FILTER (WHERE r.state = 2) AS completed,
       count(r.state) FILTER (WHERE r.state = 3) AS outcome_unknown,
       count(r.state) FILTER (WHERE r.expires_at <= c.now) AS expired,
       c.now - min(r.expires_at) FILTER (WHERE r.expires_at <= c.now) AS purge_lag_ms,
       pg_total_relation_size('idempo_record'::regclass) AS size_bytes,
       c.now AS now_ms
  FROM c LEFT JOIN idempo_record r ON true
 GROUP BY c.now"
);

// ---------------------------------------------------------------------------------------------
// SQLite (spec/STORAGE.md §7); each runs inside `BEGIN IMMEDIATE … COMMIT`
// ---------------------------------------------------------------------------------------------

/// §7: the SQLite clock expression (unix ms), overridden by `:now`.
pub const SQLITE_NOW: &str = sqlite_clock!();

/// §7 (schema of §4.1 with SQLite types and `WITHOUT ROWID`), idempotent; no parameters.
pub const SQLITE_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS idempo_record (
  scope_key   BLOB    PRIMARY KEY CHECK (length(scope_key) = 32),
  fingerprint TEXT    NOT NULL,
  state       INTEGER NOT NULL CHECK (state = 1 OR state = 2 OR state = 3),
  token       BLOB    NOT NULL CHECK (length(token) = 16),
  generation  INTEGER NOT NULL CHECK (generation >= 1),
  lease_until INTEGER,
  expires_at  INTEGER NOT NULL,
  response    BLOB
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idempo_record_expires_at ON idempo_record (expires_at);";

/// §7 claim (primitive 1): `:scope`, `:fp`, `:token`, `:lease`, `:ttl`, `:now`. One row
/// (`generation`, `now_ms`) when claimed; none when a live record exists (read it with
/// [`SQLITE_GET`] in the same transaction). Needs SQLite 3.35.0 (`RETURNING`).
pub const SQLITE_CLAIM: &str = concat!(
    "INSERT INTO idempo_record AS r
       (scope_key, fingerprint, state, token, generation, lease_until, expires_at, response)
VALUES (:scope, :fp, 1, :token, 1,
        ",
    sqlite_clock!(),
    " + :lease,
        ",
    sqlite_clock!(),
    " + max(:ttl, :lease),
        NULL)
ON CONFLICT (scope_key) DO UPDATE
   SET fingerprint = excluded.fingerprint, state = 1, token = excluded.token,
       generation = min(r.generation + 1, 2147483647),
       lease_until = excluded.lease_until, expires_at = excluded.expires_at, response = NULL
 WHERE r.expires_at <= excluded.lease_until - :lease
RETURNING generation, lease_until - :lease AS now_ms"
);

/// §7 get (primitive 2): `:scope`, `:now`. Always one row, as [`POSTGRES_GET`].
pub const SQLITE_GET: &str = concat!(
    "SELECT fingerprint, state, token, generation, lease_until, expires_at, response, ",
    sqlite_clock!(),
    " AS now_ms
  FROM (SELECT 1) AS one LEFT JOIN idempo_record ON scope_key = :scope"
);

/// §7 takeover (primitive 3, the §4.3 `UPDATE`): `:scope`, `:seen`, `:new`, `:lease`, `:now`.
/// Returns the `generation` when applied.
pub const SQLITE_TAKEOVER: &str = concat!(
    "UPDATE idempo_record SET token = :new, lease_until = ",
    sqlite_clock!(),
    " + :lease,
       expires_at = max(expires_at, ",
    sqlite_clock!(),
    " + :lease)
 WHERE scope_key = :scope AND state = 1 AND token = :seen AND lease_until <= ",
    sqlite_clock!(),
    "
RETURNING generation"
);

/// §7 mark_unknown (primitive 4): `:scope`, `:seen`, `:ttl`, `:now`. Applied when `changes()`
/// is 1.
pub const SQLITE_MARK_UNKNOWN: &str = concat!(
    "UPDATE idempo_record SET state = 3, lease_until = NULL, expires_at = ",
    sqlite_clock!(),
    " + :ttl
 WHERE scope_key = :scope AND state = 1 AND token = :seen AND lease_until <= ",
    sqlite_clock!()
);

/// §7 complete (primitive 5): `:scope`, `:token`, `:response`, `:ttl`, `:now`. Applied when
/// `changes()` is 1.
pub const SQLITE_COMPLETE: &str = concat!(
    "UPDATE idempo_record SET state = 2, response = :response, lease_until = NULL, expires_at = ",
    sqlite_clock!(),
    " + :ttl
 WHERE scope_key = :scope AND state = 1 AND token = :token"
);

/// §7 release (primitive 6): `:scope`, `:token`. Applied when `changes()` is 1.
pub const SQLITE_RELEASE: &str =
    "DELETE FROM idempo_record WHERE scope_key = :scope AND state = 1 AND token = :token";

/// §7 renew (primitive 7): `:scope`, `:token`, `:lease`, `:now`. Applied when `changes()` is 1.
pub const SQLITE_RENEW: &str = concat!(
    "UPDATE idempo_record SET lease_until = ",
    sqlite_clock!(),
    " + :lease, expires_at = max(expires_at, ",
    sqlite_clock!(),
    " + :lease)
 WHERE scope_key = :scope AND state = 1 AND token = :token"
);

/// §7 purge_expired (primitive 8): `:batch`, `:now`. One row (`state`) per deleted record.
pub const SQLITE_PURGE: &str = concat!(
    "DELETE FROM idempo_record WHERE scope_key IN (
  SELECT scope_key FROM idempo_record
   WHERE expires_at <= ",
    sqlite_clock!(),
    "
   ORDER BY expires_at LIMIT :batch)
RETURNING state"
);

/// §7 stats (metrics of the purge process): `:now`. One row as [`POSTGRES_STATS`]; `size_bytes`
/// is the whole database file (`page_count × page_size`).
pub const SQLITE_STATS: &str = concat!(
    "WITH c AS (SELECT ",
    sqlite_clock!(),
    " AS now)
SELECT count(CASE WHEN r.state = 1 THEN 1 END) AS in_progress,
       count(CASE WHEN r.state = 2 THEN 1 END) AS completed,
       count(CASE WHEN r.state = 3 THEN 1 END) AS outcome_unknown,
       count(CASE WHEN r.expires_at <= c.now THEN 1 END) AS expired,
       c.now - min(CASE WHEN r.expires_at <= c.now THEN r.expires_at END) AS purge_lag_ms,
       (SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()) AS size_bytes,
       c.now AS now_ms
  FROM c LEFT JOIN idempo_record r ON 1
 GROUP BY c.now"
);

// ---------------------------------------------------------------------------------------------
// Redis (spec/STORAGE.md §5)
// ---------------------------------------------------------------------------------------------

/// §5.2 `prelude.lua`: `clock()` (Redis `TIME` or the override in the last `ARGV`) and `int()`.
pub const REDIS_PRELUDE: &str = lua_prelude!();

/// How long a record's hash outlives its logical expiry, ms (§5.1: `PEXPIRE` to
/// `expires_at − now + 60000`); the number the scripts below add.
pub const REDIS_GRACE_MS: u64 = 60_000;

/// §5.1 the key of a record's hash: `prefix` followed by the 64 lower-case hex digits of the
/// scope key (the default prefix is [`crate::options::REDIS_PREFIX`]).
#[must_use]
pub fn redis_key(prefix: &[u8], scope_key: &[u8; 32]) -> Vec<u8> {
    let mut key = prefix.to_vec();
    key.extend_from_slice(crate::record::hex(scope_key).as_bytes());
    key
}

/// §5.2 claim (primitive 1): `ARGV` fingerprint, token, lease_ms, ttl_ms, now override.
/// Returns `{1, now, generation}` or `{0, now, HGETALL}`.
pub const REDIS_CLAIM: &str = concat!(
    lua_prelude!(),
    "local now = clock()
local lease, ttl = tonumber(ARGV[3]), tonumber(ARGV[4])
local cur = redis.call('HMGET', KEYS[1], 'expires_at', 'generation')
local gen = 1
if cur[1] then
  if tonumber(cur[1]) > now then
    return {0, int(now), redis.call('HGETALL', KEYS[1])}
  end
  gen = math.min(tonumber(cur[2]) + 1, 2147483647)
  redis.call('DEL', KEYS[1])
end
local exp = now + math.max(ttl, lease)
redis.call('HSET', KEYS[1], 'fingerprint', ARGV[1], 'state', '1', 'token', ARGV[2],
           'generation', int(gen), 'lease_until', int(now + lease), 'expires_at', int(exp))
redis.call('PEXPIRE', KEYS[1], int(exp - now + 60000))
return {1, int(now), int(gen)}
"
);

/// §5.2 get (primitive 2): `ARGV` now override. Returns `{now, HGETALL}` (empty when absent).
pub const REDIS_GET: &str = concat!(
    lua_prelude!(),
    "return {int(clock()), redis.call('HGETALL', KEYS[1])}
"
);

/// §5.2 takeover (primitive 3): `ARGV` seen_token, new_token, lease_ms, now override. Returns
/// the generation, or nil when not applied.
pub const REDIS_TAKEOVER: &str = concat!(
    lua_prelude!(),
    "local now = clock()
local r = redis.call('HMGET', KEYS[1], 'state', 'token', 'lease_until', 'expires_at', 'generation')
if r[1] ~= '1' or r[2] ~= ARGV[1] or tonumber(r[3]) > now then return false end
local lease_until = now + tonumber(ARGV[3])
local exp = math.max(tonumber(r[4]), lease_until)
redis.call('HSET', KEYS[1], 'token', ARGV[2], 'lease_until', int(lease_until), 'expires_at', int(exp))
redis.call('PEXPIRE', KEYS[1], int(exp - now + 60000))
return r[5]
"
);

/// §5.2 mark_unknown (primitive 4): `ARGV` seen_token, ttl_ms, now override. Returns 1 or 0.
pub const REDIS_MARK_UNKNOWN: &str = concat!(
    lua_prelude!(),
    "local now = clock()
local r = redis.call('HMGET', KEYS[1], 'state', 'token', 'lease_until')
if r[1] ~= '1' or r[2] ~= ARGV[1] or tonumber(r[3]) > now then return 0 end
local exp = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'state', '3', 'expires_at', int(exp))
redis.call('HDEL', KEYS[1], 'lease_until')
redis.call('PEXPIRE', KEYS[1], int(exp - now + 60000))
return 1
"
);

/// §5.2 complete (primitive 5): `ARGV` token, response, ttl_ms, now override. Returns 1 or 0.
pub const REDIS_COMPLETE: &str = concat!(
    lua_prelude!(),
    "local now = clock()
local r = redis.call('HMGET', KEYS[1], 'state', 'token')
if r[1] ~= '1' or r[2] ~= ARGV[1] then return 0 end
local exp = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'state', '2', 'response', ARGV[2], 'expires_at', int(exp))
redis.call('HDEL', KEYS[1], 'lease_until')
redis.call('PEXPIRE', KEYS[1], int(exp - now + 60000))
return 1
"
);

/// §5.2 release (primitive 6): `ARGV` token, now override (unused). Returns 1 or 0.
pub const REDIS_RELEASE: &str = concat!(
    lua_prelude!(),
    "local r = redis.call('HMGET', KEYS[1], 'state', 'token')
if r[1] ~= '1' or r[2] ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
"
);

/// §5.2 renew (primitive 7): `ARGV` token, lease_ms, now override. Returns 1 or 0.
pub const REDIS_RENEW: &str = concat!(
    lua_prelude!(),
    "local now = clock()
local r = redis.call('HMGET', KEYS[1], 'state', 'token', 'expires_at')
if r[1] ~= '1' or r[2] ~= ARGV[1] then return 0 end
local lease_until = now + tonumber(ARGV[2])
local exp = math.max(tonumber(r[3]), lease_until)
redis.call('HSET', KEYS[1], 'lease_until', int(lease_until), 'expires_at', int(exp))
redis.call('PEXPIRE', KEYS[1], int(exp - now + 60000))
return 1
"
);

/// §5.1 optional purge of one record (the spec needs none: Redis expires hashes itself):
/// `ARGV` now override. Deletes the record when `expires_at <= now` and returns its state, else 0.
pub const REDIS_PURGE_ONE: &str = concat!(
    lua_prelude!(),
    "local now = clock()
local r = redis.call('HMGET', KEYS[1], 'state', 'expires_at')
if r[1] and r[2] and tonumber(r[2]) <= now then
  redis.call('DEL', KEYS[1])
  return tonumber(r[1])
end
return 0
"
);

/// §9 cache read: `KEYS[1]` the cache entry, `ARGV` now override. Returns `{now, HGETALL}`.
pub const REDIS_CACHE_GET: &str = concat!(
    lua_prelude!(),
    "return {int(clock()), redis.call('HGETALL', KEYS[1])}
"
);

/// §9 cache fill: `KEYS[1]` the cache entry; `ARGV` fingerprint, state, token, generation,
/// expires_at, response, px (the authority's `min(cache_ttl, expires_at − now)`). Returns 1.
pub const REDIS_CACHE_PUT: &str = "redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'fingerprint', ARGV[1], 'state', ARGV[2], 'token', ARGV[3],
  'generation', ARGV[4], 'expires_at', ARGV[5], 'response', ARGV[6])
redis.call('PEXPIRE', KEYS[1], ARGV[7])
return 1
";

/// Every recipe by a stable snake_case name (`<store>_<primitive>`), for the bindings to export.
pub const ALL: &[(&str, &str)] = &[
    ("postgres_now", POSTGRES_NOW),
    ("postgres_schema", POSTGRES_SCHEMA),
    ("postgres_schema_lock", POSTGRES_SCHEMA_LOCK),
    ("postgres_claim", POSTGRES_CLAIM),
    ("postgres_get", POSTGRES_GET),
    ("postgres_takeover", POSTGRES_TAKEOVER),
    ("postgres_mark_unknown", POSTGRES_MARK_UNKNOWN),
    ("postgres_complete", POSTGRES_COMPLETE),
    ("postgres_complete_returning", POSTGRES_COMPLETE_RETURNING),
    ("postgres_release", POSTGRES_RELEASE),
    ("postgres_renew", POSTGRES_RENEW),
    ("postgres_purge", POSTGRES_PURGE),
    ("postgres_stats", POSTGRES_STATS),
    ("sqlite_now", SQLITE_NOW),
    ("sqlite_schema", SQLITE_SCHEMA),
    ("sqlite_claim", SQLITE_CLAIM),
    ("sqlite_get", SQLITE_GET),
    ("sqlite_takeover", SQLITE_TAKEOVER),
    ("sqlite_mark_unknown", SQLITE_MARK_UNKNOWN),
    ("sqlite_complete", SQLITE_COMPLETE),
    ("sqlite_release", SQLITE_RELEASE),
    ("sqlite_renew", SQLITE_RENEW),
    ("sqlite_purge", SQLITE_PURGE),
    ("sqlite_stats", SQLITE_STATS),
    ("redis_prelude", REDIS_PRELUDE),
    ("redis_claim", REDIS_CLAIM),
    ("redis_get", REDIS_GET),
    ("redis_takeover", REDIS_TAKEOVER),
    ("redis_mark_unknown", REDIS_MARK_UNKNOWN),
    ("redis_complete", REDIS_COMPLETE),
    ("redis_release", REDIS_RELEASE),
    ("redis_renew", REDIS_RENEW),
    ("redis_purge_one", REDIS_PURGE_ONE),
    ("redis_cache_get", REDIS_CACHE_GET),
    ("redis_cache_put", REDIS_CACHE_PUT),
];

/// The recipe called `name` in [`ALL`], if any.
#[must_use]
pub fn by_name(name: &str) -> Option<&'static str> {
    ALL.iter().find(|(n, _)| *n == name).map(|(_, text)| *text)
}

/// `sql` with the table moved: every whole word `idempo_record` replaced by `table` (for
/// example `"tenant_a".idempo_record`), the index name `idempo_record_expires_at` and any other
/// longer identifier left as they are. `table` is inserted verbatim: quote it first.
#[must_use]
pub fn rename_table(sql: &str, table: &str) -> String {
    replace_word(sql, "idempo_record", table)
}

/// `sql` with the table moved as [`rename_table`] does and its expiry index renamed: every whole
/// word `idempo_record_expires_at` replaced by `index` (inserted verbatim: quote it first).
#[must_use]
pub fn rename_table_and_index(sql: &str, table: &str, index: &str) -> String {
    replace_word(&rename_table(sql, table), "idempo_record_expires_at", index)
}

/// `sql` with every whole word (identifier characters `[A-Za-z0-9_]` on neither side) `word`
/// replaced by `with`.
fn replace_word(sql: &str, word: &str, with: &str) -> String {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = String::with_capacity(sql.len() + 32);
    let mut rest = sql;
    while let Some(at) = rest.find(word) {
        let (head, tail) = rest.split_at(at);
        let after = tail.get(word.len()..).unwrap_or("");
        out.push_str(head);
        if head.chars().next_back().is_some_and(ident) || after.chars().next().is_some_and(ident) {
            out.push_str(word);
        } else {
            out.push_str(with);
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_key_is_prefix_and_hex() {
        let mut scope = [0u8; 32];
        scope[0] = 0xab;
        scope[31] = 0x01;
        let key = redis_key(crate::options::REDIS_PREFIX.as_bytes(), &scope);
        let want = format!("idempo:ab{}01", "00".repeat(30));
        assert_eq!(key, want.as_bytes());
        assert!(SPEC.contains("`<prefix><64-hex scope_key>`"));
    }

    #[test]
    fn rename_table_replaces_whole_words_only() {
        let sql = "DELETE FROM idempo_record WHERE x; CREATE INDEX idempo_record_expires_at ON idempo_record(expires_at); my_idempo_record";
        assert_eq!(
            rename_table(sql, "\"s\".idempo_record"),
            "DELETE FROM \"s\".idempo_record WHERE x; CREATE INDEX idempo_record_expires_at ON \"s\".idempo_record(expires_at); my_idempo_record"
        );
        assert_eq!(
            rename_table_and_index(sql, "t", "t_exp"),
            "DELETE FROM t WHERE x; CREATE INDEX t_exp ON t(expires_at); my_idempo_record"
        );
        for text in [POSTGRES_SCHEMA, POSTGRES_CLAIM, POSTGRES_PURGE] {
            let moved = rename_table(text, "t.idempo_record");
            assert!(!moved.contains(" idempo_record ") && moved.contains("t.idempo_record"));
        }
    }

    const SPEC: &str = include_str!("../../spec/STORAGE.md");

    /// White space folded to single spaces, `;` at line ends dropped, `-- …` comment lines
    /// dropped, parameter casts (`$4::bigint`) and `IF NOT EXISTS` removed: the spec prints the
    /// statements without the casts drivers need and as first-time DDL.
    fn fold(text: &str) -> String {
        let mut lines = Vec::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with("--") || line.starts_with("```") {
                continue;
            }
            lines.push(line.strip_suffix(';').unwrap_or(line));
        }
        let joined = lines.join(" ").replace(" IF NOT EXISTS", "");
        let joined = uncast(&joined);
        let mut out = String::with_capacity(joined.len());
        let mut space = false;
        for ch in joined.chars() {
            if ch.is_whitespace() {
                space = true;
                continue;
            }
            if space && !out.is_empty() {
                out.push(' ');
            }
            space = false;
            out.push(ch);
        }
        out
    }

    /// `$n::type` becomes `$n`.
    fn uncast(text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(i) = rest.find('$') {
            out.push_str(&rest[..=i]);
            rest = &rest[i + 1..];
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            out.push_str(&rest[..digits]);
            rest = &rest[digits..];
            if digits > 0 {
                if let Some(after) = rest.strip_prefix("::") {
                    let ident = after
                        .bytes()
                        .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_')
                        .count();
                    rest = &after[ident..];
                }
            }
        }
        out.push_str(rest);
        out
    }

    fn assert_in_spec(name: &str, text: &str) {
        let spec = fold(SPEC);
        let text = fold(text);
        assert!(
            spec.contains(&text),
            "recipe {name} does not appear in spec/STORAGE.md:\n{text}"
        );
    }

    fn body(script: &str) -> &str {
        script
            .strip_prefix(REDIS_PRELUDE)
            .unwrap_or_else(|| panic!("script does not start with the prelude:\n{script}"))
    }

    #[test]
    fn postgres_recipes_are_the_spec_text() {
        for (name, text) in [
            ("postgres_claim", POSTGRES_CLAIM),
            ("postgres_get", POSTGRES_GET),
            ("postgres_takeover", POSTGRES_TAKEOVER),
            ("postgres_mark_unknown", POSTGRES_MARK_UNKNOWN),
            ("postgres_complete", POSTGRES_COMPLETE),
            ("postgres_release", POSTGRES_RELEASE),
            ("postgres_renew", POSTGRES_RENEW),
            ("postgres_purge", POSTGRES_PURGE),
            ("postgres_stats", POSTGRES_STATS),
        ] {
            assert_in_spec(name, text);
        }
        for stmt in POSTGRES_SCHEMA.split_inclusive(';') {
            assert_in_spec("postgres_schema", stmt);
        }
        assert_in_spec("postgres_now", POSTGRES_NOW);
        assert_in_spec("postgres_schema_lock", POSTGRES_SCHEMA_LOCK);
    }

    #[test]
    fn sqlite_recipes_the_spec_prints_are_the_spec_text() {
        assert_in_spec("sqlite_claim", SQLITE_CLAIM);
        assert_in_spec("sqlite_purge", SQLITE_PURGE);
        assert_in_spec("sqlite_stats", SQLITE_STATS);
        assert_in_spec("sqlite_now", SQLITE_NOW);
    }

    #[test]
    fn sqlite_recipes_the_spec_describes_mirror_postgres() {
        // §7: "the UPDATE/DELETE statements of §4.3 with the SQLite clock expression, max() for
        // greatest": the same SET and WHERE clauses once the clock and the names are mapped.
        let map = |pg: &str| -> String {
            let mut s = fold(pg);
            for (from, to) in [
                ("greatest(", "max("),
                (" FROM c", ""),
                ("c.now", "NOW"),
                ("$1", ":scope"),
            ] {
                s = s.replace(from, to);
            }
            s
        };
        let lite = |sql: &str| fold(sql).replace(&fold(SQLITE_NOW), "NOW");
        let pg_release = map(POSTGRES_RELEASE).replace("$2", ":token");
        assert_eq!(lite(SQLITE_RELEASE), pg_release);
        let pg_renew = map(POSTGRES_RENEW)
            .replace("$2", ":token")
            .replace("$3", ":lease");
        assert!(pg_renew.ends_with(&lite(SQLITE_RENEW)), "{pg_renew}");
        let pg_complete = map(POSTGRES_COMPLETE)
            .replace("$2", ":token")
            .replace("$3", ":response")
            .replace("$4", ":ttl");
        assert!(
            pg_complete.ends_with(&lite(SQLITE_COMPLETE)),
            "{pg_complete}"
        );
        let pg_unknown = map(POSTGRES_MARK_UNKNOWN)
            .replace("$2", ":seen")
            .replace("$3", ":ttl");
        assert!(
            pg_unknown.ends_with(&lite(SQLITE_MARK_UNKNOWN)),
            "{pg_unknown}"
        );
        let pg_takeover = map(POSTGRES_TAKEOVER)
            .replace("$2", ":seen")
            .replace("$3", ":new")
            .replace("$4", ":lease");
        assert!(
            pg_takeover.ends_with(&lite(SQLITE_TAKEOVER)),
            "{pg_takeover}"
        );
    }

    #[test]
    fn sqlite_schema_is_the_postgres_schema_with_sqlite_types() {
        let mapped = fold(POSTGRES_SCHEMA)
            .replace("octet_length(", "length(")
            .replace("bytea", "BLOB")
            .replace("smallint", "INTEGER")
            .replace("integer", "INTEGER")
            .replace("bigint", "INTEGER")
            .replace("text", "TEXT")
            .replace(") CREATE", ") WITHOUT ROWID CREATE")
            // SQLite evaluates `IN (list)` with a temporary b-tree built by every statement that
            // writes the column; the disjunction admits the same rows without one.
            .replace("state IN (1, 2, 3)", "state = 1 OR state = 2 OR state = 3");
        assert_eq!(fold(SQLITE_SCHEMA), mapped);
    }

    #[test]
    fn redis_scripts_are_the_spec_text() {
        assert_in_spec("redis_prelude", REDIS_PRELUDE);
        for (name, script) in [
            ("redis_claim", REDIS_CLAIM),
            ("redis_get", REDIS_GET),
            ("redis_takeover", REDIS_TAKEOVER),
            ("redis_mark_unknown", REDIS_MARK_UNKNOWN),
            ("redis_complete", REDIS_COMPLETE),
            ("redis_release", REDIS_RELEASE),
            ("redis_renew", REDIS_RENEW),
        ] {
            assert_in_spec(name, body(script));
        }
        // Scripts the spec does not print still start with the prelude (§5.2).
        let _ = body(REDIS_PURGE_ONE);
        let _ = body(REDIS_CACHE_GET);
    }

    #[test]
    fn redis_grace_is_the_number_the_scripts_add() {
        let grace = format!("int(exp - now + {REDIS_GRACE_MS}))");
        for script in [
            REDIS_CLAIM,
            REDIS_TAKEOVER,
            REDIS_MARK_UNKNOWN,
            REDIS_COMPLETE,
            REDIS_RENEW,
        ] {
            assert_eq!(script.matches(&grace).count(), 1, "{script}");
        }
        assert!(SPEC.contains(&format!("`expires_at − now + {REDIS_GRACE_MS}`")));
    }

    #[test]
    fn names_are_unique_and_resolve() {
        let mut names: Vec<_> = ALL.iter().map(|(n, _)| *n).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ALL.len());
        assert_eq!(by_name("postgres_claim"), Some(POSTGRES_CLAIM));
        assert_eq!(by_name("redis_cache_put"), Some(REDIS_CACHE_PUT));
        assert_eq!(by_name("nope"), None);
        assert!(ALL.iter().all(|(_, text)| !text.is_empty()));
    }

    #[test]
    fn the_fold_catches_a_drift() {
        let drifted = POSTGRES_COMPLETE.replace("state = 1 AND", "state = 2 AND");
        assert!(!fold(SPEC).contains(&fold(&drifted)));
        assert_eq!(uncast("a = $12::bigint + $3::bytea, $"), "a = $12 + $3, $");
    }
}
