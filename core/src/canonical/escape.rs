//! String escapes: `\\`, `\\uXXXX` and surrogate pairs decoded to UTF-8.

use super::error::CanonErrorKind as K;

#[inline]
pub(crate) fn hex4(bytes: &[u8]) -> Option<u16> {
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
