//! Number conversions between JavaScript doubles and core integers.
use crate::error::{Fail, code};

/// Largest integer a JavaScript number holds exactly (2^53 - 1).
pub(crate) const MAX_SAFE: f64 = 9_007_199_254_740_991.0;

/// A non-negative integer millisecond count (or any other count) from a JS number.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
pub(crate) fn to_u64(value: f64, name: &str) -> Result<u64, Fail> {
    if (0.0..=MAX_SAFE).contains(&value) && value.fract() == 0.0 {
        Ok(value as u64)
    } else {
        Err(Fail::new(
            code::INVALID_ARGUMENT,
            format!("{name} must be a non-negative safe integer, got {value}"),
        ))
    }
}

/// A JS number from a core `u64` (saturating at 2^53 - 1, far beyond any real time).
#[allow(clippy::cast_precision_loss)]
pub(crate) fn from_u64(value: u64) -> f64 {
    (value.min(MAX_SAFE as u64)) as f64
}

/// An HTTP status code from a JS number.
pub(crate) fn to_status(value: u32) -> Result<u16, Fail> {
    u16::try_from(value).map_err(|_| {
        Fail::new(
            code::INVALID_ARGUMENT,
            format!("HTTP status {value} is out of range"),
        )
    })
}
