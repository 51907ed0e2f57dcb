//! The `idempo` subcommands. `run` is the whole program minus the process: arguments, stdin,
//! stdout and stderr are parameters, so the commands are tested in process as well as through
//! the built binary.
use std::ffi::OsString;
use std::io::{Read, Write};

use idempo_core::canonical::{CanonError, CanonOptions, NumberMode, canonicalize_with};
use idempo_core::fingerprint::{FingerprintConfig, FingerprintError, RequestParts, fingerprint};
use idempo_core::key::{KeyOptions, parse_key_detailed};
use idempo_core::scope::ScopeId;

use crate::args::{self, Spec, UsageError, shown};

/// Exit status: success, or `check-key` found the key valid.
pub(crate) const EXIT_OK: u8 = 0;
/// Exit status: the input was rejected (invalid JSON, key, body).
pub(crate) const EXIT_REJECTED: u8 = 1;
/// Exit status: usage error, unreadable file, or output failure.
pub(crate) const EXIT_USAGE: u8 = 2;

const MAIN_HELP: &str = "\
idempo: debug idempotency keys, canonical JSON and request fingerprints

Usage: idempo <COMMAND> [OPTIONS] [ARGS]

Commands:
  canonicalize  Print the RFC 8785 canonical form of a JSON body
  fingerprint   Print the request fingerprint (v1:<hex> or h1:<hex>) the server computes
  check-key     Tell whether an Idempotency-Key header value is valid, and why not
  scope         Print the scope id (record identity) of a principal, method, route and key

Run `idempo <COMMAND> --help` for a command's options.

Exit status: 0 success (check-key: valid), 1 input rejected, 2 usage or I/O error.
";

const CANON_HELP: &str = "\
Print the RFC 8785 (JCS) canonical bytes of a JSON text.

Usage: idempo canonicalize [OPTIONS] [FILE]

Reads FILE, or standard input when FILE is absent or `-`. Writes the canonical bytes (no trailing
newline) to standard output and exits 0. A rejected input prints its error code, byte offset,
JSON pointer and message to standard error and exits 1.

Options:
      --reject-precision-loss  Refuse number literals a double cannot hold exactly (the
                               fingerprint's default) instead of rounding them as RFC 8785 does
  -h, --help                   Print this help
";

const FP_HELP: &str = "\
Print the fingerprint a server computes for a request: `v1:<64 hex>` (SHA-256) or
`h1:<64 hex>` (HMAC-SHA256 with --hmac-key-file).

Usage: idempo fingerprint --method M --route R [OPTIONS] [FILE]

Reads the body from FILE, or standard input when FILE is absent or `-`.

Options:
      --method M           HTTP method (upper-cased before hashing)
      --route R            Route template as the server names it, e.g. /payments/{id}
      --header K:V         A request header that takes part; repeatable. Every name given here is
                           added to the fingerprint configuration, as the server must configure it
      --exclude PTR        JSON pointer of a volatile field to leave out, e.g. /client_timestamp;
                           repeatable
      --content-type T     Content-Type of the body (default application/json); a non-JSON type
                           fingerprints the raw bytes
      --hmac-key-file F    Use HMAC-SHA256 with the exact bytes of file F as the key
      --rfc-numbers        Round number literals as RFC 8785 does instead of refusing the ones a
                           double cannot hold exactly
  -h, --help               Print this help

A rejected body or configuration prints its error code and message to standard error, exit 1.
";

const KEY_HELP: &str = "\
Tell whether an Idempotency-Key header value is valid (spec/KEYS.md section 1).

Usage: idempo check-key [OPTIONS] VALUE

VALUE is the header value as sent: the draft form is quoted, e.g. '\"3f6c1e0a-...\"' (an RFC 9651
sf-string, parameters allowed and ignored); the bare form is unquoted printable ASCII without
spaces, quotes or commas. Valid: prints the key, its form and its client header value, exit 0.
Invalid: prints the error code and reason to standard error, exit 1.

Options:
      --strict       Accept only the quoted (draft) form
      --min-len N    Minimum key length (default 8)
      --max-len N    Maximum key length (default 128, at most 255)
  -h, --help         Print this help
";

const SCOPE_HELP: &str = "\
Print the scope id of a key: SHA-256 of the length-prefixed (principal, METHOD, route, key)
framing of spec/KEYS.md section 2, as 64 hex digits. Stores index records by it.

Usage: idempo scope --principal P --method M --route R [OPTIONS] KEY

KEY is an Idempotency-Key header value (either form; see `idempo check-key --help`).

Options:
      --principal P  User, tenant or client the server scopes keys by (may be empty)
      --method M     HTTP method (upper-cased)
      --route R      Route template, e.g. /payments/{id}
      --raw          Take KEY as key text, unvalidated, instead of a header value
      --log-id       Print the short log form (s:<16 hex>) instead of the full id
      --strict       Accept only the quoted form of KEY
      --max-len N    Maximum key length (default 128, at most 255)
  -h, --help         Print this help
";

/// Runs the program on `argv` (without the program name). Returns the exit status.
pub(crate) fn run(
    argv: &[OsString],
    stdin: &mut dyn Read,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    let Some((cmd, rest)) = argv.split_first() else {
        let _ = err.write_all(MAIN_HELP.as_bytes());
        return EXIT_USAGE;
    };
    let (help, result) = match cmd.to_str() {
        Some("-h" | "--help" | "help") => {
            return write_or_fail(out, err, MAIN_HELP.as_bytes());
        }
        Some("-V" | "--version") => {
            let v = format!("idempo {}\n", env!("CARGO_PKG_VERSION"));
            return write_or_fail(out, err, v.as_bytes());
        }
        Some("canonicalize") => (CANON_HELP, canonicalize_cmd(rest, stdin, out, err)),
        Some("fingerprint") => (FP_HELP, fingerprint_cmd(rest, stdin, out, err)),
        Some("check-key") => (KEY_HELP, check_key_cmd(rest, out, err)),
        Some("scope") => (SCOPE_HELP, scope_cmd(rest, out, err)),
        _ => {
            let _ = writeln!(
                err,
                "idempo: unknown command {}; run `idempo --help`",
                shown(cmd)
            );
            return EXIT_USAGE;
        }
    };
    let name = cmd.to_string_lossy();
    match result {
        Ok(Outcome::Help) => write_or_fail(out, err, help.as_bytes()),
        Ok(Outcome::Status(code)) => code,
        Err(Failure::Usage(UsageError(msg))) => {
            let _ = writeln!(
                err,
                "idempo {name}: {msg}\nRun `idempo {name} --help` for usage."
            );
            EXIT_USAGE
        }
        Err(Failure::Io(msg)) => {
            let _ = writeln!(err, "idempo {name}: {msg}");
            EXIT_USAGE
        }
    }
}

/// What a command did when it did not fail on usage or I/O.
enum Outcome {
    /// `--help` was asked for.
    Help,
    /// The command ran; this is its exit status.
    Status(u8),
}

/// A usage or I/O failure (exit 2).
enum Failure {
    Usage(UsageError),
    Io(String),
}

impl From<UsageError> for Failure {
    fn from(e: UsageError) -> Self {
        Failure::Usage(e)
    }
}

fn write_or_fail(out: &mut dyn Write, err: &mut dyn Write, bytes: &[u8]) -> u8 {
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => EXIT_OK,
        Err(e) => {
            let _ = writeln!(err, "idempo: cannot write output: {e}");
            EXIT_USAGE
        }
    }
}

fn emit(out: &mut dyn Write, bytes: &[u8]) -> Result<(), Failure> {
    out.write_all(bytes)
        .and_then(|()| out.flush())
        .map_err(|e| Failure::Io(format!("cannot write output: {e}")))
}

/// Reads FILE, or stdin when there is no positional or it is `-`.
fn read_input(positional: Option<&OsString>, stdin: &mut dyn Read) -> Result<Vec<u8>, Failure> {
    let mut buf = Vec::new();
    match positional {
        Some(p) if p != "-" => {
            buf = std::fs::read(p)
                .map_err(|e| Failure::Io(format!("cannot read {}: {e}", shown(p))))?;
        }
        _ => {
            stdin
                .read_to_end(&mut buf)
                .map_err(|e| Failure::Io(format!("cannot read standard input: {e}")))?;
        }
    }
    Ok(buf)
}

fn report_canon_error(err: &mut dyn Write, e: &CanonError) {
    let _ = writeln!(err, "error: {}", e.kind);
    let _ = writeln!(err, "  code: {}", e.code());
    let _ = writeln!(err, "  offset: {}", e.offset);
    match &e.pointer {
        Some(p) => {
            let _ = writeln!(err, "  pointer: {p:?}");
        }
        None => {
            let _ = writeln!(err, "  pointer: (none)");
        }
    }
}

fn canonicalize_cmd(
    rest: &[OsString],
    stdin: &mut dyn Read,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<Outcome, Failure> {
    let spec = Spec {
        valued: &[],
        flags: &["reject-precision-loss"],
        max_positionals: 1,
    };
    let a = args::parse(rest, &spec)?;
    if a.help {
        return Ok(Outcome::Help);
    }
    let input = read_input(a.positionals.first(), stdin)?;
    let numbers = if a.flag("reject-precision-loss") {
        NumberMode::RejectPrecisionLoss
    } else {
        NumberMode::Rfc
    };
    let opts = CanonOptions {
        numbers,
        ..CanonOptions::default()
    };
    match canonicalize_with(&input, &opts) {
        Ok(bytes) => {
            emit(out, &bytes)?;
            Ok(Outcome::Status(EXIT_OK))
        }
        Err(e) => {
            report_canon_error(err, &e);
            Ok(Outcome::Status(EXIT_REJECTED))
        }
    }
}

fn fingerprint_cmd(
    rest: &[OsString],
    stdin: &mut dyn Read,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<Outcome, Failure> {
    let spec = Spec {
        valued: &[
            "method",
            "route",
            "header",
            "exclude",
            "content-type",
            "hmac-key-file",
        ],
        flags: &["rfc-numbers"],
        max_positionals: 1,
    };
    let a = args::parse(rest, &spec)?;
    if a.help {
        return Ok(Outcome::Help);
    }
    let method = a.required("method")?;
    let route = a.required("route")?;
    let mut headers: Vec<(&str, &str)> = Vec::new();
    for h in a.all("header") {
        let (name, value) = h
            .split_once(':')
            .filter(|(n, _)| !n.trim().is_empty())
            .ok_or_else(|| UsageError(format!("--header needs NAME:VALUE, got {h:?}")))?;
        headers.push((name.trim(), value));
    }
    let mut config = FingerprintConfig {
        header_names: headers.iter().map(|(n, _)| (*n).to_owned()).collect(),
        exclude: a.all("exclude").into_iter().map(str::to_owned).collect(),
        ..FingerprintConfig::default()
    };
    if a.flag("rfc-numbers") {
        config.numbers = NumberMode::Rfc;
    }
    if let Some(path) = a.value("hmac-key-file") {
        let key =
            std::fs::read(path).map_err(|e| Failure::Io(format!("cannot read {path:?}: {e}")))?;
        config.hmac_key = Some(key);
    }
    let body = read_input(a.positionals.first(), stdin)?;
    let parts = RequestParts {
        method,
        route,
        headers: &headers,
        content_type: Some(a.value("content-type").unwrap_or("application/json")),
        body: &body,
    };
    match fingerprint(&parts, &config) {
        Ok(fp) => {
            emit(out, format!("{fp}\n").as_bytes())?;
            Ok(Outcome::Status(EXIT_OK))
        }
        Err(FingerprintError::Body(e)) => {
            report_canon_error(err, &e);
            Ok(Outcome::Status(EXIT_REJECTED))
        }
        Err(e) => {
            let _ = writeln!(err, "error: {e}\n  code: {}", e.code());
            Ok(Outcome::Status(EXIT_REJECTED))
        }
    }
}

/// Key options from `--min-len`, `--max-len` and `--strict`.
fn key_options(a: &args::Parsed) -> Result<KeyOptions, Failure> {
    let d = KeyOptions::default();
    let min = a.number("min-len")?.unwrap_or(d.min_len());
    let max = a.number("max-len")?.unwrap_or(d.max_len());
    let opts = KeyOptions::new(min, max).map_err(|e| UsageError(format!("{e} ({})", e.code())))?;
    Ok(opts.with_strict(a.flag("strict")))
}

/// The raw bytes of an argument (on Unix, exactly as passed; elsewhere its lossy UTF-8 form).
fn arg_bytes(arg: &OsString) -> Vec<u8> {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        arg.as_os_str().as_bytes().to_vec()
    }
    #[cfg(not(unix))]
    {
        arg.to_string_lossy().into_owned().into_bytes()
    }
}

fn check_key_cmd(
    rest: &[OsString],
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<Outcome, Failure> {
    let spec = Spec {
        valued: &["min-len", "max-len"],
        flags: &["strict"],
        max_positionals: 1,
    };
    let a = args::parse(rest, &spec)?;
    if a.help {
        return Ok(Outcome::Help);
    }
    let value = a
        .positionals
        .first()
        .ok_or_else(|| UsageError("VALUE is required".into()))?;
    let opts = key_options(&a)?;
    match parse_key_detailed(&arg_bytes(value), &opts) {
        Ok(p) => {
            let mut text = format!(
                "valid\n  key: {}\n  form: {}\n  length: {}\n  header value: {}\n",
                p.key.as_str(),
                p.form,
                p.key.len(),
                p.key.to_header_value()
            );
            if p.ignored_parameters > 0 {
                text.push_str(&format!("  ignored parameters: {}\n", p.ignored_parameters));
            }
            emit(out, text.as_bytes())?;
            Ok(Outcome::Status(EXIT_OK))
        }
        Err(e) => {
            let _ = writeln!(err, "invalid: {e}\n  code: {}", e.code());
            if let Some(off) = e.offset() {
                let _ = writeln!(err, "  offset: {off}");
            }
            Ok(Outcome::Status(EXIT_REJECTED))
        }
    }
}

fn scope_cmd(
    rest: &[OsString],
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<Outcome, Failure> {
    let spec = Spec {
        valued: &["principal", "method", "route", "min-len", "max-len"],
        flags: &["raw", "log-id", "strict"],
        max_positionals: 1,
    };
    let a = args::parse(rest, &spec)?;
    if a.help {
        return Ok(Outcome::Help);
    }
    let principal = a.required("principal")?;
    let method = a.required("method")?;
    let route = a.required("route")?;
    let key_arg = a
        .positionals
        .first()
        .ok_or_else(|| UsageError("KEY is required".into()))?;
    let id = if a.flag("raw") {
        let key = key_arg
            .to_str()
            .ok_or_else(|| UsageError("with --raw, KEY must be UTF-8 text".into()))?;
        ScopeId::from_parts(principal, method, route, key)
    } else {
        match parse_key_detailed(&arg_bytes(key_arg), &key_options(&a)?) {
            Ok(p) => ScopeId::new(principal, method, route, &p.key),
            Err(e) => {
                let _ = writeln!(err, "invalid key: {e}\n  code: {}", e.code());
                return Ok(Outcome::Status(EXIT_REJECTED));
            }
        }
    };
    let text = if a.flag("log-id") {
        id.log_id()
    } else {
        id.to_hex()
    };
    emit(out, format!("{text}\n").as_bytes())?;
    Ok(Outcome::Status(EXIT_OK))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(argv: &[&str], stdin: &[u8]) -> (u8, String, String) {
        let argv: Vec<OsString> = argv.iter().map(OsString::from).collect();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = run(&argv, &mut &stdin[..], &mut out, &mut err);
        (
            code,
            String::from_utf8(out).expect("utf8"),
            String::from_utf8(err).expect("utf8"),
        )
    }

    #[test]
    fn canonicalize_from_stdin() {
        let (code, out, _) = call(&["canonicalize"], br#"{ "b": 1.50, "a": [true] }"#);
        assert_eq!((code, out.as_str()), (EXIT_OK, r#"{"a":[true],"b":1.5}"#));
        let (code, _, err) = call(&["canonicalize", "-"], br#"{"a":1,"a":2}"#);
        assert_eq!(code, EXIT_REJECTED);
        assert!(
            err.contains("code: duplicate_member") && err.contains("pointer:"),
            "{err}"
        );
    }

    #[test]
    fn fingerprint_matches_core() {
        let body = br#"{"amount":100,"ts":"x"}"#;
        let (code, out, err) = call(
            &[
                "fingerprint",
                "--method",
                "post",
                "--route",
                "/p",
                "--exclude",
                "/ts",
                "--header",
                "X-Tenant: acme",
            ],
            body,
        );
        assert_eq!(code, EXIT_OK, "{err}");
        let cfg = FingerprintConfig {
            header_names: vec!["X-Tenant".into()],
            exclude: vec!["/ts".into()],
            ..FingerprintConfig::default()
        };
        let parts = RequestParts {
            method: "POST",
            route: "/p",
            headers: &[("x-tenant", "acme")],
            content_type: Some("application/json"),
            body: br#"{"amount":100}"#,
        };
        let expect = fingerprint(&parts, &cfg).expect("fp");
        assert_eq!(out, format!("{expect}\n"));
    }

    #[test]
    fn check_key_and_scope() {
        let (code, out, _) = call(&["check-key", "\"abcdefgh\";x=1"], b"");
        assert_eq!(code, EXIT_OK);
        assert!(
            out.contains("key: abcdefgh") && out.contains("ignored parameters: 1"),
            "{out}"
        );
        let (code, _, err) = call(&["check-key", "--strict", "abcdefgh"], b"");
        assert_eq!(code, EXIT_REJECTED);
        assert!(err.contains("bare_form_not_allowed"), "{err}");
        let (code, _, err) = call(&["check-key", "--max-len", "300", "abcdefgh"], b"");
        assert_eq!(code, EXIT_USAGE);
        assert!(err.contains("max_len_too_large"), "{err}");
        let (code, out, _) = call(
            &[
                "scope",
                "--principal",
                "u",
                "--method",
                "post",
                "--route",
                "/r",
                "abcdefgh",
            ],
            b"",
        );
        assert_eq!(code, EXIT_OK);
        assert_eq!(
            out.trim(),
            ScopeId::from_parts("u", "POST", "/r", "abcdefgh").to_hex()
        );
    }

    #[test]
    fn usage_errors_exit_2() {
        assert_eq!(call(&[], b"").0, EXIT_USAGE);
        assert_eq!(call(&["frobnicate"], b"").0, EXIT_USAGE);
        assert_eq!(call(&["fingerprint", "--route", "/p"], b"{}").0, EXIT_USAGE);
        assert_eq!(call(&["check-key"], b"").0, EXIT_USAGE);
        assert_eq!(call(&["canonicalize", "a", "b"], b"").0, EXIT_USAGE);
        assert_eq!(
            call(&["canonicalize", "/nonexistent/file.json"], b"").0,
            EXIT_USAGE
        );
        let (code, out, _) = call(&["scope", "--help"], b"");
        assert_eq!(code, EXIT_OK);
        assert!(out.contains("Usage: idempo scope"));
    }
}
