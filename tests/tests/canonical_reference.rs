//! RFC 8785 reference data (cyberphone testdata, Appendix B, ES6 number file), read at run time
//! from `../shared/vectors/jcs` (or `$IDEMPO_JCS_VECTORS`). Skipped with a notice when absent.

use std::fs;
use std::path::Path;

use idempo_core::canonical::{canonicalize, format_number};

fn read(dir: &Path, rel: &str) -> Vec<u8> {
    fs::read(dir.join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

fn from_hex_text(text: &str) -> Vec<u8> {
    text.split_whitespace()
        .map(|h| u8::from_str_radix(h, 16).expect("hex pair"))
        .collect()
}

#[test]
fn input_output_pairs() {
    let Some(dir) = idempo_tests::shared_jcs_dir() else {
        return;
    };
    let names = [
        "arrays",
        "french",
        "structures",
        "unicode",
        "values",
        "weird",
    ];
    for name in names {
        let input = read(&dir, &format!("input/{name}.json"));
        let expected = read(&dir, &format!("output/{name}.json"));
        let hex = String::from_utf8(read(&dir, &format!("outhex/{name}.txt"))).expect("utf8");
        assert_eq!(
            from_hex_text(&hex),
            expected,
            "{name}: outhex agrees with output"
        );
        let got = canonicalize(&input).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&expected),
            "{name}"
        );
        assert_eq!(got, expected, "{name}: bytes");
        // Canonical output is a fixed point.
        assert_eq!(
            canonicalize(&got).expect("canonical re-parses"),
            got,
            "{name}"
        );
    }
    println!("checked {} input/output pairs", names.len());
}

/// Checks `format(bits) == expected` and that parsing `expected` gives the same bits back
/// (+0 for -0), through the canonicalizer's own parser.
fn check_number(hex: &str, expected: &str, ctx: &str) {
    let bits = u64::from_str_radix(hex, 16).unwrap_or_else(|e| panic!("{ctx}: {e}"));
    let v = f64::from_bits(bits);
    let got = format_number(v).unwrap_or_else(|e| panic!("{ctx}: {e}"));
    assert_eq!(got, expected, "{ctx}: format of {hex}");
    // Parse back through the canonicalizer: the canonical form is a fixed point, and its
    // double is the original (compare via the std parser on the canonical output).
    let canon = canonicalize(expected.as_bytes()).unwrap_or_else(|e| panic!("{ctx}: {e}"));
    assert_eq!(
        canon,
        expected.as_bytes(),
        "{ctx}: canonical re-parse of {expected}"
    );
    let back: f64 = expected.parse().expect("number");
    let want = if v == 0.0 { 0.0f64 } else { v };
    assert_eq!(
        back.to_bits(),
        want.to_bits(),
        "{ctx}: parse-back of {expected}"
    );
}

#[test]
fn appendix_b() {
    let Some(dir) = idempo_tests::shared_jcs_dir() else {
        return;
    };
    let text = String::from_utf8(read(&dir, "es6numbers/rfc8785-appendix-b.csv")).expect("utf8");
    let mut rows = 0;
    let mut errors = 0;
    for (i, line) in text.lines().enumerate().skip(1) {
        if line.trim().is_empty() {
            continue;
        }
        let mut parts = line.splitn(3, ',');
        let hex = parts.next().expect("hex");
        let expected = parts.next().expect("expected");
        let ctx = format!("appendix-b line {}", i + 1);
        rows += 1;
        if expected == "ERROR" {
            // NaN and Infinity have no JSON spelling, so they can only reach the formatter
            // directly; it must refuse them (RFC 8785 §3.2.2.3).
            let v = f64::from_bits(u64::from_str_radix(hex, 16).expect("hex"));
            assert!(!v.is_finite(), "{ctx}");
            let e = format_number(v).expect_err("non-finite must be rejected");
            assert_eq!(e.code(), "non_finite_number", "{ctx}");
            errors += 1;
        } else {
            check_number(hex, expected, &ctx);
        }
    }
    assert_eq!(rows, 26, "Appendix B has 26 rows");
    assert_eq!(errors, 2, "two ERROR rows");
    println!("checked {rows} Appendix B rows ({errors} rejected)");
}

#[test]
fn es6_numbers_first_20000() {
    let Some(dir) = idempo_tests::shared_jcs_dir() else {
        return;
    };
    let text =
        String::from_utf8(read(&dir, "es6numbers/es6testfile-first20000.txt")).expect("utf8");
    let mut n = 0;
    for (i, line) in text.lines().enumerate() {
        let (hex, expected) = line.split_once(',').expect("hex,expected");
        check_number(hex, expected, &format!("es6 line {}", i + 1));
        n += 1;
    }
    assert_eq!(n, 20_000);
    // All lines again as one JSON array through the full canonicalizer.
    let mut arr = String::from("[");
    let mut want = String::from("[");
    for (i, line) in text.lines().enumerate() {
        let (_, expected) = line.split_once(',').expect("pair");
        if i > 0 {
            arr.push_str(" , ");
            want.push(',');
        }
        arr.push_str(expected);
        want.push_str(expected);
    }
    arr.push(']');
    want.push(']');
    assert_eq!(
        canonicalize(arr.as_bytes()).expect("array"),
        want.as_bytes()
    );
    println!("checked {n} ES6 number lines");
}
