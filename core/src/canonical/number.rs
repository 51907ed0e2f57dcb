//! ES6 number serialization (RFC 8785 §3.2.2.3) and the exact-decimal precision check.

use super::error::{CanonError, CanonErrorKind};

/// Format a finite double with ECMAScript `Number::toString` into `buf` (a stack buffer).
///
/// `-0` formats as `0`. The caller guarantees `value.is_finite()`.
#[inline]
pub(crate) fn format_finite(value: f64, buf: &mut ryu_js::Buffer) -> &str {
    if value == 0.0 {
        "0"
    } else {
        buf.format_finite(value)
    }
}

/// Serialize a double as RFC 8785 requires (ECMAScript `Number::toString`).
///
/// This is the formatter the canonicalizer uses, exposed for conformance tests and bindings.
///
/// ```
/// use idempo_core::canonical::format_number;
/// assert_eq!(format_number(1e21).unwrap(), "1e+21");
/// assert_eq!(format_number(-0.0).unwrap(), "0");
/// assert_eq!(format_number(f64::NAN).unwrap_err().code(), "non_finite_number");
/// ```
///
/// # Errors
/// [`CanonErrorKind::NonFiniteNumber`] for NaN and the infinities (offset 0, no pointer), which
/// RFC 8785 requires to be errors.
pub fn format_number(value: f64) -> Result<String, CanonError> {
    if !value.is_finite() {
        return Err(CanonError::new(CanonErrorKind::NonFiniteNumber, 0, None));
    }
    let mut buf = ryu_js::Buffer::new();
    Ok(format_finite(value, &mut buf).to_owned())
}

/// A decimal value `0.d1d2...dn × 10^exp` reduced to at most 17 significant digits, with no leading
/// or trailing zeros in `digits`. Zero has `len == 0` (its sign is ignored: `-0` equals `0`).
#[derive(Debug, PartialEq, Eq)]
struct Decimal {
    negative: bool,
    digits: [u8; 17],
    len: usize,
    exp: i64,
}

/// Exponents beyond this magnitude are clamped; no double is anywhere near them, so a clamped
/// literal still compares unequal to every formatter output.
const EXP_CLAMP: i64 = 1 << 40;

/// Parse a JSON number literal (already validated by the grammar) into its exact decimal value.
///
/// Returns `None` when the value has more than 17 significant digits: no double's shortest
/// round-trip form has that many, so such a literal can never be exact.
fn decimal(lit: &[u8]) -> Option<Decimal> {
    let (negative, body) = match lit.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, lit),
    };
    let (mantissa, exp_part) = match body.iter().position(|&b| b == b'e' || b == b'E') {
        Some(i) => (&body[..i], Some(&body[i + 1..])),
        None => (body, None),
    };
    let mut exp10: i64 = 0;
    if let Some(e) = exp_part {
        let (neg, digits) = match e.split_first() {
            Some((b'-', r)) => (true, r),
            Some((b'+', r)) => (false, r),
            _ => (false, e),
        };
        for &d in digits {
            exp10 = (exp10 * 10 + i64::from(d - b'0')).min(EXP_CLAMP);
        }
        if neg {
            exp10 = -exp10;
        }
    }
    // Digits of the mantissa without the dot; `frac` counts those after the dot.
    let mut frac: i64 = 0;
    let mut seen_dot = false;
    let mut first_nz: Option<usize> = None;
    let mut last_nz = 0usize;
    let mut count = 0usize;
    for &b in mantissa {
        if b == b'.' {
            seen_dot = true;
            continue;
        }
        if seen_dot {
            frac += 1;
        }
        if b != b'0' {
            if first_nz.is_none() {
                first_nz = Some(count);
            }
            last_nz = count;
        }
        count += 1;
    }
    let Some(first) = first_nz else {
        return Some(Decimal {
            negative: false,
            digits: [0; 17],
            len: 0,
            exp: 0,
        });
    };
    let len = last_nz - first + 1;
    if len > 17 {
        return None;
    }
    let mut digits = [0u8; 17];
    let mut k = 0usize;
    let mut idx = 0usize;
    for &b in mantissa {
        if b == b'.' {
            continue;
        }
        if idx >= first && idx <= last_nz {
            digits[k] = b;
            k += 1;
        }
        idx += 1;
    }
    // value = D × 10^(exp10 - frac + trailing) where D is the significant digit string.
    let trailing = (count - 1 - last_nz) as i64;
    Some(Decimal {
        negative,
        digits,
        len,
        exp: exp10.saturating_sub(frac).saturating_add(trailing),
    })
}

/// True when the literal has at most 15 significant digits (counted from the first non-zero
/// digit, trailing zeros included, so this may under-report; that only costs the slow path).
///
/// Any such decimal whose double is normal is exact (DBL_DIG = 15: distinct 15-digit decimals
/// map to distinct normal doubles, so the shortest round-trip form has the same value).
#[inline]
pub(crate) fn at_most_15_digits(lit: &[u8]) -> bool {
    let mut count = 0usize;
    for &b in lit {
        match b {
            b'e' | b'E' => break,
            b'1'..=b'9' => count += 1,
            b'0' if count > 0 => count += 1,
            _ => {}
        }
    }
    count <= 15
}

/// True when the literal's decimal value equals the decimal value of `shortest` (the ES6 form of
/// the double the literal parses to). Both are compared exactly, without going through floats.
pub(crate) fn literal_is_exact(lit: &[u8], shortest: &str) -> bool {
    match (decimal(lit), decimal(shortest.as_bytes())) {
        (Some(a), Some(b)) => {
            if a.len == 0 || b.len == 0 {
                a.len == b.len
            } else {
                a == b
            }
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exact(lit: &str) -> bool {
        let v: f64 = lit.parse().expect("number");
        let mut b = ryu_js::Buffer::new();
        literal_is_exact(lit.as_bytes(), format_finite(v, &mut b))
    }

    #[test]
    fn precision_rule() {
        for ok in [
            "0.1",
            "1.10",
            "100",
            "1e2",
            "-0",
            "-0.0",
            "0e10",
            "1.0",
            "5e-324",
            "1.7976931348623157e308",
            "9007199254740992",
            "1E+2",
            "0.000001",
            "1e-7",
            "12.5e-1",
        ] {
            assert!(exact(ok), "{ok} should be exact");
        }
        for bad in [
            "9007199254740993",
            "0.10000000000000001",
            "1e-400",
            "1152921504606846976",
            "4.9e-324",
            "1.00000000000000000001",
            "123456789012345678e3",
        ] {
            assert!(!exact(bad), "{bad} should lose precision");
        }
    }

    #[test]
    fn fast_rule_agrees_with_exact_rule() {
        for lit in [
            "0.1",
            "123.456",
            "1e300",
            "1.5e-300",
            "999999999999999",
            "9999999999999999",
            "0.000123",
            "1e-310",
            "2.2250738585072014e-308",
            "100000000000000000000",
        ] {
            let v: f64 = lit.parse().expect("number");
            if v.is_normal() && at_most_15_digits(lit.as_bytes()) {
                assert!(exact(lit), "{lit}");
            }
        }
    }

    #[test]
    fn formatter_edges() {
        assert_eq!(format_number(-0.0).expect("finite"), "0");
        assert_eq!(format_number(1e21).expect("finite"), "1e+21");
        assert_eq!(format_number(1e-7).expect("finite"), "1e-7");
        assert_eq!(format_number(0.000001).expect("finite"), "0.000001");
        assert_eq!(
            format_number("1424953923781206.25".parse().expect("num")).expect("finite"),
            "1424953923781206.2"
        );
        assert!(format_number(f64::INFINITY).is_err());
    }
}
