//! `Idempotency-Key` header parsing and validation.
//!
//! The normative contract is `spec/KEYS.md` §1; this module implements it. In short:
//!
//! - **Draft form** (draft-ietf-httpapi-idempotency-key-header): the field value is an RFC 9651
//!   Item whose bare item is an sf-string: `"` … `"` with `\"` and `\\` as the only escapes and
//!   printable ASCII (`%x20-7E`) inside. RFC 9651 parameters after the string (`"k";a=1`) are
//!   parsed and validated by the RFC 9651 grammar, then ignored: the draft defines none and
//!   RFC 9651 expects unknown parameters to be ignored. Spaces are allowed inside the quotes.
//! - **Bare form** (what most clients send today): one or more bytes of `%x21-7E` except `"`
//!   and `,` (no space, no quote; a comma is refused because it is what joins repeated header
//!   lines). There are no escapes and no parameters: every byte is part of the key.
//! - **Strict mode** accepts the draft form only.
//! - Leading and trailing optional whitespace (SP, HTAB) around the field value is removed first.
//! - The key is the decoded text; its length (in bytes, equal to characters since it is ASCII)
//!   must lie in `min_len..=max_len` (default `8..=128`; `max_len` may be raised to 255).
//!   Keys are case-sensitive and compared byte for byte.
//!
//! Errors are typed ([`KeyError`]) with a stable [`KeyError::code`], and never carry raw input:
//! they hold an escaped, truncated [`Preview`] that is safe to log.
use std::fmt;

use thiserror::Error;

/// Default minimum key length, in characters.
pub const DEFAULT_MIN_LEN: usize = 8;
/// Default maximum key length, in characters.
pub const DEFAULT_MAX_LEN: usize = 128;
/// The largest `max_len` a [`KeyOptions`] accepts (the same bound Stripe uses).
pub const MAX_LEN_LIMIT: usize = 255;
/// How many input bytes an error [`Preview`] shows before it is truncated.
pub const PREVIEW_BYTES: usize = 24;

/// Validated options for [`parse_key`]. Build with [`KeyOptions::new`] or take the default.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KeyOptions {
    min_len: usize,
    max_len: usize,
    strict: bool,
}

impl Default for KeyOptions {
    /// `8..=128` characters, both forms accepted.
    fn default() -> Self {
        KeyOptions {
            min_len: DEFAULT_MIN_LEN,
            max_len: DEFAULT_MAX_LEN,
            strict: false,
        }
    }
}

impl KeyOptions {
    /// Options accepting keys of `min_len..=max_len` characters, both forms, not strict.
    ///
    /// # Errors
    /// [`KeyConfigError`] when `min_len` is 0, `min_len > max_len` or `max_len > 255`.
    pub fn new(min_len: usize, max_len: usize) -> Result<Self, KeyConfigError> {
        if min_len == 0 {
            return Err(KeyConfigError::MinLenZero);
        }
        if max_len > MAX_LEN_LIMIT {
            return Err(KeyConfigError::MaxLenTooLarge { max_len });
        }
        if min_len > max_len {
            return Err(KeyConfigError::MinAboveMax { min_len, max_len });
        }
        Ok(KeyOptions {
            min_len,
            max_len,
            strict: false,
        })
    }

    /// The same options with strict mode on or off (strict: the draft sf-string form only).
    #[must_use]
    pub fn with_strict(mut self, strict: bool) -> Self {
        self.strict = strict;
        self
    }

    /// Minimum key length in characters.
    #[must_use]
    pub fn min_len(&self) -> usize {
        self.min_len
    }

    /// Maximum key length in characters.
    #[must_use]
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Whether only the draft (sf-string) form is accepted.
    #[must_use]
    pub fn is_strict(&self) -> bool {
        self.strict
    }
}

/// An invalid [`KeyOptions`] configuration.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KeyConfigError {
    /// `min_len` was 0: an empty key is never valid.
    #[error("min_len must be at least 1")]
    MinLenZero,
    /// `min_len` was greater than `max_len`.
    #[error("min_len {min_len} is greater than max_len {max_len}")]
    MinAboveMax {
        /// The requested minimum.
        min_len: usize,
        /// The requested maximum.
        max_len: usize,
    },
    /// `max_len` exceeded [`MAX_LEN_LIMIT`] (255).
    #[error("max_len {max_len} exceeds the limit of {MAX_LEN_LIMIT}")]
    MaxLenTooLarge {
        /// The requested maximum.
        max_len: usize,
    },
}

impl KeyConfigError {
    /// Stable snake_case code for this error.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            KeyConfigError::MinLenZero => "min_len_zero",
            KeyConfigError::MinAboveMax { .. } => "min_above_max",
            KeyConfigError::MaxLenTooLarge { .. } => "max_len_too_large",
        }
    }
}

/// Which syntax a key was written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyForm {
    /// The draft form: an RFC 9651 sf-string (quoted), possibly with parameters.
    SfString,
    /// The bare form: unquoted printable ASCII without space, `"` or `,`.
    Bare,
    /// Already-decoded key text given to [`IdempotencyKey::from_text`].
    Text,
}

impl KeyForm {
    /// Stable snake_case name (`sf_string`, `bare`, `text`).
    #[must_use]
    pub fn as_str(&self) -> &'static str {
        match self {
            KeyForm::SfString => "sf_string",
            KeyForm::Bare => "bare",
            KeyForm::Text => "text",
        }
    }
}

impl fmt::Display for KeyForm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An escaped, truncated view of untrusted input, safe to log.
///
/// Printable ASCII is shown as is except `"` and `\` (escaped as `\"`, `\\`); every other byte
/// is shown as `\xNN`. At most [`PREVIEW_BYTES`] input bytes are shown; `...` marks a cut.
/// The result never contains a control character or a non-ASCII character.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Preview(String);

impl Preview {
    /// Builds the preview of `input`.
    #[must_use]
    pub fn of(input: &[u8]) -> Preview {
        let mut s = String::with_capacity(PREVIEW_BYTES + 8);
        for &b in input.iter().take(PREVIEW_BYTES) {
            push_escaped_byte(&mut s, b);
        }
        if input.len() > PREVIEW_BYTES {
            s.push_str("...");
        }
        Preview(s)
    }

    /// The escaped text (without surrounding quotes).
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Preview {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\"", self.0)
    }
}

fn push_escaped_byte(s: &mut String, b: u8) {
    match b {
        b'"' => s.push_str("\\\""),
        b'\\' => s.push_str("\\\\"),
        0x20..=0x7e => s.push(char::from(b)),
        _ => {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            s.push_str("\\x");
            s.push(char::from(HEX[usize::from(b >> 4)]));
            s.push(char::from(HEX[usize::from(b & 0x0f)]));
        }
    }
}

/// A byte shown for an error message: the printable character in quotes, or `\xNN`.
fn describe_byte(b: u8) -> String {
    let mut s = String::from("'");
    push_escaped_byte(&mut s, b);
    s.push('\'');
    s
}

/// Why an `Idempotency-Key` value was refused. Offsets are byte offsets into the value as given
/// (before whitespace trimming).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KeyError {
    /// The value was empty or only whitespace.
    #[error("the Idempotency-Key value is empty")]
    Empty,
    /// A byte not allowed in this form (control, non-ASCII, or in the bare form space, `"`, `,`).
    #[error("byte {offset}: character {} is not allowed in a {form} key (value {preview})", describe_byte(*.byte))]
    InvalidCharacter {
        /// Offset of the offending byte.
        offset: usize,
        /// The offending byte.
        byte: u8,
        /// The form being parsed.
        form: KeyForm,
        /// Escaped, truncated view of the value.
        preview: Preview,
    },
    /// The sf-string had no closing `"` (or ended in a lone `\`).
    #[error("unterminated quoted string (value {preview})")]
    UnterminatedString {
        /// Escaped, truncated view of the value.
        preview: Preview,
    },
    /// A `\` in the sf-string was followed by something other than `"` or `\`.
    #[error("byte {offset}: invalid escape; only \\\" and \\\\ are allowed (value {preview})")]
    InvalidEscape {
        /// Offset of the `\`.
        offset: usize,
        /// Escaped, truncated view of the value.
        preview: Preview,
    },
    /// Text after the closing quote that is not RFC 9651 parameters (e.g. a second list member).
    #[error("byte {offset}: unexpected characters after the quoted key (value {preview})")]
    TrailingCharacters {
        /// Offset of the first unexpected byte.
        offset: usize,
        /// Escaped, truncated view of the value.
        preview: Preview,
    },
    /// A parameter after the quoted key does not follow the RFC 9651 grammar.
    #[error("byte {offset}: malformed structured-field parameter (value {preview})")]
    InvalidParameter {
        /// Offset where the parameter stopped being valid.
        offset: usize,
        /// Escaped, truncated view of the value.
        preview: Preview,
    },
    /// Strict mode is on and the value is not a quoted sf-string.
    #[error("strict mode requires the quoted form, e.g. \"abc-123\" (value {preview})")]
    BareFormNotAllowed {
        /// Escaped, truncated view of the value.
        preview: Preview,
    },
    /// The key is shorter than `min_len`.
    #[error("the key has {len} characters; at least {min} are required")]
    TooShort {
        /// Key length in characters.
        len: usize,
        /// The configured minimum.
        min: usize,
    },
    /// The key is longer than `max_len`.
    #[error("the key has {len} characters; at most {max} are allowed")]
    TooLong {
        /// Key length in characters.
        len: usize,
        /// The configured maximum.
        max: usize,
    },
}

impl KeyError {
    /// Stable snake_case code for this error (used in problem+json bodies and vectors).
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            KeyError::Empty => "empty",
            KeyError::InvalidCharacter { .. } => "invalid_character",
            KeyError::UnterminatedString { .. } => "unterminated_string",
            KeyError::InvalidEscape { .. } => "invalid_escape",
            KeyError::TrailingCharacters { .. } => "trailing_characters",
            KeyError::InvalidParameter { .. } => "invalid_parameter",
            KeyError::BareFormNotAllowed { .. } => "bare_form_not_allowed",
            KeyError::TooShort { .. } => "too_short",
            KeyError::TooLong { .. } => "too_long",
        }
    }

    /// The byte offset the error points at, when it points at one.
    #[must_use]
    pub fn offset(&self) -> Option<usize> {
        match self {
            KeyError::InvalidCharacter { offset, .. }
            | KeyError::InvalidEscape { offset, .. }
            | KeyError::TrailingCharacters { offset, .. }
            | KeyError::InvalidParameter { offset, .. } => Some(*offset),
            _ => None,
        }
    }
}

/// A validated idempotency key: 1 to 255 printable ASCII characters (`%x20-7E`).
///
/// There is deliberately no `Default` and no unchecked constructor: a key comes from a header
/// ([`parse_key`]), from validated text ([`IdempotencyKey::from_text`]) or from host entropy
/// ([`IdempotencyKey::generate`]). `Debug` shows only the length, so keys do not end up in logs
/// by accident; use [`IdempotencyKey::as_str`] when the text is really wanted.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdempotencyKey(String);

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdempotencyKey(<{} chars>)", self.0.len())
    }
}

impl IdempotencyKey {
    /// Parses an `Idempotency-Key` header value (see the module docs for the grammar).
    ///
    /// # Errors
    /// [`KeyError`] describing the first problem found.
    pub fn parse(header_value: &str, opts: &KeyOptions) -> Result<IdempotencyKey, KeyError> {
        parse_key(header_value, opts)
    }

    /// Validates already-decoded key text (e.g. a key a client stored): printable ASCII
    /// `%x20-7E` and a length within the options. Strict mode does not apply (there is no form).
    ///
    /// # Errors
    /// [`KeyError::InvalidCharacter`] (form `text`), [`KeyError::TooShort`], [`KeyError::TooLong`].
    pub fn from_text(text: &str, opts: &KeyOptions) -> Result<IdempotencyKey, KeyError> {
        let bytes = text.as_bytes();
        if let Some(pos) = bytes.iter().position(|&b| !is_key_char(b)) {
            return Err(KeyError::InvalidCharacter {
                offset: pos,
                byte: bytes[pos],
                form: KeyForm::Text,
                preview: Preview::of(bytes),
            });
        }
        check_len(bytes.len(), opts)?;
        Ok(IdempotencyKey(text.to_owned()))
    }

    /// A fresh key shaped like a UUIDv4 (`xxxxxxxx-xxxx-4xxx-Vxxx-xxxxxxxxxxxx`, lowercase hex,
    /// 36 characters) from 16 bytes of host entropy. The version nibble is forced to 4 and the
    /// variant bits to `10`, so 122 bits of the entropy are used. Core draws no randomness:
    /// pass bytes from a CSPRNG.
    #[must_use]
    pub fn generate(entropy: [u8; 16]) -> IdempotencyKey {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut b = entropy;
        b[6] = (b[6] & 0x0f) | 0x40;
        b[8] = (b[8] & 0x3f) | 0x80;
        let mut s = String::with_capacity(36);
        for (i, byte) in b.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                s.push('-');
            }
            s.push(char::from(HEX[usize::from(byte >> 4)]));
            s.push(char::from(HEX[usize::from(byte & 0x0f)]));
        }
        IdempotencyKey(s)
    }

    /// The key text (decoded: no quotes, no escapes).
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Length in characters (equal to bytes: keys are ASCII).
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Always false: a key has at least one character. Present for API symmetry with `len`.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The value a client sends: the draft sf-string form, `"` + text with `\` and `"` escaped
    /// by a `\` + `"`. Parsing it back (in any mode) yields this key.
    #[must_use]
    pub fn to_header_value(&self) -> String {
        let mut s = String::with_capacity(self.0.len() + 2);
        s.push('"');
        for c in self.0.chars() {
            if c == '"' || c == '\\' {
                s.push('\\');
            }
            s.push(c);
        }
        s.push('"');
        s
    }
}

impl AsRef<str> for IdempotencyKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// A key together with how it was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedKey {
    /// The validated key.
    pub key: IdempotencyKey,
    /// The syntax it was written in.
    pub form: KeyForm,
    /// How many RFC 9651 parameters followed the sf-string (validated, then ignored).
    pub ignored_parameters: usize,
}

/// Parses an `Idempotency-Key` header value into a key. See the module docs for the grammar.
///
/// # Errors
/// [`KeyError`] describing the first problem found.
pub fn parse_key(header_value: &str, opts: &KeyOptions) -> Result<IdempotencyKey, KeyError> {
    parse_key_bytes(header_value.as_bytes(), opts)
}

/// [`parse_key`] for a raw header value (HTTP field values are bytes, not necessarily UTF-8).
///
/// # Errors
/// [`KeyError`] describing the first problem found.
pub fn parse_key_bytes(header_value: &[u8], opts: &KeyOptions) -> Result<IdempotencyKey, KeyError> {
    parse_key_detailed(header_value, opts).map(|p| p.key)
}

/// Parses a raw header value and also reports the form and the number of ignored parameters.
///
/// # Errors
/// [`KeyError`] describing the first problem found.
pub fn parse_key_detailed(header_value: &[u8], opts: &KeyOptions) -> Result<ParsedKey, KeyError> {
    let input = header_value;
    let is_ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = input.iter().position(|b| !is_ows(b)).unwrap_or(input.len());
    let end = input
        .iter()
        .rposition(|b| !is_ows(b))
        .map_or(start, |p| p + 1);
    if start >= end {
        return Err(KeyError::Empty);
    }
    let mut p = Parser {
        input,
        pos: start,
        end,
    };
    let (text, form, params) = if input[start] == b'"' {
        let text = p.sf_string(true)?.unwrap_or_default();
        let params = p.parameters()?;
        (text, KeyForm::SfString, params)
    } else {
        if opts.strict {
            return Err(KeyError::BareFormNotAllowed {
                preview: Preview::of(input),
            });
        }
        let bare = &input[start..end];
        if let Some(i) = bare.iter().position(|&b| !is_bare_char(b)) {
            return Err(KeyError::InvalidCharacter {
                offset: start + i,
                byte: bare[i],
                form: KeyForm::Bare,
                preview: Preview::of(input),
            });
        }
        // Every byte is in %x21-7E: one ASCII character each.
        let text: String = bare.iter().map(|&b| char::from(b)).collect();
        (text, KeyForm::Bare, 0)
    };
    check_len(text.len(), opts)?;
    Ok(ParsedKey {
        key: IdempotencyKey(text),
        form,
        ignored_parameters: params,
    })
}

fn check_len(len: usize, opts: &KeyOptions) -> Result<(), KeyError> {
    if len < opts.min_len {
        return Err(KeyError::TooShort {
            len,
            min: opts.min_len,
        });
    }
    if len > opts.max_len {
        return Err(KeyError::TooLong {
            len,
            max: opts.max_len,
        });
    }
    Ok(())
}

/// A character allowed in key text: printable ASCII including space.
fn is_key_char(b: u8) -> bool {
    (0x20..=0x7e).contains(&b)
}

/// A character allowed in the bare form: `%x21-7E` except `"` and `,`.
fn is_bare_char(b: u8) -> bool {
    (0x21..=0x7e).contains(&b) && b != b'"' && b != b','
}

/// RFC 9651 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A recursive-descent reader for the RFC 9651 subset an Item needs. `end` excludes trailing OWS.
struct Parser<'a> {
    input: &'a [u8],
    pos: usize,
    end: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.at(self.pos)
    }

    /// The byte at `i` if it lies before `end`.
    fn at(&self, i: usize) -> Option<u8> {
        (i < self.end).then(|| self.input[i])
    }

    fn preview(&self) -> Preview {
        Preview::of(self.input)
    }

    fn param_err(&self) -> KeyError {
        KeyError::InvalidParameter {
            offset: self.pos,
            preview: self.preview(),
        }
    }

    /// Parses an sf-string at `pos` (which holds `"`). Returns the decoded text when `keep`.
    /// Inside parameters, errors are reported as `InvalidParameter` by the caller's mapping.
    fn sf_string(&mut self, keep: bool) -> Result<Option<String>, KeyError> {
        self.pos += 1; // opening quote
        let mut out = keep.then(String::new);
        loop {
            let Some(c) = self.peek() else {
                return Err(KeyError::UnterminatedString {
                    preview: self.preview(),
                });
            };
            match c {
                b'"' => {
                    self.pos += 1;
                    return Ok(out);
                }
                b'\\' => {
                    let Some(next) = self.at(self.pos + 1) else {
                        return Err(KeyError::UnterminatedString {
                            preview: self.preview(),
                        });
                    };
                    if next != b'"' && next != b'\\' {
                        return Err(KeyError::InvalidEscape {
                            offset: self.pos,
                            preview: self.preview(),
                        });
                    }
                    if let Some(o) = out.as_mut() {
                        o.push(char::from(next));
                    }
                    self.pos += 2;
                }
                0x20..=0x7e => {
                    if let Some(o) = out.as_mut() {
                        o.push(char::from(c));
                    }
                    self.pos += 1;
                }
                _ => {
                    return Err(KeyError::InvalidCharacter {
                        offset: self.pos,
                        byte: c,
                        form: KeyForm::SfString,
                        preview: self.preview(),
                    });
                }
            }
        }
    }

    /// RFC 9651 `parameters = *( ";" *SP parameter )`, up to `end`. Returns how many were read.
    fn parameters(&mut self) -> Result<usize, KeyError> {
        let mut count = 0usize;
        while let Some(c) = self.peek() {
            if c != b';' {
                return Err(KeyError::TrailingCharacters {
                    offset: self.pos,
                    preview: self.preview(),
                });
            }
            self.pos += 1;
            while self.peek() == Some(b' ') {
                self.pos += 1;
            }
            self.param_key()?;
            if self.peek() == Some(b'=') {
                self.pos += 1;
                self.bare_item()?;
            }
            count += 1;
        }
        Ok(count)
    }

    /// RFC 9651 `key = ( lcalpha / "*" ) *( lcalpha / DIGIT / "_" / "-" / "." / "*" )`.
    fn param_key(&mut self) -> Result<(), KeyError> {
        match self.peek() {
            Some(c) if c.is_ascii_lowercase() || c == b'*' => self.pos += 1,
            _ => return Err(self.param_err()),
        }
        while let Some(c) = self.peek() {
            if c.is_ascii_lowercase() || c.is_ascii_digit() || b"_-.*".contains(&c) {
                self.pos += 1;
            } else {
                break;
            }
        }
        Ok(())
    }

    /// RFC 9651 `bare-item` (a parameter value): integer, decimal, string, token, byte
    /// sequence, boolean, date or display string.
    fn bare_item(&mut self) -> Result<(), KeyError> {
        match self.peek() {
            Some(c) if c == b'-' || c.is_ascii_digit() => self.number(true),
            Some(b'"') => {
                let at = self.pos;
                self.sf_string(false)
                    .map(|_| ())
                    .map_err(|_| KeyError::InvalidParameter {
                        offset: at,
                        preview: self.preview(),
                    })
            }
            Some(c) if c.is_ascii_alphabetic() || c == b'*' => {
                self.pos += 1;
                while let Some(c) = self.peek() {
                    if is_tchar(c) || c == b':' || c == b'/' {
                        self.pos += 1;
                    } else {
                        break;
                    }
                }
                Ok(())
            }
            Some(b':') => {
                self.pos += 1;
                loop {
                    match self.peek() {
                        Some(b':') => {
                            self.pos += 1;
                            return Ok(());
                        }
                        Some(c)
                            if c.is_ascii_alphanumeric() || c == b'+' || c == b'/' || c == b'=' =>
                        {
                            self.pos += 1;
                        }
                        _ => return Err(self.param_err()),
                    }
                }
            }
            Some(b'?') => {
                self.pos += 1;
                match self.peek() {
                    Some(b'0' | b'1') => {
                        self.pos += 1;
                        Ok(())
                    }
                    _ => Err(self.param_err()),
                }
            }
            Some(b'@') => {
                self.pos += 1;
                self.number(false)
            }
            Some(b'%') => self.display_string(),
            _ => Err(self.param_err()),
        }
    }

    /// RFC 9651 integer (`-`? 1*15 DIGIT) or, when `allow_decimal`, decimal
    /// (`-`? 1*12 DIGIT `.` 1*3 DIGIT).
    fn number(&mut self, allow_decimal: bool) -> Result<(), KeyError> {
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        let int_digits = self.digit_run(15)?;
        if int_digits == 0 {
            return Err(self.param_err());
        }
        if allow_decimal && self.peek() == Some(b'.') {
            if int_digits > 12 {
                return Err(self.param_err());
            }
            self.pos += 1;
            if self.digit_run(3)? == 0 {
                return Err(self.param_err());
            }
        }
        Ok(())
    }

    /// Consumes up to `max` ASCII digits; a further digit is an error at its offset.
    fn digit_run(&mut self, max: usize) -> Result<usize, KeyError> {
        let mut n = 0usize;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            if n == max {
                return Err(self.param_err());
            }
            n += 1;
            self.pos += 1;
        }
        Ok(n)
    }

    /// RFC 9651 display string: `%"` then printable ASCII with `%xx` (lowercase hex) escapes,
    /// `"`; the decoded bytes must be UTF-8.
    fn display_string(&mut self) -> Result<(), KeyError> {
        let start = self.pos;
        self.pos += 1;
        if self.peek() != Some(b'"') {
            return Err(self.param_err());
        }
        self.pos += 1;
        let mut bytes = Vec::new();
        loop {
            match self.peek() {
                Some(b'"') => {
                    self.pos += 1;
                    return if std::str::from_utf8(&bytes).is_ok() {
                        Ok(())
                    } else {
                        Err(KeyError::InvalidParameter {
                            offset: start,
                            preview: self.preview(),
                        })
                    };
                }
                Some(b'%') => {
                    let hex = |b: u8| match b {
                        b'0'..=b'9' => Some(b - b'0'),
                        b'a'..=b'f' => Some(b - b'a' + 10),
                        _ => None,
                    };
                    let hi = self.at(self.pos + 1).and_then(hex);
                    let lo = self.at(self.pos + 2).and_then(hex);
                    match (hi, lo) {
                        (Some(h), Some(l)) => {
                            bytes.push((h << 4) | l);
                            self.pos += 3;
                        }
                        _ => return Err(self.param_err()),
                    }
                }
                Some(c @ 0x20..=0x7e) => {
                    bytes.push(c);
                    self.pos += 1;
                }
                _ => return Err(self.param_err()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(v: &str) -> String {
        parse_key(v, &KeyOptions::default())
            .map(|k| k.as_str().to_owned())
            .unwrap_or_else(|e| panic!("{v:?}: {e}"))
    }

    fn code(v: &str, opts: &KeyOptions) -> &'static str {
        match parse_key(v, opts) {
            Ok(k) => panic!("{v:?} unexpectedly parsed as {:?}", k.as_str()),
            Err(e) => e.code(),
        }
    }

    #[test]
    fn both_forms_and_trimming() {
        assert_eq!(ok("\"abc-1234\""), "abc-1234");
        assert_eq!(ok("  abc-1234\t"), "abc-1234");
        assert_eq!(ok("\"a \\\"q\\\" \\\\ z\""), "a \"q\" \\ z");
        assert_eq!(
            ok(
                "\"abcdefgh\";foo=1;bar;baz=?0;q=\"x\";t=tok/1:2;b=:AQID:;d=@12;n=-1.25;s=%\"%c3%a9\""
            ),
            "abcdefgh"
        );
        assert_eq!(ok("\"AbCdEfGh\""), "AbCdEfGh");
    }

    #[test]
    fn rejections_have_codes() {
        let d = KeyOptions::default();
        assert_eq!(code("", &d), "empty");
        assert_eq!(code(" \t ", &d), "empty");
        assert_eq!(code("\"abcdefgh", &d), "unterminated_string");
        assert_eq!(code("\"abcdefgh\\", &d), "unterminated_string");
        assert_eq!(code("\"abcd\\nefgh\"", &d), "invalid_escape");
        assert_eq!(
            code("\"abcdefgh\", \"ijklmnop\"", &d),
            "trailing_characters"
        );
        assert_eq!(code("\"abcdefgh\" ;a", &d), "trailing_characters");
        assert_eq!(code("\"abcdefgh\";A=1", &d), "invalid_parameter");
        assert_eq!(code("\"abcdefgh\";a=1.2345", &d), "invalid_parameter");
        assert_eq!(code("\"abcdefgh\";a=%\"%ff\"", &d), "invalid_parameter");
        assert_eq!(code("abc defgh", &d), "invalid_character");
        assert_eq!(code("abcdefgh,ijk", &d), "invalid_character");
        assert_eq!(code("\"abc\u{7f}defgh\"", &d), "invalid_character");
        assert_eq!(code("abcdéfgh", &d), "invalid_character");
        assert_eq!(
            code("abcdefgh", &d.with_strict(true)),
            "bare_form_not_allowed"
        );
        assert_eq!(code("\"abc\"", &d), "too_short");
        assert_eq!(code(&"x".repeat(129), &d), "too_long");
    }

    #[test]
    fn errors_never_echo_raw_control_bytes() {
        let e = parse_key("abc\r\nSet-Cookie: x", &KeyOptions::default()).unwrap_err();
        let msg = e.to_string();
        assert!(!msg.contains('\r') && !msg.contains('\n'), "{msg}");
        assert!(msg.contains("\\x0d"), "{msg}");
        let long = format!("\u{1b}[31m{}", "y".repeat(100));
        let msg = parse_key(&long, &KeyOptions::default())
            .unwrap_err()
            .to_string();
        assert!(!msg.contains('\u{1b}') && msg.contains("..."), "{msg}");
    }

    #[test]
    fn options_are_validated() {
        assert_eq!(KeyOptions::new(0, 10), Err(KeyConfigError::MinLenZero));
        assert_eq!(
            KeyOptions::new(11, 10),
            Err(KeyConfigError::MinAboveMax {
                min_len: 11,
                max_len: 10
            })
        );
        assert_eq!(
            KeyOptions::new(1, 256),
            Err(KeyConfigError::MaxLenTooLarge { max_len: 256 })
        );
        let o = KeyOptions::new(1, 255).unwrap();
        assert_eq!(parse_key(&"k".repeat(255), &o).unwrap().len(), 255);
    }

    #[test]
    fn generate_is_uuid_v4_shaped_and_valid() {
        let k = IdempotencyKey::generate([0xff; 16]);
        assert_eq!(k.as_str(), "ffffffff-ffff-4fff-bfff-ffffffffffff");
        let k = IdempotencyKey::generate([0; 16]);
        assert_eq!(k.as_str(), "00000000-0000-4000-8000-000000000000");
        let opts = KeyOptions::default().with_strict(true);
        assert_eq!(parse_key(&k.to_header_value(), &opts).unwrap(), k);
        assert_eq!(format!("{k:?}"), "IdempotencyKey(<36 chars>)");
    }
}
