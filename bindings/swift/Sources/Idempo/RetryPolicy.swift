import Foundation
import IdempoBindings

/// idempo's client retry policy, decided by core (the same algorithm in every binding).
///
/// Retried: timeouts, connection errors, idempo's 409 in-flight problem (the first request is
/// still running), 408, 425, 429 and 5xx except 501/505/506/508/510/511. Stopped: 1xx-3xx,
/// idempo's 422 key-reused problem (key used with another request), other 4xx (an application's
/// own 409 or 422 included: its answer), and idempo's outcome-unknown and response-not-retained
/// 500s (retrying that key cannot change the answer). Backoff is exponential with jitter; a server's `Retry-After` is a floor;
/// attempts and total time are bounded.
public struct RetryPolicy: Sendable, Hashable {
    /// Attempts in all, the first included.
    public let maxAttempts: UInt32
    /// Backoff cap after the first attempt, in milliseconds.
    public let baseDelayMilliseconds: UInt64
    /// Largest backoff, in milliseconds (does not cap `Retry-After`).
    public let maxDelayMilliseconds: UInt64
    /// Time budget from the start of the first attempt, in milliseconds.
    public let maxElapsedMilliseconds: UInt64
    /// Jitter mode.
    public let jitter: JitterMode

    /// A policy checked by core.
    ///
    /// - Throws: ``RetryPolicyError/invalidConfiguration(code:message:)`` naming the first value
    ///   out of range.
    public init(
        maxAttempts: UInt32, baseDelayMilliseconds: UInt64, maxDelayMilliseconds: UInt64,
        maxElapsedMilliseconds: UInt64, jitter: JitterMode = .equal
    ) throws {
        let config = RetryConfig(
            maxAttempts: maxAttempts, baseDelayMs: baseDelayMilliseconds, maxDelayMs: maxDelayMilliseconds,
            maxElapsedMs: maxElapsedMilliseconds, jitter: jitter.ffi)
        do {
            try validateRetryConfig(config: config)
        } catch {
            throw RetryPolicyError(ffiError: error)
        }
        self.init(checked: config)
    }

    private init(checked config: RetryConfig) {
        maxAttempts = config.maxAttempts
        baseDelayMilliseconds = config.baseDelayMs
        maxDelayMilliseconds = config.maxDelayMs
        maxElapsedMilliseconds = config.maxElapsedMs
        jitter = JitterMode(config.jitter)
    }

    /// Core's default: 5 attempts, 500 ms base, 10 s cap, 60 s budget, equal jitter.
    public static let standard = RetryPolicy(checked: defaultRetryConfig())

    var ffi: RetryConfig {
        RetryConfig(
            maxAttempts: maxAttempts, baseDelayMs: baseDelayMilliseconds, maxDelayMs: maxDelayMilliseconds,
            maxElapsedMs: maxElapsedMilliseconds, jitter: jitter.ffi)
    }

    /// What to do after attempt number `attempt` (1-based) ended with `outcome`, `elapsed`
    /// milliseconds after the first attempt started, given a uniform sample `jitter` in `[0, 1)`.
    ///
    /// - Throws: ``RetryPolicyError/invalidInput(code:message:)`` for attempt 0, a jitter outside
    ///   `[0, 1)` or a status outside 100...599.
    public func decide(attempt: UInt32, elapsedMilliseconds: UInt64, outcome: AttemptOutcome, jitter: Double)
        throws -> RetryDecision
    {
        do {
            return RetryDecision(
                try retryDecide(
                    config: ffi, attempt: attempt, elapsedMs: elapsedMilliseconds, outcome: outcome.ffi,
                    jitter: jitter))
        } catch {
            throw RetryPolicyError(ffiError: error)
        }
    }

    /// How core classifies a response that arrived (`spec/KEYS.md` §3.5): idempo's own problems
    /// (`application/problem+json` with idempo's `type`: 500 outcome-unknown and
    /// response-not-retained, 422 key-reused, 409 in-flight) become their cases; anything else,
    /// an application's own 409 or 422 included, is `.response` with the status and the
    /// `Retry-After` delay relative to `now`.
    public static func outcome(of response: HTTPResponse, now: Date = Date()) -> AttemptOutcome {
        let retryAfter = response.header("Retry-After").flatMap { retryAfterMilliseconds($0, now: now) }
        return AttemptOutcome(
            attemptOutcomeFromResponse(
                status: UInt16(clamping: response.status), retryAfterMs: retryAfter,
                contentType: response.header("Content-Type"), body: response.body))
    }

    /// Reads a `Retry-After` value (delay-seconds or an HTTP-date) as milliseconds from `now`;
    /// `nil` when it is not a usable value.
    public static func retryAfterMilliseconds(_ value: String, now: Date = Date()) -> UInt64? {
        let nowMs = UInt64(clamping: Int64((now.timeIntervalSince1970 * 1000).rounded(.down)))
        return retryAfterMilliseconds(value, nowUnixMilliseconds: nowMs)
    }

    /// ``retryAfterMilliseconds(_:now:)`` with the current time in unix milliseconds.
    public static func retryAfterMilliseconds(_ value: String, nowUnixMilliseconds: UInt64) -> UInt64? {
        parseRetryAfter(value: value, nowUnixMs: nowUnixMilliseconds)
    }
}
