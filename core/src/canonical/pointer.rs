//! RFC 6901 JSON Pointers: the exclusion list used by the fingerprint, and pointer text for errors.

/// Why an exclusion pointer was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PointerError {
    /// The pointer is `""`: it would exclude the whole document.
    #[error("the root pointer \"\" cannot be excluded")]
    Root,
    /// The pointer does not start with `/`.
    #[error("JSON pointer {0:?} must start with '/'")]
    MissingSlash(String),
    /// A `~` not followed by `0` or `1`.
    #[error("JSON pointer {0:?} has a '~' not followed by '0' or '1'")]
    InvalidEscape(String),
    /// More pointers than [`MAX_EXCLUSIONS`].
    #[error("at most {MAX_EXCLUSIONS} exclusion pointers are supported")]
    TooMany,
}

impl PointerError {
    /// Stable snake_case code of the error.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Self::Root => "root_pointer",
            Self::MissingSlash(_) => "pointer_missing_slash",
            Self::InvalidEscape(_) => "pointer_invalid_escape",
            Self::TooMany => "too_many_exclusions",
        }
    }
}

/// The largest number of exclusion pointers one [`Exclusions`] may hold.
pub const MAX_EXCLUSIONS: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Token {
    /// The unescaped reference token (matched against unescaped member names).
    pub(crate) name: Vec<u8>,
    /// The array index this token denotes, when it is one (`0` or digits without a leading zero).
    pub(crate) index: Option<u32>,
}

/// A compiled list of RFC 6901 JSON Pointers whose targets are left out of the canonical output.
///
/// Semantics (normative text in `spec/CANONICAL.md`):
/// - A pointer whose target is an object member drops that member (name and value).
/// - A pointer whose target is an array element drops that element; later elements move up
///   (`/items/0` turns `[a,b]` into `[b]`).
/// - A token matches a member whose *unescaped* name equals the token after `~1`→`/` and `~0`→`~`
///   decoding; it matches an array element when it is a decimal index without leading zeros.
///   `-` never matches.
/// - Pointers that match nothing are ignored. The root pointer `""` is refused.
/// - Excluded values are still fully validated (syntax, UTF-8, duplicates); only the number
///   precision check of [`NumberMode::RejectPrecisionLoss`](super::NumberMode) is skipped for them,
///   since they cannot affect the output.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exclusions {
    pub(crate) pointers: Vec<Vec<Token>>,
}

impl Exclusions {
    /// No exclusions.
    #[must_use]
    pub fn none() -> Self {
        Self::default()
    }

    /// Compile pointers such as `/client_timestamp` or `/items/0/trace_id`.
    ///
    /// # Errors
    /// [`PointerError`] for a malformed pointer, the root pointer, or more than
    /// [`MAX_EXCLUSIONS`] pointers.
    pub fn new<I, S>(pointers: I) -> Result<Self, PointerError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut out = Vec::new();
        for p in pointers {
            let p = p.as_ref();
            if out.len() == MAX_EXCLUSIONS {
                return Err(PointerError::TooMany);
            }
            out.push(parse_pointer(p)?);
        }
        Ok(Self { pointers: out })
    }

    /// True when no pointer is configured.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.pointers.is_empty()
    }

    /// Bit mask with one bit per pointer (all pointers alive at the root).
    pub(crate) fn root_mask(&self) -> u64 {
        match self.pointers.len() {
            0 => 0,
            64 => u64::MAX,
            n => (1u64 << n) - 1,
        }
    }

    /// Descend from a container at `depth` (number of tokens already matched) into a child.
    ///
    /// Returns `None` when the child is excluded, else the mask of pointers still alive below it.
    #[inline]
    pub(crate) fn descend(
        &self,
        mask: u64,
        depth: usize,
        name: Option<&[u8]>,
        index: u32,
    ) -> Option<u64> {
        let mut next = 0u64;
        let mut m = mask;
        while m != 0 {
            let bit = m.trailing_zeros() as usize;
            m &= m - 1;
            let Some(tokens) = self.pointers.get(bit) else {
                continue;
            };
            let Some(tok) = tokens.get(depth) else {
                continue;
            };
            let hit = match name {
                Some(n) => tok.name == n,
                None => tok.index == Some(index),
            };
            if hit {
                if tokens.len() == depth + 1 {
                    return None;
                }
                next |= 1u64 << bit;
            }
        }
        Some(next)
    }
}

fn parse_pointer(p: &str) -> Result<Vec<Token>, PointerError> {
    if p.is_empty() {
        return Err(PointerError::Root);
    }
    let Some(rest) = p.strip_prefix('/') else {
        return Err(PointerError::MissingSlash(p.to_owned()));
    };
    let mut tokens = Vec::new();
    for raw in rest.split('/') {
        let mut name = Vec::with_capacity(raw.len());
        let mut bytes = raw.bytes();
        while let Some(b) = bytes.next() {
            if b == b'~' {
                match bytes.next() {
                    Some(b'0') => name.push(b'~'),
                    Some(b'1') => name.push(b'/'),
                    _ => return Err(PointerError::InvalidEscape(p.to_owned())),
                }
            } else {
                name.push(b);
            }
        }
        let index = array_index(&name);
        tokens.push(Token { name, index });
    }
    Ok(tokens)
}

fn array_index(tok: &[u8]) -> Option<u32> {
    if tok.is_empty() || tok.len() > 10 || !tok.iter().all(u8::is_ascii_digit) {
        return None;
    }
    if tok.len() > 1 && tok[0] == b'0' {
        return None;
    }
    std::str::from_utf8(tok).ok()?.parse().ok()
}

/// Append `/` and the RFC 6901 escaped form of `token` to `out`.
pub(crate) fn push_token(out: &mut String, token: &[u8]) {
    out.push('/');
    let s = String::from_utf8_lossy(token);
    for c in s.chars() {
        match c {
            '~' => out.push_str("~0"),
            '/' => out.push_str("~1"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_escapes() {
        let e = Exclusions::new(["/a~1b/~0c", "/items/0", "/x/01"]).expect("valid");
        assert_eq!(e.pointers[0][0].name, b"a/b");
        assert_eq!(e.pointers[0][1].name, b"~c");
        assert_eq!(e.pointers[1][1].index, Some(0));
        assert_eq!(e.pointers[2][1].index, None);
        assert_eq!(Exclusions::new([""]), Err(PointerError::Root));
        assert!(matches!(
            Exclusions::new(["a"]),
            Err(PointerError::MissingSlash(_))
        ));
        assert!(matches!(
            Exclusions::new(["/a~2"]),
            Err(PointerError::InvalidEscape(_))
        ));
        let many: Vec<String> = (0..65).map(|i| format!("/{i}")).collect();
        assert_eq!(Exclusions::new(&many), Err(PointerError::TooMany));
        assert_eq!(
            Exclusions::new(&many[..64]).expect("64 ok").root_mask(),
            u64::MAX
        );
    }

    #[test]
    fn token_text() {
        let mut s = String::new();
        push_token(&mut s, b"a/b~c");
        assert_eq!(s, "/a~1b~0c");
    }
}
