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

/// `sql` with the table `idempo_record` renamed to `table` and, when given, the index
/// `idempo_record_expires_at` to `index`, whole words only (`idempo_core::recipes`); both are
/// inserted verbatim: quote them first.
#[napi(catch_unwind)]
#[must_use]
pub fn rename_recipe(sql: String, table: String, index: Option<String>) -> String {
    match index {
        Some(index) => idempo_core::recipes::rename_table_and_index(&sql, &table, &index),
        None => idempo_core::recipes::rename_table(&sql, &table),
    }
}
