//! The command line as an operator meets it: help, version, usage errors and exit codes.
use std::process::{Command, Output};

fn gateway(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idempo-gateway"))
        .args(args)
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn help_goes_to_stdout_and_succeeds() {
    for flag in ["--help", "-h", "help"] {
        let out = gateway(&[flag]);
        assert_eq!(out.status.code(), Some(0), "{flag}");
        let help = text(&out.stdout);
        assert!(help.contains("check-config FILE"), "{flag}: {help}");
        assert!(help.contains("serve --config FILE"), "{flag}: {help}");
        assert!(out.stderr.is_empty(), "{flag}");
    }
}

#[test]
fn version_names_the_crate_version() {
    for flag in ["--version", "-V"] {
        let out = gateway(&[flag]);
        assert_eq!(out.status.code(), Some(0), "{flag}");
        assert_eq!(
            text(&out.stdout).trim(),
            format!("idempo-gateway {}", env!("CARGO_PKG_VERSION"))
        );
    }
}

#[test]
fn a_usage_error_prints_the_usage_on_stderr_with_exit_2() {
    for args in [&[][..], &["serve"], &["serve", "--config"], &["frobnicate"]] {
        let out = gateway(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            text(&out.stderr).starts_with("usage: idempo-gateway"),
            "{args:?}"
        );
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn a_missing_file_is_exit_2_and_names_the_file() {
    let out = gateway(&["check-config", "/nonexistent/idempo-gateway.toml"]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("/nonexistent/idempo-gateway.toml"), "{err}");
    let out = gateway(&["serve", "-c", "/nonexistent/idempo-gateway.toml"]);
    assert_eq!(out.status.code(), Some(2));
}
