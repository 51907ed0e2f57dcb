//! Property tests for the canonicalizer, with `serde_json_canonicalizer` 0.4 (output bytes) and
//! `serde_json` (values) as independent oracles.

use std::fmt::Write as _;

use idempo_core::canonical::{
    CanonOptions, NumberMode, canonicalize, canonicalize_with, format_number,
};
use proptest::prelude::*;
use proptest::test_runner::TestRng;
use serde_json::{Map, Number, Value};

/// Integers stay within ±(2^53 − 1) so `serde_json`'s u64/i64 and the double agree exactly.
fn arb_number() -> impl Strategy<Value = Value> {
    prop_oneof![
        (-(1i64 << 53) + 1..(1i64 << 53)).prop_map(Value::from),
        (-1000i64..1000).prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| Number::from_f64(f).map_or(Value::Null, Value::Number)),
        (-1e6f64..1e6).prop_map(|f| Number::from_f64(f).map_or(Value::Null, Value::Number)),
    ]
}

fn arb_key() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-e]{0,3}",
        any::<String>(),
        proptest::collection::vec(
            prop_oneof![
                Just('a'),
                Just('\u{e9}'),
                Just('\u{FB33}'),
                Just('\u{FFFF}'),
                Just('\u{E000}'),
                Just('\u{1F600}'),
                Just('\u{10000}'),
                Just('\n'),
                Just('"'),
                Just('\\'),
            ],
            0..4
        )
        .prop_map(|v| v.into_iter().collect()),
    ]
}

fn arb_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        arb_number(),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(5, 64, 8, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            proptest::collection::vec((arb_key(), inner), 0..8)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<String, Value>>())),
        ]
    })
}

/// Write `v` as JSON text with shuffled members, random whitespace and random escaping.
fn write_json(v: &Value, rng: &mut TestRng, out: &mut String) {
    let ws = |rng: &mut TestRng, out: &mut String| {
        for _ in 0..rng.random_range(0..3u8) {
            out.push([' ', '\n', '\t', '\r'][rng.random_range(0..4usize)]);
        }
    };
    ws(rng, out);
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            if let Some(f) = n.as_f64().filter(|_| n.is_f64()) {
                // Several spellings of the same decimal value as the ES6 form. (Other shortest
                // spellings exist on exact ties, e.g. Rust's `{:e}` gives 1549363236687059.3 for
                // the double ES6 prints 1549363236687059.2; strict mode rightly refuses those.)
                let es6 = format_number(f).expect("finite");
                match rng.random_range(0..4u8) {
                    0 => out.push_str(&es6),
                    1 => out.push_str(&scientific(&es6, 'e', "")),
                    2 => out.push_str(&scientific(&es6, 'E', "+")),
                    _ => {
                        let mut t = scientific(&es6, 'e', "");
                        if let Some(i) = t.find('e') {
                            t.insert_str(i, if t[..i].contains('.') { "000" } else { ".000" });
                        }
                        out.push_str(&t);
                    }
                }
            } else {
                out.push_str(&n.to_string());
            }
        }
        Value::String(s) => write_string(s, rng, out),
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_json(x, rng, out);
            }
            ws(rng, out);
            out.push(']');
        }
        Value::Object(m) => {
            let mut items: Vec<_> = m.iter().collect();
            // Fisher-Yates with the test's own RNG.
            for i in (1..items.len()).rev() {
                items.swap(i, rng.random_range(0..=i));
            }
            out.push('{');
            for (i, (k, x)) in items.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                ws(rng, out);
                write_string(k, rng, out);
                ws(rng, out);
                out.push(':');
                write_json(x, rng, out);
            }
            ws(rng, out);
            out.push('}');
        }
    }
    ws(rng, out);
}

fn write_string(s: &str, rng: &mut TestRng, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        let must = c < ' ' || c == '"' || c == '\\';
        if must || rng.random_range(0..5u8) == 0 {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                let _ = write!(out, "\\u{u:04x}");
            }
        } else {
            out.push(c);
        }
    }
    out.push('"');
}

/// The same decimal value as `es6`, written as `d.ddd<e><sign>n`.
fn scientific(es6: &str, e: char, plus: &str) -> String {
    let (neg, digits, exp) = decimal_value(es6);
    if digits.is_empty() {
        return format!("0{e}0");
    }
    let point = exp + digits.len() as i64 - 1;
    let mut out = String::new();
    if neg {
        out.push('-');
    }
    out.push_str(&digits[..1]);
    if digits.len() > 1 {
        out.push('.');
        out.push_str(&digits[1..]);
    }
    let sign = if point < 0 { "-" } else { plus };
    let _ = write!(out, "{e}{sign}{}", point.abs());
    out
}

/// Structural equality with numbers compared as doubles (so `-0.0` equals `0`).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

fn text(v: &Value, seed: u64) -> String {
    let mut rng = TestRng::from_seed(proptest::test_runner::RngAlgorithm::ChaCha, &{
        let mut s = [0u8; 32];
        s[..8].copy_from_slice(&seed.to_le_bytes());
        s
    });
    let mut out = String::new();
    write_json(v, &mut rng, &mut out);
    out
}

/// Exact decimal value of a JSON number literal, as (negative, digits, exponent) with no leading
/// or trailing zeros; zero is ("", 0). Written independently of the library's normalizer.
fn decimal_value(lit: &str) -> (bool, String, i64) {
    let neg = lit.starts_with('-');
    let body = lit.trim_start_matches('-');
    let (mant, exp) = match body.find(['e', 'E']) {
        Some(i) => (&body[..i], body[i + 1..].parse::<i64>().expect("exponent")),
        None => (body, 0),
    };
    let (int, frac) = mant.split_once('.').unwrap_or((mant, ""));
    let digits = format!("{int}{frac}");
    let mut e = exp - frac.len() as i64;
    let trimmed = digits.trim_start_matches('0');
    let t2 = trimmed.trim_end_matches('0');
    e += (trimmed.len() - t2.len()) as i64;
    if t2.is_empty() {
        (false, String::new(), 0)
    } else {
        (neg, t2.to_owned(), e)
    }
}

fn strict() -> CanonOptions {
    CanonOptions {
        numbers: NumberMode::RejectPrecisionLoss,
        ..CanonOptions::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(384))]

    #[test]
    fn matches_oracle_and_is_stable(v in arb_value(), s1 in any::<u64>(), s2 in any::<u64>()) {
        let a = text(&v, s1);
        let b = text(&v, s2);
        let ca = canonicalize(a.as_bytes()).map_err(|e| TestCaseError::fail(format!("{e}: {a}")))?;
        // Independent oracle for the bytes.
        let oracle = serde_json_canonicalizer::to_vec(&v).expect("oracle");
        prop_assert_eq!(String::from_utf8_lossy(&ca), String::from_utf8_lossy(&oracle));
        // Invariant under member order, whitespace and escaping.
        let cb = canonicalize(b.as_bytes()).expect("valid");
        prop_assert_eq!(&ca, &cb);
        // Idempotent.
        prop_assert_eq!(canonicalize(&ca).expect("canonical re-parses"), ca.clone());
        // Parses back to the same value.
        let back: Value = serde_json::from_slice(&ca).expect("serde_json parses the output");
        prop_assert!(same(&back, &v), "value changed: {}", String::from_utf8_lossy(&ca));
        // Values written by a shortest-round-trip formatter are exact: strict mode agrees.
        let strict_out = canonicalize_with(a.as_bytes(), &strict()).expect("exact numbers pass");
        prop_assert_eq!(strict_out, ca);
    }

    #[test]
    fn number_literals(
        neg in any::<bool>(),
        int in "(0|[1-9][0-9]{0,24})",
        frac in proptest::option::of("[0-9]{1,20}"),
        exp in proptest::option::of((prop_oneof![Just("e"), Just("E")], prop_oneof![Just(""), Just("+"), Just("-")], 0u32..340)),
    ) {
        let mut lit = String::new();
        if neg { lit.push('-'); }
        lit.push_str(&int);
        if let Some(f) = &frac { lit.push('.'); lit.push_str(f); }
        if let Some((e, sign, n)) = &exp { let _ = write!(lit, "{e}{sign}{n}"); }
        let v: f64 = lit.parse().expect("grammar-valid literal");
        match canonicalize(lit.as_bytes()) {
            Ok(out) => {
                prop_assert!(v.is_finite());
                let want = format_number(v).expect("finite");
                prop_assert_eq!(String::from_utf8_lossy(&out), want.clone(), "literal {}", lit);
                let exact = decimal_value(&lit) == decimal_value(&want);
                let strict_res = canonicalize_with(lit.as_bytes(), &strict());
                prop_assert_eq!(strict_res.is_ok(), exact, "literal {}", lit);
                if let Ok(s) = &strict_res {
                    prop_assert_eq!(s, &out, "literal {}", lit);
                }
                if let Err(e) = strict_res {
                    prop_assert_eq!(e.code(), "precision_loss");
                    prop_assert_eq!(e.offset, 0);
                }
            }
            Err(e) => {
                prop_assert!(!v.is_finite(), "{} rejected: {}", lit, e);
                prop_assert_eq!(e.code(), "number_out_of_range");
            }
        }
    }

    /// Strict mode's literal fast path (16-17 digit shortest forms printed from the literal)
    /// against the formatter: the shortest form of a double in everyday ranges, written in
    /// fixed or scientific notation, with padding zeros, or with its last digit moved.
    #[test]
    fn long_shortest_forms_in_every_notation(
        unit in 0.0f64..1.0,
        scale in -9i32..24,
        neg in any::<bool>(),
        form in 0u8..6,
        pad in 0usize..4,
    ) {
        let v = if neg { -unit } else { unit } * 10f64.powi(scale);
        let es6 = format_number(v).expect("finite");
        let lit = match form {
            0 => es6.clone(),
            1 => scientific(&es6, 'e', "+"),
            2 => scientific(&es6, 'E', ""),
            3 if es6.contains('.') && !es6.contains('e') => format!("{es6}{}", "0".repeat(pad + 1)),
            4 | 5 => {
                // Move the last non-zero digit up or down: usually not the shortest form.
                let mut b = es6.clone().into_bytes();
                let end = es6.find('e').unwrap_or(es6.len());
                if let Some(p) = b[..end].iter().rposition(|c| (b'1'..=b'8').contains(c)) {
                    b[p] = if form == 4 { b[p] + 1 } else { b[p] - 1 };
                }
                String::from_utf8(b).expect("ascii")
            }
            _ => es6.clone(),
        };
        let x: f64 = lit.parse().expect("literal");
        let rfc = canonicalize(lit.as_bytes()).expect("finite literal");
        prop_assert_eq!(String::from_utf8_lossy(&rfc), format_number(x).expect("finite"));
        let exact = decimal_value(&lit) == decimal_value(&format_number(x).expect("finite"));
        match canonicalize_with(lit.as_bytes(), &strict()) {
            Ok(out) => {
                prop_assert!(exact, "inexact literal {} accepted", lit);
                prop_assert_eq!(out, rfc.clone(), "literal {}", lit);
            }
            Err(e) => {
                prop_assert!(!exact, "exact literal {} refused: {}", lit, e);
                prop_assert_eq!(e.code(), "precision_loss");
            }
        }
        // Inside an array, next to other members: the same text.
        let doc = format!("[{lit},{lit}]");
        if let Ok(out) = canonicalize_with(doc.as_bytes(), &strict()) {
            prop_assert_eq!(out, [b"[".as_slice(), &rfc, b",", &rfc, b"]"].concat());
        }
    }

    #[test]
    fn any_double_round_trips(bits in any::<u64>()) {
        let v = f64::from_bits(bits);
        prop_assume!(v.is_finite());
        let s = format_number(v).expect("finite");
        let out = canonicalize_with(s.as_bytes(), &strict()).expect("shortest form is exact");
        prop_assert_eq!(&out, s.as_bytes());
        let back: f64 = s.parse().expect("number");
        prop_assert_eq!(back.to_bits(), if v == 0.0 { 0 } else { v.to_bits() });
        // Appending a far digit makes the literal inexact: strict mode must refuse it.
        let sci = format!("{v:e}");
        let (m, e) = sci.split_once('e').expect("exponent");
        let longer = if m.contains('.') { format!("{m}00000000000000000001e{e}") } else { format!("{m}.00000000000000000001e{e}") };
        if v != 0.0 {
            let err = canonicalize_with(longer.as_bytes(), &strict()).expect_err("inexact");
            prop_assert_eq!(err.code(), "precision_loss");
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        match canonicalize(&bytes) {
            Ok(out) => {
                // Whatever is accepted is valid JSON for serde_json too, and a fixed point.
                prop_assert!(serde_json::from_slice::<Value>(&out).is_ok());
                prop_assert_eq!(canonicalize(&out).expect("fixed point"), out);
            }
            Err(e) => prop_assert!(e.offset <= bytes.len()),
        }
    }
}

#[test]
fn wide_object_is_fast_and_sorted() {
    // 50,000 members in reverse order: must be well under a second (no quadratic sort).
    let mut s = String::from("{");
    for i in (0..50_000).rev() {
        if i != 49_999 {
            s.push(',');
        }
        let _ = write!(s, "\"k{i:06}\":{i}");
    }
    s.push('}');
    let start = std::time::Instant::now();
    let out = canonicalize(s.as_bytes()).expect("valid");
    let took = start.elapsed();
    println!("50,000-member object ({} bytes): {took:?}", s.len());
    let v: Value = serde_json::from_slice(&out).expect("json");
    assert_eq!(v.as_object().map(Map::len), Some(50_000));
    assert!(out.starts_with(b"{\"k000000\":0,\"k000001\":1,"));
}
