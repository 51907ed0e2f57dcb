//! Structured logs: one JSON object per line on stderr.
//!
//! On an async runtime the lines are batched: a line goes into a shared buffer, and the first
//! line into an empty buffer schedules one flush task, which yields once (so the requests the
//! runtime is already working on add their lines) and then writes the whole buffer to stderr in
//! one `write`. A quiet gateway therefore writes each line at once, a busy one a batch per
//! runtime turn instead of a system call per request. Off a runtime (start-up errors, tests) a
//! line is written directly. The flush task flushes even when its runtime shuts down before it
//! ran (on drop), and [`flush`] writes whatever is left.
use std::io::Write as _;
use std::sync::Mutex;

use serde_json::Value;

/// The buffer is written at once past this size, whatever the runtime is doing.
const FLUSH_AT: usize = 64 * 1024;

#[derive(Debug, Default)]
struct Pending {
    buf: Vec<u8>,
    scheduled: bool,
}

static PENDING: Mutex<Pending> = Mutex::new(Pending {
    buf: Vec::new(),
    scheduled: false,
});

fn pending() -> std::sync::MutexGuard<'static, Pending> {
    PENDING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write_out(bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(bytes);
    let _ = err.flush();
}

/// Writes every buffered line to stderr now.
pub fn flush() {
    let bytes = {
        let mut p = pending();
        p.scheduled = false;
        std::mem::take(&mut p.buf)
    };
    write_out(&bytes);
}

/// Flushes when dropped: at the end of the flush task, or when its runtime drops it unrun.
struct FlushOnDrop;

impl Drop for FlushOnDrop {
    fn drop(&mut self) {
        flush();
    }
}

fn line(level: &str, msg: &str, fields: &[(&str, Value)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(160);
    out.extend_from_slice(b"{\"ts_ms\":");
    out.extend_from_slice(crate::store::Clock::System.now_ms().to_string().as_bytes());
    out.extend_from_slice(b",\"level\":");
    let _ = serde_json::to_writer(&mut out, level);
    out.extend_from_slice(b",\"msg\":");
    let _ = serde_json::to_writer(&mut out, msg);
    for (k, v) in fields {
        // The fixed keys are not repeated (as the map this replaced kept one of each).
        if matches!(*k, "ts_ms" | "level" | "msg") {
            continue;
        }
        out.push(b',');
        let _ = serde_json::to_writer(&mut out, k);
        out.push(b':');
        let _ = serde_json::to_writer(&mut out, v);
    }
    out.extend_from_slice(b"}\n");
    out
}

/// Writes one log line: `{"ts_ms":…,"level":…,"msg":…, fields…}`.
pub fn emit(level: &str, msg: &str, fields: &[(&str, Value)]) {
    let line = line(level, msg, fields);
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        // Off a runtime: what is buffered first, then this line.
        let mut bytes = {
            let mut p = pending();
            std::mem::take(&mut p.buf)
        };
        bytes.extend_from_slice(&line);
        write_out(&bytes);
        return;
    };
    let (spawn, now) = {
        let mut p = pending();
        p.buf.extend_from_slice(&line);
        if p.buf.len() >= FLUSH_AT {
            (false, Some(std::mem::take(&mut p.buf)))
        } else if p.scheduled {
            (false, None)
        } else {
            p.scheduled = true;
            (true, None)
        }
    };
    if let Some(bytes) = now {
        write_out(&bytes);
    }
    if spawn {
        let guard = FlushOnDrop;
        handle.spawn(async move {
            tokio::task::yield_now().await;
            drop(guard);
        });
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_one_json_object_with_the_fields_in_order() {
        let l = line(
            "info",
            "request",
            &[
                ("route", Value::from("/p\"q")),
                ("ms", Value::from(3)),
                ("level", Value::from("x")),
            ],
        );
        let text = String::from_utf8(l).unwrap();
        assert!(text.ends_with("}\n"));
        let v: Value = serde_json::from_str(text.trim_end()).unwrap();
        assert_eq!(v["level"], "info");
        assert_eq!(v["msg"], "request");
        assert_eq!(v["route"], "/p\"q");
        assert_eq!(v["ms"], 3);
        assert!(v["ts_ms"].as_u64().unwrap() > 0);
        assert!(text.find("\"route\"").unwrap() < text.find("\"ms\"").unwrap());
    }
}
