//! The fixed shapes of the request-path metrics every binding exports (`spec/METRICS.md`), so
//! that a dashboard or an alert written once reads every host the same way.

/// Histogram bounds, in seconds, of `idempo_store_operation_duration_seconds`: an embedded store
/// answers in well under a millisecond, a networked one in a few, a failing one at its timeout.
pub const STORE_LATENCY_BUCKETS_SECONDS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_increasing_and_positive() {
        assert!(
            STORE_LATENCY_BUCKETS_SECONDS
                .first()
                .is_some_and(|b| *b > 0.0)
        );
        assert!(
            STORE_LATENCY_BUCKETS_SECONDS
                .windows(2)
                .all(|w| w[0] < w[1])
        );
    }

    #[test]
    fn buckets_are_the_vectors() {
        let doc: serde_json::Value =
            serde_json::from_str(include_str!("../../spec/vectors/metrics/request.json"))
                .expect("the metrics vector is JSON");
        let latency = doc["metrics"]
            .as_array()
            .and_then(|m| m.iter().find(|e| e["id"] == "store_latency"))
            .expect("the store_latency series");
        let buckets: Vec<f64> = latency["buckets"]
            .as_array()
            .expect("buckets")
            .iter()
            .map(|b| b.as_f64().expect("a number"))
            .collect();
        assert_eq!(buckets, STORE_LATENCY_BUCKETS_SECONDS);
    }
}
