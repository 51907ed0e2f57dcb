//! Member-name order (RFC 8785 §3.2.3: UTF-16 code units) and duplicate detection.
//!
//! UTF-8 byte order equals code-point order; UTF-16 order differs from it only where a
//! supplementary character (lead byte F0–F4; surrogates in UTF-16) meets U+E000–U+FFFF (lead EE
//! or EF) at the first differing byte. Names are compared through an 8-byte sortable prefix
//! first, and byte by byte only when the prefixes tie. Both the full parser and the
//! small-document fast path order names with these functions.

use std::cmp::Ordering;

use super::scan::HI;
use super::tape::Tape;

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
pub(crate) fn key_prefix(key: &[u8]) -> u64 {
    if let Some(head) = key.first_chunk::<8>() {
        return u64::from_be_bytes(*head);
    }
    slow_prefix(key)
}

/// The prefix of a borrowed key starting at `input[a]` with `len` bytes: one unaligned load
/// when the input extends 8 bytes past the key start (it always holds the closing quote).
#[inline]
pub(crate) fn borrowed_prefix(input: &[u8], a: usize, len: usize) -> u64 {
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
pub(crate) fn cmp_prefixed(a: u64, b: u64) -> Ordering {
    a.cmp(&b)
}

/// Remap the bytes of a big-endian key prefix so that integer order is UTF-16 code-unit order.
///
/// At the first differing byte both names sit at the same place in a character (the bytes
/// before are equal), so lead bytes meet lead bytes. UTF-16 order differs from byte order only
/// where a supplementary lead (F0–F4, surrogates in UTF-16) meets EE or EF (U+E000–U+FFFF): the
/// remap moves F0–F4 to EE–F2 and EE, EF to F3, F4. Equal prefixes stay equal.
#[inline(always)]
pub(crate) fn utf16_sortable(p: u64) -> u64 {
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
pub(crate) fn first_duplicate(t: &Tape<'_>, keys: &[(u64, u32, u32)]) -> Option<(usize, Vec<u8>)> {
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

/// Order two member names (prefix, key node) by UTF-16 code units.
#[inline(always)]
pub(crate) fn cmp_keys(t: &Tape<'_>, x: &(u64, u32, u32), y: &(u64, u32, u32)) -> Ordering {
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
pub(crate) fn sort_keys(t: &Tape<'_>, keys: &mut [(u64, u32, u32)]) {
    if keys.len() <= 12 {
        sort_small(t, keys);
    } else {
        keys.sort_unstable_by(|x, y| cmp_keys(t, x, y));
    }
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
}
