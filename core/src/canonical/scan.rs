//! Byte scanning: the end of a plain string run, whitespace, and UTF-8 validity.
//!
//! Word-at-a-time (SWAR) scans over the input, shared by the full parser, the small-document
//! fast path and the emitter.

use super::error::CanonErrorKind as K;

pub(crate) const HI: u64 = 0x8080_8080_8080_8080;
pub(crate) const LO: u64 = 0x0101_0101_0101_0101;

/// High bit set in each byte of `w` (little-endian) that is `"`, `\` or below 0x20. Bytes above
/// the lowest such byte may be flagged spuriously (borrows): only the lowest set bit is exact.
#[inline(always)]
pub(crate) fn special_bytes(w: u64) -> u64 {
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

/// Index of the first byte in `input[i..]` that is `"`, `\` or below 0x20 (or `input.len()`),
/// and whether any byte before it is non-ASCII.
#[inline]
pub(crate) fn scan_string(input: &[u8], mut i: usize) -> (usize, bool) {
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

/// The index of the first byte at or after `i` that is not JSON whitespace.
#[inline(always)]
pub(crate) fn skip_ws(input: &[u8], mut i: usize) -> usize {
    while let Some(b' ' | b'\n' | b'\r' | b'\t') = input.get(i) {
        i += 1;
    }
    i
}

/// True when `input` is valid UTF-8 (as [`std::str::from_utf8`] decides): ASCII input is
/// settled word by word, anything else with SIMD (`simdutf8`).
pub(crate) fn valid_utf8(input: &[u8]) -> bool {
    input.is_ascii() || simdutf8::basic::from_utf8(input).is_ok()
}

/// Decode the UTF-8 character at `i`, if the bytes there form one.
pub(crate) fn char_at(input: &[u8], i: usize) -> Option<char> {
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
pub(crate) fn utf8_error_kind(input: &[u8], i: usize) -> K {
    match (input.get(i), input.get(i + 1)) {
        (Some(0xED), Some(0xA0..=0xBF)) => K::LoneSurrogate,
        _ => K::InvalidUtf8,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
