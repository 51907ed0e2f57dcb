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

/// The fixture JWKS with only the keys whose `kid` is in `kids`.
fn jwks_with(kids: &[&str]) -> String {
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("jwks.json")).unwrap()).unwrap();
    let keys: Vec<Value> = doc["keys"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|k| kids.contains(&k["kid"].as_str().unwrap_or("")))
        .cloned()
        .collect();
    assert_eq!(keys.len(), kids.len(), "fixture kids");
    json!({ "keys": keys }).to_string()
}

/// The value of `idempo_gateway_jwks_reloads_total{result}` in a `/metrics` text.
fn reloads(metrics: &str, result: &str) -> u64 {
    let series = format!("idempo_gateway_jwks_reloads_total{{result=\"{result}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .map_or(0, |v| v.trim().parse().unwrap())
}

/// Polls `pay` with fresh keys until it answers `status` (the gateway reads the file on its own
/// time), within `secs` seconds; the last answer.
async fn until_status(c: &TestClient, gw: &Gateway, token: &str, status: u16, secs: u64) -> Answer {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    let mut n = 0_u32;
    loop {
        n += 1;
        let a = pay(
            c,
            gw,
            &format!("key-rotate-{status}-{n:06}"),
            Some(token),
            "{}",
        )
        .await;
        if a.status == status || std::time::Instant::now() > deadline {
            return a;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_rotated_jwks_is_read_again_on_sighup_and_on_its_interval() {
    let dir = temp_dir("jwt-rotate");
    let jwks = dir.join("jwks.json");
    std::fs::write(&jwks, jwks_with(&["ec-1"])).unwrap();
    let (up, seen) = upstream().await;
    let config = jwt_config(up, &jwks).replace("leeway_s = 30", "leeway_s = 30, reload_s = 1");
    let gw = Gateway::start(&dir, &config);
    let c = client();
    let rsa = rs256("alice");

    // Signed with a key the file does not hold yet: refused, nothing forwarded.
    let a = pay(&c, &gw, "key-rotate-before", Some(&rsa), "{}").await;
    assert_eq!(a.status, 401, "{}", a.text());

    // The issuer publishes rsa-1; SIGHUP reads the file at once.
    std::fs::write(&jwks, jwks_with(&["ec-1", "rsa-1"])).unwrap();
    let hup = std::process::Command::new("kill")
        .args(["-HUP", &gw.child.id().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    let a = until_status(&c, &gw, &rsa, 201, 5).await;
    assert_eq!(a.status, 201, "{}", a.text());

    // A half-written file: refused, logged, counted; the last good keys stay in use.
    std::fs::write(&jwks, "{\"keys\": [").unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let m = get(&c, &gw.url("/metrics")).await.text();
        if reloads(&m, "failed") >= 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no failed reload counted: {m}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let a = pay(&c, &gw, "key-rotate-broken", Some(&rsa), "{}").await;
    assert_eq!(a.status, 201, "{}", a.text());
    assert!(
        gw.logs
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("JWKS reload failed") && l.contains("is not a JWKS")),
        "{:?}",
        gw.logs.lock().unwrap()
    );

    // rsa-1 retired: the interval picks the file up without a signal.
    std::fs::write(&jwks, jwks_with(&["ec-1"])).unwrap();
    let a = until_status(&c, &gw, &rsa, 401, 5).await;
    assert_eq!(a.status, 401, "{}", a.text());
    // At least the two good files were loaded (a read that caught a file mid-write counts as
    // one more failure, then the finished file loads).
    let m = get(&c, &gw.url("/metrics")).await.text();
    assert!(reloads(&m, "loaded") >= 2, "{m}");
    // The gateway is still the same process (SIGHUP did not end it).
    assert!(matches!(
        std::process::Command::new("kill")
            .args(["-0", &gw.child.id().to_string()])
            .status(),
        Ok(s) if s.success()
    ));
    assert!(
        seen.lock()
            .unwrap()
            .calls
            .get("/payments")
            .copied()
            .unwrap_or(0)
            >= 2
    );
}
