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

/// A decimal value `mantissa × 10^exp`, `mantissa` without trailing zeros and of at most 17
/// digits. Zero has `mantissa == 0` (its sign and exponent are then ignored: `-0` equals `0`).
#[derive(Debug, PartialEq, Eq)]
struct Decimal {
    negative: bool,
    mantissa: u64,
    exp: i64,
}

impl Decimal {
    fn same_value(&self, other: &Self) -> bool {
        if self.mantissa == 0 || other.mantissa == 0 {
            self.mantissa == other.mantissa
        } else {
            self == other
        }
    }
}

/// Exponents beyond this magnitude are clamped; no double is anywhere near them, so a clamped
/// literal still compares unequal to every formatter output.
const EXP_CLAMP: i64 = 1 << 40;

/// Parse a JSON number literal (already validated by the grammar) into its exact decimal value,
/// in one pass.
///
/// Returns `None` when the value has more than 17 significant digits: no double's shortest
/// round-trip form has that many, so such a literal can never be exact.
fn decimal(lit: &[u8]) -> Option<Decimal> {
    let negative = lit.first() == Some(&b'-');
    let mut mantissa: u64 = 0;
    let mut digits = 0u32;
    // Zeros read after the last non-zero significant digit, not yet in `mantissa`.
    let mut zeros = 0u32;
    let mut exp: i64 = 0;
    let mut after_dot = false;
    let mut rest: &[u8] = &[];
    for (i, &b) in lit.iter().enumerate().skip(usize::from(negative)) {
        match b {
            b'0' => {
                exp -= i64::from(after_dot);
                zeros += u32::from(mantissa != 0);
            }
            b'1'..=b'9' => {
                exp -= i64::from(after_dot);
                digits += zeros + 1;
                if digits > 17 {
                    return None;
                }
                mantissa = mantissa * 10u64.pow(zeros + 1) + u64::from(b - b'0');
                zeros = 0;
            }
            b'.' => after_dot = true,
            _ => {
                rest = &lit[i + 1..];
                break;
            }
        }
    }
    let mut exp10: i64 = 0;
    if !rest.is_empty() {
        let (neg, digits) = match rest.split_first() {
            Some((b'-', r)) => (true, r),
            Some((b'+', r)) => (false, r),
            _ => (false, rest),
        };
        for &d in digits {
            exp10 = (exp10 * 10 + i64::from(d.wrapping_sub(b'0'))).min(EXP_CLAMP);
        }
        if neg {
            exp10 = -exp10;
        }
    }
    Some(Decimal {
        negative,
        mantissa,
        exp: exp10.saturating_add(exp).saturating_add(i64::from(zeros)),
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
        (Some(a), Some(b)) => a.same_value(&b),
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
    fn decimal_values() {
        let same = |a: &str, b: &str| {
            decimal(a.as_bytes())
                .expect("<= 17 digits")
                .same_value(&decimal(b.as_bytes()).expect("<= 17 digits"))
        };
        assert!(same("1.10", "11e-1"));
        assert!(same("0.0000011e6", "1.1"));
        assert!(same("100", "1e2"));
        assert!(same("-0.0", "0e5"));
        assert!(same("1000000000000000000000000", "1e24"));
        assert!(!same("1.1", "-1.1"));
        assert!(!same("1.01", "1.1"));
        assert!(!same("10", "1"));
        assert!(decimal(b"123456789012345678").is_none());
        assert!(decimal(b"12345678901234567000e-3").is_some());
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
