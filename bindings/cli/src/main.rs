//! The `idempo` command-line tool: what a developer runs when a client and the server disagree
//! about a request body or a key.
//!
//! ```text
//! idempo canonicalize [FILE]                      RFC 8785 canonical bytes of a JSON body
//! idempo fingerprint --method M --route R [FILE]  the request fingerprint (v1:/h1:)
//! idempo check-key VALUE                          is this Idempotency-Key value valid?
//! idempo scope --principal P --method M --route R KEY   the record's scope id
//! ```
//!
//! Exit status: 0 success (for `check-key`: valid), 1 the input was rejected (invalid JSON,
//! invalid key, unfingerprintable body), 2 usage or I/O error. All logic lives in `idempo-core`;
//! this binary only reads arguments and files and prints.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
#![forbid(unsafe_code)]

mod args;
mod commands;

use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    let mut out = stdout.lock();
    let mut err = stderr.lock();
    let code = commands::run(&argv, &mut stdin.lock(), &mut out, &mut err);
    // A closed stdout (e.g. `| head`) must not turn into a panic; the status still tells.
    let _ = out.flush();
    ExitCode::from(code)
}
