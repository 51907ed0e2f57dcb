//! Structured logs: one JSON object per line on stderr.
use std::io::Write as _;

use serde_json::{Map, Value};

/// Writes one log line: `{"ts_ms":…,"level":…,"msg":…, fields…}`.
pub fn emit(level: &str, msg: &str, fields: &[(&str, Value)]) {
    let mut obj = Map::new();
    obj.insert(
        "ts_ms".to_owned(),
        Value::from(crate::store::Clock::System.now_ms()),
    );
    obj.insert("level".to_owned(), Value::from(level));
    obj.insert("msg".to_owned(), Value::from(msg));
    for (k, v) in fields {
        obj.insert((*k).to_owned(), v.clone());
    }
    let line = Value::Object(obj).to_string();
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{line}");
}

/// An info line.
pub fn info(msg: &str, fields: &[(&str, Value)]) {
    emit("info", msg, fields);
}

/// A warning line.
pub fn warn(msg: &str, fields: &[(&str, Value)]) {
    emit("warn", msg, fields);
}

/// An error line.
pub fn error(msg: &str, fields: &[(&str, Value)]) {
    emit("error", msg, fields);
}
