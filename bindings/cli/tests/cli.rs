#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]
//! Runs the built `idempo` binary as a user would: exit codes, stdout/stderr, files and stdin.
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use idempo_core::canonical::canonicalize;
use idempo_core::fingerprint::{FingerprintConfig, RequestParts, fingerprint};
use idempo_core::scope::ScopeId;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("..")
}

fn idempo(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_idempo"))
        .args(args)
        .current_dir(root())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn idempo");
    {
        let mut pipe = child.stdin.take().expect("stdin");
        if let Some(bytes) = stdin {
            // A command that refuses its arguments exits without reading stdin: a broken pipe
            // here is that exit racing the write, not a failure (the status is asserted below).
            match pipe.write_all(bytes) {
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
                other => other.expect("write stdin"),
            }
        }
    }
    child.wait_with_output().expect("wait")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

const PAYMENT: &str = "spec/examples/payment.json";

#[test]
fn canonicalize_file_and_stdin() {
    let body = std::fs::read(root().join(PAYMENT)).expect("example body");
    let expect = canonicalize(&body).expect("core canonicalizes");
    let o = idempo(&["canonicalize", PAYMENT], None);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(o.stdout, expect);
    let o = idempo(&["canonicalize"], Some(&body));
    assert_eq!(o.stdout, expect);
    let o = idempo(&["canonicalize", "-"], Some(&body));
    assert_eq!(o.stdout, expect);
}

#[test]
fn canonicalize_rejections_report_code_offset_pointer() {
    let o = idempo(&["canonicalize"], Some(br#"{"a":{"b":1,"b":2}}"#));
    assert_eq!(o.status.code(), Some(1));
    assert!(o.stdout.is_empty());
    let err = text(&o.stderr);
    assert!(err.contains("code: duplicate_member"), "{err}");
    assert!(err.contains("offset: 12"), "{err}");
    assert!(err.contains("pointer: \"/a/b\""), "{err}");
    let o = idempo(
        &["canonicalize", "--reject-precision-loss"],
        Some(b"[9007199254740993]"),
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("precision_loss"));
    let o = idempo(&["canonicalize"], Some(b"[9007199254740993]"));
    assert_eq!(o.stdout, b"[9007199254740992]");
}

#[test]
fn fingerprint_demo_command_matches_core() {
    let o = idempo(
        &[
            "fingerprint",
            "--method",
            "POST",
            "--route",
            "/payments",
            "--exclude",
            "/client_timestamp",
            PAYMENT,
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let body = std::fs::read(root().join(PAYMENT)).expect("body");
    let cfg = FingerprintConfig {
        exclude: vec!["/client_timestamp".into()],
        ..FingerprintConfig::default()
    };
    let expect = fingerprint(&RequestParts::json("POST", "/payments", &body), &cfg).expect("fp");
    assert_eq!(text(&o.stdout), format!("{expect}\n"));
    assert!(text(&o.stdout).starts_with("v1:"));
    // Excluding the volatile field makes a changed timestamp irrelevant.
    let changed = text(&body).replace("2026-11-30T07:00:00Z", "2031-01-01T00:00:00Z");
    let o2 = idempo(
        &[
            "fingerprint",
            "--method",
            "post",
            "--route",
            "/payments",
            "--exclude",
            "/client_timestamp",
        ],
        Some(changed.as_bytes()),
    );
    assert_eq!(o2.stdout, o.stdout);
}

#[test]
fn fingerprint_headers_hmac_and_content_type() {
    let dir = std::env::temp_dir().join(format!("idempo-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp");
    let key_file = dir.join("hmac.key");
    std::fs::write(&key_file, b"server-secret").expect("write key");
    let key_path = key_file.to_str().expect("utf8 path");
    let body = br#"{"amount":5}"#;
    let args = [
        "fingerprint",
        "--method",
        "POST",
        "--route",
        "/p/{id}",
        "--header",
        "X-Tenant:  acme ",
        "--hmac-key-file",
        key_path,
    ];
    let o = idempo(&args, Some(body));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let cfg = FingerprintConfig {
        header_names: vec!["X-Tenant".into()],
        hmac_key: Some(b"server-secret".to_vec()),
        ..FingerprintConfig::default()
    };
    let parts = RequestParts {
        method: "POST",
        route: "/p/{id}",
        headers: &[("X-Tenant", "acme")],
        content_type: Some("application/json"),
        body,
    };
    assert_eq!(
        text(&o.stdout),
        format!("{}\n", fingerprint(&parts, &cfg).expect("fp"))
    );
    assert!(text(&o.stdout).starts_with("h1:"));
    // A non-JSON content type hashes raw bytes: invalid JSON is then fine.
    let o = idempo(
        &[
            "fingerprint",
            "--method",
            "PUT",
            "--route",
            "/f",
            "--content-type",
            "text/plain",
        ],
        Some(b"not json"),
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    // An empty HMAC key file is a configuration error.
    std::fs::write(&key_file, b"").expect("write key");
    let o = idempo(&args, Some(body));
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("empty_hmac_key"),
        "{}",
        text(&o.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn check_key_valid_and_invalid() {
    let o = idempo(
        &["check-key", "\"3f6c1e0a-77c4-4b2e-9d7e-5b1f2c9a0d11\""],
        None,
    );
    assert_eq!(o.status.code(), Some(0));
    let out = text(&o.stdout);
    assert!(
        out.starts_with("valid\n") && out.contains("key: 3f6c1e0a-77c4-4b2e-9d7e-5b1f2c9a0d11"),
        "{out}"
    );
    assert!(out.contains("form: sf_string"), "{out}");
    let o = idempo(
        &[
            "check-key",
            "--strict",
            "3f6c1e0a-77c4-4b2e-9d7e-5b1f2c9a0d11",
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("code: bare_form_not_allowed"));
    let o = idempo(&["check-key", "--max-len", "10", "abcdefghijk"], None);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("code: too_long"));
    let o = idempo(&["check-key", "--min-len", "0", "abcdefghijk"], None);
    assert_eq!(o.status.code(), Some(2));
}

#[cfg(unix)]
#[test]
fn check_key_non_utf8_argument_is_escaped() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let o = Command::new(env!("CARGO_BIN_EXE_idempo"))
        .arg("check-key")
        .arg(OsStr::from_bytes(b"abcd\xff\x1b[31mefgh"))
        .output()
        .expect("run");
    assert_eq!(o.status.code(), Some(1));
    let err = o.stderr;
    assert!(
        !err.contains(&0xff) && !err.contains(&0x1b),
        "raw bytes echoed: {:?}",
        text(&err)
    );
    assert!(text(&err).contains("\\xff"));
}

#[test]
fn check_key_agrees_with_the_key_vectors() {
    let path = root().join("spec/vectors/key/parse.json");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("vectors")).expect("json");
    let mut checked = 0;
    for case in doc["cases"].as_array().expect("cases") {
        let Some(input) = case["input"].as_str() else {
            continue;
        };
        // argv cannot carry NUL; those cases are covered by the core tests.
        if input.contains('\0') {
            continue;
        }
        let o = &case["options"];
        let mut args = vec!["check-key".to_owned()];
        args.push(format!("--min-len={}", o["min_len"]));
        args.push(format!("--max-len={}", o["max_len"]));
        if o["strict"].as_bool() == Some(true) {
            args.push("--strict".into());
        }
        args.push("--".into());
        args.push(input.to_owned());
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = idempo(&argv, None);
        let name = case["name"].as_str().expect("name");
        match case["expect"]["error"].as_str() {
            Some(code) => {
                assert_eq!(out.status.code(), Some(1), "{name}");
                assert!(
                    text(&out.stderr).contains(&format!("code: {code}")),
                    "{name}: {}",
                    text(&out.stderr)
                );
            }
            None => {
                assert_eq!(out.status.code(), Some(0), "{name}: {}", text(&out.stderr));
                let key = case["expect"]["key"].as_str().expect("key");
                assert!(
                    text(&out.stdout).contains(&format!("  key: {key}\n")),
                    "{name}"
                );
            }
        }
        checked += 1;
    }
    assert!(checked >= 60, "{checked}");
}

#[test]
fn scope_prints_the_core_scope_id() {
    let o = idempo(
        &[
            "scope",
            "--principal",
            "user_42",
            "--method",
            "post",
            "--route",
            "/payments",
            "3f6c1e0a-77c4-4b2e-9d7e-5b1f2c9a0d11",
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    // The `basic` scope vector.
    assert_eq!(
        text(&o.stdout),
        "3e4b3b77d1e3f14f6ebdc9a00a5a1861ccd30f502cf3daaded4cf47031de2676\n"
    );
    let o = idempo(
        &[
            "scope",
            "--principal",
            "",
            "--method",
            "POST",
            "--route",
            "/x",
            "--raw",
            "k",
        ],
        None,
    );
    assert_eq!(
        text(&o.stdout).trim(),
        ScopeId::from_parts("", "POST", "/x", "k").to_hex()
    );
    let o = idempo(
        &[
            "scope",
            "--principal",
            "u",
            "--method",
            "POST",
            "--route",
            "/x",
            "--log-id",
            "\"abcdefgh\"",
        ],
        None,
    );
    assert_eq!(
        text(&o.stdout).trim(),
        ScopeId::from_parts("u", "POST", "/x", "abcdefgh").log_id()
    );
    let o = idempo(
        &[
            "scope",
            "--principal",
            "u",
            "--method",
            "POST",
            "--route",
            "/x",
            "short",
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(1));
    let o = idempo(
        &["scope", "--method", "POST", "--route", "/x", "abcdefgh"],
        None,
    );
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn help_and_usage_errors() {
    for cmd in ["canonicalize", "fingerprint", "check-key", "scope"] {
        let o = idempo(&[cmd, "--help"], None);
        assert_eq!(o.status.code(), Some(0), "{cmd}");
        assert!(
            text(&o.stdout).contains(&format!("Usage: idempo {cmd}")),
            "{cmd}"
        );
    }
    let o = idempo(&["--help"], None);
    assert_eq!(o.status.code(), Some(0));
    assert!(text(&o.stdout).contains("check-key"));
    for args in [
        &[][..],
        &["nope"][..],
        &["canonicalize", "--bogus"][..],
        &["fingerprint", "--method"][..],
        &[
            "fingerprint",
            "--method",
            "POST",
            "--route",
            "/p",
            "--header",
            "novalue",
        ][..],
        &["canonicalize", "/definitely/not/here.json"][..],
    ] {
        let o = idempo(args, Some(b"{}"));
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(o.stdout.is_empty(), "{args:?}");
        assert!(!o.stderr.is_empty(), "{args:?}");
    }
}
