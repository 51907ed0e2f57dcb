//! Property tests for scope ids: no collisions for distinct tuples, stable text form.
use std::collections::{HashMap, HashSet};

use idempo_core::scope::ScopeId;
use proptest::prelude::*;

/// Short strings over a tiny alphabet rich in separators, so that naive concatenations collide.
fn field() -> impl Strategy<Value = String> {
    "[ab:/|\\x00 é]{0,4}"
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Distinct (principal, METHOD, route, key) tuples in a generated set get distinct ids.
    #[test]
    fn distinct_tuples_never_collide(
        tuples in proptest::collection::vec((field(), "(get|GET|post|POST|Post|a:b|)", field(), field()), 1..200)
    ) {
        let mut seen: HashMap<ScopeId, (String, String, String, String)> = HashMap::new();
        let mut distinct = HashSet::new();
        for (p, m, r, k) in tuples {
            let norm = (p.clone(), m.to_ascii_uppercase(), r.clone(), k.clone());
            distinct.insert(norm.clone());
            let id = ScopeId::from_parts(&p, &m, &r, &k);
            if let Some(prev) = seen.insert(id, norm.clone()) {
                prop_assert_eq!(&prev, &norm, "collision");
            }
        }
        prop_assert_eq!(seen.len(), distinct.len());
    }

    /// Moving a boundary between adjacent fields always changes the id.
    #[test]
    fn shifting_a_boundary_changes_the_id(a in field(), b in "[ab:]{1,4}", c in field(), k in field()) {
        let left = ScopeId::from_parts(&format!("{a}{b}"), "POST", &c, &k);
        let right = ScopeId::from_parts(&a, "POST", &format!("{b}{c}"), &k);
        prop_assert_ne!(left, right);
        let rk = ScopeId::from_parts(&a, "POST", &format!("{c}{b}"), &k);
        let kk = ScopeId::from_parts(&a, "POST", &c, &format!("{b}{k}"));
        prop_assert_ne!(rk, kk);
    }

    /// Hex and raw-byte forms round-trip; the log id is a prefix of the hex.
    #[test]
    fn text_forms_round_trip(p in field(), k in field()) {
        let id = ScopeId::from_parts(&p, "post", "/r", &k);
        let hex = id.to_hex();
        prop_assert_eq!(hex.len(), 64);
        prop_assert_eq!(hex.parse::<ScopeId>(), Ok(id));
        prop_assert_eq!(ScopeId::try_from(&id.as_bytes()[..]), Ok(id));
        prop_assert!(hex.starts_with(&id.log_id()[2..]));
        prop_assert_eq!(ScopeId::from_parts(&p, "POST", "/r", &k), id);
    }
}
