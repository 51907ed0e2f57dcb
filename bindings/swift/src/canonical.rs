//! RFC 8785 canonical JSON over the FFI (`idempo_core::canonical`).
use idempo_core::canonical as core;

use crate::{to_u64, to_usize};

/// How number literals that a double cannot hold exactly are treated (core `NumberMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, uniffi::Enum)]
pub enum NumberMode {
    /// RFC 8785: round to the nearest double.
    Rfc,
    /// Refuse a literal whose decimal value a double cannot represent exactly.
    RejectPrecisionLoss,
}

/// Limits and number policy of [`canonicalize_with`] (core `CanonOptions`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, uniffi::Record)]
pub struct CanonicalOptions {
    /// Largest accepted input, in bytes.
    pub max_input_bytes: u64,
    /// Deepest accepted nesting of arrays and objects.
    pub max_depth: u64,
    /// Most members accepted in one object.
    pub max_members: u64,
    /// Number policy.
    pub numbers: NumberMode,
}

/// A JSON text that core refused to canonicalize.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, uniffi::Error)]
pub enum CanonicalError {
    /// The text is not acceptable JSON (syntax, encoding, duplicates, numbers).
    #[error("{message}")]
    InvalidJson {
        /// Core's stable snake_case code, e.g. `duplicate_member`.
        code: String,
        /// Core's message.
        message: String,
        /// Byte offset of the first offending byte.
        offset: u64,
        /// RFC 6901 pointer of the value concerned, when inside a value.
        pointer: Option<String>,
    },
    /// A configured limit (size, depth, members) was exceeded.
    #[error("{message}")]
    LimitExceeded {
        /// Core's stable snake_case code: `input_too_large`, `depth_limit` or `too_many_members`.
        code: String,
        /// Core's message.
        message: String,
        /// Byte offset where the limit was hit.
        offset: u64,
        /// The configured limit.
        limit: u64,
        /// RFC 6901 pointer of the value where the limit was hit, when inside a value.
        pointer: Option<String>,
    },
    /// An exclusion pointer is malformed (or the root pointer, or too many pointers).
    #[error("{message}")]
    InvalidPointer {
        /// Core's stable snake_case code, e.g. `pointer_missing_slash`.
        code: String,
        /// Core's message.
        message: String,
    },
}

impl From<core::PointerError> for CanonicalError {
    fn from(e: core::PointerError) -> Self {
        CanonicalError::InvalidPointer {
            code: e.code().to_owned(),
            message: e.to_string(),
        }
    }
}

impl From<core::CanonError> for CanonicalError {
    fn from(e: core::CanonError) -> Self {
        let code = e.code().to_owned();
        let message = e.to_string();
        let offset = to_u64(e.offset);
        match e.kind {
            core::CanonErrorKind::InputTooLarge { limit }
            | core::CanonErrorKind::DepthLimit { limit }
            | core::CanonErrorKind::TooManyMembers { limit } => CanonicalError::LimitExceeded {
                code,
                message,
                offset,
                limit: to_u64(limit),
                pointer: e.pointer,
            },
            _ => CanonicalError::InvalidJson {
                code,
                message,
                offset,
                pointer: e.pointer,
            },
        }
    }
}

impl From<core::NumberMode> for NumberMode {
    fn from(m: core::NumberMode) -> Self {
        match m {
            core::NumberMode::Rfc => NumberMode::Rfc,
            core::NumberMode::RejectPrecisionLoss => NumberMode::RejectPrecisionLoss,
        }
    }
}

impl From<NumberMode> for core::NumberMode {
    fn from(m: NumberMode) -> Self {
        match m {
            NumberMode::Rfc => core::NumberMode::Rfc,
            NumberMode::RejectPrecisionLoss => core::NumberMode::RejectPrecisionLoss,
        }
    }
}

impl From<core::CanonOptions> for CanonicalOptions {
    fn from(o: core::CanonOptions) -> Self {
        CanonicalOptions {
            max_input_bytes: to_u64(o.limits.max_input_bytes),
            max_depth: to_u64(o.limits.max_depth),
            max_members: to_u64(o.limits.max_members),
            numbers: o.numbers.into(),
        }
    }
}

impl From<CanonicalOptions> for core::CanonOptions {
    fn from(o: CanonicalOptions) -> Self {
        core::CanonOptions {
            limits: core::Limits {
                max_input_bytes: to_usize(o.max_input_bytes),
                max_depth: to_usize(o.max_depth),
                max_members: to_usize(o.max_members),
            },
            numbers: o.numbers.into(),
        }
    }
}

/// Core's default canonicalization options (8 MiB, depth 128, 100,000 members, RFC numbers).
#[must_use]
#[uniffi::export]
pub fn default_canonical_options() -> CanonicalOptions {
    core::CanonOptions::default().into()
}

/// The RFC 8785 canonical form of a JSON text, with core's default options.
///
/// # Errors
/// [`CanonicalError`] for any text core refuses.
#[uniffi::export]
pub fn canonicalize(json: Vec<u8>) -> Result<Vec<u8>, CanonicalError> {
    Ok(core::canonicalize(&json)?)
}

/// The RFC 8785 canonical form of a JSON text, with explicit options.
///
/// # Errors
/// [`CanonicalError`] for any text core refuses or a limit exceeded.
#[uniffi::export]
pub fn canonicalize_with(
    json: Vec<u8>,
    options: CanonicalOptions,
) -> Result<Vec<u8>, CanonicalError> {
    Ok(core::canonicalize_with(&json, &options.into())?)
}

/// The canonical form of a JSON text with the values at the RFC 6901 pointers in `exclude` left
/// out (they are still validated), as the fingerprint does with its `exclude` setting.
///
/// # Errors
/// `InvalidPointer` for a bad pointer, otherwise as [`canonicalize_with`].
#[uniffi::export]
pub fn canonicalize_excluding(
    json: Vec<u8>,
    options: CanonicalOptions,
    exclude: Vec<String>,
) -> Result<Vec<u8>, CanonicalError> {
    let exclusions = core::Exclusions::new(&exclude)?;
    let mut out = Vec::with_capacity(json.len());
    core::canonicalize_excluding_to(&json, &options.into(), &exclusions, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorts_members_and_formats_numbers() {
        let out = canonicalize(br#"{"b": 1.0, "a": [true, null, "x"]}"#.to_vec()).unwrap();
        assert_eq!(out, br#"{"a":[true,null,"x"],"b":1}"#);
    }

    #[test]
    fn duplicate_member_is_invalid_json_with_code_and_pointer() {
        let err = canonicalize(br#"{"a":1,"a":2}"#.to_vec()).unwrap_err();
        match err {
            CanonicalError::InvalidJson {
                code,
                offset,
                message,
                ..
            } => {
                assert_eq!(code, "duplicate_member");
                assert!(offset > 0);
                assert!(!message.is_empty());
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn limits_are_reported_as_limit_exceeded() {
        let mut opts = default_canonical_options();
        opts.max_depth = 2;
        let err = canonicalize_with(b"[[[1]]]".to_vec(), opts).unwrap_err();
        assert!(matches!(
            err,
            CanonicalError::LimitExceeded { ref code, limit: 2, .. } if code == "depth_limit"
        ));
    }

    #[test]
    fn exclusions_drop_values_and_check_pointers() {
        let opts = default_canonical_options();
        let out = canonicalize_excluding(
            br#"{"ts":1,"a":{"b":2,"c":3}}"#.to_vec(),
            opts,
            vec!["/ts".into(), "/a/c".into()],
        )
        .unwrap();
        assert_eq!(out, br#"{"a":{"b":2}}"#);
        let err = canonicalize_excluding(b"{}".to_vec(), opts, vec!["ts".into()]).unwrap_err();
        assert!(
            matches!(err, CanonicalError::InvalidPointer { ref code, .. } if code == "pointer_missing_slash")
        );
    }

    #[test]
    fn options_round_trip_through_core() {
        let ffi = default_canonical_options();
        let back: core::CanonOptions = ffi.into();
        assert_eq!(back, core::CanonOptions::default());
    }

    #[test]
    fn precision_mode_is_passed_to_core() {
        let mut opts = default_canonical_options();
        opts.numbers = NumberMode::RejectPrecisionLoss;
        let err = canonicalize_with(b"9007199254740993".to_vec(), opts).unwrap_err();
        assert!(
            matches!(err, CanonicalError::InvalidJson { ref code, .. } if code == "precision_loss")
        );
        assert_eq!(
            canonicalize(b"9007199254740993".to_vec()).unwrap(),
            b"9007199254740992"
        );
    }
}
