//! The shipped SQLite and Redis recipes under the model (`spec/MODEL.md` §5): on every state the
//! model reaches, every store step that can come next gives the same answer and leaves the same
//! record on SQLite (the shipped SQL) and on Lua 5.1 (the shipped Redis scripts) as core's
//! primitive. Planted one-line mistakes in the recipe texts are counterexamples, each named.
use idempo_tests::model::recipe_check::{R, RecipeCheck};
use idempo_tests::model::{Bounds, ClientSpec, EffectMode, IdempoModel};
use idempo_tests::recipes::redis::RedisTexts;
use idempo_tests::recipes::sqlite::SqliteTexts;
use stateright::{Checker, Model};

const ALICE_A: ClientSpec = ClientSpec {
    principal: "alice",
    body: r#"{"amount":100,"to":"acct-1"}"#,
};
const ALICE_B: ClientSpec = ClientSpec {
    principal: "alice",
    body: r#"{"amount":250,"to":"acct-1"}"#,
};

fn ab(mode: EffectMode, bounds: Bounds) -> IdempoModel {
    IdempoModel::new(mode, &[ALICE_A, ALICE_B], bounds)
}

fn failures() -> Bounds {
    Bounds {
        retries: 0,
        failures: true,
        heartbeats: true,
        ..Bounds::default()
    }
}

/// Explores `check` exhaustively; returns the unique state count, or the disagreement.
fn explore(label: &str, check: RecipeCheck) -> Result<usize, String> {
    let start = std::time::Instant::now();
    let checker = check.checker().spawn_bfs().join();
    assert!(checker.is_done(), "{label}: exploration incomplete");
    let unique = checker.unique_state_count();
    println!("{label}: {unique} unique states, {:.2?}", start.elapsed());
    match checker.discovery(R) {
        None => Ok(unique),
        Some(path) => {
            let last = path.last_state();
            let why = checker
                .model()
                .disagreement(last)
                .unwrap_or_else(|| "(not reproduced on this thread)".into());
            Err(format!(
                "{label}: {R} fails after {} steps: {why}",
                path.into_actions().len()
            ))
        }
    }
}

#[test]
fn shipped_recipes_agree_with_core_on_every_reachable_step() {
    // The same state spaces as the fast tier's (the counts are model_check.rs's pins).
    for (label, model, pinned) in [
        (
            "outcome-unknown A/B, failures + heartbeats",
            ab(EffectMode::UnkeyedOutcomeUnknown, failures()),
            46_790,
        ),
        (
            "re-run A/B, failures + heartbeats",
            ab(EffectMode::UnkeyedReRun, failures()),
            39_386,
        ),
        (
            "transactional A/B",
            ab(EffectMode::Transactional, Bounds::default()),
            74_736,
        ),
    ] {
        let unique = explore(label, RecipeCheck::shipped(model)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            unique, pinned,
            "{label}: the wrapper explores the model's own states"
        );
    }
}

/// A recipe mutation: the shipped texts with `from` replaced by `to` in one of them.
fn mutated(which: &str, from: &str, to: &str) -> (SqliteTexts, RedisTexts) {
    let mut sqlite = SqliteTexts::default();
    let mut redis = RedisTexts::default();
    let text: &mut String = match which {
        "sqlite claim" => &mut sqlite.claim,
        "sqlite takeover" => &mut sqlite.takeover,
        "sqlite complete" => &mut sqlite.complete,
        "sqlite renew" => &mut sqlite.renew,
        "redis takeover" => &mut redis.takeover,
        "redis complete" => &mut redis.complete,
        "redis renew" => &mut redis.renew,
        "redis mark_unknown" => &mut redis.mark_unknown,
        other => panic!("no recipe {other}"),
    };
    assert!(
        text.contains(from),
        "{which}: {from:?} is not in the shipped text"
    );
    *text = text.replacen(from, to, 1);
    (sqlite, redis)
}

#[test]
fn planted_recipe_mistakes_are_counterexamples() {
    let cases = [
        // A claim that replaces a record one tick early (at expires_at, the record still counts).
        (
            "sqlite claim",
            "WHERE r.expires_at <= excluded.lease_until - :lease",
            "WHERE r.expires_at < excluded.lease_until - :lease",
            "sqlite",
        ),
        // A takeover that skips the lease guard.
        (
            "sqlite takeover",
            " AND lease_until <= ",
            " AND 0 <= ",
            "sqlite",
        ),
        // A completion that ignores the fencing token.
        ("sqlite complete", " AND token = :token", "", "sqlite"),
        // A renewal that shortens the retention.
        (
            "sqlite renew",
            "expires_at = max(expires_at, ",
            "expires_at = min(expires_at, ",
            "sqlite",
        ),
        // The Redis takeover with its lease test inverted at the boundary.
        (
            "redis takeover",
            "tonumber(r[3]) > now",
            "tonumber(r[3]) >= now",
            "redis",
        ),
        // A completion that does not check the token.
        ("redis complete", "r[2] ~= ARGV[1]", "false", "redis"),
        // A renewal that sets the expiry to the lease instead of keeping the longer retention.
        (
            "redis renew",
            "local exp = math.max(tonumber(r[3]), lease_until)",
            "local exp = lease_until",
            "redis",
        ),
        // The outcome-unknown mark that leaves the hash's TTL at the old value.
        (
            "redis mark_unknown",
            "redis.call('PEXPIRE', KEYS[1], int(exp - now + 60000))",
            "",
            "redis",
        ),
    ];
    let mut survived = Vec::new();
    for (which, from, to, backend) in cases {
        let (sqlite, redis) = mutated(which, from, to);
        let model = ab(EffectMode::UnkeyedOutcomeUnknown, failures());
        let check = RecipeCheck {
            inner: model,
            sqlite,
            redis,
        };
        match explore(which, check) {
            Ok(_) => survived.push(which),
            Err(why) => assert!(
                why.contains(&format!("{backend} disagrees"))
                    || why.contains(&format!("{backend}:")),
                "{which}: the counterexample names another backend: {why}"
            ),
        }
    }
    // The takeover mutations need a takeover of the same request (two clients sending one body)
    // under the re-run policy, with a heartbeat that may renew in between.
    for (which, from, to) in [
        ("sqlite takeover", " AND lease_until <= ", " AND 0 <= "),
        (
            "redis takeover",
            "tonumber(r[3]) > now",
            "tonumber(r[3]) >= now",
        ),
    ] {
        if !survived.contains(&which) {
            continue;
        }
        let (sqlite, redis) = mutated(which, from, to);
        let inner = IdempoModel::new(EffectMode::UnkeyedReRun, &[ALICE_A, ALICE_A], failures());
        let check = RecipeCheck {
            inner,
            sqlite,
            redis,
        };
        if explore(which, check).is_err() {
            survived.retain(|w| *w != which);
        }
    }
    assert!(
        survived.is_empty(),
        "mutations no reachable step tells apart: {survived:?}"
    );
}
