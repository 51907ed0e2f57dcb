//! The strict, iterative JSON parser: input bytes to a flat tape.
//!
//! One pass over the input builds a `Vec<Node>`; strings without escapes are borrowed (a range of
//! the input), others are unescaped once into one shared buffer. Each object's member keys are
//! sorted by an O(n log n) sort when the object closes; duplicates are then adjacent.

use std::cmp::Ordering;

use super::error::{CanonError, CanonErrorKind as K};
use super::number::{
    Num, decimal_to_f64, es6_from_literal, literal_is_shortest, read_literal_digits,
    write_es6_digits,
};
use super::pointer::push_token;
use super::{Limits, NumberMode};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tag {
    Null,
    True,
    False,
    /// A number whose canonical form is `input[a..a + b]` (a prefix of its literal; `-0` is
    /// written `0`): integers of at most 15 digits, and plain decimals of at most 15 significant
    /// digits at or above 1e-6, which are exact and print as themselves minus trailing zeros.
    Int,
    /// Other number. `a` = start, `b` = length, `c` = index into `nums`.
    Float,
    /// A number of at most 15 significant digits well inside the normal range, whose canonical
    /// form was written from its digits: `strbuf[a..a + b]` (exact, no precision check needed).
    /// `c` = start of the literal.
    NumText,
    /// String without escapes. `a` = first content byte, `b` = length in the input.
    Str,
    /// Unescaped string. `a` = start, `b` = length in `strbuf`, `c` = offset of the opening quote.
    StrOwned,
    /// Array. `a` = offset of `[`, `b` = index of the node after the array's subtree.
    Array,
    /// Object. `a` = first index in `members`, `b` = index after the subtree, `c` = member count.
    Object,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Node {
    pub(crate) tag: Tag,
    /// Verbatim: the canonical form is a run of the input. On a member's key node (`Str`):
    /// `"name":value` is `input[a - 1..c]`. On an `Array`: the array is `input[a..c]`.
    pub(crate) v: bool,
    pub(crate) a: u32,
    pub(crate) b: u32,
    pub(crate) c: u32,
}

/// The parsed document: a flat arena the emitter walks without recursion.
pub(crate) struct Tape<'a> {
    pub(crate) input: &'a [u8],
    pub(crate) nodes: Vec<Node>,
    /// Per object, its member key node indices in canonical (UTF-16) order; value = key + 1.
    pub(crate) members: Vec<u32>,
    pub(crate) strbuf: Vec<u8>,
    pub(crate) nums: Vec<Num>,
    /// When the root value's canonical form is a run of the input: that run's start and end.
    pub(crate) root: Option<(u32, u32)>,
}

impl Tape<'_> {
    /// The unescaped bytes of a string node.
    #[inline]
    pub(crate) fn str_bytes(&self, n: Node) -> &[u8] {
        let (a, b) = (n.a as usize, n.b as usize);
        match n.tag {
            Tag::StrOwned | Tag::NumText => self.strbuf.get(a..a + b).unwrap_or(&[]),
            _ => self.input.get(a..a + b).unwrap_or(&[]),
        }
    }

    /// The literal text of a number node.
    #[inline]
    pub(crate) fn literal(&self, n: Node) -> &[u8] {
        let (a, b) = (n.a as usize, n.b as usize);
        self.input.get(a..a + b).unwrap_or(&[])
    }

    /// Byte offset where a string node starts (its opening quote).
    pub(crate) fn str_offset(&self, n: Node) -> usize {
        match n.tag {
            Tag::StrOwned => n.c as usize,
            _ => (n.a as usize).saturating_sub(1),
        }
    }

    /// Node `i`; indices come from the parser itself, so they are always in range.
    #[inline]
    pub(crate) fn node(&self, i: u32) -> Node {
        self.nodes[i as usize]
    }

    /// True when a borrowed member name is followed directly by `:` in the input, so that
    /// `"name":` is one run of input bytes.
    #[inline]
    pub(crate) fn colon_follows(&self, n: Node) -> bool {
        self.input.get((n.a + n.b) as usize + 1) == Some(&b':')
    }
}

/// Compare two UTF-8 strings by their UTF-16 code units (RFC 8785 §3.2.3).
///
/// Byte order equals code point order; it differs from UTF-16 order only where a supplementary
/// character (4-byte lead F0–F4, surrogates D800–DBFF in UTF-16) meets U+E000–U+FFFF (lead EE or
/// EF) at the first differing position, where the result is inverted.
#[inline]
pub(crate) fn cmp_utf16(a: &[u8], b: &[u8]) -> Ordering {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        None => a.len().cmp(&b.len()),
        Some(i) => {
            let (x, y) = (a[i], b[i]);
            if x >= 0xF0 && (y == 0xEE || y == 0xEF) {
                Ordering::Less
            } else if y >= 0xF0 && (x == 0xEE || x == 0xEF) {
                Ordering::Greater
            } else {
                x.cmp(&y)
            }
        }
    }
}

/// The first 8 bytes of a key, big-endian, zero-padded: compares like the bytes themselves.
#[inline]
fn key_prefix(key: &[u8]) -> u64 {
    if let Some(head) = key.first_chunk::<8>() {
        return u64::from_be_bytes(*head);
    }
    slow_prefix(key)
}

/// The prefix of a borrowed key starting at `input[a]` with `len` bytes: one unaligned load
/// when the input extends 8 bytes past the key start (it always holds the closing quote).
#[inline]
fn borrowed_prefix(input: &[u8], a: usize, len: usize) -> u64 {
    match input.get(a..a + 8) {
        Some(chunk) => {
            let mut w = [0u8; 8];
            w.copy_from_slice(chunk);
            let v = u64::from_be_bytes(w);
            if len >= 8 {
                v
            } else {
                v & !(u64::MAX >> (8 * len))
            }
        }
        None => slow_prefix(input.get(a..a + len.min(8)).unwrap_or(&[])),
    }
}

fn slow_prefix(key: &[u8]) -> u64 {
    let mut v = 0u64;
    for (i, &b) in key.iter().enumerate() {
        v |= u64::from(b) << (56 - 8 * i);
    }
    v
}

/// Order two key prefixes (made by [`utf16_sortable`]) by UTF-16 code units; `Equal` means
/// "decide on the full keys".
#[inline(always)]
fn cmp_prefixed(a: u64, b: u64) -> Ordering {
    a.cmp(&b)
}

/// Remap the bytes of a big-endian key prefix so that integer order is UTF-16 code-unit order.
///
/// At the first differing byte both names sit at the same place in a character (the bytes
/// before are equal), so lead bytes meet lead bytes. UTF-16 order differs from byte order only
/// where a supplementary lead (F0–F4, surrogates in UTF-16) meets EE or EF (U+E000–U+FFFF): the
/// remap moves F0–F4 to EE–F2 and EE, EF to F3, F4. Equal prefixes stay equal.
#[inline(always)]
fn utf16_sortable(p: u64) -> u64 {
    if p & HI == 0 {
        return p;
    }
    let mut bytes = p.to_be_bytes();
    for b in &mut bytes {
        *b = match *b {
            0xEE | 0xEF => *b + 5,
            0xF0..=0xF4 => *b - 2,
            other => other,
        };
    }
    u64::from_be_bytes(bytes)
}

/// After sorting: the offset and name of the first duplicate member name, if any.
#[cold]
fn dup_at(t: &Tape<'_>, x: u32, y: u32) -> (usize, Vec<u8>) {
    let (x, y) = (t.node(x), t.node(y));
    (
        t.str_offset(x).max(t.str_offset(y)),
        t.str_bytes(y).to_vec(),
    )
}

#[inline]
fn first_duplicate(t: &Tape<'_>, keys: &[(u64, u32, u32)]) -> Option<(usize, Vec<u8>)> {
    for w in keys.windows(2) {
        if w[0].0 == w[1].0
            && w[0].2 == w[1].2
            && t.str_bytes(t.node(w[0].1)) == t.str_bytes(t.node(w[1].1))
        {
            return Some(dup_at(t, w[0].1, w[1].1));
        }
    }
    None
}

/// Member names of an object (in input order) and the permutation that sorts them.
#[derive(Default)]
struct Shape {
    keys: Vec<(u64, u32, u32)>,
    perm: Vec<u32>,
    /// The names were already in canonical order.
    sorted: bool,
}

struct Frame {
    node: u32,
    is_obj: bool,
    /// Some enclosing container is an array: this object's shape probably repeats.
    in_arr: bool,
    /// Objects: where this object's key indices start in `pending`.
    pending_start: u32,
    /// Objects: members so far. Arrays: elements started so far.
    count: u32,
    /// Objects: the key node of the member being read, or `NO_KEY`.
    key: u32,
    /// Whitespace count when the container opened (objects: when the current member began).
    ws_open: u32,
    ws_key: u32,
    /// Every child so far is verbatim.
    all: bool,
}

const NO_KEY: u32 = u32::MAX;
const HI: u64 = 0x8080_8080_8080_8080;
const LO: u64 = 0x0101_0101_0101_0101;

/// High bit set in each byte of `w` (little-endian) that is `"`, `\` or below 0x20. Bytes above
/// the lowest such byte may be flagged spuriously (borrows): only the lowest set bit is exact.
#[inline(always)]
fn special_bytes(w: u64) -> u64 {
    let q = w ^ (LO * u64::from(b'"'));
    let s = w ^ (LO * u64::from(b'\\'));
    (q.wrapping_sub(LO) & !q | s.wrapping_sub(LO) & !s | w.wrapping_sub(LO * 0x20) & !w) & HI
}

/// Index of the first byte in `input[i..]` that is `"`, `\` or below 0x20 (or `input.len()`).
#[inline(always)]
pub(crate) fn scan_plain(input: &[u8], mut i: usize) -> usize {
    while let Some(chunk) = input.get(i..i + 8) {
        let mut w8 = [0u8; 8];
        w8.copy_from_slice(chunk);
        let m = special_bytes(u64::from_le_bytes(w8));
        if m != 0 {
            return i + (m.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while let Some(&b) = input.get(i) {
        if b == b'"' || b == b'\\' || b < 0x20 {
            return i;
        }
        i += 1;
    }
    i
}

/// Order two member names (prefix, key node) by UTF-16 code units.
#[inline(always)]
fn cmp_keys(t: &Tape<'_>, x: &(u64, u32, u32), y: &(u64, u32, u32)) -> Ordering {
    cmp_prefixed(x.0, y.0)
        .then_with(|| cmp_utf16(t.str_bytes(t.node(x.1)), t.str_bytes(t.node(y.1))))
}

/// Sort a few member names in place (insertion sort: no setup cost for small objects).
#[inline]
fn sort_small(t: &Tape<'_>, keys: &mut [(u64, u32, u32)]) {
    for i in 1..keys.len() {
        let cur = keys[i];
        let mut j = i;
        while j > 0 && cmp_keys(t, &cur, &keys[j - 1]) == Ordering::Less {
            keys[j] = keys[j - 1];
            j -= 1;
        }
        keys[j] = cur;
    }
}

/// Sort member names: insertion sort for small objects, pattern-defeating quicksort otherwise
/// (O(n log n) for large objects).
#[inline]
fn sort_keys(t: &Tape<'_>, keys: &mut [(u64, u32, u32)]) {
    if keys.len() <= 12 {
        sort_small(t, keys);
    } else {
        keys.sort_unstable_by(|x, y| cmp_keys(t, x, y));
    }
}

/// Index of the first byte in `input[i..]` that is `"`, `\` or below 0x20 (or `input.len()`),
/// and whether any byte before it is non-ASCII.
#[inline]
fn scan_string(input: &[u8], mut i: usize) -> (usize, bool) {
    let mut high = 0u64;
    while let Some(chunk) = input.get(i..i + 8) {
        let mut w8 = [0u8; 8];
        w8.copy_from_slice(chunk);
        let w = u64::from_le_bytes(w8);
        let q = w ^ (LO * u64::from(b'"'));
        let s = w ^ (LO * u64::from(b'\\'));
        let m =
            (q.wrapping_sub(LO) & !q | s.wrapping_sub(LO) & !s | w.wrapping_sub(LO * 0x20) & !w)
                & HI;
        if m != 0 {
            let k = (m.trailing_zeros() / 8) as usize;
            // High bits of the bytes before the hit only: every bit below the lowest set bit of
            // `m` (bit 8k+7) covers bytes 0..k fully and byte k's low 7 bits.
            let below = (m & m.wrapping_neg()).wrapping_sub(1);
            return (i + k, (high | (w & below)) & HI != 0);
        }
        high |= w;
        i += 8;
    }
    let mut hb = high & HI != 0;
    while let Some(&b) = input.get(i) {
        if b == b'"' || b == b'\\' || b < 0x20 {
            return (i, hb);
        }
        hb |= b >= 0x80;
        i += 1;
    }
    (i, hb)
}

/// Number of consecutive ASCII digits in `input` from `i`, eight bytes per step: the loop exit
/// does not depend on each digit, so digit counts that vary from number to number cost no
/// branch misprediction per digit.
#[inline(always)]
pub(crate) fn digit_run(input: &[u8], start: usize) -> usize {
    const F0: u64 = 0xF0F0_F0F0_F0F0_F0F0;
    const D0: u64 = 0x3030_3030_3030_3030;
    if !input.get(start).is_some_and(u8::is_ascii_digit) {
        return 0;
    }
    let mut i = start;
    while let Some(chunk) = input.get(i..i + 8) {
        let mut w8 = [0u8; 8];
        w8.copy_from_slice(chunk);
        let w = u64::from_le_bytes(w8);
        // A byte is a digit when its high nibble is 3, also after adding 6 (low nibble <= 9).
        // A carry out of a byte only comes from a non-digit (>= 0xFA) and only affects the
        // bytes above it, so the lowest flagged byte is exact.
        let t = ((w & F0) ^ D0) | ((w.wrapping_add(LO * 6) & F0) ^ D0);
        if t != 0 {
            return i + (t.trailing_zeros() / 8) as usize - start;
        }
        i += 8;
    }
    while input.get(i).is_some_and(u8::is_ascii_digit) {
        i += 1;
    }
    i - start
}

/// The canonical length of a number literal without exponent that is certainly exact and prints
/// in ES6 fixed notation as itself (trailing fractional zeros and a bare dot removed), or `None`.
///
/// Any decimal of at most 15 significant digits converts to a double whose shortest round-trip
/// form has the same value (DBL_DIG = 15) as long as the double is normal, which holds at or above
/// 1e-6; ES6 prints such a value in fixed notation, i.e. as the normalized literal.
#[inline]
pub(crate) fn exact_fixed(
    input: &[u8],
    start: usize,
    int_start: usize,
    int_end: usize,
    frac_end: Option<usize>,
) -> Option<usize> {
    let form = fixed_form(input, start, int_start, int_end, frac_end)?;
    let int_digits = int_end - int_start;
    let exact = if form.integer {
        // Integers of up to 15 digits, and of 16 digits up to 2^53: exact doubles whose
        // shortest round-trip form is the integer itself (the spacing of doubles there is at
        // most 1).
        int_digits <= 15
            || (int_digits == 16
                && input.get(int_start..int_end) <= Some(b"9007199254740992".as_slice()))
    } else {
        form.significant <= 15
    };
    exact.then_some(form.len)
}

/// A number literal without exponent as ES6 fixed notation would print its value, when its
/// digits are the shortest round-trip digits of its double (see [`fixed_form`]).
struct FixedForm {
    /// The canonical length: the literal minus trailing fractional zeros and a bare dot.
    len: usize,
    /// Significant digits (integer: its digit count).
    significant: usize,
    /// No fractional digits other than zeros.
    integer: bool,
}

/// The fixed-notation form of a literal without exponent, or `None` when ES6 prints its value
/// in exponent notation: more than 21 integer digits, or below 1e-6 (a zero integer part and no
/// non-zero digit among the first six fractional ones).
#[inline]
fn fixed_form(
    input: &[u8],
    start: usize,
    int_start: usize,
    int_end: usize,
    frac_end: Option<usize>,
) -> Option<FixedForm> {
    let int_digits = int_end - int_start;
    let int_zero = input.get(int_start) == Some(&b'0');
    if !int_zero && int_digits > 21 {
        return None;
    }
    let integer = FixedForm {
        len: int_end - start,
        significant: int_digits,
        integer: true,
    };
    let Some(fe) = frac_end else {
        return Some(integer);
    };
    let frac = input.get(int_end + 1..fe)?;
    let kept = frac.iter().rposition(|&d| d != b'0').map_or(0, |p| p + 1);
    if kept == 0 {
        // `x.000`: an integer.
        return Some(integer);
    }
    let significant = if int_zero {
        // Only the first six fractional digits matter (below 1e-6 is exponent notation): a
        // long run of leading zeros is not scanned here.
        kept - frac.iter().take(6).position(|&d| d != b'0')?
    } else {
        int_digits + kept
    };
    Some(FixedForm {
        len: int_end + 1 + kept - start,
        significant,
        integer: false,
    })
}

/// The index of the first byte at or after `i` that is not JSON whitespace.
#[inline(always)]
fn skip_ws(input: &[u8], mut i: usize) -> usize {
    while let Some(b' ' | b'\n' | b'\r' | b'\t') = input.get(i) {
        i += 1;
    }
    i
}

#[inline]
fn hex4(bytes: &[u8]) -> Option<u16> {
    let [a, b, c, d] = *bytes.first_chunk::<4>()?;
    let (a, b, c, d) = (
        HEX_VALUE[usize::from(a)],
        HEX_VALUE[usize::from(b)],
        HEX_VALUE[usize::from(c)],
        HEX_VALUE[usize::from(d)],
    );
    // Non-hex bytes map to 0xFF: one test for all four.
    if (a | b | c | d) & 0xF0 != 0 {
        return None;
    }
    Some(u16::from(a) << 12 | u16::from(b) << 8 | u16::from(c) << 4 | u16::from(d))
}

/// Value of each byte as a hexadecimal digit, 0xFF for non-digits.
const HEX_VALUE: [u8; 256] = {
    let mut t = [0xFFu8; 256];
    let mut i = 0;
    while i < 10 {
        t[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        t[b'a' as usize + i] = 10 + i as u8;
        t[b'A' as usize + i] = 10 + i as u8;
        i += 1;
    }
    t
};

/// True when `input` is valid UTF-8 (as [`std::str::from_utf8`] decides): ASCII input is
/// settled word by word, anything else with SIMD (`simdutf8`).
pub(crate) fn valid_utf8(input: &[u8]) -> bool {
    input.is_ascii() || simdutf8::basic::from_utf8(input).is_ok()
}

/// Decode the UTF-8 character at `i`, if the bytes there form one.
fn char_at(input: &[u8], i: usize) -> Option<char> {
    let lead = *input.get(i)?;
    let n = match lead {
        0x00..=0x7F => 1,
        0xC2..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF4 => 4,
        _ => return None,
    };
    std::str::from_utf8(input.get(i..i + n)?)
        .ok()?
        .chars()
        .next()
}

/// Classify invalid UTF-8 at `i`: an encoded surrogate (`ED A0..BF ..`) is a lone surrogate.
fn utf8_error_kind(input: &[u8], i: usize) -> K {
    match (input.get(i), input.get(i + 1)) {
        (Some(0xED), Some(0xA0..=0xBF)) => K::LoneSurrogate,
        _ => K::InvalidUtf8,
    }
}

pub(crate) struct Parser<'a> {
    input: &'a [u8],
    pos: usize,
    limits: Limits,
    tape: Tape<'a>,
    stack: Vec<Frame>,
    /// Keys of the open objects: (8-byte big-endian prefix, key node, name length in bytes).
    pending: Vec<(u64, u32, u32)>,
    /// Per depth, the member names of the last object closed there and their sort permutation.
    shapes: Vec<Shape>,
    /// How many runs of whitespace were skipped so far (wrapping): unchanged across a value
    /// means the value's input text has no whitespace.
    ws: u32,
    /// The whole input is valid UTF-8 (checked once up front), so strings need no UTF-8 check.
    /// When it is not, strings are checked one by one so the first error is reported in order.
    utf8_ok: bool,
    /// [`NumberMode::RejectPrecisionLoss`]: float literals keep their exact decimal value.
    strict: bool,
}

/// The parser's and the tape's vectors, kept between calls so that a prepared caller (the
/// fingerprinter) allocates nothing per call once they have grown. Always left empty.
#[derive(Default)]
pub(crate) struct ParseScratch {
    nodes: Vec<Node>,
    members: Vec<u32>,
    strbuf: Vec<u8>,
    nums: Vec<Num>,
    stack: Vec<Frame>,
    pending: Vec<(u64, u32, u32)>,
    shapes: Vec<Shape>,
}

/// Vectors holding more nodes than this are freed after use rather than kept (a large body
/// must not pin its memory in a long-lived fingerprinter).
const KEEP_NODES: usize = 1 << 14;

impl ParseScratch {
    /// Take back the vectors of a tape (emptied; too large ones are dropped).
    pub(crate) fn recycle(&mut self, tape: Tape<'_>) {
        fn keep<T>(slot: &mut Vec<T>, mut v: Vec<T>, max: usize) {
            if v.capacity() <= max {
                v.clear();
                *slot = v;
            }
        }
        keep(&mut self.nodes, tape.nodes, KEEP_NODES);
        keep(&mut self.members, tape.members, KEEP_NODES);
        keep(&mut self.strbuf, tape.strbuf, KEEP_NODES * 4);
        keep(&mut self.nums, tape.nums, KEEP_NODES);
    }
}

/// How a number literal's canonical text is found (see [`read_number`]).
#[derive(Clone, Copy)]
pub(crate) enum NumberForm {
    /// The first `len` bytes of the literal (`-0` is written `0`).
    Prefix(usize),
    /// Written into the string buffer, at this range.
    Text(usize, usize),
    /// Formatted from the value when written ([`super::emit::float_text`]).
    Float(Num),
}

/// Read the number literal at `start` (which holds `-` or a digit): where it ends and how its
/// canonical text is found, or why it is refused (and where). Canonical text written here goes
/// to `strbuf`. The full parser and the small-document fast path both read numbers with it.
#[inline(always)]
pub(crate) fn read_number(
    input: &[u8],
    start: usize,
    strict: bool,
    strbuf: &mut Vec<u8>,
) -> Result<(usize, NumberForm), (K, usize)> {
    let mut i = start;
    let digit = |i: usize| matches!(input.get(i), Some(b'0'..=b'9'));
    if input.get(i) == Some(&b'-') {
        i += 1;
        if input[i..].starts_with(b"Infinity") {
            return Err((K::NonFiniteNumber, start));
        }
    }
    match input.get(i) {
        Some(b'0') => {
            i += 1;
            if digit(i) {
                return Err((K::LeadingZero, start));
            }
        }
        Some(b'1'..=b'9') => {
            i += 1 + digit_run(input, i + 1);
        }
        None => return Err((K::UnexpectedEnd, i)),
        _ => return Err((K::InvalidNumber, start)),
    }
    let int_end = i;
    let mut frac_end = None;
    if input.get(i) == Some(&b'.') {
        i += 1;
        let n = digit_run(input, i);
        if n == 0 {
            return Err((K::InvalidNumber, start));
        }
        i += n;
        frac_end = Some(i);
    }
    let mut has_exp = false;
    if matches!(input.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(input.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        let n = digit_run(input, i);
        if n == 0 {
            return Err((K::InvalidNumber, start));
        }
        i += n;
        has_exp = true;
    }
    let int_start = start + usize::from(input[start] == b'-');
    if !has_exp && let Some(verbatim) = exact_fixed(input, start, int_start, int_end, frac_end) {
        return Ok((i, NumberForm::Prefix(verbatim)));
    }
    let lit = &input[start..i];
    // A short literal with more than 15 digits gains nothing from being read here unless
    // its exact value is needed (strict mode): the standard parser reads it as fast.
    let digit_chars = int_end - int_start + frac_end.map_or(0, |fe| fe - int_end - 1);
    let read = if strict || digit_chars <= 15 || lit.len() > 32 {
        read_literal_digits(lit)
    } else {
        None
    };
    let exact = read.map(|(d, n, _)| (d, n));
    if let Some((d, digits, (a, b))) = &read {
        if strbuf.capacity() == 0 {
            // The first number written out: room for a share of the rest at once.
            strbuf.reserve((input.len() - i) / 4 + 32);
        }
        let text = lit.get(*a..*b).unwrap_or(&[]);
        let at = strbuf.len();
        if es6_from_literal(d, *digits, text, strbuf) {
            return Ok((i, NumberForm::Text(at, strbuf.len())));
        }
    }
    let value = match &read {
        Some((d, _, (a, b))) => decimal_to_f64(d, lit.get(*a..*b).unwrap_or(&[]), lit),
        None => std::str::from_utf8(lit)
            .ok()
            .and_then(|s| s.parse::<f64>().ok()),
    };
    let Some(value) = value else {
        return Err((K::InvalidNumber, start));
    };
    if !value.is_finite() {
        return Err((K::NumberOutOfRange, start));
    }
    // Strict mode accepts a 16-17 digit literal only when it is its double's shortest
    // form, which then prints from the literal's digits: proven here without the formatter.
    // Written in fixed notation, the literal is (nearly always) already that text.
    if let (true, Some((d, digits, (a, b)))) = (strict, &read)
        && (16..=17).contains(digits)
        && literal_is_shortest(d, value)
    {
        if !has_exp && let Some(form) = fixed_form(input, start, int_start, int_end, frac_end) {
            return Ok((i, NumberForm::Prefix(form.len)));
        }
        let text = lit.get(*a..*b).unwrap_or(&[]);
        let at = strbuf.len();
        if write_es6_digits(d, *digits, text, strbuf) {
            return Ok((i, NumberForm::Text(at, strbuf.len())));
        }
    }
    Ok((i, NumberForm::Float(Num::new(value, exact))))
}

/// Parse and fully validate `input` into a tape, using (and refilling) `scratch`'s vectors. The
/// tape's vectors go back with [`ParseScratch::recycle`].
pub(crate) fn parse_with<'a>(
    input: &'a [u8],
    limits: &Limits,
    numbers: NumberMode,
    scratch: &mut ParseScratch,
) -> Result<Tape<'a>, CanonError> {
    let max = limits.max_input_bytes.min(u32::MAX as usize - 1);
    if input.len() > max {
        return Err(CanonError::new(
            K::InputTooLarge {
                limit: limits.max_input_bytes,
            },
            max,
            None,
        ));
    }
    if input.starts_with(&[0xEF, 0xBB, 0xBF]) {
        return Err(CanonError::new(K::ByteOrderMark, 0, None));
    }
    let est = input.len() / 5 + 4;
    fn take<T>(v: &mut Vec<T>, n: usize) -> Vec<T> {
        let mut v = std::mem::take(v);
        if v.capacity() == 0 {
            return Vec::with_capacity(n);
        }
        v.clear();
        v.reserve(n);
        v
    }
    let mut shapes = std::mem::take(&mut scratch.shapes);
    for shape in &mut shapes {
        // Node ids of a previous input mean nothing here: an empty permutation never matches.
        shape.keys.clear();
        shape.perm.clear();
    }
    let mut p = Parser {
        input,
        pos: 0,
        limits: *limits,
        tape: Tape {
            input,
            nodes: take(&mut scratch.nodes, est),
            members: take(&mut scratch.members, est / 2),
            strbuf: take(&mut scratch.strbuf, 0),
            nums: take(&mut scratch.nums, 0),
            root: None,
        },
        stack: take(&mut scratch.stack, 16),
        pending: take(&mut scratch.pending, 32),
        shapes,
        ws: 0,
        utf8_ok: valid_utf8(input),
        strict: numbers == NumberMode::RejectPrecisionLoss,
    };
    let result = p.run();
    p.stack.clear();
    p.pending.clear();
    scratch.stack = p.stack;
    scratch.pending = p.pending;
    if p.shapes.len() <= 64 {
        scratch.shapes = p.shapes;
    }
    match result {
        Ok(()) => Ok(p.tape),
        Err(e) => {
            scratch.recycle(p.tape);
            Err(e)
        }
    }
}

impl<'a> Parser<'a> {
    #[inline]
    fn peek(&self) -> Option<u8> {
        self.input.get(self.pos).copied()
    }

    /// Skip whitespace at `pos`; returns the byte found there (the next token's first byte).
    #[inline(always)]
    fn peek_ws(&mut self) -> Option<u8> {
        let b = self.input.get(self.pos).copied();
        match b {
            Some(b' ' | b'\n' | b'\r' | b'\t') => self.skip_ws_run(),
            _ => b,
        }
    }

    /// Skip a run of whitespace starting at `pos` (which holds whitespace); returns the byte
    /// after it.
    fn skip_ws_run(&mut self) -> Option<u8> {
        self.ws = self.ws.wrapping_add(1);
        self.pos += 1;
        while let Some(&b) = self.input.get(self.pos) {
            if b == b' ' || b == b'\n' || b == b'\r' || b == b'\t' {
                self.pos += 1;
            } else {
                return Some(b);
            }
        }
        None
    }

    #[inline]
    fn push(&mut self, tag: Tag, a: u32, b: u32, c: u32) -> u32 {
        let i = self.tape.nodes.len() as u32;
        self.tape.nodes.push(Node {
            tag,
            v: false,
            a,
            b,
            c,
        });
        i
    }

    /// JSON pointer of the place being read: each open container contributes its current child.
    #[cold]
    fn pointer(&self, frames: usize) -> String {
        let mut out = String::new();
        for f in self.stack.iter().take(frames) {
            if f.is_obj {
                if f.key == NO_KEY {
                    break;
                }
                let k = self.tape.node(f.key);
                push_token(&mut out, self.tape.str_bytes(k));
            } else {
                if f.count == 0 {
                    break;
                }
                out.push('/');
                out.push_str(&(f.count - 1).to_string());
            }
        }
        out
    }

    #[cold]
    fn err(&self, kind: K, offset: usize) -> CanonError {
        CanonError::new(kind, offset, Some(self.pointer(self.stack.len())))
    }

    /// Error located at the innermost open container (not at one of its children).
    #[cold]
    fn err_container(&self, kind: K, offset: usize) -> CanonError {
        let frames = self.stack.len().saturating_sub(1);
        CanonError::new(kind, offset, Some(self.pointer(frames)))
    }

    /// Error for an unexpected byte at `pos`; `context` is the code used when nothing more
    /// specific applies.
    #[cold]
    fn unexpected(&self, at_value: bool, trailing: bool) -> CanonError {
        let i = self.pos;
        let input = self.input;
        let Some(&b) = input.get(i) else {
            return self.err(K::UnexpectedEnd, i);
        };
        let kind = match b {
            b'/' if matches!(input.get(i + 1), Some(b'/' | b'*')) => K::Comment,
            0x0B | 0x0C => K::InvalidWhitespace,
            b'+' | b'.' if at_value => K::InvalidNumber,
            b'N' if at_value && input[i..].starts_with(b"NaN") => K::NonFiniteNumber,
            b'I' if at_value && input[i..].starts_with(b"Infinity") => K::NonFiniteNumber,
            0x80..=0xFF => match char_at(input, i) {
                None => utf8_error_kind(input, i),
                Some(c) if c.is_whitespace() || c == '\u{FEFF}' => K::InvalidWhitespace,
                Some(_) if trailing => K::TrailingData,
                Some(_) => K::UnexpectedCharacter { byte: b },
            },
            _ if trailing => K::TrailingData,
            _ => K::UnexpectedCharacter { byte: b },
        };
        if trailing {
            CanonError::new(kind, i, None)
        } else {
            self.err(kind, i)
        }
    }

    fn run(&mut self) -> Result<(), CanonError> {
        let _ = self.peek_ws();
        let (root_start, root_ws) = (self.pos, self.ws);
        'value: loop {
            let Some(b) = self.peek_ws() else {
                return Err(self.err(K::UnexpectedEnd, self.pos));
            };
            // Whether the value just read is verbatim (its canonical form is its input text).
            let mut verbatim = match b {
                b'{' | b'[' => {
                    if self.stack.len() >= self.limits.max_depth {
                        return Err(self.err(
                            K::DepthLimit {
                                limit: self.limits.max_depth,
                            },
                            self.pos,
                        ));
                    }
                    if b == b'[' && self.input.get(skip_ws(self.input, self.pos + 1)) == Some(&b'"')
                    {
                        match self.string_array() {
                            Some(v) => v,
                            None => continue 'value,
                        }
                    } else {
                        let is_obj = b == b'{';
                        let node = if is_obj {
                            self.push(Tag::Object, 0, 0, 0)
                        } else {
                            self.push(Tag::Array, self.pos as u32, 0, 0)
                        };
                        let in_arr = self.stack.last().is_some_and(|p| !p.is_obj || p.in_arr);
                        self.stack.push(Frame {
                            node,
                            is_obj,
                            in_arr,
                            pending_start: self.pending.len() as u32,
                            count: 0,
                            key: NO_KEY,
                            ws_open: self.ws,
                            ws_key: self.ws,
                            all: true,
                        });
                        self.pos += 1;
                        let next = self.peek_ws();
                        if is_obj {
                            if next == Some(b'}') {
                                self.pos += 1;
                                self.close_object()?
                            } else {
                                self.member_key(next)?;
                                continue 'value;
                            }
                        } else if next == Some(b']') {
                            self.pos += 1;
                            self.close_array()
                        } else {
                            if let Some(f) = self.stack.last_mut() {
                                f.count = 1;
                            }
                            continue 'value;
                        }
                    }
                }
                b'"' => {
                    if let Some((a, len)) = self.simple_string() {
                        self.push(Tag::Str, a, len, 0);
                        true
                    } else {
                        let (tag, a, len, c) = self.string()?;
                        self.push(tag, a, len, c);
                        tag == Tag::Str
                    }
                }
                b'-' | b'0'..=b'9' => self.number()?,
                b't' => self.literal(b"true", Tag::True)?,
                b'f' => self.literal(b"false", Tag::False)?,
                b'n' => self.literal(b"null", Tag::Null)?,
                _ => return Err(self.unexpected(true, false)),
            };
            // A value is complete: continue the enclosing containers.
            loop {
                let pos = self.pos as u32;
                let ws = self.ws;
                let Some(top) = self.stack.last_mut() else {
                    if verbatim && ws == root_ws {
                        self.tape.root = Some((root_start as u32, pos));
                    }
                    if self.peek_ws().is_some() {
                        return Err(self.unexpected(false, true));
                    }
                    return Ok(());
                };
                if top.is_obj {
                    // `"name":value` without whitespace, value verbatim: one run.
                    verbatim &= ws == top.ws_key;
                    if verbatim {
                        match self.tape.nodes.get_mut(top.key as usize) {
                            Some(k) if k.tag == Tag::Str => {
                                k.v = true;
                                k.c = pos;
                            }
                            _ => verbatim = false,
                        }
                    }
                }
                top.all &= verbatim;
                let is_obj = top.is_obj;
                match self.peek_ws() {
                    Some(b',') => {
                        let comma = self.pos;
                        self.pos += 1;
                        let next = self.peek_ws();
                        if is_obj {
                            // The frame still names the previous member: `member_key` resets it
                            // on every path that can fail before naming the new one.
                            if next == Some(b'}') {
                                return Err(self.err_container(K::TrailingComma, comma));
                            }
                            self.member_key(next)?;
                        } else {
                            if next == Some(b']') {
                                return Err(self.err_container(K::TrailingComma, comma));
                            }
                            if let Some(f) = self.stack.last_mut() {
                                f.count += 1;
                            }
                        }
                        continue 'value;
                    }
                    Some(b'}') if is_obj => {
                        self.pos += 1;
                        verbatim = match self.close_repeated() {
                            Some(v) => v,
                            None => self.close_object()?,
                        };
                    }
                    Some(b']') if !is_obj => {
                        self.pos += 1;
                        verbatim = self.close_array();
                    }
                    _ => return Err(self.unexpected(false, false)),
                }
            }
        }
    }

    /// Fast path for an array whose `[` at `pos` is followed by `"` (after any whitespace): reads elements
    /// that are strings without escapes (needing no UTF-8 check), separated by commas (with
    /// or without whitespace), without the generic per-element continuation. When the array closes this way it is
    /// verbatim and no frame is pushed: returns `Some(true)`. Otherwise the array's frame is
    /// pushed in exactly the state the generic loop would have reached: `Some(true)` when an
    /// element was just completed (the caller continues the container), `None` when `pos` is at
    /// the start of an element not read yet (the caller reads it as a value).
    #[inline]
    fn string_array(&mut self) -> Option<bool> {
        let input = self.input;
        let open = self.pos;
        let ws_open = self.ws;
        let node = self.push(Tag::Array, open as u32, 0, 0);
        // Whitespace (as `json.dumps` and pretty printers write it) is skipped here too; each
        // skipped run counts in `ws` as `peek_ws` would count it, so the array is verbatim
        // exactly when none was skipped.
        let first = skip_ws(input, open + 1);
        self.ws = self.ws.wrapping_add(u32::from(first != open + 1));
        self.pos = first;
        let mut count = 0u32;
        let completed = loop {
            let Some((a, len)) = self.simple_string() else {
                break false;
            };
            self.push(Tag::Str, a, len, 0);
            count += 1;
            let sep = skip_ws(input, self.pos);
            match input.get(sep) {
                Some(b',') => {
                    let next = skip_ws(input, sep + 1);
                    if input.get(next) != Some(&b'"') {
                        // A trailing comma or another kind of element: the generic loop
                        // reads from the separator on (and reports errors as it would).
                        break true;
                    }
                    let runs = u32::from(sep != self.pos) + u32::from(next != sep + 1);
                    self.ws = self.ws.wrapping_add(runs);
                    self.pos = next;
                }
                Some(b']') => {
                    self.ws = self.ws.wrapping_add(u32::from(sep != self.pos));
                    self.pos = sep + 1;
                    let verbatim = self.ws == ws_open;
                    let end = self.tape.nodes.len() as u32;
                    let pos = self.pos as u32;
                    if let Some(n) = self.tape.nodes.get_mut(node as usize) {
                        n.b = end;
                        n.v = verbatim;
                        n.c = pos;
                    }
                    return Some(verbatim);
                }
                _ => break true,
            }
        };
        let in_arr = self.stack.last().is_some_and(|p| !p.is_obj || p.in_arr);
        self.stack.push(Frame {
            node,
            is_obj: false,
            in_arr,
            pending_start: self.pending.len() as u32,
            count: count + u32::from(!completed),
            key: NO_KEY,
            ws_open,
            ws_key: self.ws,
            all: true,
        });
        completed.then_some(true)
    }

    /// Read `"name"` and `:` of an object member (`first` is the byte at `pos`); the value
    /// follows.
    #[inline(always)]
    fn member_key(&mut self, first: Option<u8>) -> Result<(), CanonError> {
        if first != Some(b'"') {
            self.forget_key();
            return Err(self.unexpected(false, false));
        }
        let ws = self.ws;
        let (key, prefix, len) = if let Some((a, len, prefix)) = self.short_key() {
            let key = self.push(Tag::Str, a, len, 0);
            (key, prefix, len)
        } else if let Some((a, len)) = self.simple_string() {
            let key = self.push(Tag::Str, a, len, 0);
            (
                key,
                borrowed_prefix(self.input, a as usize, len as usize),
                len,
            )
        } else {
            self.forget_key();
            let (tag, a, len, c) = self.string()?;
            let key = self.push(tag, a, len, c);
            let prefix = if tag == Tag::Str {
                borrowed_prefix(self.input, a as usize, len as usize)
            } else {
                key_prefix(self.tape.str_bytes(self.tape.node(key)))
            };
            (key, prefix, len)
        };
        self.pending.push((utf16_sortable(prefix), key, len));
        let limit = self.limits.max_members;
        let Some(f) = self.stack.last_mut() else {
            return Err(self.err(K::UnexpectedEnd, self.pos));
        };
        f.count += 1;
        f.key = key;
        f.ws_key = ws;
        if f.count as usize > limit {
            let off = self.tape.str_offset(self.tape.node(key));
            return Err(self.err(K::TooManyMembers { limit }, off));
        }
        if self.peek() == Some(b':') {
            self.pos += 1;
            return Ok(());
        }
        if self.peek_ws() != Some(b':') {
            return Err(self.unexpected(false, false));
        }
        self.pos += 1;
        Ok(())
    }

    /// The innermost object has no current member name (for error pointers while a name is
    /// read).
    #[cold]
    fn forget_key(&mut self) {
        if let Some(f) = self.stack.last_mut() {
            f.key = NO_KEY;
        }
    }

    /// Close the innermost array (its `]` was read); returns whether it is verbatim.
    fn close_array(&mut self) -> bool {
        let Some(f) = self.stack.pop() else {
            return false;
        };
        let end = self.tape.nodes.len() as u32;
        let verbatim = f.all && f.ws_open == self.ws;
        if let Some(n) = self.tape.nodes.get_mut(f.node as usize) {
            n.b = end;
            n.v = verbatim;
            n.c = self.pos as u32;
        }
        verbatim
    }

    /// Common case of [`Parser::close_object`], kept small so it can sit in the main loop: an
    /// object inside an array with the same member names, in the same order, as the previous
    /// object closed at its depth reuses that object's sort permutation (its names were already
    /// checked for duplicates). Returns what `close_object` would, or `None` (nothing changed)
    /// when the case does not apply.
    #[inline(always)]
    fn close_repeated(&mut self) -> Option<bool> {
        let f = self.stack.last()?;
        if !f.in_arr {
            return None;
        }
        let start = f.pending_start as usize;
        let shape = self.shapes.get(self.stack.len() - 1)?;
        let keys = self.pending.get(start..)?;
        if keys.len() < 2 || shape.perm.len() != keys.len() || shape.keys.len() != keys.len() {
            return None;
        }
        let tape = &self.tape;
        for (a, b) in shape.keys.iter().zip(keys) {
            // Equal prefixes and equal lengths up to 8 bytes: equal names.
            if a.0 != b.0
                || a.2 != b.2
                || (a.2 > 8 && tape.str_bytes(tape.node(a.1)) != tape.str_bytes(tape.node(b.1)))
            {
                return None;
            }
        }
        let tight = f.all && f.ws_open == self.ws;
        let node = f.node;
        let count = keys.len() as u32;
        let mstart = self.tape.members.len() as u32;
        self.tape.members.extend(
            shape
                .perm
                .iter()
                .map(|&p| keys.get(p as usize).map_or(0, |k| k.1)),
        );
        let sorted = shape.sorted;
        self.pending.truncate(start);
        let end = self.tape.nodes.len() as u32;
        if let Some(n) = self.tape.nodes.get_mut(node as usize) {
            n.a = mstart;
            n.b = end;
            n.c = count;
        }
        self.stack.pop();
        Some(tight && sorted)
    }

    /// Close the innermost object (its `}` was read): sort and check its member names; returns
    /// whether it is verbatim (members verbatim and already in order, no whitespace).
    fn close_object(&mut self) -> Result<bool, CanonError> {
        let Some(f) = self.stack.last() else {
            return Ok(false);
        };
        let tight = f.all && f.ws_open == self.ws;
        let start = f.pending_start as usize;
        let node = f.node;
        let depth = self.stack.len() - 1;
        let tape = &mut self.tape;
        let mstart = tape.members.len() as u32;
        let keys = &mut self.pending[start..];
        let count = keys.len() as u32;
        // Objects inside arrays often repeat one shape (arrays of records, and the objects
        // nested in them): those use the per-depth shape cache. Others are sorted directly.
        let in_array = f.in_arr;
        let sorted;
        if keys.len() < 2 {
            sorted = true;
            tape.members.extend(keys.iter().map(|&(_, k, _)| k));
        } else if !in_array {
            let t: &Tape<'_> = tape;
            sorted = keys
                .windows(2)
                .all(|w| cmp_keys(t, &w[0], &w[1]) == Ordering::Less);
            if !sorted {
                sort_keys(t, keys);
            }
            if let Some((off, kb)) = first_duplicate(t, keys) {
                let mut ptr = self.pointer(self.stack.len() - 1);
                push_token(&mut ptr, &kb);
                return Err(CanonError::new(K::DuplicateMember, off, Some(ptr)));
            }
            tape.members.extend(keys.iter().map(|&(_, k, _)| k));
        } else {
            if self.shapes.len() <= depth {
                self.shapes.resize_with(depth + 1, Shape::default);
            }
            let shape = &mut self.shapes[depth];
            let same = shape.perm.len() == keys.len()
                && shape.keys.iter().zip(keys.iter()).all(|(a, b)| {
                    if a.0 != b.0 {
                        return false;
                    }
                    // Equal prefixes and equal lengths up to 8 bytes: equal names.
                    (a.2 == b.2 && a.2 <= 8)
                        || tape.str_bytes(tape.node(a.1)) == tape.str_bytes(tape.node(b.1))
                });
            if same {
                // Same member names in the same order as the previous object at this depth
                // (typical of arrays of records): reuse its sort permutation. Its names were
                // already checked for duplicates.
                let keys: &[(u64, u32, u32)] = keys;
                tape.members.extend(
                    shape
                        .perm
                        .iter()
                        .map(|&p| keys.get(p as usize).map_or(0, |k| k.1)),
                );
                sorted = shape.sorted;
            } else {
                shape.keys.clear();
                shape.keys.extend_from_slice(keys);
                let t: &Tape<'_> = tape;
                sorted = keys
                    .windows(2)
                    .all(|w| cmp_keys(t, &w[0], &w[1]) == Ordering::Less);
                shape.sorted = sorted;
                if !sorted {
                    sort_keys(t, keys);
                }
                if let Some((off, kb)) = first_duplicate(t, keys) {
                    shape.perm.clear();
                    let mut ptr = self.pointer(self.stack.len() - 1);
                    push_token(&mut ptr, &kb);
                    return Err(CanonError::new(K::DuplicateMember, off, Some(ptr)));
                }
                // Node ids grow in input order, so an id's original position is its rank.
                shape.perm.clear();
                for &(_, id, _) in keys.iter() {
                    let pos = shape.keys.partition_point(|&(_, k, _)| k < id);
                    shape.perm.push(pos as u32);
                }
                tape.members.extend(keys.iter().map(|&(_, k, _)| k));
            }
        }
        self.pending.truncate(start);
        let end = self.tape.nodes.len() as u32;
        if let Some(n) = self.tape.nodes.get_mut(node as usize) {
            n.a = mstart;
            n.b = end;
            n.c = count;
        }
        self.stack.pop();
        Ok(tight && sorted)
    }

    /// Read `true`, `false` or `null` (always verbatim).
    #[inline]
    fn literal(&mut self, word: &[u8], tag: Tag) -> Result<bool, CanonError> {
        if self.input[self.pos..].starts_with(word) {
            self.pos += word.len();
            self.push(tag, 0, 0, 0);
            Ok(true)
        } else {
            Err(self.err(K::InvalidLiteral, self.pos))
        }
    }

    /// Read a number literal; returns whether it is verbatim (printed exactly as written).
    fn number(&mut self) -> Result<bool, CanonError> {
        let start = self.pos;
        let (end, form) = match read_number(self.input, start, self.strict, &mut self.tape.strbuf) {
            Ok(read) => read,
            Err((kind, offset)) => return Err(self.err(kind, offset)),
        };
        self.pos = end;
        Ok(match form {
            NumberForm::Prefix(len) => {
                self.push(Tag::Int, start as u32, len as u32, 0);
                // `-0` prints as `0`; other literals are verbatim unless zeros were trimmed.
                len == end - start && &self.input[start..end] != b"-0"
            }
            NumberForm::Text(a, b) => {
                self.push(Tag::NumText, a as u32, (b - a) as u32, start as u32);
                false
            }
            NumberForm::Float(num) => {
                let idx = self.tape.nums.len() as u32;
                if self.tape.nums.capacity() == 0 {
                    self.tape.nums.reserve((self.input.len() - end) / 16 + 8);
                }
                self.tape.nums.push(num);
                self.push(Tag::Float, start as u32, (end - start) as u32, idx);
                false
            }
        })
    }

    /// Fast path for a member name of at most 7 bytes without escapes at `pos` (which holds
    /// `"`), when the input is valid UTF-8: one 8-byte load gives both its end and its sort
    /// prefix. Returns its content start, length and prefix (as [`borrowed_prefix`] computes it)
    /// and moves past it, exactly as [`Parser::simple_string`] would; `None` (nothing consumed)
    /// otherwise.
    #[inline(always)]
    fn short_key(&mut self) -> Option<(u32, u32, u64)> {
        if !self.utf8_ok {
            return None;
        }
        let start = self.pos + 1;
        let chunk = self.input.get(start..start + 8)?;
        let mut w8 = [0u8; 8];
        w8.copy_from_slice(chunk);
        let w = u64::from_le_bytes(w8);
        let m = special_bytes(w);
        if m == 0 {
            return None;
        }
        // The lowest flagged byte is exact; it ends the name only if it is a quote.
        let k = (m.trailing_zeros() / 8) as usize;
        if w8[k] != b'"' {
            return None;
        }
        self.pos = start + k + 1;
        let prefix = w.swap_bytes() & !u64::MAX.checked_shr(8 * k as u32).unwrap_or(0);
        Some((start as u32, k as u32, prefix))
    }

    /// Fast path for a string at `pos` (which holds `"`) without escapes whose bytes need no
    /// UTF-8 check: returns its content start and length and moves past it. `None` (nothing
    /// consumed) sends the caller to [`Parser::string`].
    #[inline(always)]
    fn simple_string(&mut self) -> Option<(u32, u32)> {
        let start = self.pos + 1;
        let j = if self.utf8_ok {
            scan_plain(self.input, start)
        } else {
            match scan_string(self.input, start) {
                (_, true) => return None,
                (j, false) => j,
            }
        };
        if self.input.get(j) != Some(&b'"') {
            return None;
        }
        self.pos = j + 1;
        Some((start as u32, (j - start) as u32))
    }

    /// Read a string at `pos` (which holds `"`). Returns the node fields.
    #[inline(never)]
    fn string(&mut self) -> Result<(Tag, u32, u32, u32), CanonError> {
        let input = self.input;
        let quote = self.pos;
        let start = quote + 1;
        let mut i = start;
        let mut owned: Option<usize> = None;
        let mut high = false;
        let end = loop {
            let (j, h) = scan_string(input, i);
            high |= h;
            match input.get(j) {
                None => return Err(self.err(K::UnexpectedEnd, j)),
                Some(b'"') => {
                    if owned.is_some() {
                        self.tape.strbuf.extend_from_slice(&input[i..j]);
                    }
                    break j;
                }
                Some(b'\\') => {
                    if owned.is_none() {
                        owned = Some(self.tape.strbuf.len());
                    }
                    self.tape.strbuf.extend_from_slice(&input[i..j]);
                    i = self.escape(j)?;
                }
                Some(&c) => return Err(self.err(K::ControlCharacter { byte: c }, j)),
            }
        };
        if high && !self.utf8_ok {
            if let Err(e) = std::str::from_utf8(&input[start..end]) {
                let at = start + e.valid_up_to();
                return Err(self.err(utf8_error_kind(input, at), at));
            }
        }
        self.pos = end + 1;
        Ok(match owned {
            None => (Tag::Str, start as u32, (end - start) as u32, 0),
            Some(s) => (
                Tag::StrOwned,
                s as u32,
                (self.tape.strbuf.len() - s) as u32,
                quote as u32,
            ),
        })
    }

    /// Decode the escape starting at `j` (a backslash) into `strbuf`; returns the index after it.
    fn escape(&mut self, j: usize) -> Result<usize, CanonError> {
        read_escape(self.input, j, &mut self.tape.strbuf).map_err(|(kind, at)| self.err(kind, at))
    }
}

/// Decode the escape starting at `j` (a backslash) into `buf`: the index after it, or why it is
/// refused (and where). The full parser and the small-document fast path both decode with it.
pub(crate) fn read_escape(input: &[u8], j: usize, buf: &mut Vec<u8>) -> Result<usize, (K, usize)> {
    let Some(&e) = input.get(j + 1) else {
        return Err((K::UnexpectedEnd, input.len()));
    };
    let simple = match e {
        b'"' => b'"',
        b'\\' => b'\\',
        b'/' => b'/',
        b'b' => 0x08,
        b'f' => 0x0C,
        b'n' => b'\n',
        b'r' => b'\r',
        b't' => b'\t',
        b'u' => 0,
        _ => return Err((K::InvalidEscape, j)),
    };
    if e != b'u' {
        buf.push(simple);
        return Ok(j + 2);
    }
    let Some(u) = input.get(j + 2..).and_then(hex4) else {
        if input.len() < j + 6 && input[j + 2..].iter().all(u8::is_ascii_hexdigit) {
            return Err((K::UnexpectedEnd, input.len()));
        }
        return Err((K::InvalidEscape, j));
    };
    let (cp, next) = match u {
        0xD800..=0xDBFF => {
            let lo = if input.get(j + 6..j + 8) == Some(b"\\u") {
                input.get(j + 8..).and_then(hex4)
            } else {
                None
            };
            match lo {
                Some(lo @ 0xDC00..=0xDFFF) => {
                    let cp = 0x10000 + ((u32::from(u) - 0xD800) << 10) + (u32::from(lo) - 0xDC00);
                    (cp, j + 12)
                }
                _ => return Err((K::LoneSurrogate, j)),
            }
        }
        0xDC00..=0xDFFF => return Err((K::LoneSurrogate, j)),
        _ => (u32::from(u), j + 6),
    };
    // UTF-8 by hand (cp is a scalar value: surrogates were handled above).
    if cp < 0x80 {
        buf.push(cp as u8);
    } else if cp < 0x800 {
        buf.extend_from_slice(&[0xC0 | (cp >> 6) as u8, 0x80 | (cp & 0x3F) as u8]);
    } else if cp < 0x1_0000 {
        buf.extend_from_slice(&[
            0xE0 | (cp >> 12) as u8,
            0x80 | ((cp >> 6) & 0x3F) as u8,
            0x80 | (cp & 0x3F) as u8,
        ]);
    } else {
        buf.extend_from_slice(&[
            0xF0 | (cp >> 18) as u8,
            0x80 | ((cp >> 12) & 0x3F) as u8,
            0x80 | ((cp >> 6) & 0x3F) as u8,
            0x80 | (cp & 0x3F) as u8,
        ]);
    }
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf16_order() {
        let emoji = "\u{1F600}".as_bytes();
        let fb33 = "\u{FB33}".as_bytes();
        assert_eq!(cmp_utf16(emoji, fb33), Ordering::Less);
        assert_eq!(cmp_utf16(fb33, emoji), Ordering::Greater);
        assert_eq!(cmp_utf16(b"a", b"b"), Ordering::Less);
        assert_eq!(cmp_utf16(b"a", b"ab"), Ordering::Less);
        assert_eq!(
            cmp_utf16("\u{D7FF}".as_bytes(), emoji),
            Ordering::Less,
            "U+D7FF < surrogates"
        );
        assert_eq!(cmp_utf16("\u{E000}".as_bytes(), emoji), Ordering::Greater);
    }

    /// Remapped prefixes order names exactly as their UTF-16 code units do (or tie, when the
    /// names share their first eight bytes): every pair of short names over characters from
    /// each UTF-8 length and the ranges where UTF-16 order differs from byte order.
    #[test]
    fn sortable_prefixes_follow_utf16() {
        let chars = [
            "a",
            "z",
            "\u{7F}",
            "é",
            "\u{7FF}",
            "\u{800}",
            "\u{D7FF}",
            "\u{E000}",
            "\u{FB33}",
            "\u{FFFF}",
            "\u{10000}",
            "\u{1F600}",
            "\u{10FFFF}",
        ];
        let mut names = vec![String::new()];
        for a in chars {
            names.push(a.to_owned());
            for b in chars {
                names.push(format!("{a}{b}"));
                names.push(format!("x{a}{b}"));
            }
        }
        for x in &names {
            for y in &names {
                let want = x.encode_utf16().cmp(y.encode_utf16());
                let px = utf16_sortable(key_prefix(x.as_bytes()));
                let py = utf16_sortable(key_prefix(y.as_bytes()));
                let got = cmp_prefixed(px, py);
                assert!(got == want || got == Ordering::Equal, "{x:?} {y:?}");
                if got == Ordering::Equal {
                    assert_eq!(cmp_utf16(x.as_bytes(), y.as_bytes()), want, "{x:?} {y:?}");
                }
            }
        }
    }

    /// The UTF-8 check decides exactly like the standard library: every sequence of up to four
    /// bytes from a set covering each lead and continuation class, at every alignment, inside
    /// ASCII context.
    #[test]
    fn utf8_check_agrees_with_std() {
        let bytes: Vec<u8> = vec![
            0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0,
            0xE1, 0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xFF,
        ];
        let mut seqs: Vec<Vec<u8>> = Vec::new();
        for &a in &bytes {
            seqs.push(vec![a]);
            for &b in &bytes {
                seqs.push(vec![a, b]);
                for &c in &bytes {
                    seqs.push(vec![a, b, c]);
                    for &d in &[0x41u8, 0x80, 0x8F, 0x90, 0xBF, 0xC3] {
                        seqs.push(vec![a, b, c, d]);
                    }
                }
            }
        }
        for seq in &seqs {
            for pad in 0..10 {
                let mut s = vec![b'a'; pad];
                s.extend_from_slice(seq);
                for tail in [0usize, 1, 9] {
                    let mut t = s.clone();
                    t.extend(std::iter::repeat_n(b'z', tail));
                    assert_eq!(valid_utf8(&t), std::str::from_utf8(&t).is_ok(), "{t:x?}");
                }
            }
        }
        let text =
            "caf\u{e9} \u{65e5}\u{672c} \u{1F600}\u{10FFFF}\u{FFFF}\u{800}\u{7FF} ok".repeat(5);
        for cut in 0..text.len() {
            let b = &text.as_bytes()[..cut];
            assert_eq!(valid_utf8(b), std::str::from_utf8(b).is_ok(), "cut {cut}");
        }
    }

    #[test]
    fn digit_runs() {
        let cases: [&[u8]; 9] = [
            b"",
            b"x",
            b"7",
            b"123,",
            b"1234567890123456789]",
            b"12345678",
            b"0123456789:/",
            b"12\xff9",
            b"99999999\xfa1",
        ];
        for case in cases {
            for start in 0..=case.len() {
                let want = case[start..]
                    .iter()
                    .take_while(|b| b.is_ascii_digit())
                    .count();
                assert_eq!(digit_run(case, start), want, "{case:?} at {start}");
            }
        }
        for b in 0..=255u8 {
            let s = [b'1', b'2', b, b'3', b'4', b'5', b'6', b'7', b'8', b'9'];
            let want = if b.is_ascii_digit() { 10 } else { 2 };
            assert_eq!(digit_run(&s, 0), want, "byte {b:#x}");
        }
    }

    /// String arrays written with whitespace take the fast path and end as the generic path
    /// would: the same canonical text, the same error (kind, offset, pointer) at the same place.
    #[test]
    fn spaced_string_arrays() {
        use crate::canonical::canonicalize;
        for (doc, want) in [
            (r#"["a", "b"]"#, r#"["a","b"]"#),
            (r#"[ "a" , "b" ]"#, r#"["a","b"]"#),
            ("[\n  \"a\",\n  \"b\"\n]", r#"["a","b"]"#),
            (
                r#"{"k": ["Zoë", "東京"], "a": ["x","y"]}"#,
                r#"{"a":["x","y"],"k":["Zoë","東京"]}"#,
            ),
            (r#"["a", 1, "b", null]"#, r#"["a",1,"b",null]"#),
            (r#"["a", "\u0041", "b"]"#, r#"["a","A","b"]"#),
            (r#"[["a", "b"], ["c"]]"#, r#"[["a","b"],["c"]]"#),
            (r#"["a","b"]"#, r#"["a","b"]"#),
        ] {
            let out = canonicalize(doc.as_bytes()).expect(doc);
            assert_eq!(String::from_utf8_lossy(&out), want, "{doc}");
        }
        for (doc, code, offset) in [
            (r#"["a", ]"#, "trailing_comma", 4),
            (r#"["a",  "b" "c"]"#, "unexpected_character", 11),
            (r#"["a", "b"#, "unexpected_end", 8),
            ("[\"a\", \"\u{1}\"]", "control_character", 7),
        ] {
            let err = canonicalize(doc.as_bytes()).expect_err(doc);
            assert_eq!((err.code(), err.offset), (code, offset), "{doc}: {err}");
        }
    }

    #[test]
    fn scan_finds_specials() {
        let s = b"abcdefghijk\"lmn";
        assert_eq!(scan_string(s, 0), (11, false));
        let s = "ab\u{e9}defghijklm\\".as_bytes();
        assert_eq!(scan_string(s, 0), (s.len() - 1, true));
        let s = b"abcdefg\x01";
        assert_eq!(scan_string(s, 0), (7, false));
        let s = "abcdefg\"\u{e9}".as_bytes();
        assert_eq!(scan_string(s, 0), (7, false));
        assert_eq!(scan_string(b"abc", 0), (3, false));
    }
}
