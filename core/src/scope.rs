//! Scope ids: which record an `Idempotency-Key` refers to.
//!
//! A key alone is not an identity: two users (or two routes) may pick the same key. The record is
//! addressed by a [`ScopeId`], the SHA-256 digest of a versioned, length-prefixed framing of
//! (principal, method, route, key). The framing is normative (`spec/KEYS.md` §2) and pinned by
//! `spec/vectors/scope/`:
//!
//! ```text
//! frame(s)  = u64_be(len(s)) || s                      (len in bytes, s as UTF-8)
//! input     = frame("idempo-scope-v1") || frame(principal) || frame(METHOD)
//!             || frame(route) || frame(key)
//! ScopeId   = SHA-256(input)                           (32 bytes; text form: 64 lowercase hex)
//! ```
//!
//! `METHOD` is the method with ASCII `a-z` upper-cased (nothing else changes). Because every
//! field carries its length, no two distinct tuples share an input: `("a:b", "c")` and
//! `("a", "b:c")` differ. The empty principal is a legitimate value ("anonymous") distinct from
//! every other principal.
use std::fmt;
use std::str::FromStr;

use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::key::IdempotencyKey;

/// The version tag that opens every scope framing.
pub const SCOPE_TAG: &str = "idempo-scope-v1";

/// The 32-byte identity of a record: SHA-256 over (principal, method, route, key). Ordered as
/// its bytes are.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ScopeId([u8; 32]);

impl Ord for ScopeId {
    /// The bytes' order, compared eight at a time: the ordered maps of the memory store compare
    /// scope ids on every step, and digests nearly always differ in their first eight bytes.
    #[inline]
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        let word = |b: &[u8; 32], i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[8 * i..8 * i + 8]);
            u64::from_be_bytes(w)
        };
        (0..4)
            .map(|i| word(&self.0, i).cmp(&word(&other.0, i)))
            .find(|o| o.is_ne())
            .unwrap_or(std::cmp::Ordering::Equal)
    }
}

impl PartialOrd for ScopeId {
    #[inline]
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl ScopeId {
    /// The scope of `key` for `principal` (user, tenant or API client; `""` for none), HTTP
    /// `method` (upper-cased here) and `route` (the template, e.g. `/payments/{id}`, not the
    /// concrete path).
    #[must_use]
    pub fn new(principal: &str, method: &str, route: &str, key: &IdempotencyKey) -> ScopeId {
        ScopeId::from_parts(principal, method, route, key.as_str())
    }

    /// [`ScopeId::new`] with the key as plain text, unvalidated (for stores, tools and tests).
    #[must_use]
    pub fn from_parts(principal: &str, method: &str, route: &str, key: &str) -> ScopeId {
        let mut h = Sha256::new();
        let mut feed = |bytes: &[u8]| {
            h.update((bytes.len() as u64).to_be_bytes());
            h.update(bytes);
        };
        feed(SCOPE_TAG.as_bytes());
        feed(principal.as_bytes());
        feed(method.to_ascii_uppercase().as_bytes());
        feed(route.as_bytes());
        feed(key.as_bytes());
        ScopeId(h.finalize().into())
    }

    /// The exact bytes hashed by [`ScopeId::from_parts`], for debugging other implementations.
    #[must_use]
    pub fn framing(principal: &str, method: &str, route: &str, key: &str) -> Vec<u8> {
        let method = method.to_ascii_uppercase();
        let fields = [
            SCOPE_TAG.as_bytes(),
            principal.as_bytes(),
            method.as_bytes(),
            route.as_bytes(),
            key.as_bytes(),
        ];
        let mut out = Vec::with_capacity(fields.iter().map(|f| f.len() + 8).sum());
        for f in fields {
            out.extend_from_slice(&(f.len() as u64).to_be_bytes());
            out.extend_from_slice(f);
        }
        out
    }

    /// A scope id from its 32 raw bytes (as read back from a store).
    #[must_use]
    pub fn from_bytes(bytes: [u8; 32]) -> ScopeId {
        ScopeId(bytes)
    }

    /// The 32 raw bytes (what stores keep in `scope_key`).
    #[must_use]
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// 64 lowercase hex characters.
    #[must_use]
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    /// A short form for logs and metrics: `s:` and the first 8 bytes in hex (18 characters).
    /// It identifies a record well enough to correlate log lines and reveals nothing of the key.
    #[must_use]
    pub fn log_id(&self) -> String {
        format!("s:{}", hex(&self.0[..8]))
    }
}

fn hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(HEX[usize::from(b >> 4)]));
        s.push(char::from(HEX[usize::from(b & 0x0f)]));
    }
    s
}

impl fmt::Debug for ScopeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ScopeId({})", self.to_hex())
    }
}

impl fmt::Display for ScopeId {
    /// The 64-character lowercase hex form.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl TryFrom<&[u8]> for ScopeId {
    type Error = ScopeIdError;

    fn try_from(bytes: &[u8]) -> Result<Self, Self::Error> {
        <[u8; 32]>::try_from(bytes)
            .map(ScopeId)
            .map_err(|_| ScopeIdError::WrongByteLength { len: bytes.len() })
    }
}

/// A scope id that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ScopeIdError {
    /// The hex text was not 64 characters long.
    #[error("a scope id is 64 hex characters, got {len}")]
    WrongHexLength {
        /// Length of the text in bytes.
        len: usize,
    },
    /// The hex text held a character other than `0-9`, `a-f`, `A-F`.
    #[error("character at byte {offset} is not a hex digit")]
    InvalidHexDigit {
        /// Offset of the offending byte.
        offset: usize,
    },
    /// A raw scope id was not 32 bytes long.
    #[error("a scope id is 32 bytes, got {len}")]
    WrongByteLength {
        /// The length that was given.
        len: usize,
    },
}

impl ScopeIdError {
    /// Stable snake_case code for this error.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            ScopeIdError::WrongHexLength { .. } => "wrong_hex_length",
            ScopeIdError::InvalidHexDigit { .. } => "invalid_hex_digit",
            ScopeIdError::WrongByteLength { .. } => "wrong_byte_length",
        }
    }
}

impl FromStr for ScopeId {
    type Err = ScopeIdError;

    /// Reads 64 hex digits (either case; [`ScopeId::to_hex`] writes lowercase).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let b = s.as_bytes();
        if b.len() != 64 {
            return Err(ScopeIdError::WrongHexLength { len: b.len() });
        }
        let nibble = |i: usize| -> Result<u8, ScopeIdError> {
            match b[i] {
                c @ b'0'..=b'9' => Ok(c - b'0'),
                c @ b'a'..=b'f' => Ok(c - b'a' + 10),
                c @ b'A'..=b'F' => Ok(c - b'A' + 10),
                _ => Err(ScopeIdError::InvalidHexDigit { offset: i }),
            }
        };
        let mut out = [0u8; 32];
        for (i, o) in out.iter_mut().enumerate() {
            *o = (nibble(2 * i)? << 4) | nibble(2 * i + 1)?;
        }
        Ok(ScopeId(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scope_ids_order_as_their_bytes() {
        // Pairs that differ in each word, in the last byte only, and in a byte's sign bit.
        let mut ids = vec![[0u8; 32], [0xff; 32]];
        for at in [0, 7, 8, 15, 16, 23, 24, 31] {
            for v in [0x01, 0x7f, 0x80, 0xfe] {
                let mut b = [0x55u8; 32];
                b[at] = v;
                ids.push(b);
            }
        }
        for a in &ids {
            for b in &ids {
                let (x, y) = (ScopeId::from_bytes(*a), ScopeId::from_bytes(*b));
                assert_eq!(x.cmp(&y), a.cmp(b), "{a:?} vs {b:?}");
                assert_eq!(x.partial_cmp(&y), Some(a.cmp(b)));
            }
        }
    }

    #[test]
    fn separators_cannot_collide() {
        let a = ScopeId::from_parts("a:b", "POST", "c", "keykeykey");
        let b = ScopeId::from_parts("a", "POST", "b:c", "keykeykey");
        assert_ne!(a, b);
        let c = ScopeId::from_parts("", "POST", "/x", "abcdefgh");
        let d = ScopeId::from_parts("POST", "", "/x", "abcdefgh");
        assert_ne!(c, d);
    }

    #[test]
    fn method_is_upper_cased_and_hex_round_trips() {
        let a = ScopeId::from_parts("u1", "post", "/p", "abcdefgh");
        let b = ScopeId::from_parts("u1", "POST", "/p", "abcdefgh");
        assert_eq!(a, b);
        let hex = a.to_hex();
        assert_eq!(hex.len(), 64);
        assert_eq!(hex.parse::<ScopeId>(), Ok(a));
        assert_eq!(hex.to_uppercase().parse::<ScopeId>(), Ok(a));
        assert_eq!(
            "zz".parse::<ScopeId>(),
            Err(ScopeIdError::WrongHexLength { len: 2 })
        );
        let bad = format!("{}g", &hex[..63]);
        assert_eq!(
            bad.parse::<ScopeId>(),
            Err(ScopeIdError::InvalidHexDigit { offset: 63 })
        );
        assert_eq!(ScopeId::try_from(&a.as_bytes()[..]), Ok(a));
        assert_eq!(
            ScopeId::try_from(&[0u8; 3][..]),
            Err(ScopeIdError::WrongByteLength { len: 3 })
        );
        assert!(
            a.log_id().starts_with("s:")
                && a.log_id().len() == 18
                && hex.starts_with(&a.log_id()[2..])
        );
    }

    #[test]
    fn framing_matches_digest() {
        let f = ScopeId::framing("u", "get", "/r", "k");
        let expect_prefix = [&15u64.to_be_bytes()[..], SCOPE_TAG.as_bytes()].concat();
        assert!(f.starts_with(&expect_prefix));
        assert!(f.ends_with(&[0, 0, 0, 0, 0, 0, 0, 1, b'k']));
        let digest: [u8; 32] = Sha256::digest(&f).into();
        assert_eq!(
            ScopeId::from_parts("u", "get", "/r", "k"),
            ScopeId::from_bytes(digest)
        );
    }
}
