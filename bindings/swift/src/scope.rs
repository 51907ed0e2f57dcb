//! Scope ids over the FFI (`idempo_core::scope`).
use idempo_core::scope::ScopeId;

/// The scope id of a key, as 64 lowercase hex characters: SHA-256 over the length-prefixed
/// (principal, method upper-cased, route template, key) framing of core. Infallible: every string
/// has a framing.
#[must_use]
#[uniffi::export]
pub fn scope_id_hex(principal: String, method: String, route: String, key: String) -> String {
    ScopeId::from_parts(&principal, &method, &route, &key).to_hex()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_case_does_not_matter_but_every_part_does() {
        let a = scope_id_hex("u".into(), "post".into(), "/p".into(), "k-123456".into());
        let b = scope_id_hex("u".into(), "POST".into(), "/p".into(), "k-123456".into());
        let c = scope_id_hex("u".into(), "POST".into(), "/p".into(), "k-123457".into());
        assert_eq!(a, b);
        assert_ne!(b, c);
        assert_eq!(a.len(), 64);
        assert!(
            a.bytes()
                .all(|x| x.is_ascii_hexdigit() && !x.is_ascii_uppercase())
        );
    }
}
