//! The principal from a verified JWT, through real sockets: the built binary with
//! `[principal] jwt = { ... }` in front of an upstream hyper server. Keys: the test-only
//! fixtures in `tests/fixtures/jwt/` (their README says how they were made).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use common::{Answer, Gateway, TestClient, client, get, post, temp_dir, upstream};
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use serde_json::{Value, json};

const ISSUER: &str = "https://auth.example.test/";
const AUDIENCE: &str = "payments-api";

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/jwt")
        .join(name)
}

/// The DER inside a PEM file.
fn der(name: &str) -> Vec<u8> {
    let text = std::fs::read_to_string(fixture(name)).unwrap();
    let b64: String = text.lines().filter(|l| !l.starts_with("-----")).collect();
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap()
}

fn rsa1() -> EncodingKey {
    EncodingKey::from_rsa_der(&der("rsa1.pem"))
}

fn ec1() -> EncodingKey {
    EncodingKey::from_ec_der(&der("ec1.pem"))
}

fn now() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    )
    .unwrap()
}

/// Standard claims for `sub`, valid for an hour.
fn claims(sub: &str) -> Value {
    json!({"iss": ISSUER, "aud": AUDIENCE, "sub": sub, "iat": now(), "exp": now() + 3600})
}

fn token(alg: Algorithm, kid: Option<&str>, claims: &Value, key: &EncodingKey) -> String {
    let mut h = Header::new(alg);
    h.kid = kid.map(str::to_owned);
    encode(&h, claims, key).unwrap()
}

fn rs256(sub: &str) -> String {
    token(Algorithm::RS256, Some("rsa-1"), &claims(sub), &rsa1())
}

fn jwt_config(upstream: SocketAddr, jwks: &Path) -> String {
    format!(
        r#"listen = "127.0.0.1:0"
upstream_timeout_ms = 5000

[store]
kind = "memory"

[principal]
jwt = {{ jwks_file = "{}", issuer = "{ISSUER}", audience = "{AUDIENCE}", claim = "sub", algorithms = ["RS256", "ES256"], leeway_s = 30 }}

[upstreams]
app = "http://{upstream}"

[[routes]]
method = "POST"
path = "/payments"
upstream = "app"
"#,
        jwks.display()
    )
}

async fn pay(c: &TestClient, gw: &Gateway, key: &str, bearer: Option<&str>, body: &str) -> Answer {
    let auth = bearer.map(|t| format!("Bearer {t}"));
    let mut h = vec![("Idempotency-Key", key)];
    if let Some(a) = &auth {
        h.push(("Authorization", a.as_str()));
    }
    post(c, &gw.url("/payments"), &h, body).await.unwrap()
}

#[tokio::test]
async fn verified_principals_get_their_own_records() {
    let dir = temp_dir("jwt-ok");
    let (up, seen) = upstream().await;
    let gw = Gateway::start(&dir, &jwt_config(up, &fixture("jwks.json")));
    let c = client();
    let key = "key-0000-jwt-shared";
    let body = r#"{"amount":10}"#;

    let alice = pay(&c, &gw, key, Some(&rs256("alice")), body).await;
    assert_eq!(alice.status, 201, "{}", alice.text());
    assert!(alice.header("idempotent-replayed").is_none());
    // A retry with a fresh token of the same principal replays.
    let fresh = token(
        Algorithm::RS256,
        Some("rsa-1"),
        &json!({"iss": ISSUER, "aud": [AUDIENCE, "other"], "sub": "alice", "exp": now() + 60}),
        &rsa1(),
    );
    let again = pay(&c, &gw, key, Some(&fresh), body).await;
    assert_eq!(again.status, 201);
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.body, alice.body);

    // Bob (ES256) with the same key and body: his own record, not Alice's replay.
    let bob = token(Algorithm::ES256, Some("ec-1"), &claims("bob"), &ec1());
    let b = pay(&c, &gw, key, Some(&bob), body).await;
    assert_eq!(b.status, 201, "{}", b.text());
    assert!(b.header("idempotent-replayed").is_none());

    // No kid: the JWKS's only RSA key is used. Within the leeway, an expired token still counts.
    let carol = token(
        Algorithm::RS256,
        None,
        &json!({"iss": ISSUER, "aud": AUDIENCE, "sub": "carol", "exp": now() - 5}),
        &rsa1(),
    );
    let k = pay(&c, &gw, key, Some(&carol), body).await;
    assert_eq!(k.status, 201, "{}", k.text());
    assert!(k.header("idempotent-replayed").is_none());

    // The upstream ran once per principal, and got the token (it may authorize on its own).
    assert_eq!(seen.lock().unwrap().calls.get("/payments"), Some(&3));
    let metrics = get(&c, &gw.url("/metrics")).await.text();
    assert!(
        metrics.contains("idempo_requests_total{route=\"/payments\",outcome=\"replayed\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn unverified_tokens_are_refused_and_nothing_is_forwarded() {
    let dir = temp_dir("jwt-refuse");
    let (up, seen) = upstream().await;
    let gw = Gateway::start(&dir, &jwt_config(up, &fixture("jwks.json")));
    let c = client();
    let body = r#"{"amount":10}"#;
    let with = |f: &dyn Fn(&mut serde_json::Map<String, Value>)| {
        let mut v = claims("alice");
        f(v.as_object_mut().unwrap());
        v
    };
    let other_rsa = EncodingKey::from_rsa_der(&der("rsa-other.pem"));
    let cases: Vec<(&str, String)> = vec![
        ("garbage", "not.a.jwt".to_owned()),
        (
            "expired",
            token(
                Algorithm::RS256,
                Some("rsa-1"),
                &with(&|m| {
                    m.insert("exp".into(), json!(now() - 3600));
                }),
                &rsa1(),
            ),
        ),
        (
            "not yet valid",
            token(
                Algorithm::RS256,
                Some("rsa-1"),
                &with(&|m| {
                    m.insert("nbf".into(), json!(now() + 3600));
                }),
                &rsa1(),
            ),
        ),
        (
            "no exp",
            token(
                Algorithm::RS256,
                Some("rsa-1"),
                &with(&|m| {
                    m.remove("exp");
                }),
                &rsa1(),
            ),
        ),
        (
            "wrong issuer",
            token(
                Algorithm::RS256,
                Some("rsa-1"),
                &with(&|m| {
                    m.insert("iss".into(), json!("https://evil.example.test/"));
                }),
                &rsa1(),
            ),
        ),
        (
            "no issuer",
            token(
                Algorithm::RS256,
                Some("rsa-1"),
                &with(&|m| {
                    m.remove("iss");
                }),
                &rsa1(),
            ),
        ),
        (
            "wrong audience",
            token(
                Algorithm::RS256,
                Some("rsa-1"),
                &with(&|m| {
                    m.insert("aud".into(), json!("another-api"));
                }),
                &rsa1(),
            ),
        ),
        (
            "no audience",
            token(
                Algorithm::RS256,
                Some("rsa-1"),
                &with(&|m| {
                    m.remove("aud");
                }),
                &rsa1(),
            ),
        ),
        (
            "bad signature",
            token(
                Algorithm::RS256,
                Some("rsa-1"),
                &claims("alice"),
                &other_rsa,
            ),
        ),
        (
            "unknown kid",
            token(Algorithm::RS256, Some("rsa-9"), &claims("alice"), &rsa1()),
        ),
        (
            "algorithm not configured",
            token(Algorithm::RS384, Some("rsa-1"), &claims("alice"), &rsa1()),
        ),
        (
            "HMAC",
            token(
                Algorithm::HS256,
                Some("rsa-1"),
                &claims("alice"),
                &EncodingKey::from_secret(b"secret"),
            ),
        ),
        (
            "ES256 signed by the RSA key's kid",
            token(Algorithm::ES256, Some("rsa-1"), &claims("alice"), &ec1()),
        ),
    ];
    for (i, (what, t)) in cases.iter().enumerate() {
        let key = format!("key-0000-jwt-refused-{i}");
        let a = pay(&c, &gw, &key, Some(t), body).await;
        assert_eq!(a.status, 401, "{what}: {}", a.text());
        let challenge = a.header("www-authenticate").unwrap_or_default();
        assert!(
            challenge.starts_with("Bearer error=\"invalid_token\""),
            "{what}: {challenge}"
        );
        assert_eq!(a.header("content-type"), Some("application/problem+json"));
        assert_eq!(a.problem_type(), "about:blank", "{what}");
    }
    // An unsigned token (alg none, no signature).
    let b64 = |v: &Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string().as_bytes())
    };
    let unsigned = format!(
        "{}.{}.",
        b64(&json!({"alg": "none", "typ": "JWT"})),
        b64(&claims("alice"))
    );
    let a = pay(&c, &gw, "key-0000-jwt-none", Some(&unsigned), body).await;
    assert_eq!(a.status, 401, "{}", a.text());

    // No token, or not a bearer one: a challenge without an error code (RFC 6750 §3.1).
    let missing = pay(&c, &gw, "key-0000-jwt-missing", None, body).await;
    assert_eq!(missing.status, 401, "{}", missing.text());
    assert_eq!(missing.header("www-authenticate"), Some("Bearer"));
    let basic = post(
        &c,
        &gw.url("/payments"),
        &[
            ("Idempotency-Key", "key-0000-jwt-basic"),
            ("Authorization", "Basic YWxpY2U6cHc="),
        ],
        body,
    )
    .await
    .unwrap();
    assert_eq!(basic.status, 401);
    assert_eq!(basic.header("www-authenticate"), Some("Bearer"));

    // Two tokens: which one counts is unknown; refused (400 invalid_request).
    let mut req = hyper::Request::post(gw.url("/payments"))
        .header("content-type", "application/json")
        .header("Idempotency-Key", "key-0000-jwt-two")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
        .unwrap();
    for sub in ["alice", "mallory"] {
        req.headers_mut().append(
            "authorization",
            format!("Bearer {}", rs256(sub)).parse().unwrap(),
        );
    }
    let two = c.request(req).await.unwrap();
    assert_eq!(two.status(), 400);

    // A verified token whose claim gives no principal: core's scope-unresolved.
    for (what, sub) in [
        ("no sub", None),
        ("a number", Some(json!(42))),
        ("empty", Some(json!(""))),
    ] {
        let mut v = claims("x");
        match sub {
            None => {
                v.as_object_mut().unwrap().remove("sub");
            }
            Some(s) => {
                v["sub"] = s;
            }
        }
        let t = token(Algorithm::ES256, Some("ec-1"), &v, &ec1());
        let a = pay(&c, &gw, "key-0000-jwt-claim", Some(&t), body).await;
        assert_eq!(a.status, 500, "{what}: {}", a.text());
        assert_eq!(
            a.problem_type(),
            "urn:idempo:problem:scope-unresolved",
            "{what}"
        );
    }

    assert_eq!(seen.lock().unwrap().calls.get("/payments"), None);
    let metrics = get(&c, &gw.url("/metrics")).await.text();
    // 13 + none + missing + basic + two tokens + 3 claims.
    assert!(
        metrics
            .contains("idempo_requests_total{route=\"/payments\",outcome=\"scope_unresolved\"} 20"),
        "{metrics}"
    );
}

fn check_config(dir: &Path, text: &str) -> (i32, String) {
    let file = dir.join("gateway.toml");
    std::fs::write(&file, text).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idempo-gateway"))
        .arg("check-config")
        .arg(&file)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn an_unusable_jwks_fails_start_naming_the_line_and_the_file() {
    let dir = temp_dir("jwt-jwks");
    let up: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let (code, _) = check_config(&dir, &jwt_config(up, &fixture("jwks.json")));
    assert_eq!(code, 0);

    let missing = dir.join("nope.json");
    let (code, err) = check_config(&dir, &jwt_config(up, &missing));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("gateway.toml:8:"), "{err}");
    assert!(
        err.contains("cannot read") && err.contains("nope.json"),
        "{err}"
    );

    let empty = dir.join("empty.json");
    std::fs::write(&empty, "{\"keys\": []}").unwrap();
    let (code, err) = check_config(&dir, &jwt_config(up, &empty));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("gateway.toml:8:"), "{err}");
    assert!(
        err.contains("empty.json") && err.contains("no signature keys"),
        "{err}"
    );

    // The gateway itself does not start either.
    let file = dir.join("gateway.toml");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_idempo-gateway"))
        .args(["serve", "--config"])
        .arg(&file)
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(!status.success());
}
