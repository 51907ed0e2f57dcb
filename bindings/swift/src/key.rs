//! `Idempotency-Key` parsing, validation and generation over the FFI (`idempo_core::key`).
use idempo_core::key as core;

use crate::to_u64;

/// Length bounds and strictness for key parsing (core `KeyOptions`, validated on every call).
#[derive(Debug, Clone, Copy, PartialEq, Eq, uniffi::Record)]
pub struct KeyOptions {
    /// Shortest accepted key, in characters (at least 1).
    pub min_len: u32,
    /// Longest accepted key, in characters (at most 255).
    pub max_len: u32,
    /// Accept only the draft sf-string form (`"..."`).
    pub strict: bool,
}

/// Which syntax a key was written in (core `KeyForm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, uniffi::Enum)]
pub enum KeyForm {
    /// The draft form: an RFC 9651 sf-string, possibly with parameters.
    SfString,
    /// The bare form: unquoted printable ASCII without space, `"` or `,`.
    Bare,
    /// Already-decoded key text.
    Text,
}

/// A parsed header value.
#[derive(Debug, Clone, PartialEq, Eq, uniffi::Record)]
pub struct ParsedKey {
    /// The decoded key text.
    pub key: String,
    /// The syntax it was written in.
    pub form: KeyForm,
    /// How many RFC 9651 parameters followed the sf-string (validated, then ignored).
    pub ignored_parameters: u32,
}

/// Why a key, its options or its entropy was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, uniffi::Error)]
pub enum KeyError {
    /// The value is not a well-formed key (empty, bad character, bad quoting or parameters, bare
    /// form in strict mode).
    #[error("{message}")]
    Malformed {
        /// Core's stable snake_case code, e.g. `invalid_character`.
        code: String,
        /// Core's message (input shown only as an escaped, truncated preview).
        message: String,
        /// Byte offset the error points at, when it points at one.
        offset: Option<u64>,
    },
    /// The key is shorter than the configured minimum.
    #[error("{message}")]
    TooShort {
        /// Key length in characters.
        len: u64,
        /// The configured minimum.
        min: u64,
        /// Core's message.
        message: String,
    },
    /// The key is longer than the configured maximum.
    #[error("{message}")]
    TooLong {
        /// Key length in characters.
        len: u64,
        /// The configured maximum.
        max: u64,
        /// Core's message.
        message: String,
    },
    /// The [`KeyOptions`] are out of range.
    #[error("{message}")]
    InvalidOptions {
        /// Core's stable snake_case code, e.g. `min_above_max`.
        code: String,
        /// Core's message.
        message: String,
    },
    /// [`generate_key`] was given entropy that is not exactly 16 bytes.
    #[error("a key needs exactly 16 bytes of entropy, got {len}")]
    InvalidEntropy {
        /// The number of bytes given.
        len: u64,
    },
}

impl From<core::KeyError> for KeyError {
    fn from(e: core::KeyError) -> Self {
        let message = e.to_string();
        match e {
            core::KeyError::TooShort { len, min } => KeyError::TooShort {
                len: to_u64(len),
                min: to_u64(min),
                message,
            },
            core::KeyError::TooLong { len, max } => KeyError::TooLong {
                len: to_u64(len),
                max: to_u64(max),
                message,
            },
            other => KeyError::Malformed {
                code: other.code().to_owned(),
                offset: other.offset().map(to_u64),
                message,
            },
        }
    }
}

impl From<core::KeyConfigError> for KeyError {
    fn from(e: core::KeyConfigError) -> Self {
        KeyError::InvalidOptions {
            code: e.code().to_owned(),
            message: e.to_string(),
        }
    }
}

impl From<core::KeyForm> for KeyForm {
    fn from(f: core::KeyForm) -> Self {
        match f {
            core::KeyForm::SfString => KeyForm::SfString,
            core::KeyForm::Bare => KeyForm::Bare,
            core::KeyForm::Text => KeyForm::Text,
        }
    }
}

impl From<core::KeyOptions> for KeyOptions {
    fn from(o: core::KeyOptions) -> Self {
        // Core bounds max_len by 255, so both lengths fit in u32.
        KeyOptions {
            min_len: u32::try_from(o.min_len()).unwrap_or(u32::MAX),
            max_len: u32::try_from(o.max_len()).unwrap_or(u32::MAX),
            strict: o.is_strict(),
        }
    }
}

impl TryFrom<KeyOptions> for core::KeyOptions {
    type Error = KeyError;

    fn try_from(o: KeyOptions) -> Result<Self, KeyError> {
        let min = usize::try_from(o.min_len).unwrap_or(usize::MAX);
        let max = usize::try_from(o.max_len).unwrap_or(usize::MAX);
        Ok(core::KeyOptions::new(min, max)?.with_strict(o.strict))
    }
}

/// Options that accept any well-formed key text of 1 to 255 characters (used where only the
/// character set matters, e.g. formatting a key for the header).
fn any_length() -> Result<core::KeyOptions, KeyError> {
    Ok(core::KeyOptions::new(1, core::MAX_LEN_LIMIT)?)
}

/// Core's default key options: 8 to 128 characters, both forms accepted.
#[must_use]
#[uniffi::export]
pub fn default_key_options() -> KeyOptions {
    core::KeyOptions::default().into()
}

/// Parses an `Idempotency-Key` header value (sf-string or bare form).
///
/// # Errors
/// [`KeyError`] describing the first problem, or `InvalidOptions`.
#[uniffi::export]
pub fn parse_key(header_value: String, options: KeyOptions) -> Result<ParsedKey, KeyError> {
    parse_key_bytes(header_value.into_bytes(), options)
}

/// [`parse_key`] for a raw header value (field values are bytes, not necessarily UTF-8).
///
/// # Errors
/// [`KeyError`] describing the first problem, or `InvalidOptions`.
#[uniffi::export]
pub fn parse_key_bytes(header_value: Vec<u8>, options: KeyOptions) -> Result<ParsedKey, KeyError> {
    let opts = core::KeyOptions::try_from(options)?;
    let parsed = core::parse_key_detailed(&header_value, &opts)?;
    Ok(ParsedKey {
        key: parsed.key.as_str().to_owned(),
        form: parsed.form.into(),
        ignored_parameters: u32::try_from(parsed.ignored_parameters).unwrap_or(u32::MAX),
    })
}

/// Validates already-decoded key text (e.g. a key read back from storage) and returns it.
///
/// # Errors
/// `Malformed` for a character outside printable ASCII, `TooShort`/`TooLong`, `InvalidOptions`.
#[uniffi::export]
pub fn validate_key_text(text: String, options: KeyOptions) -> Result<String, KeyError> {
    let opts = core::KeyOptions::try_from(options)?;
    Ok(core::IdempotencyKey::from_text(&text, &opts)?
        .as_str()
        .to_owned())
}

/// A fresh UUIDv4-shaped key from exactly 16 bytes of host entropy (use a CSPRNG).
///
/// # Errors
/// `InvalidEntropy` when `entropy` is not 16 bytes long.
#[uniffi::export]
pub fn generate_key(entropy: Vec<u8>) -> Result<String, KeyError> {
    let bytes: [u8; 16] = entropy
        .as_slice()
        .try_into()
        .map_err(|_| KeyError::InvalidEntropy {
            len: to_u64(entropy.len()),
        })?;
    Ok(core::IdempotencyKey::generate(bytes).as_str().to_owned())
}

/// The header value a client sends for `key`: the draft sf-string form (`"..."`, with `\` and
/// `"` escaped).
///
/// # Errors
/// `Malformed` when `key` contains a character no key may contain, `TooLong` above 255.
#[uniffi::export]
pub fn key_header_value(key: String) -> Result<String, KeyError> {
    let key = core::IdempotencyKey::from_text(&key, &any_length()?)?;
    Ok(key.to_header_value())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_forms() {
        let opts = default_key_options();
        let sf = parse_key(r#""abc-12345";x=1"#.to_owned(), opts).unwrap();
        assert_eq!(sf.key, "abc-12345");
        assert_eq!(sf.form, KeyForm::SfString);
        assert_eq!(sf.ignored_parameters, 1);
        let bare = parse_key("abc-12345".to_owned(), opts).unwrap();
        assert_eq!(bare.form, KeyForm::Bare);
        let err = parse_key_bytes(b"abc\xffdefgh".to_vec(), opts).unwrap_err();
        assert!(matches!(
            err,
            KeyError::Malformed {
                offset: Some(3),
                ..
            }
        ));
    }

    #[test]
    fn maps_length_errors_with_bounds() {
        let err = parse_key("short".to_owned(), default_key_options()).unwrap_err();
        assert!(matches!(err, KeyError::TooShort { len: 5, min: 8, .. }));
        let long = "k".repeat(129);
        let err = validate_key_text(long, default_key_options()).unwrap_err();
        assert!(matches!(
            err,
            KeyError::TooLong {
                len: 129,
                max: 128,
                ..
            }
        ));
    }

    #[test]
    fn malformed_keys_keep_code_and_offset() {
        let err = parse_key("abc def-123".to_owned(), default_key_options()).unwrap_err();
        match err {
            KeyError::Malformed { code, offset, .. } => {
                assert_eq!(code, "invalid_character");
                assert_eq!(offset, Some(3));
            }
            other => panic!("unexpected {other:?}"),
        }
        let strict = KeyOptions {
            strict: true,
            ..default_key_options()
        };
        let err = parse_key("abcdefgh".to_owned(), strict).unwrap_err();
        assert!(
            matches!(err, KeyError::Malformed { ref code, .. } if code == "bare_form_not_allowed")
        );
    }

    #[test]
    fn bad_options_are_typed() {
        let opts = KeyOptions {
            min_len: 10,
            max_len: 5,
            strict: false,
        };
        let err = parse_key("abcdefgh".to_owned(), opts).unwrap_err();
        assert!(
            matches!(err, KeyError::InvalidOptions { ref code, .. } if code == "min_above_max")
        );
    }

    #[test]
    fn generate_uses_all_given_entropy_and_checks_length() {
        let key = generate_key((0u8..16).collect()).unwrap();
        assert_eq!(key, "00010203-0405-4607-8809-0a0b0c0d0e0f");
        assert_eq!(
            generate_key(vec![0; 15]),
            Err(KeyError::InvalidEntropy { len: 15 })
        );
        assert!(validate_key_text(key, default_key_options()).is_ok());
    }

    #[test]
    fn header_value_round_trips() {
        let value = key_header_value(r#"a"b\c-1234"#.to_owned()).unwrap();
        assert_eq!(value, r#""a\"b\\c-1234""#);
        let back = parse_key(value, default_key_options()).unwrap();
        assert_eq!(back.key, r#"a"b\c-1234"#);
        assert!(matches!(
            key_header_value("tab\there".to_owned()),
            Err(KeyError::Malformed { .. })
        ));
    }
}
