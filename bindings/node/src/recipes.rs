//! The store recipes of `spec/STORAGE.md` (SQL and Lua texts), read-only from core.
use std::collections::HashMap;

use napi_derive::napi;

/// Every store recipe of `idempo_core::recipes` by name (`postgres_claim`, `sqlite_get`,
/// `redis_complete`, …): the SQL and Lua the stores run, written once in core.
#[napi]
#[must_use]
pub fn recipes() -> HashMap<String, String> {
    idempo_core::recipes::ALL
        .iter()
        .map(|(name, text)| ((*name).to_owned(), (*text).to_owned()))
        .collect()
}
