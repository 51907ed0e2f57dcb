//! Property tests for the request fingerprint.

use idempo_core::fingerprint::{
    Fingerprint, FingerprintConfig, Fingerprinter, RequestParts, fingerprint,
};
use proptest::prelude::*;

/// A flat JSON object body from (name, integer) pairs with unique names, in the given order.
fn body(members: &[(String, i64)], spaced: bool) -> String {
    let sep = if spaced { " , " } else { "," };
    let inner: Vec<String> = members
        .iter()
        .map(|(k, v)| format!("{}:{v}", serde_json::to_string(k).expect("string")))
        .collect();
    format!("{{{}}}", inner.join(sep))
}

fn arb_members() -> impl Strategy<Value = Vec<(String, i64)>> {
    proptest::collection::btree_map(any::<String>(), -(1i64 << 53) + 1..(1i64 << 53), 0..12)
        .prop_map(|m| m.into_iter().collect())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn stable_under_member_order_and_whitespace(
        members in arb_members(),
        seed in any::<u64>(),
        method in "(post|POST|Post|put)",
    ) {
        let mut shuffled = members.clone();
        let n = shuffled.len();
        let mut x = seed | 1;
        for i in (1..n).rev() {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            shuffled.swap(i, (x % (i as u64 + 1)) as usize);
        }
        let (a, b) = (body(&members, false), body(&shuffled, true));
        let cfg = FingerprintConfig::default();
        let fa = fingerprint(&RequestParts::json(&method, "/r/{id}", a.as_bytes()), &cfg).expect("valid");
        let fb = fingerprint(&RequestParts::json(&method.to_uppercase(), "/r/{id}", b.as_bytes()), &cfg).expect("valid");
        prop_assert_eq!(fa, fb);
        prop_assert_eq!(fa.to_string().parse::<Fingerprint>().expect("round trip"), fa);
        // Changing one value changes the fingerprint.
        if let Some((k, v)) = members.first() {
            let mut changed = members.clone();
            changed[0] = (k.clone(), v.wrapping_add(1) % (1i64 << 53));
            let c = body(&changed, false);
            let fc = fingerprint(&RequestParts::json(&method, "/r/{id}", c.as_bytes()), &cfg).expect("valid");
            prop_assert_ne!(fa, fc);
        }
    }

    #[test]
    fn excluded_fields_do_not_matter(
        members in arb_members(),
        ts1 in any::<u64>(),
        ts2 in any::<u64>(),
    ) {
        let members: Vec<_> = members.into_iter().filter(|(k, _)| k != "ts").collect();
        let with = |ts: u64| {
            let mut m = members.clone();
            m.push(("ts".to_owned(), (ts >> 12) as i64));
            body(&m, false)
        };
        let fp = Fingerprinter::new(&FingerprintConfig {
            exclude: vec!["/ts".into()],
            ..FingerprintConfig::default()
        }).expect("config");
        let (a, b) = (with(ts1), with(ts2));
        let fa = fp.fingerprint(&RequestParts::json("POST", "/r", a.as_bytes())).expect("valid");
        let fb = fp.fingerprint(&RequestParts::json("POST", "/r", b.as_bytes())).expect("valid");
        prop_assert_eq!(fa, fb);
        let plain = body(&members, false);
        let fc = fp.fingerprint(&RequestParts::json("POST", "/r", plain.as_bytes())).expect("valid");
        prop_assert_eq!(fa, fc);
    }

    #[test]
    fn headers_are_case_and_order_insensitive_by_name(
        v1 in "[ -~]{0,12}",
        v2 in "[ -~]{0,12}",
    ) {
        let cfg = FingerprintConfig {
            header_names: vec!["X-B".into(), "x-a".into()],
            ..FingerprintConfig::default()
        };
        let h1 = [("x-a", v1.as_str()), ("X-B", v2.as_str())];
        let h2 = [("X-b", v2.as_str()), ("X-A", v1.as_str()), ("x-other", "ignored")];
        let a = fingerprint(&RequestParts { headers: &h1, ..RequestParts::json("POST", "/r", b"{}") }, &cfg).expect("ok");
        let b = fingerprint(&RequestParts { headers: &h2, ..RequestParts::json("POST", "/r", b"{}") }, &cfg).expect("ok");
        prop_assert_eq!(a, b);
    }
}
