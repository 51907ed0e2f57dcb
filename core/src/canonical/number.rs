//! Numbers: reading a literal (where it ends, whether it is already canonical, its exact decimal
//! value), ES6 serialization (RFC 8785 §3.2.2.3) and the exact-decimal precision check.
//!
//! The full parser and the small-document fast path both read numbers with [`read_number`].

use super::error::{CanonError, CanonErrorKind};
use super::scan::LO;

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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Decimal {
    negative: bool,
    mantissa: u64,
    exp: i64,
}

/// A float literal read once by the parser: its double, and (when it has at most 19
/// significant digits and a short exponent) its exact decimal value and significant digit count
/// (from the first non-zero digit to the last non-zero digit), packed in 24 bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Num {
    pub(crate) value: f64,
    mantissa: u64,
    exp: i32,
    /// Significant digits; [`Num::UNKNOWN`] when the exact value was not kept.
    digits: u8,
    negative: bool,
}

impl Num {
    const UNKNOWN: u8 = u8::MAX;

    /// Pack a double and, if known, the literal's exact decimal value and digit count.
    pub(crate) fn new(value: f64, exact: Option<(Decimal, u32)>) -> Self {
        match exact {
            Some((d, digits)) if digits < u32::from(Self::UNKNOWN) => match i32::try_from(d.exp) {
                Ok(exp) => Self {
                    value,
                    mantissa: d.mantissa,
                    exp,
                    digits: digits as u8,
                    negative: d.negative,
                },
                Err(_) => Self::unknown(value),
            },
            _ => Self::unknown(value),
        }
    }

    fn unknown(value: f64) -> Self {
        Self {
            value,
            mantissa: 0,
            exp: 0,
            digits: Self::UNKNOWN,
            negative: false,
        }
    }

    /// The literal's exact decimal value and digit count, when kept.
    pub(crate) fn exact(&self) -> Option<(Decimal, u32)> {
        (self.digits != Self::UNKNOWN).then_some((
            Decimal {
                negative: self.negative,
                mantissa: self.mantissa,
                exp: i64::from(self.exp),
            },
            u32::from(self.digits),
        ))
    }
}

/// Powers of ten that a double holds exactly (10^0 ..= 10^22).
const POW10_F64: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
];

/// Read a JSON number literal (grammar already checked) as `mantissa × 10^exp` in one pass,
/// skipping leading zeros eight at a time. Returns the value and its count of significant
/// digits, or `None` when it has more than 19 significant digits or more than 6 exponent
/// digits (the caller then falls back to the general path). Also returns where the significant
/// digits are in `lit`: from the first non-zero digit to the last one (a dot may sit among them).
pub(crate) fn read_literal_digits(lit: &[u8]) -> Option<(Decimal, u32, (usize, usize))> {
    const ZEROS: u64 = u64::from_le_bytes(*b"00000000");
    let negative = lit.first() == Some(&b'-');
    let mut i = usize::from(negative);
    let mut exp: i64 = 0;
    let mut after_dot = false;
    // Leading zeros (and the dot among them) add nothing but exponent.
    loop {
        match lit.get(i) {
            Some(b'0') => {
                let mut step = 1;
                while let Some(w) = lit.get(i + step - 1..).and_then(<[u8]>::first_chunk::<8>) {
                    if u64::from_le_bytes(*w) != ZEROS {
                        break;
                    }
                    step += 8;
                }
                // `step - 1` zeros were seen eight at a time, plus the one at `i` when no
                // full word of zeros starts there.
                let n = if step > 1 { step - 1 } else { 1 };
                i += n;
                exp -= n as i64 * i64::from(after_dot);
            }
            Some(b'.') => {
                after_dot = true;
                i += 1;
            }
            _ => break,
        }
    }
    // The significant digits: one run, or two around the dot; eight at a time.
    let mut mantissa: u64 = 0;
    let mut count = 0u32;
    let sig_start = i;
    loop {
        let run = digit_run(lit, i);
        if !add_digits(&lit[i..i + run], &mut mantissa, &mut count) {
            return None;
        }
        i += run;
        if after_dot {
            exp -= run as i64;
            break;
        }
        if lit.get(i) != Some(&b'.') {
            break;
        }
        after_dot = true;
        i += 1;
    }
    let mut digits = count;
    let mut sig_end = i;
    if mantissa != 0 {
        // Trailing zeros (rare) leave the mantissa for the exponent.
        while mantissa % 10 == 0 {
            mantissa /= 10;
            digits -= 1;
            exp += 1;
        }
        while sig_end > sig_start && matches!(lit.get(sig_end - 1), Some(b'0' | b'.')) {
            sig_end -= 1;
        }
    }
    let mut exp10: i64 = 0;
    if let Some(rest) = lit.get(i + 1..).filter(|r| !r.is_empty()) {
        let (neg, ds) = match rest.split_first() {
            Some((b'-', r)) => (true, r),
            Some((b'+', r)) => (false, r),
            _ => (false, rest),
        };
        if ds.is_empty() || ds.len() > 6 {
            return None;
        }
        for &d in ds {
            exp10 = exp10 * 10 + i64::from(d.wrapping_sub(b'0'));
        }
        if neg {
            exp10 = -exp10;
        }
    }
    let exp = if mantissa == 0 { 0 } else { exp10 + exp };
    Some((
        Decimal {
            negative,
            mantissa,
            exp,
        },
        digits,
        (sig_start, sig_end),
    ))
}

/// The value of eight ASCII digits (first digit most significant), in a few multiplications.
#[inline(always)]
fn eight_digits(chunk: [u8; 8]) -> u64 {
    let v = u64::from_le_bytes(chunk).wrapping_sub(0x3030_3030_3030_3030);
    let v = (v.wrapping_mul(10) + (v >> 8)) & 0x00FF_00FF_00FF_00FF;
    let v = (v.wrapping_mul(100) + (v >> 16)) & 0x0000_FFFF_0000_FFFF;
    (v.wrapping_mul(10_000) + (v >> 32)) & 0xFFFF_FFFF
}

/// Append the digits of `run` (ASCII digits only) to `mantissa`, counting them in `count`;
/// `false` when that would make more than 19 digits.
#[inline(always)]
fn add_digits(run: &[u8], mantissa: &mut u64, count: &mut u32) -> bool {
    if *count as usize + run.len() > 19 {
        return false;
    }
    let mut rest = run;
    while let Some((chunk, tail)) = rest.split_first_chunk::<8>() {
        *mantissa = *mantissa * 100_000_000 + eight_digits(*chunk);
        rest = tail;
    }
    for &d in rest {
        *mantissa = *mantissa * 10 + u64::from(d - b'0');
    }
    *count += run.len() as u32;
    true
}

/// The double nearest to `d` (ties to even), as Rust's float parser gives it: exact arithmetic
/// when mantissa and power of ten are both exact doubles (one rounding), otherwise the standard
/// parser on the literal itself when it is short, else on the short form `<digits>e<exp>`.
/// `digits` is the text of the mantissa's digits, a dot possibly among them (ignored); `lit`
/// the whole literal.
pub(crate) fn decimal_to_f64(d: &Decimal, digits: &[u8], lit: &[u8]) -> Option<f64> {
    let sign = if d.negative { -1.0 } else { 1.0 };
    if d.mantissa == 0 {
        return Some(sign * 0.0);
    }
    if d.mantissa < 1 << 53 && d.exp.unsigned_abs() <= 22 {
        let m = d.mantissa as f64;
        let p = POW10_F64[d.exp.unsigned_abs() as usize];
        return Some(sign * if d.exp >= 0 { m * p } else { m / p });
    }
    if lit.len() <= 32 {
        return std::str::from_utf8(lit).ok()?.parse().ok();
    }
    // "-", at most 19 digits and a dot, "e-", at most 20 exponent digits.
    let mut buf = [0u8; 48];
    let mut n = usize::from(d.negative);
    buf[0] = b'-';
    for &b in digits.iter().take(20) {
        buf[n] = b;
        n += usize::from(b != b'.');
    }
    buf[n] = b'e';
    n += 1;
    if d.exp < 0 {
        buf[n] = b'-';
        n += 1;
    }
    let mut e = d.exp.unsigned_abs();
    let mut tmp = [0u8; 20];
    let mut k = tmp.len();
    loop {
        k -= 1;
        tmp[k] = b'0' + (e % 10) as u8;
        e /= 10;
        if e == 0 {
            break;
        }
    }
    let part = &tmp[k..];
    buf[n..n + part.len()].copy_from_slice(part);
    n += part.len();
    std::str::from_utf8(&buf[..n]).ok()?.parse().ok()
}

/// True when the literal `text`, read as `lit` (by [`read_literal_digits`], `digits` significant
/// digits), has the decimal value of `shortest`, the ES6 form of its double `value`.
pub(crate) fn decimal_is_exact(
    lit: &Decimal,
    digits: u32,
    text: &[u8],
    value: f64,
    shortest: &str,
) -> bool {
    // DBL_DIG = 15: distinct decimals of at most 15 significant digits map to distinct normal
    // doubles, so such a literal is the shortest round-trip form of its double.
    if digits <= 15 && value.is_normal() {
        return true;
    }
    // A literal already written in the ES6 form (most 16-17 digit literals from serializers
    // that print shortest round-trip digits) needs no arithmetic. ES6 output is a valid JSON
    // number, so the general case reads it with the literal's SWAR reader; that reader refuses
    // integers of 20-21 digits (trailing zeros), which the digit-by-digit reader takes.
    if digits > 17 {
        return false;
    }
    if text == shortest.as_bytes() {
        return true;
    }
    match read_literal_digits(shortest.as_bytes()) {
        Some((d, _, _)) => d.same_value(lit),
        None => decimal(shortest.as_bytes()).is_some_and(|d| d.same_value(lit)),
    }
}

/// Write the ES6 `Number::toString` form of the literal read as `d` with `digits` significant
/// digits into `out`, without going through a double, when that form is decided by the
/// literal alone: at most 15 significant digits and a value well inside the normal range. Then
/// (DBL_DIG = 15) the literal's digits are the shortest round-trip digits of its double, and
/// the literal is exact. Returns `false` (nothing written) otherwise.
///
/// `text` is the literal's significant digits as written (a dot possibly among them), as
/// [`read_literal_digits`] locates them.
pub(crate) fn es6_from_literal(d: &Decimal, digits: u32, text: &[u8], out: &mut Vec<u8>) -> bool {
    if d.mantissa == 0 || digits > 15 {
        return false;
    }
    // 10^(n-1) <= |value| < 10^n with n = exp + digits: normal and finite for these n.
    if !(-306..=308).contains(&(d.exp + i64::from(digits))) {
        return false;
    }
    write_es6_digits(d, digits, text, out)
}

/// Powers of ten that fit a `u128` (10^0 ..= 10^38).
const POW10_U128: [u128; 39] = {
    let mut t = [1u128; 39];
    let mut i = 1;
    while i < 39 {
        t[i] = t[i - 1] * 10;
        i += 1;
    }
    t
};

/// True when exact integer arithmetic proves that the literal read as `d` (non-zero, of the sign
/// of `value`) is what ECMAScript's `Number::toString` (shortest round-trip digits, the closest
/// to the double when several) prints for `value`, the double nearest to it. `false` means not
/// proven: not shortest, or a boundary, tie, subnormal or scale this leaves to the formatter.
///
/// With `d = m × 10^q` (`m` without trailing zeros) and the double's rounding interval `R` (half a
/// gap either side), the shortest form is `d` exactly when no multiple of `10^(q+1)` (every
/// shorter decimal near `d` is one) lies in `R`, and `d` is strictly the closest multiple of
/// `10^q` to the double. Every quantity is scaled to an integer in one `u128` frame.
pub(crate) fn literal_is_shortest(d: &Decimal, value: f64) -> bool {
    if d.mantissa == 0 || !value.is_normal() || d.negative != value.is_sign_negative() {
        return false;
    }
    let bits = value.to_bits();
    let biased = ((bits >> 52) & 0x7FF) as i64;
    let frac = bits & ((1 << 52) - 1);
    // The double is 4M × 2^s2; its half gaps are 2 units above and 2 below (1 at a power of
    // two, where the gap below halves).
    let big_m = u128::from(frac | (1 << 52));
    let s2 = biased - 1075 - 2;
    let below = if frac == 0 && biased > 1 { 1u128 } else { 2 };
    // Scale by 2^-s2 × 10^-q: the double side gets 10^max(-q,0) << max(s2,0), the decimal side
    // 10^max(q,0) << max(-s2,0). Bit lengths bound every product below 2^126 (room for the
    // sums and the doubling below), else the formatter decides.
    let q = d.exp;
    let (Some(&dec), Some(&up10)) = (
        POW10_U128.get(usize::try_from((-q).max(0)).unwrap_or(usize::MAX)),
        POW10_U128.get(usize::try_from(q.max(0)).unwrap_or(usize::MAX)),
    ) else {
        return false;
    };
    let (shl_dbl, shl_dec) = (s2.max(0) as u32, (-s2).max(0) as u32);
    let bits_of = |x: u128| 128 - x.leading_zeros();
    let m = u128::from(d.mantissa);
    if bits_of(big_m) + 2 + bits_of(dec) + shl_dbl > 126
        || bits_of(m * 10) + bits_of(up10) + shl_dec > 126
    {
        return false;
    }
    let v = (4 * big_m * dec) << shl_dbl;
    let (r_lo, r_hi) = (v - ((below * dec) << shl_dbl), v + ((2 * dec) << shl_dbl));
    let unit = up10 << shl_dec;
    let l = m * unit;
    let lo = l - (m % 10) * unit;
    let hi = lo + 10 * unit;
    // The literal lies in R (its double is the nearest); shorter decimals strictly outside R;
    // the literal strictly within half a unit of the double.
    (r_lo..=r_hi).contains(&l) && lo < r_lo && hi > r_hi && 2 * l.abs_diff(v) < unit
}

/// Write the ES6 `Number::toString` form of the exact decimal `d` (non-zero, `digits` <= 17
/// significant digits, `text` as for [`es6_from_literal`]). `false` (nothing written) when `text`
/// does not hold exactly `digits` digits.
pub(crate) fn write_es6_digits(d: &Decimal, digits: u32, text: &[u8], out: &mut Vec<u8>) -> bool {
    // The value is 0.d1..dk x 10^n.
    let k = i64::from(digits);
    let n = d.exp + k;
    // At most 17 digits and a dot.
    let mut buf = [0u8; 18];
    let mut len = 0;
    for &b in text.iter().take(18) {
        buf[len] = b;
        len += usize::from(b != b'.');
    }
    if len != digits as usize || digits > 17 {
        return false;
    }
    let ds = &buf[..len];
    if d.negative {
        out.push(b'-');
    }
    if k <= n && n <= 21 {
        out.extend_from_slice(ds);
        out.resize(out.len() + (n - k) as usize, b'0');
    } else if 0 < n && n <= 21 {
        let (a, b) = ds.split_at(n as usize);
        out.extend_from_slice(a);
        out.push(b'.');
        out.extend_from_slice(b);
    } else if -6 < n && n <= 0 {
        out.extend_from_slice(b"0.");
        out.resize(out.len() + (-n) as usize, b'0');
        out.extend_from_slice(ds);
    } else {
        out.push(ds[0]);
        if k > 1 {
            out.push(b'.');
            out.extend_from_slice(&ds[1..]);
        }
        out.push(b'e');
        let e = n - 1;
        out.push(if e < 0 { b'-' } else { b'+' });
        let e = e.unsigned_abs();
        if e >= 100 {
            out.push(b'0' + (e / 100) as u8);
        }
        if e >= 10 {
            out.push(b'0' + (e / 10 % 10) as u8);
        }
        out.push(b'0' + (e % 10) as u8);
    }
    true
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
) -> Result<(usize, NumberForm), (CanonErrorKind, usize)> {
    let mut i = start;
    let digit = |i: usize| matches!(input.get(i), Some(b'0'..=b'9'));
    if input.get(i) == Some(&b'-') {
        i += 1;
        if input[i..].starts_with(b"Infinity") {
            return Err((CanonErrorKind::NonFiniteNumber, start));
        }
    }
    match input.get(i) {
        Some(b'0') => {
            i += 1;
            if digit(i) {
                return Err((CanonErrorKind::LeadingZero, start));
            }
        }
        Some(b'1'..=b'9') => {
            i += 1 + digit_run(input, i + 1);
        }
        None => return Err((CanonErrorKind::UnexpectedEnd, i)),
        _ => return Err((CanonErrorKind::InvalidNumber, start)),
    }
    let int_end = i;
    let mut frac_end = None;
    if input.get(i) == Some(&b'.') {
        i += 1;
        let n = digit_run(input, i);
        if n == 0 {
            return Err((CanonErrorKind::InvalidNumber, start));
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
            return Err((CanonErrorKind::InvalidNumber, start));
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
        return Err((CanonErrorKind::InvalidNumber, start));
    };
    if !value.is_finite() {
        return Err((CanonErrorKind::NumberOutOfRange, start));
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

    /// The one-pass literal reader and its conversion agree with the standard parser bit for
    /// bit, and with the exact-decimal rule.
    #[test]
    fn literal_reader_agrees_with_std() {
        let mut lits: Vec<String> = [
            "0",
            "-0",
            "0.0",
            "-0.0e5",
            "1",
            "10",
            "100e-2",
            "9007199254740992",
            "9007199254740993",
            "18446744073709551615",
            "1234567890123456789",
            "12345678901234567890",
            "0.1",
            "0.30000000000000004",
            "1e21",
            "1e-7",
            "5e-324",
            "4.9e-324",
            "2.2250738585072014e-308",
            "2.2250738585072011e-308",
            "1.7976931348623157e308",
            "1.7976931348623158e308",
            "1e22",
            "1e23",
            "9e22",
            "123456789012345e-22",
            "1424953923781206.25",
            "0.000001",
            "0.0000001",
            "-1.5E+2",
            "1e+0",
            "12.50000",
            "0.000000000000000000000000000000000123",
            "100000000000000000000000000000000000000",
            "1e-400",
            "1e400",
            "1e999999",
            "1e0000005",
            "8.103807940831011e-175",
            "-9.550253805403221e-297",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = f64::from_bits(x >> 1);
            if v.is_finite() {
                lits.push(format!("{v}"));
                lits.push(format!("{v:e}"));
                lits.push(format!("{:.3e}", v));
            }
            let m = x % 100_000_000_000_000_000;
            let e = (x >> 40) as i64 % 700 - 350;
            lits.push(format!("{m}e{e}"));
            lits.push(format!("{}e{}", m % 1_000_000_000_000_000, e % 30));
            lits.push(format!("-{}e{}", m % 1_000, e % 25));
            lits.push(format!("-0.{:0>20}e{}", m, e / 3));
        }
        for lit in &lits {
            let want: f64 = lit.parse().expect("number");
            let Some((d, digits, (a, b))) = read_literal_digits(lit.as_bytes()) else {
                assert!(
                    lit.contains("0000005") || lit.trim_start_matches('-').len() > 19,
                    "{lit} refused"
                );
                continue;
            };
            let got = decimal_to_f64(&d, &lit.as_bytes()[a..b], lit.as_bytes()).expect("converts");
            let long = format!("{lit}{}", " ".repeat(40));
            let via_digits = decimal_to_f64(&d, &lit.as_bytes()[a..b], long.as_bytes());
            assert_eq!(via_digits.map(f64::to_bits), Some(want.to_bits()), "{lit}");
            assert_eq!(got.to_bits(), want.to_bits(), "{lit}");
            let mut text = Vec::new();
            if es6_from_literal(&d, digits, &lit.as_bytes()[a..b], &mut text) {
                assert_eq!(
                    text,
                    format_number(want).expect("finite").as_bytes(),
                    "{lit}"
                );
                assert!(literal_is_exact(
                    lit.as_bytes(),
                    &format_number(want).expect("finite")
                ));
            }
            if want.is_finite() {
                let mut b = ryu_js::Buffer::new();
                let s = format_finite(want, &mut b);
                assert_eq!(
                    decimal_is_exact(&d, digits, lit.as_bytes(), want, s),
                    literal_is_exact(lit.as_bytes(), s),
                    "{lit}"
                );
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

    /// The literal fast path of strict mode agrees with the formatter: whenever
    /// `literal_is_shortest` proves a literal is its double's shortest form, the ES6 text
    /// written from its digits is the formatter's, and every literal it refuses that the
    /// formatter would accept is left to the formatter (never a wrong answer, only a slower one).
    /// Literals: the shortest forms of pseudo-random doubles over many magnitudes, and those
    /// forms with the last digit moved, a digit appended, or cut.
    #[test]
    fn shortest_proof_agrees_with_formatter() {
        let mut state = 0x9E37_79B9_7F4A_7C15_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let (mut everyday, mut everyday_proven, mut proven) = (0u32, 0u32, 0u32);
        for i in 0..200_000u32 {
            let r = next();
            // Half uniform bit patterns (every exponent), half values in everyday ranges.
            let v = if i % 2 == 0 {
                f64::from_bits(r)
            } else {
                let unit = (r >> 11) as f64 / (1u64 << 53) as f64;
                (unit - 0.5) * 10f64.powi((r % 40) as i32 - 12)
            };
            if !v.is_finite() || v == 0.0 {
                continue;
            }
            let mut b = ryu_js::Buffer::new();
            let s = format_finite(v, &mut b).to_owned();
            let mut literals = vec![s.clone()];
            let last = s.rfind(|c: char| c.is_ascii_digit() && c != '0');
            if let (Some(p), None) = (last, s.find('e')) {
                let digit = s.as_bytes()[p];
                for alt in [digit - 1, digit + 1] {
                    if alt.is_ascii_digit() {
                        let mut t = s.clone().into_bytes();
                        t[p] = alt;
                        literals.push(String::from_utf8(t).expect("ascii"));
                    }
                }
                if s.contains('.') {
                    literals.push(format!("{s}1"));
                    literals.push(format!("{s}9"));
                    literals.push(s[..p].to_owned() + "0");
                }
            }
            for lit in literals {
                let Some((d, digits, (a, z))) = read_literal_digits(lit.as_bytes()) else {
                    continue;
                };
                let Ok(want) = lit.parse::<f64>() else {
                    continue;
                };
                if !want.is_finite() {
                    continue;
                }
                let mut b = ryu_js::Buffer::new();
                let formatted = format_finite(want, &mut b);
                let exact = decimal_is_exact(&d, digits, lit.as_bytes(), want, formatted);
                let mut out = Vec::new();
                let fast = (16..=17).contains(&digits)
                    && literal_is_shortest(&d, want)
                    && write_es6_digits(&d, digits, &lit.as_bytes()[a..z], &mut out);
                if fast {
                    assert!(
                        exact,
                        "{lit}: proven shortest but the formatter prints {formatted}"
                    );
                    assert_eq!(out, formatted.as_bytes(), "{lit}");
                    proven += 1;
                }
                if lit == s && (16..=17).contains(&digits) && i % 2 == 1 && v.abs() >= 1e-6 {
                    everyday += 1;
                    everyday_proven += u32::from(fast);
                }
            }
        }
        // The fast path must carry everyday values (ties and exact halves go to the formatter).
        assert!(proven > 10_000, "{proven}");
        assert!(
            everyday > 10_000 && everyday_proven * 100 > everyday * 90,
            "{everyday_proven} of {everyday} everyday shortest forms proven"
        );
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
}
