//! Typed errors of the canonicalizer.

use std::fmt;

/// What went wrong while reading or canonicalizing a JSON text.
///
/// Every variant has a stable snake_case code ([`CanonErrorKind::code`]) that the bindings, the CLI
/// and the vectors in `spec/vectors/canonical/` use. Codes never change meaning; new variants may be
/// added.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CanonErrorKind {
    /// The input is longer than [`Limits::max_input_bytes`](super::Limits::max_input_bytes).
    #[error("input is larger than the limit of {limit} bytes")]
    InputTooLarge {
        /// The configured limit in bytes.
        limit: usize,
    },
    /// The input starts with a UTF-8 byte order mark (EF BB BF).
    #[error("input starts with a byte order mark")]
    ByteOrderMark,
    /// The input is not well-formed UTF-8.
    #[error("invalid UTF-8")]
    InvalidUtf8,
    /// A lone or reversed UTF-16 surrogate, escaped (`\uD800`) or raw (`ED A0 80`).
    #[error("lone or reversed surrogate")]
    LoneSurrogate,
    /// The input ended in the middle of a value.
    #[error("unexpected end of input")]
    UnexpectedEnd,
    /// A byte that cannot start or continue a JSON token at this place.
    #[error("unexpected byte 0x{byte:02x}")]
    UnexpectedCharacter {
        /// The offending byte (shown in hex, never echoed raw).
        byte: u8,
    },
    /// Something other than whitespace follows the top-level value.
    #[error("data after the end of the JSON value")]
    TrailingData,
    /// A `,` directly before `]` or `}`.
    #[error("trailing comma")]
    TrailingComma,
    /// A `//` or `/*` comment (JSON has no comments).
    #[error("comments are not allowed in JSON")]
    Comment,
    /// Whitespace other than space, tab, line feed and carriage return (e.g. vertical tab, NBSP).
    #[error("whitespace character not allowed in JSON")]
    InvalidWhitespace,
    /// A misspelled `true`, `false` or `null`.
    #[error("invalid literal")]
    InvalidLiteral,
    /// `NaN`, `Infinity` or `-Infinity`, which JSON cannot carry.
    #[error("NaN and Infinity are not JSON numbers")]
    NonFiniteNumber,
    /// A number with a superfluous leading zero, such as `01` or `-00.5`.
    #[error("number with a leading zero")]
    LeadingZero,
    /// A malformed number: `+1`, `.5`, `1.`, `1e`, `-`, ...
    #[error("malformed number")]
    InvalidNumber,
    /// A number literal whose magnitude overflows an IEEE-754 double (e.g. `1e400`).
    #[error("number is outside the range of an IEEE-754 double")]
    NumberOutOfRange,
    /// Under [`NumberMode::RejectPrecisionLoss`](super::NumberMode::RejectPrecisionLoss): the
    /// literal's decimal value differs from the shortest round-trip form of the double it parses to.
    #[error(
        "number cannot be represented exactly as an IEEE-754 double; send it as a JSON string instead"
    )]
    PrecisionLoss,
    /// A raw control character (U+0000 to U+001F) inside a string.
    #[error("unescaped control character 0x{byte:02x} in string")]
    ControlCharacter {
        /// The control character's byte value.
        byte: u8,
    },
    /// A backslash escape that JSON does not define, or a malformed `\u` escape.
    #[error("invalid escape sequence")]
    InvalidEscape,
    /// Two members of one object share a name (compared after unescaping).
    #[error("duplicate member name")]
    DuplicateMember,
    /// Arrays and objects nest deeper than [`Limits::max_depth`](super::Limits::max_depth).
    #[error("nesting deeper than the limit of {limit}")]
    DepthLimit {
        /// The configured depth limit.
        limit: usize,
    },
    /// An object has more members than [`Limits::max_members`](super::Limits::max_members).
    #[error("object has more members than the limit of {limit}")]
    TooManyMembers {
        /// The configured member limit.
        limit: usize,
    },
}

impl CanonErrorKind {
    /// The stable snake_case code of this error, e.g. `"duplicate_member"`.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Self::InputTooLarge { .. } => "input_too_large",
            Self::ByteOrderMark => "byte_order_mark",
            Self::InvalidUtf8 => "invalid_utf8",
            Self::LoneSurrogate => "lone_surrogate",
            Self::UnexpectedEnd => "unexpected_end",
            Self::UnexpectedCharacter { .. } => "unexpected_character",
            Self::TrailingData => "trailing_data",
            Self::TrailingComma => "trailing_comma",
            Self::Comment => "comment",
            Self::InvalidWhitespace => "invalid_whitespace",
            Self::InvalidLiteral => "invalid_literal",
            Self::NonFiniteNumber => "non_finite_number",
            Self::LeadingZero => "leading_zero",
            Self::InvalidNumber => "invalid_number",
            Self::NumberOutOfRange => "number_out_of_range",
            Self::PrecisionLoss => "precision_loss",
            Self::ControlCharacter { .. } => "control_character",
            Self::InvalidEscape => "invalid_escape",
            Self::DuplicateMember => "duplicate_member",
            Self::DepthLimit { .. } => "depth_limit",
            Self::TooManyMembers { .. } => "too_many_members",
        }
    }
}

/// A rejected JSON text: what ([`kind`](Self::kind)), where in bytes ([`offset`](Self::offset)) and,
/// when the error concerns a value, where in the document ([`pointer`](Self::pointer)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanonError {
    /// What went wrong.
    pub kind: CanonErrorKind,
    /// Byte offset into the input of the first offending byte (for a value: its first byte).
    pub offset: usize,
    /// RFC 6901 JSON Pointer of the value concerned (`""` is the whole document); `None` where the
    /// error is not inside a value (size limit, byte order mark, trailing data).
    pub pointer: Option<String>,
}

impl CanonError {
    /// The stable snake_case code of [`kind`](Self::kind), e.g. `"lone_surrogate"`.
    #[must_use]
    pub fn code(&self) -> &'static str {
        self.kind.code()
    }

    pub(crate) fn new(kind: CanonErrorKind, offset: usize, pointer: Option<String>) -> Self {
        Self {
            kind,
            offset,
            pointer,
        }
    }
}

impl fmt::Display for CanonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}) at byte {}", self.kind, self.code(), self.offset)?;
        if let Some(p) = &self.pointer {
            // `{:?}` escapes quotes and control characters: member names are never echoed raw.
            write!(f, ", JSON pointer {p:?}")?;
        }
        Ok(())
    }
}

impl std::error::Error for CanonError {}
