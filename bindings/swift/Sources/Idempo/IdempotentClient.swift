import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// The server's final answer to an idempotent request.
public struct IdempotentResponse: Sendable {
    /// The response (any final status other than idempo's key-reused 422, an application's own
    /// 422 or 409 included, with ``stopReason`` `.clientError`; see
    /// ``IdempotentClient/send(_:intent:key:)``).
    public let response: HTTPResponse
    /// The key that was sent with every attempt.
    public let key: IdempotencyKey
    /// How many attempts were made (1 when the first one got this answer).
    public let attempts: Int
    /// Why the retry policy stopped (``StopReason/success`` for a 2xx).
    public let stopReason: StopReason

    /// The status code.
    public var status: Int { response.status }
    /// The body.
    public var body: Data { response.body }
    /// True when the server answered from its stored response (`Idempotent-Replayed: true`):
    /// the operation ran earlier, for an attempt whose answer was lost.
    public var isReplay: Bool {
        response.header("Idempotent-Replayed")?.trimmingCharacters(in: .whitespaces).lowercased() == "true"
    }
}

/// Why ``IdempotentClient/send(_:intent:key:)`` did not return a final answer.
public enum IdempotentClientError: Error, Sendable, CustomStringConvertible {
    /// idempo's 422 key-reused problem: the server saw this key with a different request (an
    /// application's own 422 is returned as its answer instead). Retrying cannot help; the pending
    /// key was dropped, and a new intent needs a new key.
    case keyReusedWithDifferentRequest(key: IdempotencyKey, response: HTTPResponse)
    /// The outcome is still unknown: every attempt was retryable (timeouts, connectivity loss,
    /// 409 in flight, 429, 5xx) and the policy stopped (`attemptsExhausted`,
    /// `timeBudgetExhausted`, `retryAfterBeyondBudget`). The key stays pending: send the same
    /// intent again later to reuse it.
    case gaveUp(key: IdempotencyKey, reason: StopReason, attempts: Int, lastAttempt: LastAttempt)
    /// A transport error that is not a timeout or connectivity loss (bad URL, TLS failure, ...).
    /// The key stays pending.
    case transport(key: IdempotencyKey, error: URLError)
    /// The server answered idempo's outcome-unknown problem (500): an earlier attempt with this
    /// key may have taken effect and its outcome was not recorded. No further attempt was made
    /// (retrying this key cannot change the answer). The key stays pending: reconcile (check the
    /// resource's state) before deciding on a new key; do not mint one blindly.
    case outcomeUnknown(key: IdempotencyKey, attempts: Int, response: HTTPResponse)

    /// What the last attempt of a ``gaveUp(key:reason:attempts:lastAttempt:)`` ended with.
    public enum LastAttempt: Sendable {
        /// A retryable response (409, 429, 5xx, ...).
        case response(HTTPResponse)
        /// No response within the timeout.
        case timeout
        /// The connection failed or broke.
        case connectionError(URLError)
    }

    /// The key the failed request carried.
    public var key: IdempotencyKey {
        switch self {
        case .keyReusedWithDifferentRequest(let key, _), .gaveUp(let key, _, _, _), .transport(let key, _),
            .outcomeUnknown(let key, _, _):
            return key
        }
    }

    public var description: String {
        switch self {
        case .keyReusedWithDifferentRequest(_, let response):
            return "the idempotency key was already used with a different request (HTTP \(response.status))"
        case .gaveUp(_, let reason, let attempts, _):
            return "gave up after \(attempts) attempt(s): \(reason.code); the key stays pending"
        case .transport(_, let error):
            return "transport error \(error.code.rawValue): \(error.localizedDescription)"
        case .outcomeUnknown(_, let attempts, _):
            return "outcome unknown after \(attempts) attempt(s): an earlier attempt may have taken effect; "
                + "reconcile before using a new key (the key stays pending)"
        }
    }
}

/// Sends requests with an `Idempotency-Key` and retries them safely.
///
/// For each call: the key is the one you pass, else the intent's pending key from the
/// ``PendingKeyStore``, else a fresh one; it is saved before the first attempt, sent with every
/// attempt (core's sf-string form), and removed once the server gives a definitive answer.
/// Between attempts it follows core's ``RetryPolicy`` (idempo's 409 in-flight + `Retry-After`,
/// 5xx, timeouts and connectivity loss are retried; 422, other 4xx, an application's own 409, and
/// idempo's outcome-unknown and response-not-retained 500s stop). Core tells idempo's problems from
/// the application's answers by their problem `type`.
///
/// ```swift
/// let client = IdempotentClient(keyStore: FilePendingKeyStore(fileURL: url))
/// let answer = try await client.send(request, intent: "checkout-\(cart.id)")
/// ```
public final class IdempotentClient: Sendable {
    private let transport: any HTTPTransport
    private let keyStore: any PendingKeyStore
    private let policy: RetryPolicy
    private let headerName: String
    private let jitter: @Sendable () -> Double

    /// A client.
    ///
    /// - Parameters:
    ///   - transport: how attempts are sent (default: `URLSession.shared`).
    ///   - keyStore: where pending keys live (default: in memory; use ``FilePendingKeyStore``
    ///     to survive restarts).
    ///   - retryPolicy: core's policy (default ``RetryPolicy/standard``).
    ///   - headerName: the key header (default `Idempotency-Key`).
    ///   - jitter: a uniform sample in `[0, 1)` per decision (default `Double.random`).
    public init(
        transport: any HTTPTransport = URLSessionTransport(),
        keyStore: any PendingKeyStore = InMemoryPendingKeyStore(),
        retryPolicy: RetryPolicy = .standard,
        headerName: String = "Idempotency-Key",
        jitter: @escaping @Sendable () -> Double = { Double.random(in: 0..<1) }
    ) {
        self.transport = transport
        self.keyStore = keyStore
        self.policy = retryPolicy
        self.headerName = headerName
        self.jitter = jitter
    }

    /// Sends `request` idempotently.
    ///
    /// - Parameters:
    ///   - intent: a stable name for this user intent (e.g. `checkout-<cart id>`). When given,
    ///     the key is kept in the ``PendingKeyStore`` under it until the outcome is known, so
    ///     calling `send` again for the same intent (even after a restart) reuses the key.
    ///   - key: the key to use (it replaces the intent's pending key); default: the intent's
    ///     pending key, else a fresh one.
    /// - Returns: the server's final answer: 2xx (possibly a replay), 3xx, or a 4xx/5xx that
    ///   retrying cannot change (inspect ``IdempotentResponse/status``); never idempo's
    ///   outcome-unknown 500, which throws ``IdempotentClientError/outcomeUnknown(key:attempts:response:)``.
    /// - Throws: ``IdempotentClientError``, `CancellationError` (the key stays pending), errors
    ///   of the key store, errors other than `URLError` thrown by a custom ``HTTPTransport`` (the
    ///   key stays pending), ``RetryPolicyError`` if the policy refuses an input.
    public func send(_ request: URLRequest, intent: String? = nil, key: IdempotencyKey? = nil) async throws
        -> IdempotentResponse
    {
        let key = try await resolveKey(intent: intent, explicit: key)
        var attemptRequest = request
        attemptRequest.setValue(key.headerValue, forHTTPHeaderField: headerName)

        let started = ProcessInfo.processInfo.systemUptime
        var attempt: UInt32 = 0
        while true {
            try Task.checkCancellation()
            attempt += 1
            let outcome: AttemptOutcome
            let last: IdempotentClientError.LastAttempt
            do {
                let response = try await transport.send(attemptRequest)
                outcome = RetryPolicy.outcome(of: response)
                last = .response(response)
            } catch let error as URLError {
                if error.code == .cancelled, Task.isCancelled { throw CancellationError() }
                switch Self.classify(error) {
                case .timeout:
                    outcome = .timeout
                    last = .timeout
                case .connectionError:
                    outcome = .connectionError
                    last = .connectionError(error)
                case .notRetryable:
                    throw IdempotentClientError.transport(key: key, error: error)
                }
            }

            let elapsed = UInt64(max(0, (ProcessInfo.processInfo.systemUptime - started) * 1000))
            let decision = try policy.decide(
                attempt: attempt, elapsedMilliseconds: elapsed, outcome: outcome, jitter: jitter())
            switch decision {
            case .retry(let delayMs):
                try await Task.sleep(nanoseconds: delayMs.multipliedReportingOverflow(by: 1_000_000).partialValue)
            case .stop(let reason):
                return try await finish(
                    reason: reason, last: last, key: key, intent: intent, attempts: Int(attempt))
            }
        }
    }

    private func resolveKey(intent: String?, explicit: IdempotencyKey?) async throws -> IdempotencyKey {
        guard let intent else { return explicit ?? IdempotencyKey.generate() }
        if let explicit {
            try await keyStore.savePendingKey(explicit, for: intent)
            return explicit
        }
        if let pending = try await keyStore.pendingKey(for: intent) { return pending }
        let fresh = IdempotencyKey.generate()
        try await keyStore.savePendingKey(fresh, for: intent)
        return fresh
    }

    private func finish(
        reason: StopReason, last: IdempotentClientError.LastAttempt, key: IdempotencyKey, intent: String?,
        attempts: Int
    ) async throws -> IdempotentResponse {
        switch (reason, last) {
        case (.attemptsExhausted, _), (.timeBudgetExhausted, _), (.retryAfterBeyondBudget, _):
            throw IdempotentClientError.gaveUp(key: key, reason: reason, attempts: attempts, lastAttempt: last)
        case (.outcomeUnknown, .response(let response)):
            // Not definitive for the intent: the key stays pending until the caller reconciles.
            throw IdempotentClientError.outcomeUnknown(key: key, attempts: attempts, response: response)
        case (.keyReusedWithDifferentRequest, .response(let response)):
            if let intent { try await keyStore.removePendingKey(for: intent) }
            throw IdempotentClientError.keyReusedWithDifferentRequest(key: key, response: response)
        case (_, .response(let response)):
            // A definitive answer: the outcome is known, the key is no longer pending.
            if let intent { try await keyStore.removePendingKey(for: intent) }
            return IdempotentResponse(response: response, key: key, attempts: attempts, stopReason: reason)
        case (_, .timeout), (_, .connectionError):
            // Core stops a timeout or connection error only for budget reasons (handled above).
            throw IdempotentClientError.gaveUp(key: key, reason: reason, attempts: attempts, lastAttempt: last)
        }
    }

    private enum TransportClass { case timeout, connectionError, notRetryable }

    /// Timeouts and connectivity loss are retried (the request may or may not have run; the
    /// same key makes a repeat safe); other transport errors are not.
    private static func classify(_ error: URLError) -> TransportClass {
        switch error.code {
        case .timedOut:
            return .timeout
        case .networkConnectionLost, .notConnectedToInternet, .cannotConnectToHost, .cannotFindHost,
            .dnsLookupFailed, .badServerResponse, .internationalRoamingOff, .callIsActive, .dataNotAllowed,
            .resourceUnavailable, .secureConnectionFailed:
            return .connectionError
        default:
            return .notRetryable
        }
    }
}
