//! RFC 8785 (JCS) canonical JSON with strict input validation and limits.
//!
//! [`canonicalize`] turns a JSON text into its canonical UTF-8 bytes: members sorted by UTF-16 code
//! units, ECMAScript number serialization, minimal string escaping, no whitespace. The input is
//! read strictly: anything RFC 8259 / I-JSON does not allow is a typed [`CanonError`] naming the
//! byte offset and, where there is one, the JSON Pointer of the value concerned. The normative
//! profile is `spec/CANONICAL.md`.
//!
//! ```
//! use idempo_core::canonical::canonicalize;
//! let out = canonicalize(br#"{ "b": 1.50, "a": [true, "\u0041"] }"#).unwrap();
//! assert_eq!(out, br#"{"a":[true,"A"],"b":1.5}"#);
//! assert_eq!(canonicalize(br#"{"a":1,"\u0061":2}"#).unwrap_err().code(), "duplicate_member");
//! ```
//!
//! # How it works
//! Two paths give the same bytes and the same errors:
//!
//! - **The small-document fast path** (`small.rs`), tried first for inputs up to 1 MiB without
//!   exclusions: one recursive pass (nesting bounded at 48 levels) writes the canonical text
//!   straight into a buffer, sorting each object's members as it closes. It handles the plain
//!   documents request bodies usually are; on anything else (an escaped member name, a
//!   duplicate, a limit, any error) it gives up without output and the full path runs.
//! - **The full path** (`parse.rs`, then `emit.rs`): one iterative pass (no recursion: depth is
//!   bounded by [`Limits::max_depth`] and by memory only, never by the call stack) parses the
//!   input into a flat tape (`tape.rs`). Strings without escapes are borrowed from the input.
//!   Each object's member names are sorted once with an O(n log n) sort using a UTF-16
//!   comparator over UTF-8 bytes (`keys.rs`); duplicates (compared after unescaping) are then
//!   adjacent. A second iterative walk writes the canonical bytes into a [`CanonSink`]: a
//!   `Vec<u8>`, or a hasher through [`DigestSink`] so the fingerprint never materializes the
//!   canonical text. It is the reference the fast path is tested against, and it decides every
//!   error.
//!
//! Both paths share the byte scanners (`scan.rs`), the number reader (`number.rs`), the escape
//! decoder (`escape.rs`) and the member-name order (`keys.rs`).
//!
//! # Errors and their order
//! The parser reports the first error met left to right. Duplicate member names are reported when
//! their object closes (offset: the later of the two names). [`NumberMode::RejectPrecisionLoss`]
//! errors are reported while emitting, after the whole input has been validated. Partial output may
//! have been written to the sink when an error is returned.

mod emit;
mod error;
mod escape;
mod keys;
mod number;
mod parse;
mod pointer;
mod scan;
mod sink;
mod small;
mod tape;

pub use error::{CanonError, CanonErrorKind};
pub use number::format_number;
pub use pointer::{Exclusions, MAX_EXCLUSIONS, PointerError};
pub use sink::{CanonSink, DIGEST_SINK_BUFFER, DigestSink};

/// Size and nesting limits applied before and while parsing.
///
/// The defaults are [`Limits::DEFAULT_MAX_INPUT_BYTES`] (8 MiB), [`Limits::DEFAULT_MAX_DEPTH`] (128)
/// and [`Limits::DEFAULT_MAX_MEMBERS`] (100,000 per object). Depth counts open arrays and objects:
/// `[]` has depth 1, a top-level scalar depth 0. Inputs are also capped at 4 GiB - 2 bytes whatever
/// the configured size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest accepted input, in bytes.
    pub max_input_bytes: usize,
    /// Deepest accepted nesting of arrays and objects.
    pub max_depth: usize,
    /// Most members accepted in one object.
    pub max_members: usize,
}

impl Limits {
    /// Default for [`Limits::max_input_bytes`]: 8 MiB.
    pub const DEFAULT_MAX_INPUT_BYTES: usize = 8 * 1024 * 1024;
    /// Default for [`Limits::max_depth`]: 128.
    pub const DEFAULT_MAX_DEPTH: usize = 128;
    /// Default for [`Limits::max_members`]: 100,000.
    pub const DEFAULT_MAX_MEMBERS: usize = 100_000;
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_input_bytes: Self::DEFAULT_MAX_INPUT_BYTES,
            max_depth: Self::DEFAULT_MAX_DEPTH,
            max_members: Self::DEFAULT_MAX_MEMBERS,
        }
    }
}

/// How number literals that a double cannot hold exactly are treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NumberMode {
    /// RFC 8785: round to the nearest double (`9007199254740993` becomes `9007199254740992`).
    /// The default of [`canonicalize`].
    #[default]
    Rfc,
    /// Accept a literal only when its decimal value equals the value of the shortest round-trip
    /// form of its double (`0.1`, `1.10`, `100`, `1e2`, `-0` pass; `9007199254740993`,
    /// `0.10000000000000001`, `1e-400` and `1152921504606846976` fail with
    /// [`CanonErrorKind::PrecisionLoss`]). Integers of at most 15 digits are always exact. This
    /// makes distinct accepted literals map to distinct outputs. The fingerprint's default.
    RejectPrecisionLoss,
}

/// Options of [`canonicalize_with`] and [`canonicalize_to`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CanonOptions {
    /// Input size, depth and member limits.
    pub limits: Limits,
    /// Number policy; [`NumberMode::Rfc`] by default.
    pub numbers: NumberMode,
}

/// Canonicalize with the default options ([`Limits::default`], [`NumberMode::Rfc`]).
///
/// # Errors
/// A [`CanonError`] for any input RFC 8259 / RFC 8785 rejects or a limit exceeded.
pub fn canonicalize(input: &[u8]) -> Result<Vec<u8>, CanonError> {
    canonicalize_with(input, &CanonOptions::default())
}

/// Canonicalize with explicit options, returning the canonical bytes.
///
/// # Errors
/// A [`CanonError`] for any input RFC 8259 / RFC 8785 rejects or a limit exceeded.
pub fn canonicalize_with(input: &[u8], opts: &CanonOptions) -> Result<Vec<u8>, CanonError> {
    let mut out = Vec::with_capacity(input.len());
    canonicalize_to(input, opts, &mut out)?;
    Ok(out)
}

/// Canonicalize into `sink` without building the output in memory.
///
/// # Errors
/// A [`CanonError`]; the sink may then hold partial output.
pub fn canonicalize_to<S: CanonSink + ?Sized>(
    input: &[u8],
    opts: &CanonOptions,
    sink: &mut S,
) -> Result<(), CanonError> {
    canonicalize_excluding_to(input, opts, &Exclusions::none(), sink)
}

/// Canonicalize into `sink`, leaving out the values that `exclusions` points at.
///
/// Excluded values are validated like every other value but not emitted (see [`Exclusions`]).
///
/// # Errors
/// A [`CanonError`]; the sink may then hold partial output.
pub fn canonicalize_excluding_to<S: CanonSink + ?Sized>(
    input: &[u8],
    opts: &CanonOptions,
    exclusions: &Exclusions,
    sink: &mut S,
) -> Result<(), CanonError> {
    canonicalize_scratch(input, opts, exclusions, sink, &mut Scratch::default())
}

/// A canonicalizer that keeps its working memory between calls: once its vectors have grown it
/// allocates nothing but the output. Results are exactly those of [`canonicalize_with`]; use one
/// per thread (or behind a lock) on hot paths.
///
/// ```
/// use idempo_core::canonical::{CanonOptions, Canonicalizer};
/// let mut c = Canonicalizer::new(CanonOptions::default());
/// let mut out = Vec::new();
/// c.canonicalize_into(br#"{ "b": 1, "a": [2.50] }"#, &mut out).unwrap();
/// assert_eq!(out, br#"{"a":[2.5],"b":1}"#);
/// assert_eq!(c.canonicalize(b"[1,]").unwrap_err().code(), "trailing_comma");
/// ```
#[derive(Default)]
pub struct Canonicalizer {
    opts: CanonOptions,
    scratch: Scratch,
}

impl std::fmt::Debug for Canonicalizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Canonicalizer")
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

impl Canonicalizer {
    /// A canonicalizer with these options.
    #[must_use]
    pub fn new(opts: CanonOptions) -> Self {
        Self {
            opts,
            scratch: Scratch::default(),
        }
    }

    /// The options it applies.
    #[must_use]
    pub fn options(&self) -> &CanonOptions {
        &self.opts
    }

    /// Canonicalize `input` into a new vector, as [`canonicalize_with`] does.
    ///
    /// # Errors
    /// A [`CanonError`] for any input RFC 8259 / RFC 8785 rejects or a limit exceeded.
    pub fn canonicalize(&mut self, input: &[u8]) -> Result<Vec<u8>, CanonError> {
        let mut out = Vec::with_capacity(input.len());
        self.canonicalize_into(input, &mut out)?;
        Ok(out)
    }

    /// Append the canonical form of `input` to `out`. On error `out` is left as it was.
    ///
    /// # Errors
    /// A [`CanonError`] for any input RFC 8259 / RFC 8785 rejects or a limit exceeded.
    pub fn canonicalize_into(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<(), CanonError> {
        let at = out.len();
        let result = canonicalize_scratch(
            input,
            &self.opts,
            &Exclusions::none(),
            out,
            &mut self.scratch,
        );
        if result.is_err() {
            out.truncate(at);
        }
        result
    }

    /// Canonicalize into `sink`, leaving out what `exclusions` points at (see
    /// [`canonicalize_excluding_to`]).
    ///
    /// # Errors
    /// A [`CanonError`]; the sink may then hold partial output.
    pub fn canonicalize_to<S: CanonSink + ?Sized>(
        &mut self,
        input: &[u8],
        exclusions: &Exclusions,
        sink: &mut S,
    ) -> Result<(), CanonError> {
        canonicalize_scratch(input, &self.opts, exclusions, sink, &mut self.scratch)
    }
}

/// Working memory of the canonicalizer, reusable from call to call: a caller that keeps one
/// (the fingerprinter does) allocates nothing per call once its vectors have grown. It holds no
/// state between calls that could change a result.
#[derive(Default)]
pub(crate) struct Scratch {
    parse: parse::ParseScratch,
    emit: emit::EmitScratch,
    small: small::SmallScratch,
}

/// [`canonicalize_excluding_to`] with reusable working memory.
#[inline]
pub(crate) fn canonicalize_scratch<S: CanonSink + ?Sized>(
    input: &[u8],
    opts: &CanonOptions,
    exclusions: &Exclusions,
    sink: &mut S,
    scratch: &mut Scratch,
) -> Result<(), CanonError> {
    // Small plain documents: one pass without a tape (it gives up, writing nothing, on
    // anything it does not handle, errors included).
    if exclusions.is_empty() && scratch.small.canonicalize(input, opts, sink) {
        return Ok(());
    }
    canonicalize_full(input, opts, exclusions, sink, scratch)
}

/// The full parser and emitter, for every input (the fast path's reference).
pub(crate) fn canonicalize_full<S: CanonSink + ?Sized>(
    input: &[u8],
    opts: &CanonOptions,
    exclusions: &Exclusions,
    sink: &mut S,
    scratch: &mut Scratch,
) -> Result<(), CanonError> {
    let tape = parse::parse_with(input, &opts.limits, opts.numbers, &mut scratch.parse)?;
    let result = emit::emit(&tape, opts.numbers, exclusions, sink, &mut scratch.emit);
    scratch.parse.recycle(tape);
    result
}

/// Check that `input` is acceptable (including the number policy) without producing output.
///
/// # Errors
/// The [`CanonError`] that [`canonicalize_with`] would return.
pub fn validate(input: &[u8], opts: &CanonOptions) -> Result<(), CanonError> {
    struct Discard;
    impl CanonSink for Discard {
        fn write(&mut self, _bytes: &[u8]) {}
    }
    canonicalize_to(input, opts, &mut Discard)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(s: &str) -> String {
        String::from_utf8(canonicalize(s.as_bytes()).expect("valid")).expect("utf8")
    }

    fn code(s: &[u8]) -> (&'static str, usize, Option<String>) {
        let e = canonicalize(s).expect_err("must fail");
        (e.code(), e.offset, e.pointer)
    }

    #[test]
    fn basics() {
        assert_eq!(canon(" 1 "), "1");
        assert_eq!(canon("-0"), "0");
        assert_eq!(canon("-0.0"), "0");
        assert_eq!(canon("\"\\u00e9\\n\\u001f/\\/\""), "\"\u{e9}\\n\\u001f//\"");
        assert_eq!(
            canon("[1e21, 1E-7, 0.000001, 56.0]"),
            "[1e+21,1e-7,0.000001,56]"
        );
        assert_eq!(
            canon("{\"b\":{\"d\":1,\"c\":2},\"a\":[]}"),
            "{\"a\":[],\"b\":{\"c\":2,\"d\":1}}"
        );
        assert_eq!(canon("9007199254740993"), "9007199254740992");
        assert_eq!(canon("{}"), "{}");
        assert_eq!(canon("\"\u{FFFF}\u{FDD0}\""), "\"\u{FFFF}\u{FDD0}\"");
    }

    #[test]
    fn rejections() {
        assert_eq!(code(b"{\"a\":1,\"\\u0061\":2}").0, "duplicate_member");
        assert_eq!(
            code(b"{\"x\":{\"a\":1,\"a\":2}}"),
            ("duplicate_member", 12, Some("/x/a".into()))
        );
        assert_eq!(code(b"[1, ]"), ("trailing_comma", 2, Some("".into())));
        assert_eq!(
            code(b"{\"a\":{\"b\":1,}}"),
            ("trailing_comma", 11, Some("/a".into()))
        );
        assert_eq!(code(b"\xEF\xBB\xBF1").0, "byte_order_mark");
        assert_eq!(code(b"[\"\xED\xA0\x80\"]").0, "lone_surrogate");
        assert_eq!(
            code(b"[\"\\uDC00\\uD800\"]"),
            ("lone_surrogate", 2, Some("/0".into()))
        );
        assert_eq!(code(b"[\"\xff\"]").0, "invalid_utf8");
        assert_eq!(code(b"01").0, "leading_zero");
        assert_eq!(code(b"+1").0, "invalid_number");
        assert_eq!(code(b".5").0, "invalid_number");
        assert_eq!(code(b"1.").0, "invalid_number");
        assert_eq!(code(b"NaN").0, "non_finite_number");
        assert_eq!(code(b"-Infinity").0, "non_finite_number");
        assert_eq!(code(b"1e400").0, "number_out_of_range");
        assert_eq!(code(b"1 2"), ("trailing_data", 2, None));
        assert_eq!(code(b"[1]//c").0, "comment");
        assert_eq!(code(b"[\x0c1]").0, "invalid_whitespace");
        assert_eq!(code(b"\"a\x01\"").0, "control_character");
        assert_eq!(code(b"").0, "unexpected_end");
        assert_eq!(code(b"tru").0, "invalid_literal");
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        let deep = "[".repeat(100_000);
        let e = canonicalize(deep.as_bytes()).expect_err("too deep");
        assert_eq!(e.code(), "depth_limit");
        assert_eq!(e.offset, 128);
        let ok = format!("{}{}", "[".repeat(128), "]".repeat(128));
        assert_eq!(canon(&ok), ok);
        let opts = CanonOptions {
            limits: Limits {
                max_depth: 200_000,
                ..Limits::default()
            },
            ..CanonOptions::default()
        };
        let huge = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(
            canonicalize_with(huge.as_bytes(), &opts).expect("deep ok"),
            huge.as_bytes()
        );
    }

    #[test]
    fn precision_mode() {
        let opts = CanonOptions {
            numbers: NumberMode::RejectPrecisionLoss,
            ..CanonOptions::default()
        };
        let e = canonicalize_with(b"{\"a\":[1,9007199254740993]}", &opts).expect_err("loss");
        assert_eq!(
            (e.code(), e.offset, e.pointer.as_deref()),
            ("precision_loss", 8, Some("/a/1"))
        );
        assert!(canonicalize_with(b"[0.1,1.10,100,1e2,-0]", &opts).is_ok());
    }

    /// The verbatim fast path for plain decimals must agree with parse + ES6 format.
    #[test]
    fn fixed_fast_path_agrees_with_formatter() {
        let ints = [
            "0",
            "-0",
            "1",
            "-7",
            "12",
            "999999999999999",
            "123456789012345",
            "100",
            "1000000000000000",
            "9007199254740991",
            "9007199254740992",
            "9007199254740993",
            "-9007199254740992",
            "9999999999999999",
            "1234567890123456",
        ];
        let fracs = [
            "",
            ".0",
            ".000",
            ".5",
            ".50",
            ".000001",
            ".0000001",
            ".00000123",
            ".1234567890123",
            ".12345678901234567",
            ".000010",
            ".999999999999999",
            ".100000000000000",
        ];
        let strict = CanonOptions {
            numbers: NumberMode::RejectPrecisionLoss,
            ..CanonOptions::default()
        };
        for i in ints {
            for f in fracs {
                let lit = format!("{i}{f}");
                let v: f64 = lit.parse().expect("number");
                let want = format_number(v).expect("finite");
                assert_eq!(canon(&lit), want, "{lit}");
                let exact = number::literal_is_exact(lit.as_bytes(), &want);
                assert_eq!(
                    canonicalize_with(lit.as_bytes(), &strict).is_ok(),
                    exact,
                    "{lit}"
                );
            }
        }
    }

    /// Number literals on the edges of the fast paths (digits written without a double, the
    /// one-pass reader, the 15-digit rule) print like parse + ES6 format, and strict mode
    /// accepts exactly the literals whose value equals that form.
    #[test]
    fn number_edges_agree_with_formatter() {
        let lits = [
            "9007199254740991",
            "9007199254740992",
            "9007199254740993",
            "-9007199254740993",
            "999999999999999",
            "1000000000000000",
            "999999999999999e6",
            "1e20",
            "1e21",
            "999999999999999900000",
            "1e-6",
            "1e-7",
            "0.0000001",
            "1.5e-7",
            "-0",
            "-0e0",
            "0e-5",
            "-0.0e+3",
            "1.50e1",
            "1.500000000000000000000",
            "12345678901234.5e0",
            "123456789012345e-20",
            "1E+2",
            "1e+0",
            "5e-324",
            "1e-306",
            "1e-307",
            "1e-308",
            "2.2250738585072014e-308",
            "1e308",
            "1.7976931348623157e308",
            "100e-2",
            "0.00000000000000000000000000000000000000000000000000000000001234",
            "0.1000000000000000055511151231257827",
            "123456789012345678901234567890",
            "1e0000001",
            "0.10000000000000001",
            "4.35",
            "-7.6186e25",
            "9.9e-7",
            "99e19",
            "1.0e-0",
            "7e-1",
        ];
        let strict = CanonOptions {
            numbers: NumberMode::RejectPrecisionLoss,
            ..CanonOptions::default()
        };
        for lit in lits {
            let v: f64 = lit.parse().expect("number");
            let want = format_number(v).expect("finite");
            assert_eq!(canon(lit), want, "{lit}");
            assert_eq!(canon(&format!("[{lit}]")), format!("[{want}]"), "{lit}");
            assert_eq!(
                canonicalize_with(lit.as_bytes(), &strict).is_ok(),
                number::literal_is_exact(lit.as_bytes(), &want),
                "{lit}"
            );
        }
        assert_eq!(code(b"1e309").0, "number_out_of_range");
        assert_eq!(code(b"-1e400").0, "number_out_of_range");
    }

    /// Escaped strings are re-escaped minimally whatever the position of the characters that
    /// need it (runs are copied in blocks): checked against a byte-by-byte reference.
    #[test]
    fn escaping_matches_reference() {
        fn reference(text: &str) -> String {
            let mut out = String::from("\"");
            for c in text.chars() {
                match c {
                    '"' => out.push_str("\\\""),
                    '\\' => out.push_str("\\\\"),
                    '\u{8}' => out.push_str("\\b"),
                    '\t' => out.push_str("\\t"),
                    '\n' => out.push_str("\\n"),
                    '\u{c}' => out.push_str("\\f"),
                    '\r' => out.push_str("\\r"),
                    c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                    c => out.push(c),
                }
            }
            out.push('"');
            out
        }
        for pad in 0..12 {
            for code in (0u32..0x80).chain([0xe9, 0x4e2d, 0x1F600]) {
                let c = char::from_u32(code).expect("scalar");
                let text = format!("{}{c}{}{c}", "a".repeat(pad), "\u{e9}b".repeat(pad));
                let escaped: String = text
                    .chars()
                    .map(|c| format!("\\u{:04x}", c as u32))
                    .collect::<Vec<_>>()
                    .join("");
                let input = if (c as u32) < 0x10000 {
                    format!("\"{escaped}\"")
                } else {
                    // Surrogate pairs for the emoji.
                    let mut units = [0u16; 2];
                    let mut e = String::new();
                    for ch in text.chars() {
                        for u in ch.encode_utf16(&mut units) {
                            e.push_str(&format!("\\u{:04x}", u));
                        }
                    }
                    format!("\"{e}\"")
                };
                assert_eq!(canon(&input), reference(&text), "{input}");
            }
        }
    }

    /// `\u` escapes decode to the right UTF-8 over the whole code space (either hex case,
    /// surrogate pairs), and malformed ones are refused.
    #[test]
    fn unicode_escapes_decode() {
        // Control characters are covered by `escaping_matches_reference`.
        let mut cp = 0x20u32;
        while cp <= 0x10_FFFF {
            if let Some(c) = char::from_u32(cp) {
                let mut units = [0u16; 2];
                let esc: String = c
                    .encode_utf16(&mut units)
                    .iter()
                    .map(|u| format!("\\u{u:04X}"))
                    .collect();
                let want = match c {
                    '"' => "\"\\\"\"".to_owned(),
                    '\\' => "\"\\\\\"".to_owned(),
                    c => format!("\"{c}\""),
                };
                assert_eq!(canon(&format!("\"{esc}\"")), want, "{cp:x}");
                assert_eq!(
                    canon(&format!("\"{}\"", esc.to_lowercase())),
                    want,
                    "{cp:x}"
                );
            }
            cp += if cp < 0x800 { 1 } else { 61 };
        }
        for bad in [
            r#""\u00g1""#,
            r#""\u00G1""#,
            r#""\u 123""#,
            r#""\u12""#,
            r#""\u-123""#,
        ] {
            let e = canonicalize(bad.as_bytes()).expect_err(bad);
            assert!(
                matches!(e.code(), "invalid_escape" | "unexpected_end"),
                "{bad}"
            );
        }
    }

    /// A kept canonicalizer gives the results of the free functions, call after call, errors
    /// included, and leaves nothing in `out` on error.
    #[test]
    fn kept_canonicalizer_matches_free_functions() {
        let inputs: [&[u8]; 7] = [
            br#"[{"long_member_name":1,"another_long_name":2},{"long_member_name":3,"another_long_name":4}]"#,
            br#"[{"another_long_name":1,"long_member_name":2}]"#,
            br#"{"b":"\u00e9\n","a":[1e2,-0,0.1,123456789.123456789]}"#,
            b"[1,",
            br#"{"a":1,"a":2}"#,
            br#"[[{"q":1,"p":2}],[{"q":3,"p":4}]]"#,
            b"  \"x\"  ",
        ];
        for opts in [
            CanonOptions::default(),
            CanonOptions {
                numbers: NumberMode::RejectPrecisionLoss,
                ..CanonOptions::default()
            },
        ] {
            let mut c = Canonicalizer::new(opts);
            for _ in 0..2 {
                for input in inputs {
                    let mut out = b"prefix".to_vec();
                    let got = c.canonicalize_into(input, &mut out);
                    let want = canonicalize_with(input, &opts);
                    match (&got, &want) {
                        (Ok(()), Ok(w)) => assert_eq!(&out[6..], &w[..]),
                        (Err(a), Err(b)) => {
                            assert_eq!(a, b);
                            assert_eq!(out, b"prefix");
                        }
                        _ => panic!("{input:?}: {got:?} vs {want:?}"),
                    }
                    assert_eq!(c.canonicalize(input), want);
                }
            }
        }
    }

    /// Members, arrays and roots copied as input runs must print exactly like the general path.
    #[test]
    fn verbatim_runs() {
        for (input, want) in [
            (r#"{"a":1,"b":[1,"x",null]}"#, r#"{"a":1,"b":[1,"x",null]}"#),
            (r#"{"b":-0,"a":1.50}"#, r#"{"a":1.5,"b":0}"#),
            (
                r#"{"b":[1,[2,-0]],"a":[[]]}"#,
                r#"{"a":[[]],"b":[1,[2,0]]}"#,
            ),
            (
                r#"{"b":{"d":1,"c":2},"a":{"x":"\u0041"}}"#,
                r#"{"a":{"x":"A"},"b":{"c":2,"d":1}}"#,
            ),
            (r#"{"\u0062":1,"a":2}"#, r#"{"a":2,"b":1}"#),
            (
                r#"[{"b":1,"a":2},{"a":1,"b":2},[1e2,true]]"#,
                r#"[{"a":2,"b":1},{"a":1,"b":2},[100,true]]"#,
            ),
            (r#"{"a":1,"b":2}  "#, r#"{"a":1,"b":2}"#),
            (r#" {"a": 1,"b":2}"#, r#"{"a":1,"b":2}"#),
            (r#"{"a":[1, 2],"b":{"c" :3}}"#, r#"{"a":[1,2],"b":{"c":3}}"#),
            (
                r#"{"a":-0.5,"b":0.000001,"c":1E2}"#,
                r#"{"a":-0.5,"b":0.000001,"c":100}"#,
            ),
            (
                "[\"\u{e9}\",{\"\u{e9}\":\"\u{1F600}\"}]",
                "[\"\u{e9}\",{\"\u{e9}\":\"\u{1F600}\"}]",
            ),
        ] {
            assert_eq!(canon(input), want, "{input}");
            let mut again = Vec::new();
            canonicalize_to(want.as_bytes(), &CanonOptions::default(), &mut again).expect("valid");
            assert_eq!(again, want.as_bytes(), "{want}");
        }
    }

    /// Objects nested in arrays share the per-depth shape cache: repeats, changes and
    /// duplicates after a cached shape must all come out right.
    #[test]
    fn string_arrays() {
        assert_eq!(
            canon(r#"{"u":[["x"],"y"],"t":["b","a"]}"#),
            r#"{"t":["b","a"],"u":[["x"],"y"]}"#
        );
        assert_eq!(
            canon("[\"a\",\"b\\n\", \"c\",1,{\"k\":\"v\"},\"\u{e9}\"]"),
            "[\"a\",\"b\\n\",\"c\",1,{\"k\":\"v\"},\"\u{e9}\"]"
        );
        assert_eq!(
            code(br#"["a","b\q"]"#),
            ("invalid_escape", 7, Some("/1".into()))
        );
        assert_eq!(
            code(br#"["a","b",]"#),
            ("trailing_comma", 8, Some("".into()))
        );
        assert_eq!(
            code(br#"{"k":["a","b""#),
            ("unexpected_end", 13, Some("/k/1".into()))
        );
        assert_eq!(
            code(br#"["a","b"x]"#),
            ("unexpected_character", 8, Some("/1".into()))
        );
        assert_eq!(
            code(b"[\"a\",\"\x01\"]"),
            ("control_character", 6, Some("/1".into()))
        );
    }

    #[test]
    fn repeated_shapes() {
        assert_eq!(
            canon(
                r#"[{"m":{"b":1,"a":2}},{"m":{"b":3,"a":4}},{"m":{"a":5,"b":6}},{"m":{"c":7,"b":8}}]"#
            ),
            r#"[{"m":{"a":2,"b":1}},{"m":{"a":4,"b":3}},{"m":{"a":5,"b":6}},{"m":{"b":8,"c":7}}]"#
        );
        assert_eq!(
            code(br#"[{"m":{"b":1,"a":2}},{"m":{"b":1,"b":2}}]"#),
            ("duplicate_member", 33, Some("/1/m/b".into()))
        );
        assert_eq!(
            code(
                br#"[{"m":{"abcdefghij":1,"abcdefghiJ":2}},{"m":{"abcdefghij":1,"abcdefghij":2}}]"#
            )
            .0,
            "duplicate_member"
        );
        assert_eq!(
            canon(
                r#"[{"abcdefghiz":1,"abcdefghia":2},{"abcdefghiy":3,"abcdefghia":4},{"abcdefghiy":5,"abcdefghia":6}]"#
            ),
            r#"[{"abcdefghia":2,"abcdefghiz":1},{"abcdefghia":4,"abcdefghiy":3},{"abcdefghia":6,"abcdefghiy":5}]"#
        );
        assert_eq!(
            canon(r#"[{"b":1,"a":2},{"b":3,"\u0061":4},{"b":5,"ab":6},{"b":7,"a":8,"c":9}]"#),
            r#"[{"a":2,"b":1},{"a":4,"b":3},{"ab":6,"b":5},{"a":8,"b":7,"c":9}]"#
        );
    }

    #[test]
    fn exclusions() {
        let ex = Exclusions::new(["/ts", "/items/0", "/items/1/trace"]).expect("valid");
        let mut out = Vec::new();
        canonicalize_excluding_to(
            br#"{"ts":1,"items":[{"a":1},{"trace":"x","b":2}],"z":0}"#,
            &CanonOptions::default(),
            &ex,
            &mut out,
        )
        .expect("valid");
        assert_eq!(out, br#"{"items":[{"b":2}],"z":0}"#);
    }
}
