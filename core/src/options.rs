//! One option vocabulary beyond [`Config`](crate::policy::Config): the user-facing options of the
//! hosts and stores every binding ships, each with its one name and its one default.
//!
//! Names are snake_case here and in Python, camelCase in Node and Swift (the same words:
//! `timeout_ms` is `timeoutMs`); durations are milliseconds and end in `_ms` everywhere. The
//! bindings read their defaults from [`OPTIONS`] (Python `idempo._idempo.option_defaults()`, Node
//! the native `optionDefaults()`), so a default changed here changes in every language at once;
//! `spec/OPTIONS.md` is the reference table and `spec/vectors/options/defaults.json` its
//! machine-readable copy, checked against this module by its tests and by each binding's suite.
//! Core's per-route policy options ([`ConfigOptions::NAMES`](crate::policy::ConfigOptions::NAMES))
//! are listed there too, with their defaults from [`Config`](crate::policy::Config).

use crate::machine::memory::{DEFAULT_MAX_BYTES, DEFAULT_MAX_ENTRIES};
use crate::recipes::REDIS_GRACE_MS;

/// The request header that carries the key (matched case-insensitively).
pub const HEADER_NAME: &str = "Idempotency-Key";
/// The HTTP methods a host protects unless told otherwise (`spec/PROTOCOL.md` §7.2.1).
pub const METHODS: &[&str] = &["POST", "PATCH"];
/// How long one store operation may take before the host gives up on it (PostgreSQL, Redis).
pub const STORE_TIMEOUT_MS: u64 = 2_000;
/// Transactional mode: how long a claim waits on a duplicate's row lock before answering 409
/// (PostgreSQL `lock_timeout`, the SQLite store's writer wait).
pub const LOCK_TIMEOUT_MS: u64 = 2_000;
/// Transactional mode: PostgreSQL `idle_in_transaction_session_timeout`, so a hung handler
/// cannot hold a row lock forever.
pub const IDLE_IN_TRANSACTION_TIMEOUT_MS: u64 = 60_000;
/// How long one purge batch may take (it deletes up to [`PURGE_BATCH`] rows).
pub const PURGE_TIMEOUT_MS: u64 = 30_000;
/// Records one purge batch deletes at most (`purge_expired(batch)`).
pub const PURGE_BATCH: u64 = 1_000;
/// SQLite's `busy_timeout`: how long a connection waits for another's write lock.
pub const SQLITE_BUSY_TIMEOUT_MS: u64 = 5_000;
/// The prefix of every Redis key the Redis store writes.
pub const REDIS_PREFIX: &str = "idempo:";
/// How long a cached completed record lives in the Redis cache in front of PostgreSQL (at most;
/// never past the record's own expiry).
pub const CACHE_TTL_MS: u64 = 60_000;
/// The prefix of every Redis key the cache in front of PostgreSQL writes.
pub const CACHE_PREFIX: &str = "idempo:cache:";

/// An option's default value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptionDefault {
    /// A duration in milliseconds.
    Ms(u64),
    /// A count (entries, bytes, rows).
    Count(u64),
    /// A switch.
    Bool(bool),
    /// A text.
    Text(&'static str),
    /// A list of texts.
    List(&'static [&'static str]),
    /// No value: the option is off, or its value has no default (a path, a callback).
    Unset,
}

/// One user-facing option of a host or a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionSpec {
    /// What it configures: `host`, `memory_store`, `sqlite_store`, `postgres_store`,
    /// `redis_store`, `cached_store` or `purge`.
    pub owner: &'static str,
    /// Its name in snake_case (Node and Swift: the same words in camelCase).
    pub name: &'static str,
    /// Its default.
    pub default: OptionDefault,
    /// One line for the reference table.
    pub doc: &'static str,
    /// The bindings that offer it (`python`, `node`); every one of them spells it this way.
    pub bindings: &'static [&'static str],
}

const BOTH: &[&str] = &["python", "node"];
const PYTHON: &[&str] = &["python"];
const NODE: &[&str] = &["node"];

const fn opt(
    owner: &'static str,
    name: &'static str,
    default: OptionDefault,
    doc: &'static str,
) -> OptionSpec {
    OptionSpec {
        owner,
        name,
        default,
        doc,
        bindings: BOTH,
    }
}

const fn python_only(spec: OptionSpec) -> OptionSpec {
    OptionSpec {
        bindings: PYTHON,
        ..spec
    }
}

const fn node_only(spec: OptionSpec) -> OptionSpec {
    OptionSpec {
        bindings: NODE,
        ..spec
    }
}

/// Every host and store option with a default the bindings share, in reference-table order.
pub const OPTIONS: &[OptionSpec] = &[
    opt(
        "host",
        "header_name",
        OptionDefault::Text(HEADER_NAME),
        "the request header that carries the key",
    ),
    opt(
        "host",
        "methods",
        OptionDefault::List(METHODS),
        "the methods protected; others pass through",
    ),
    opt(
        "memory_store",
        "max_entries",
        OptionDefault::Count(DEFAULT_MAX_ENTRIES as u64),
        "records kept at most (the oldest-expiring are evicted first)",
    ),
    opt(
        "memory_store",
        "max_bytes",
        OptionDefault::Count(DEFAULT_MAX_BYTES as u64),
        "bytes kept at most (keys, fingerprints and stored responses)",
    ),
    opt(
        "sqlite_store",
        "busy_timeout_ms",
        OptionDefault::Ms(SQLITE_BUSY_TIMEOUT_MS),
        "how long a write waits for another connection's lock",
    ),
    node_only(opt(
        "sqlite_store",
        "lock_timeout_ms",
        OptionDefault::Ms(LOCK_TIMEOUT_MS),
        "transactional mode: how long a claim waits on a duplicate's transaction (then 409)",
    )),
    opt(
        "sqlite_store",
        "create_schema",
        OptionDefault::Bool(true),
        "create the table on open",
    ),
    opt(
        "postgres_store",
        "timeout_ms",
        OptionDefault::Ms(STORE_TIMEOUT_MS),
        "how long one statement may take (then 503, nothing run)",
    ),
    python_only(opt(
        "postgres_store",
        "connect_timeout_ms",
        OptionDefault::Unset,
        "how long opening a connection may take (unset: timeout_ms; libpq counts whole seconds, at least 2)",
    )),
    opt(
        "postgres_store",
        "lock_timeout_ms",
        OptionDefault::Ms(LOCK_TIMEOUT_MS),
        "transactional mode: how long a claim waits on a duplicate's row lock (then 409)",
    ),
    opt(
        "postgres_store",
        "idle_in_transaction_timeout_ms",
        OptionDefault::Ms(IDLE_IN_TRANSACTION_TIMEOUT_MS),
        "transactional mode: the server ends a transaction idle that long",
    ),
    opt(
        "postgres_store",
        "purge_timeout_ms",
        OptionDefault::Ms(PURGE_TIMEOUT_MS),
        "how long one purge batch may take",
    ),
    python_only(opt(
        "postgres_store",
        "prepared_statements",
        OptionDefault::Bool(false),
        "use named server-side prepared statements (never behind PgBouncer's transaction pooling)",
    )),
    opt(
        "redis_store",
        "prefix",
        OptionDefault::Text(REDIS_PREFIX),
        "the prefix of every key written",
    ),
    python_only(opt(
        "redis_store",
        "grace_ms",
        OptionDefault::Ms(REDIS_GRACE_MS),
        "how long a record's hash outlives its logical expiry (spec/STORAGE.md §5.1)",
    )),
    opt(
        "redis_store",
        "assume_noeviction",
        OptionDefault::Bool(false),
        "skip the start-up check of maxmemory-policy (where CONFIG is disabled: check it yourself)",
    ),
    python_only(opt(
        "redis_store",
        "allow_eviction",
        OptionDefault::Bool(false),
        "accept a server whose maxmemory-policy may evict records (a lost record is a double execution)",
    )),
    opt(
        "cached_store",
        "cache_ttl_ms",
        OptionDefault::Ms(CACHE_TTL_MS),
        "how long a completed record stays cached (never past its expiry)",
    ),
    opt(
        "cached_store",
        "prefix",
        OptionDefault::Text(CACHE_PREFIX),
        "the prefix of every cache key written",
    ),
    opt(
        "purge",
        "batch",
        OptionDefault::Count(PURGE_BATCH),
        "records one purge_expired call deletes at most",
    ),
];

/// The option `name` of `owner`, if there is one.
#[must_use]
pub fn option(owner: &str, name: &str) -> Option<&'static OptionSpec> {
    OPTIONS.iter().find(|o| o.owner == owner && o.name == name)
}

/// A host of core: how its users set an option, for refusals that name the fix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Host {
    /// The Python package (keyword arguments, `snake_case`).
    Python,
    /// The Node package (option objects, `camelCase`).
    Node,
    /// The gateway (its TOML file, `snake_case`).
    Gateway,
}

impl Host {
    /// How this host's users switch the option `name` (`snake_case`) on: `assume_noeviction=True`
    /// in Python, `assumeNoeviction: true` in Node, `assume_noeviction = true` in the gateway's
    /// TOML.
    #[must_use]
    pub fn switch_on(self, name: &str) -> String {
        match self {
            Self::Python => format!("{name}=True"),
            Self::Node => format!("{}: true", camel_case(name)),
            Self::Gateway => format!("{name} = true"),
        }
    }
}

/// `snake_case` as `camelCase` (the spelling of Node and Swift).
#[must_use]
pub fn camel_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = false;
    for ch in name.chars() {
        if ch == '_' {
            upper = true;
        } else if upper {
            out.extend(ch.to_uppercase());
            upper = false;
        } else {
            out.push(ch);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_snake_case_and_durations_end_in_ms() {
        for (i, o) in OPTIONS.iter().enumerate() {
            assert!(
                o.name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "{}",
                o.name
            );
            assert_eq!(
                matches!(o.default, OptionDefault::Ms(_)) || o.name == "connect_timeout_ms",
                o.name.ends_with("_ms"),
                "{}: a duration is named *_ms and only a duration is",
                o.name
            );
            assert!(
                OPTIONS[..i]
                    .iter()
                    .all(|p| (p.owner, p.name) != (o.owner, o.name)),
                "{}.{} twice",
                o.owner,
                o.name
            );
        }
    }

    #[test]
    fn camel_case_is_the_same_words() {
        assert_eq!(
            camel_case("idle_in_transaction_timeout_ms"),
            "idleInTransactionTimeoutMs"
        );
        assert_eq!(camel_case("prefix"), "prefix");
    }

    #[test]
    fn the_vector_is_this_table() {
        let doc: serde_json::Value =
            serde_json::from_str(include_str!("../../spec/vectors/options/defaults.json"))
                .expect("the options vector is JSON");
        let rows = doc["options"].as_array().expect("options");
        assert_eq!(rows.len(), OPTIONS.len(), "one row per option");
        for (row, o) in rows.iter().zip(OPTIONS) {
            assert_eq!(row["owner"], o.owner);
            assert_eq!(row["name"], o.name);
            assert_eq!(row["camel"], camel_case(o.name));
            let want = match o.default {
                OptionDefault::Ms(v) | OptionDefault::Count(v) => serde_json::json!(v),
                OptionDefault::Bool(b) => serde_json::json!(b),
                OptionDefault::Text(t) => serde_json::json!(t),
                OptionDefault::List(l) => serde_json::json!(l),
                OptionDefault::Unset => serde_json::Value::Null,
            };
            assert_eq!(row["default"], want, "{}.{}", o.owner, o.name);
            assert_eq!(
                row["bindings"],
                serde_json::json!(o.bindings),
                "{}.{}",
                o.owner,
                o.name
            );
        }
    }

    #[test]
    fn the_reference_table_lists_every_option() {
        let doc = include_str!("../../spec/OPTIONS.md");
        for o in OPTIONS {
            let row = format!("| {} | `{}` | `{}` |", o.owner, o.name, camel_case(o.name));
            assert!(doc.contains(&row), "spec/OPTIONS.md lacks {row}");
        }
        for name in crate::policy::ConfigOptions::NAMES {
            let row = format!("| `{name}` | `{}` |", camel_case(name));
            assert!(doc.contains(&row), "spec/OPTIONS.md lacks {row}");
        }
    }
}
