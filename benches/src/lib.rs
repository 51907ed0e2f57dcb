//! Benchmark support for idempo: deterministic JSON bodies (no randomness at run time, a fixed
//! xorshift sequence) and a small timing helper for the summary report.
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// A fixed pseudo-random sequence (xorshift64*), so every run benchmarks identical bytes.
#[derive(Debug, Clone)]
pub struct Seq(u64);

impl Seq {
    /// Start the sequence from `seed` (any value; 0 is mapped to a fixed non-zero state).
    #[must_use]
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// Next 64-bit value.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A value in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

const WORDS: &[&str] = &[
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet",
    "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango",
];

fn word(s: &mut Seq) -> &'static str {
    WORDS[s.below(WORDS.len() as u64) as usize]
}

/// A payment request of about 200 bytes, pretty-printed with members out of order.
#[must_use]
pub fn tiny() -> Vec<u8> {
    br#"{
  "currency": "EUR",
  "amount": 12.5,
  "customer": {"id": "cus_8f3a2b", "email": "ada@example.com"},
  "description": "Order #18452, 3 items",
  "capture": true,
  "metadata": {"cart": "c-771", "channel": "ios"}
}"#
    .to_vec()
}

fn record(s: &mut Seq, i: u64, out: &mut String) {
    let _ = write!(
        out,
        "{{\"sku\":\"{}-{}\",\"qty\":{},\"price\":{}.{:02},\"name\":\"{} {}\",\"tags\":[\"{}\",\"{}\"],\"active\":{},\"meta\":{{\"z\":{},\"a\":\"{}\",\"m\":null}},\"id\":{}}}",
        word(s),
        s.below(100_000),
        s.below(20) + 1,
        s.below(1000),
        s.below(100),
        word(s),
        word(s),
        word(s),
        word(s),
        s.below(2) == 0,
        s.below(1_000_000),
        word(s),
        i
    );
}

fn records(target: usize, seed: u64) -> Vec<u8> {
    let mut s = Seq::new(seed);
    let mut out = String::with_capacity(target + 256);
    out.push_str("{\"order_id\":\"ord_1\",\"items\":[");
    let mut i = 0;
    while out.len() < target.saturating_sub(64) {
        if i > 0 {
            out.push(',');
        }
        record(&mut s, i, &mut out);
        i += 1;
    }
    out.push_str("],\"total\":1234.5,\"currency\":\"EUR\"}");
    out.into_bytes()
}

/// An order with line items, about 4 KB.
#[must_use]
pub fn medium() -> Vec<u8> {
    records(4 * 1024, 2)
}

/// An order with many line items, about 1 MB.
#[must_use]
pub fn large() -> Vec<u8> {
    records(1024 * 1024, 3)
}

/// About 256 KB of numbers: integers, decimals, exponents, negative values.
#[must_use]
pub fn numbers() -> Vec<u8> {
    let mut s = Seq::new(4);
    let mut out = String::from("{\"series\":[");
    let mut i = 0;
    while out.len() < 256 * 1024 {
        if i > 0 {
            out.push(',');
        }
        let _ = match s.below(4) {
            0 => write!(out, "{}", s.below(1 << 40)),
            1 => write!(out, "{}.{}", s.below(10_000), s.below(1_000_000)),
            2 => write!(out, "-{}.{}e{}", s.below(10), s.below(100_000), s.below(40)),
            _ => write!(out, "{}", f64::from_bits(s.next_u64() >> 2) / 1e10),
        };
        i += 1;
    }
    out.push_str("]}");
    out.into_bytes()
}

/// About 256 KB of non-ASCII text (accents, CJK, emoji) and escapes, in many keyed objects.
#[must_use]
pub fn unicode() -> Vec<u8> {
    const TEXT: &[&str] = &[
        "café crème",
        "naïve façade",
        "日本語のテキスト",
        "中文字符",
        "emoji 😀🎉",
        "Ελληνικά",
        "кириллица",
        "tab\\tnew\\nline",
        "quote \\\" slash \\\\",
        "\\u00e9\\u4e2d\\ud83d\\ude00",
    ];
    let mut s = Seq::new(5);
    let mut out = String::from("[");
    let mut i = 0;
    while out.len() < 256 * 1024 {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(
            out,
            "{{\"ключ\":\"{}\",\"名前\":\"{}\",\"דּ\":{},\"😀\":\"{}\"}}",
            TEXT[s.below(TEXT.len() as u64) as usize],
            TEXT[s.below(TEXT.len() as u64) as usize],
            i,
            TEXT[s.below(TEXT.len() as u64) as usize]
        );
        i += 1;
    }
    out.push(']');
    out.into_bytes()
}

/// Character ranges of the unicode-heavy bodies: supplementary planes (surrogate pairs in UTF-16)
/// next to U+E000-U+FFFF, where UTF-16 order and code-point order disagree, and other scripts.
const RANGES: &[(u32, u32)] = &[
    (0x1F300, 0x1F64F),
    (0x1D400, 0x1D7FF),
    (0x20000, 0x2A6DF),
    (0xE000, 0xF8FF),
    (0xFB00, 0xFDCF),
    (0xFF01, 0xFFEF),
    (0x4E00, 0x9FFF),
    (0x0400, 0x04FF),
    (0x00C0, 0x024F),
    (0x0370, 0x03FF),
    (0x0590, 0x05FF),
    (0x0041, 0x007A),
];

/// `n` characters from one range of [`RANGES`], sometimes followed by text that needs escaping.
fn unicode_text(s: &mut Seq, n: usize) -> String {
    let (lo, hi) = RANGES[s.below(RANGES.len() as u64) as usize];
    let mut out: String = (0..n)
        .filter_map(|_| char::from_u32(lo + s.below(u64::from(hi - lo + 1)) as u32))
        .collect();
    if s.below(100) < 15 {
        const TAILS: &[&str] = &[
            "\"quoted\"",
            "\\path",
            "line\nbreak",
            "\t",
            "\u{2028}",
            "\u{1}",
            " ascii text",
        ];
        out.push_str(TAILS[s.below(TAILS.len() as u64) as usize]);
    }
    out
}

/// A JSON string literal of `text`: non-ASCII raw (as `JSON.stringify` writes it) or, with
/// `ascii`, every non-ASCII character a `\u` escape and supplementary ones surrogate pairs (as
/// Python's default `json.dumps` writes it).
fn json_string(text: &str, ascii: bool, out: &mut String) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || (ascii && !c.is_ascii()) => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{u:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// About 160 KB (`ascii`: about 330 KB) of records and one large object whose member names and
/// values mix supplementary characters with U+E000-U+FFFF, other scripts and escapes: the
/// unicode-heavy shape of issue 17 (the same shape as `evidence/bench/bodies.py` writes).
fn unicode_heavy(ascii: bool) -> Vec<u8> {
    let mut s = Seq::new(17);
    let mut out = String::from("{\"items\": [");
    for i in 0..400u64 {
        if i > 0 {
            out.push_str(", ");
        }
        // Names that start with a supplementary character sort before U+E000-U+FFFF in UTF-16,
        // after them by code point.
        let member = |name: &str, out: &mut String, first: bool| {
            if !first {
                out.push_str(", ");
            }
            json_string(name, ascii, out);
            out.push_str(": ");
        };
        out.push('{');
        member("\u{1F600} mood", &mut out, true);
        json_string(&unicode_text(&mut s, 6), ascii, &mut out);
        member("\u{FF3A}one", &mut out, false);
        json_string(&unicode_text(&mut s, 12), ascii, &mut out);
        member("\u{1D518}\u{1D52B}\u{1D526}", &mut out, false);
        out.push('[');
        json_string(&unicode_text(&mut s, 4), ascii, &mut out);
        out.push_str(", ");
        json_string(&unicode_text(&mut s, 8), ascii, &mut out);
        let _ = write!(out, ", {i}]");
        member("\u{E000}private", &mut out, false);
        json_string(&unicode_text(&mut s, 20), ascii, &mut out);
        member("\u{540d}\u{524d}", &mut out, false);
        json_string(&unicode_text(&mut s, 10), ascii, &mut out);
        member("\u{43a}\u{43b}\u{44e}\u{447}", &mut out, false);
        out.push('{');
        member("\u{FB33}", &mut out, true);
        json_string(&unicode_text(&mut s, 3), ascii, &mut out);
        member("\u{20000}", &mut out, false);
        json_string(&unicode_text(&mut s, 5), ascii, &mut out);
        member("z", &mut out, false);
        let _ = write!(out, "{}}}", i * 7);
        member("id", &mut out, false);
        let _ = write!(out, "{i}}}");
    }
    // One large object of distinct names (no repeated shape to reuse).
    out.push_str("], \"index\": {");
    let mut seen = std::collections::HashSet::new();
    while seen.len() < 600 {
        let n = 1 + s.below(6) as usize;
        let name = unicode_text(&mut s, n);
        if !seen.insert(name.clone()) {
            continue;
        }
        if seen.len() > 1 {
            out.push_str(", ");
        }
        json_string(&name, ascii, &mut out);
        out.push_str(": ");
        let n = 2 + s.below(11) as usize;
        json_string(&unicode_text(&mut s, n), ascii, &mut out);
    }
    out.push_str("}}");
    out.into_bytes()
}

/// The unicode-heavy body written as UTF-8 (about 160 KB).
#[must_use]
pub fn unicode_raw() -> Vec<u8> {
    unicode_heavy(false)
}

/// The unicode-heavy body with every non-ASCII character escaped (about 330 KB).
#[must_use]
pub fn unicode_escaped() -> Vec<u8> {
    unicode_heavy(true)
}

/// The benchmark bodies, by name.
#[must_use]
pub fn bodies() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("tiny", tiny()),
        ("medium", medium()),
        ("large", large()),
        ("numbers", numbers()),
        ("unicode", unicode()),
        ("uni-raw", unicode_raw()),
        ("uni-esc", unicode_escaped()),
    ]
}

/// Run `f` repeatedly for about `budget` (after a short warm-up) and return the time per call of
/// the fastest of about 20 batches. On a shared machine the fastest batch is the one least
/// disturbed by other work, so it is the steadiest estimate of the code's own speed.
pub fn time_per_call(budget: Duration, mut f: impl FnMut()) -> Duration {
    let warm = Instant::now();
    let mut calls: u32 = 0;
    while warm.elapsed() < budget / 10 || calls == 0 {
        f();
        calls += 1;
    }
    // Calls per batch so that a batch lasts about budget / 20.
    let per_call = warm.elapsed() / calls;
    let batch = ((budget / 20).as_nanos() / per_call.as_nanos().max(1)).clamp(1, 1 << 20) as u32;
    let mut best = Duration::MAX;
    let start = Instant::now();
    while start.elapsed() < budget || best == Duration::MAX {
        let t = Instant::now();
        for _ in 0..batch {
            f();
        }
        best = best.min(t.elapsed() / batch);
    }
    best
}

/// Print the summary table: for each body, raw SHA-256 of its bytes (the limit), `canonicalize`
/// and `fingerprint` throughput in MB/s, the fingerprint time, and the fingerprint's share of the
/// SHA-256 throughput. Figures only; nothing is asserted.
///
/// # Errors
/// A message if a body is refused (it never is: the bodies are generated valid).
pub fn print_report(budget: Duration) -> Result<(), String> {
    use idempo_core::canonical::canonicalize;
    use idempo_core::fingerprint::{FingerprintConfig, Fingerprinter, RequestParts};
    use sha2::{Digest, Sha256};
    use std::hint::black_box;

    let fp = Fingerprinter::new(&FingerprintConfig::default()).map_err(|e| e.to_string())?;
    println!(
        "{:<8} {:>9} {:>12} {:>12} {:>12} {:>12} {:>10}",
        "body", "bytes", "sha256 MB/s", "canon MB/s", "fp MB/s", "fp time", "fp/sha256"
    );
    for (name, body) in bodies() {
        let mb = body.len() as f64 / 1e6;
        let parts = RequestParts::json("POST", "/orders/{id}", &body);
        fp.fingerprint(&parts).map_err(|e| format!("{name}: {e}"))?;
        let sha = time_per_call(budget, || {
            black_box(Sha256::digest(black_box(&body)));
        });
        let canon = time_per_call(budget, || {
            black_box(canonicalize(black_box(&body)).ok());
        });
        let fpt = time_per_call(budget, || {
            black_box(fp.fingerprint(black_box(&parts)).ok());
        });
        let rate = |d: Duration| mb / d.as_secs_f64();
        println!(
            "{:<8} {:>9} {:>12.0} {:>12.0} {:>12.0} {:>12} {:>9.1}%",
            name,
            body.len(),
            rate(sha),
            rate(canon),
            rate(fpt),
            format!("{fpt:.2?}"),
            100.0 * sha.as_secs_f64() / fpt.as_secs_f64()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_valid_and_deterministic() {
        for (name, body) in bodies() {
            let v: serde_json::Value =
                serde_json::from_slice(&body).unwrap_or_else(|e| panic!("{name} is not JSON: {e}"));
            assert!(!v.is_null());
            assert_eq!(
                body,
                bodies()
                    .into_iter()
                    .find(|(n, _)| *n == name)
                    .expect("same name")
                    .1
            );
        }
        assert!((150..400).contains(&tiny().len()));
        assert!((3_000..6_000).contains(&medium().len()));
        assert!(large().len() > 1_000_000);
    }
}
