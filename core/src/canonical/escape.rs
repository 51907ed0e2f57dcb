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

/// Decode the escape starting at `j` (a backslash) into `buf` as UTF-8: the index after it, or
/// why it is refused (and where). The full parser and the small-document fast path both decode
/// with it.
#[inline]
pub(crate) fn read_escape(input: &[u8], j: usize, buf: &mut Vec<u8>) -> Result<usize, (K, usize)> {
    let (cp, next) = decode_escape(input, j)?;
    // A fixed-length copy, then the unused bytes dropped (no variable-length copy per escape).
    let (bytes, len) = utf8(cp);
    let at = buf.len();
    buf.extend_from_slice(&bytes);
    buf.truncate(at + len);
    Ok(next)
}

/// Decode the escape starting at `j` (a backslash): the Unicode scalar value it stands for (a
/// surrogate pair is one escape) and the index after it, or why it is refused (and where).
#[inline(always)]
pub(crate) fn decode_escape(input: &[u8], j: usize) -> Result<(u32, usize), (K, usize)> {
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
        return Ok((u32::from(simple), j + 2));
    }
    let Some(u) = input.get(j + 2..).and_then(hex4) else {
        if input.len() < j + 6 && input[j + 2..].iter().all(u8::is_ascii_hexdigit) {
            return Err((K::UnexpectedEnd, input.len()));
        }
        return Err((K::InvalidEscape, j));
    };
    match u {
        0xD800..=0xDBFF => {
            let lo = if input.get(j + 6..j + 8) == Some(b"\\u") {
                input.get(j + 8..).and_then(hex4)
            } else {
                None
            };
            match lo {
                Some(lo @ 0xDC00..=0xDFFF) => {
                    let cp = 0x10000 + ((u32::from(u) - 0xD800) << 10) + (u32::from(lo) - 0xDC00);
                    Ok((cp, j + 12))
                }
                _ => Err((K::LoneSurrogate, j)),
            }
        }
        0xDC00..=0xDFFF => Err((K::LoneSurrogate, j)),
        _ => Ok((u32::from(u), j + 6)),
    }
}

/// The UTF-8 encoding of the scalar value `cp` (from [`decode_escape`]: never a surrogate), by
/// hand: its bytes and their count.
#[inline(always)]
pub(crate) fn utf8(cp: u32) -> ([u8; 4], usize) {
    if cp < 0x80 {
        ([cp as u8, 0, 0, 0], 1)
    } else if cp < 0x800 {
        ([0xC0 | (cp >> 6) as u8, 0x80 | (cp & 0x3F) as u8, 0, 0], 2)
    } else if cp < 0x1_0000 {
        (
            [
                0xE0 | (cp >> 12) as u8,
                0x80 | ((cp >> 6) & 0x3F) as u8,
                0x80 | (cp & 0x3F) as u8,
                0,
            ],
            3,
        )
    } else {
        (
            [
                0xF0 | (cp >> 18) as u8,
                0x80 | ((cp >> 12) & 0x3F) as u8,
                0x80 | ((cp >> 6) & 0x3F) as u8,
                0x80 | (cp & 0x3F) as u8,
            ],
            4,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::utf8;

    #[test]
    fn utf8_encodes_every_scalar_value_as_the_standard_library_does() {
        for c in (0..=0x10_FFFF).filter_map(char::from_u32) {
            let mut want = [0u8; 4];
            let want = c.encode_utf8(&mut want).as_bytes();
            let (bytes, len) = utf8(u32::from(c));
            assert_eq!(&bytes[..len], want, "U+{:04X}", u32::from(c));
        }
    }
}
