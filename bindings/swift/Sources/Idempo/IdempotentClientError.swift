import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Why ``IdempotentClient/send(_:intent:key:)`` did not return a final answer.
///
/// Every case that involves a key carries it (``key``), and says whether it stays pending: a
/// pending key is what the next send of the intent reuses, and what an app reconciles.
public enum IdempotentClientError: Error, Sendable, CustomStringConvertible {
    /// idempo's 422 key-reused problem: the server saw this key with a different request (an
    /// application's own 422 is returned as its answer instead). Retrying cannot help; the
    /// intent is settled (its pending key removed), and a new intent needs a new key.
    case keyReusedWithDifferentRequest(key: IdempotencyKey, response: HTTPResponse)
    /// The outcome is still unknown: every attempt was retryable (timeouts, connectivity loss,
    /// 409 in flight, 429, 5xx) and the policy stopped (`attemptsExhausted`,
    /// `timeBudgetExhausted`, `retryAfterBeyondBudget`). The key stays pending: send the same
    /// intent again later to reuse it.
    case gaveUp(key: IdempotencyKey, reason: StopReason, attempts: Int, lastAttempt: LastAttempt)
    /// A transport error that is not a timeout or connectivity loss (bad URL, TLS failure, ...).
    /// The key stays pending.
    case transport(key: IdempotencyKey, error: URLError)
    /// A custom ``HTTPTransport`` threw something other than a `URLError`. The key stays pending.
    case transportFailed(key: IdempotencyKey, error: any Error)
    /// The server answered idempo's outcome-unknown problem (500): an earlier attempt with this
    /// key may have taken effect and its outcome was not recorded. No further attempt was made.
    /// The key stays pending: reconcile (check the resource's state), then remove the intent's
    /// record; do not mint a new key blindly.
    case outcomeUnknown(key: IdempotencyKey, attempts: Int, response: HTTPResponse)
    /// Nothing was sent: `intent` has a pending key that was minted for a different request
    /// (e.g. the amount changed from 100 to 250). The earlier attempt may have run: reconcile
    /// (check the resource's state), then remove the intent's record
    /// (``PendingKeyStore/removePendingIntent(for:)``) before sending the changed request, or send
    /// it under a new intent name.
    case intentChangedWhilePending(intent: String, pending: PendingIntent)
    /// Nothing was sent: an explicit `key:` was passed that is not `intent`'s pending key.
    case keyDiffersFromPending(intent: String, pending: PendingIntent)
    /// Nothing was sent: the request cannot be bound to an intent because core cannot
    /// fingerprint it (a body declared JSON that is not valid JSON).
    case requestNotBindable(intent: String, error: FingerprintError)
    /// The ``PendingKeyStore`` failed. `key` is the key involved, when one was known; nothing was
    /// sent unless `key` is set, and then it stays pending.
    case keyStore(intent: String, key: IdempotencyKey?, error: any Error)
    /// The calling task was cancelled. `key` (when one had been chosen) stays pending: the
    /// request may have run; send the intent again to reuse it. (Other callers sharing the
    /// intent's attempts are not affected.)
    case cancelled(key: IdempotencyKey?)
    /// Core refused a retry-policy input (a bug in a custom jitter source: a sample outside
    /// `[0, 1)`). The key stays pending.
    case retryPolicy(key: IdempotencyKey, error: RetryPolicyError)

    /// What the last attempt of a ``gaveUp(key:reason:attempts:lastAttempt:)`` ended with.
    public enum LastAttempt: Sendable {
        /// A retryable response (409, 429, 5xx, ...).
        case response(HTTPResponse)
        /// No response within the timeout.
        case timeout
        /// The connection failed or broke.
        case connectionError(URLError)
    }

    /// The key the failed request carried or would carry, when one was chosen.
    public var key: IdempotencyKey? {
        switch self {
        case .keyReusedWithDifferentRequest(let key, _), .gaveUp(let key, _, _, _), .transport(let key, _),
            .transportFailed(let key, _), .outcomeUnknown(let key, _, _), .retryPolicy(let key, _):
            return key
        case .intentChangedWhilePending(_, let pending), .keyDiffersFromPending(_, let pending):
            return pending.key
        case .keyStore(_, let key, _), .cancelled(let key):
            return key
        case .requestNotBindable:
            return nil
        }
    }

    /// Whether ``key`` is (still) the pending key of the intent, if the send had one.
    public var keyStaysPending: Bool {
        switch self {
        case .keyReusedWithDifferentRequest, .requestNotBindable: return false
        default: return key != nil
        }
    }

    public var description: String {
        switch self {
        case .keyReusedWithDifferentRequest(_, let response):
            return "the idempotency key was already used with a different request (HTTP \(response.status))"
        case .gaveUp(_, let reason, let attempts, _):
            return "gave up after \(attempts) attempt(s): \(reason.code); the key stays pending"
        case .transport(_, let error):
            return "transport error \(error.code.rawValue): \(error.localizedDescription); the key stays pending"
        case .transportFailed(_, let error):
            return "the transport failed: \(error); the key stays pending"
        case .outcomeUnknown(_, let attempts, _):
            return "outcome unknown after \(attempts) attempt(s): an earlier attempt may have taken effect; "
                + "reconcile before using a new key (the key stays pending)"
        case .intentChangedWhilePending(let intent, _):
            return "intent \(intent.debugDescription) has a pending key minted for a different request; nothing was "
                + "sent: reconcile (the earlier attempt may have run), then remove the intent's record or use a new intent"
        case .keyDiffersFromPending(let intent, _):
            return "the explicit key is not the pending key of intent \(intent.debugDescription); nothing was sent"
        case .requestNotBindable(let intent, let error):
            return "cannot bind the request to intent \(intent.debugDescription): \(error.code): \(error); nothing was sent"
        case .keyStore(let intent, let key, let error):
            return "the pending-key store failed for intent \(intent.debugDescription): \(error)"
                + (key == nil ? "; nothing was sent" : "; the key stays pending")
        case .cancelled(let key):
            return key == nil ? "cancelled before a key was chosen" : "cancelled; the key stays pending"
        case .retryPolicy(_, let error):
            return "the retry policy refused an input: \(error.code): \(error)"
        }
    }
}
