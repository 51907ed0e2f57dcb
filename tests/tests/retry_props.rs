//! Property tests for the client retry policy: bounded delays, attempts and total time.
use idempo_core::retry::{
    AttemptOutcome, Jitter, RetryConfig, RetryDecision, RetryPolicy, parse_retry_after,
};
use proptest::prelude::*;

fn config() -> impl Strategy<Value = RetryConfig> {
    (
        1u32..12,
        1u64..5_000,
        0u64..60_000,
        0u64..300_000,
        any::<bool>(),
    )
        .prop_map(|(a, base, extra, budget, full)| RetryConfig {
            max_attempts: a,
            base_delay_ms: base,
            max_delay_ms: base + extra,
            max_elapsed_ms: budget,
            jitter: if full { Jitter::Full } else { Jitter::Equal },
        })
}

fn outcome() -> impl Strategy<Value = AttemptOutcome> {
    prop_oneof![
        Just(AttemptOutcome::Timeout),
        Just(AttemptOutcome::ConnectionError),
        Just(AttemptOutcome::OutcomeUnknown),
        (100u16..600, proptest::option::of(0u64..120_000)).prop_map(|(status, retry_after_ms)| {
            AttemptOutcome::Response {
                status,
                retry_after_ms,
            }
        }),
    ]
}

/// Jitter samples in [0, 1), including the extremes.
fn jitter() -> impl Strategy<Value = f64> {
    prop_oneof![Just(0.0), Just(1.0 - f64::EPSILON / 2.0), 0.0f64..1.0]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(5000))]

    /// One decision: a retry stays within the backoff window, honours Retry-After as a floor,
    /// never starts after the budget and never exceeds the attempt bound.
    #[test]
    fn single_decision_bounds(cfg in config(), attempt in 1u32..20, elapsed in 0u64..400_000, o in outcome(), j in jitter()) {
        let policy = RetryPolicy::new(cfg).expect("valid");
        let d = policy.decide(attempt, elapsed, &o, j).expect("valid inputs");
        if let RetryDecision::Retry { delay_ms } = d {
            let ra = match o { AttemptOutcome::Response { retry_after_ms, .. } => retry_after_ms, _ => None };
            prop_assert!(attempt < cfg.max_attempts);
            prop_assert!(elapsed + delay_ms <= cfg.max_elapsed_ms);
            let cap = policy.backoff_cap_ms(attempt);
            prop_assert!(cap <= cfg.max_delay_ms);
            match ra {
                None => {
                    prop_assert!(delay_ms <= cap);
                    if cfg.jitter == Jitter::Equal {
                        prop_assert!(delay_ms >= cap / 2);
                    }
                }
                Some(ra) => {
                    prop_assert!(delay_ms >= ra);
                    prop_assert!(delay_ms <= cap.max(ra));
                }
            }
        }
    }

    /// A whole retry loop of always-failing attempts ends within max_attempts attempts, and
    /// no attempt starts after max_elapsed_ms.
    #[test]
    fn loop_is_bounded(cfg in config(), durations in proptest::collection::vec(0u64..10_000, 12), js in proptest::collection::vec(0.0f64..1.0, 12), o in outcome()) {
        let policy = RetryPolicy::new(cfg).expect("valid");
        let mut attempt = 1u32;
        let mut started_at = 0u64;
        loop {
            prop_assert!(attempt <= cfg.max_attempts);
            prop_assert!(attempt == 1 || started_at <= cfg.max_elapsed_ms);
            let ended = started_at + durations[(attempt - 1) as usize % durations.len()];
            match policy.decide(attempt, ended, &o, js[(attempt - 1) as usize % js.len()]).expect("valid") {
                RetryDecision::Retry { delay_ms } => {
                    started_at = ended + delay_ms;
                    attempt += 1;
                }
                RetryDecision::Stop { .. } => break,
            }
        }
    }

    /// The backoff ceiling never decreases with the attempt number.
    #[test]
    fn cap_is_monotonic(cfg in config(), n in 1u32..200) {
        let p = RetryPolicy::new(cfg).expect("valid");
        prop_assert!(p.backoff_cap_ms(n) <= p.backoff_cap_ms(n + 1));
    }

    /// Delta-seconds read back exactly.
    #[test]
    fn delta_seconds(n in 0u64..2_147_483_648u64, now in any::<u64>()) {
        prop_assert_eq!(parse_retry_after(&n.to_string(), now), Some(n * 1000));
    }

    /// IMF-fixdate: a date formatted by the test's own (year-by-year) calendar reads back as
    /// the exact delay from the epoch.
    #[test]
    fn imf_fixdate_round_trip(secs in 0u64..253_402_300_800u64) {
        prop_assert_eq!(parse_retry_after(&imf_fixdate(secs), 0), Some(secs * 1000));
    }
}

/// Formats unix seconds as an IMF-fixdate by walking years and months (independent of core).
fn imf_fixdate(secs: u64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let leap = |y: u64| (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let mut days = secs / 86_400;
    let weekday = DAYS[(days % 7) as usize];
    let mut year = 1970;
    while days >= if leap(year) { 366 } else { 365 } {
        days -= if leap(year) { 366 } else { 365 };
        year += 1;
    }
    let lens = [
        31,
        if leap(year) { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    let mut month = 0;
    while days >= lens[month] {
        days -= lens[month];
        month += 1;
    }
    let rem = secs % 86_400;
    format!(
        "{weekday}, {:02} {} {year:04} {:02}:{:02}:{:02} GMT",
        days + 1,
        MONTHS[month],
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}
