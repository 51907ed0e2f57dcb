import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Sends requests with an `Idempotency-Key` and retries them safely.
///
/// **Intents.** Name each user intent (`send(request, intent: "checkout-\(cart.id)")`): the
/// intent gets one key, kept in the ``PendingKeyStore`` across retries, second taps and app
/// restarts until the server gives a definitive answer, and never reused for a changed request
/// (`spec/KEYS.md` §3.6):
///
/// - concurrent sends of one intent share one key and one attempt sequence, and every caller
///   gets the same result (a double tap charges once);
/// - the store's atomic ``PendingKeyStore/pendingIntent(for:orCreate:)`` makes that hold across
///   store instances, processes and launches too;
/// - a different request under an intent whose key is still pending throws
///   ``IdempotentClientError/intentChangedWhilePending(intent:pending:)`` and sends nothing.
///
/// Without an intent every call is its own operation with a fresh key (or the `key:` you pass).
///
/// Between attempts core's ``RetryPolicy`` decides (idempo's 409 in-flight + `Retry-After`, 5xx,
/// timeouts and connectivity loss are retried; other 4xx, an application's own 409 or 422, and
/// idempo's 422 key-reused, outcome-unknown and response-not-retained stop). Core tells idempo's
/// problems from the application's answers by their problem `type`. Each attempt is bounded by
/// ``attemptTimeout`` (default 10 s), so a timed-out attempt is retried within the policy's
/// budget (default 60 s) instead of consuming it.
///
/// ```swift
/// let client = IdempotentClient(
///     keyStore: FilePendingKeyStore(fileURL: url),
///     retryPolicy: try RetryPolicy(maxAttempts: 5, baseDelayMilliseconds: 500,
///                                  maxDelayMilliseconds: 10_000, maxElapsedMilliseconds: 60_000),
///     attemptTimeout: 10)
/// let answer = try await client.send(request, intent: "checkout-\(cart.id)")
/// ```
public final class IdempotentClient: Sendable {
    /// The default per-attempt timeout, in seconds: 10 s, so an attempt that hangs is retried
    /// several times within the default 60 s budget (URLSession's own 60 s would use it all).
    public static let defaultAttemptTimeout: TimeInterval = 10

    private let transport: any HTTPTransport
    private let keyStore: any PendingKeyStore
    private let policy: RetryPolicy
    private let headerName: String
    private let jitter: @Sendable () -> Double
    /// The longest one attempt may take, in seconds (`nil`: only the transport's own timeouts).
    public let attemptTimeout: TimeInterval?
    private let flights = IntentFlights()

    /// A client.
    ///
    /// - Parameters:
    ///   - transport: how attempts are sent (default: `URLSession.shared`).
    ///   - keyStore: where pending keys live (default: in memory; use ``FilePendingKeyStore``
    ///     to survive restarts).
    ///   - retryPolicy: core's policy (default ``RetryPolicy/standard``: 5 attempts, 60 s budget).
    ///   - attemptTimeout: the longest one attempt may take, in seconds (default
    ///     ``defaultAttemptTimeout``); an attempt over it counts as a timeout and is retried
    ///     with the same key. `nil` leaves it to the transport (URLSession: 60 s).
    ///   - headerName: the key header (default `Idempotency-Key`).
    ///   - jitter: a uniform sample in `[0, 1)` per decision (default `Double.random`).
    public init(
        transport: any HTTPTransport = URLSessionTransport(),
        keyStore: any PendingKeyStore = InMemoryPendingKeyStore(),
        retryPolicy: RetryPolicy = .standard,
        attemptTimeout: TimeInterval? = IdempotentClient.defaultAttemptTimeout,
        headerName: String = "Idempotency-Key",
        jitter: @escaping @Sendable () -> Double = { Double.random(in: 0..<1) }
    ) {
        self.transport = transport
        self.keyStore = keyStore
        self.policy = retryPolicy
        self.attemptTimeout = attemptTimeout
        self.headerName = headerName
        self.jitter = jitter
    }

    /// Sends `request` idempotently.
    ///
    /// - Parameters:
    ///   - intent: a stable name for this user intent (e.g. `checkout-<cart id>`). The intent's
    ///     key is kept in the ``PendingKeyStore`` until the outcome is known, bound to this
    ///     request; concurrent sends of the intent share one attempt sequence.
    ///   - key: a key to use. Without an intent: this call's key (default: a fresh one). With an
    ///     intent: the key to mint when nothing is pending (it must then equal the pending key).
    /// - Returns: the server's final answer: 2xx (possibly a replay), 3xx, or a 4xx/5xx that
    ///   retrying cannot change (inspect ``IdempotentResponse/status``; an application's 422 is
    ///   its answer, `stopReason == .clientError(status: 422)`). idempo's response-not-retained
    ///   500 is returned too, and its key stays pending (the request ran; look the resource up).
    /// - Throws: only ``IdempotentClientError``, which names the key and whether it stays
    ///   pending. (Declared untyped: Swift 6.0's compiler crashes on `catch E.case(let x)` around a
    ///   typed-throws call, the very pattern callers use.)
    public func send(_ request: URLRequest, intent: String? = nil, key: IdempotencyKey? = nil)
        async throws -> IdempotentResponse
    {
        try await sendTyped(request, intent: intent, key: key)
    }

    private func sendTyped(_ request: URLRequest, intent: String?, key: IdempotencyKey?)
        async throws(IdempotentClientError) -> IdempotentResponse
    {
        guard let intent else {
            let result = await attempts(request, key: key ?? IdempotencyKey.generate(), intent: nil)
            return try result.get()
        }
        return try await send(request, intent: intent, explicitKey: key)
    }

    private func send(_ request: URLRequest, intent: String, explicitKey: IdempotencyKey?)
        async throws(IdempotentClientError) -> IdempotentResponse
    {
        let fingerprint: Fingerprint
        do {
            fingerprint = try PendingIntent.bind(request)
        } catch {
            throw .requestNotBindable(intent: intent, error: error)
        }
        let (flight, created) = await flights.join(intent)
        let result = await joined(flight, created: created, request, intent: intent, fingerprint: fingerprint, explicitKey: explicitKey)
        await flights.leave(intent, flight)
        return try result.get()
    }

    private func joined(
        _ flight: IntentFlight, created: Bool, _ request: URLRequest, intent: String, fingerprint: Fingerprint,
        explicitKey: IdempotencyKey?
    ) async -> Result<IdempotentResponse, IdempotentClientError> {
        if created {
            // The first caller resolves the record: one get-or-create for every caller.
            let candidate = PendingIntent(key: explicitKey ?? IdempotencyKey.generate(), fingerprint: fingerprint, createdAt: Date())
            let store = keyStore
            Task {
                do {
                    flight.record.resolve(.success(try await store.pendingIntent(for: intent, orCreate: candidate)))
                } catch {
                    flight.record.resolve(.failure(.keyStore(intent: intent, key: nil, error: error)))
                }
            }
        }
        let record: PendingIntent
        do {
            record = try await flight.record.value()
        } catch let error as IdempotentClientError {
            return .failure(error)
        } catch {
            return .failure(.cancelled(key: nil))
        }
        let decision: IntentSend
        do {
            decision = try IntentSend.decide(pending: record, request: fingerprint, explicitKey: explicitKey)
        } catch {
            return .failure(.keyStore(intent: intent, key: nil, error: error))
        }
        switch decision {
        case .changedWhilePending:
            return .failure(.intentChangedWhilePending(intent: intent, pending: record))
        case .keyDiffersFromPending:
            return .failure(.keyDiffersFromPending(intent: intent, pending: record))
        case .mint, .reuse:
            // (`mint` needs an absent record; the store always returned one.)
            break
        }
        let (shared, start) = await flights.attempts(of: flight)
        if start {
            let worker = Task {
                shared.resolve(await self.attempts(request, key: record.key, intent: intent))
            }
            await flights.setWorker(worker, of: flight)
        }
        do {
            return .success(try await shared.value())
        } catch let error as IdempotentClientError {
            return .failure(error)
        } catch {
            return .failure(.cancelled(key: record.key))
        }
    }

    /// One attempt sequence under `key`; settles `intent` when core says the stop does.
    private func attempts(_ request: URLRequest, key: IdempotencyKey, intent: String?) async
        -> Result<IdempotentResponse, IdempotentClientError>
    {
        var attemptRequest = request
        attemptRequest.setValue(key.headerValue, forHTTPHeaderField: headerName)

        let started = ProcessInfo.processInfo.systemUptime
        var attempt: UInt32 = 0
        while true {
            if Task.isCancelled { return .failure(.cancelled(key: key)) }
            attempt += 1
            let outcome: AttemptOutcome
            let last: IdempotentClientError.LastAttempt
            do {
                let response = try await send(attemptRequest)
                outcome = RetryPolicy.outcome(of: response)
                last = .response(response)
            } catch is AttemptTimedOut {
                if Task.isCancelled { return .failure(.cancelled(key: key)) }
                outcome = .timeout
                last = .timeout
            } catch let error as URLError {
                if Task.isCancelled { return .failure(.cancelled(key: key)) }
                switch Self.classify(error) {
                case .timeout:
                    outcome = .timeout
                    last = .timeout
                case .connectionError:
                    outcome = .connectionError
                    last = .connectionError(error)
                case .notRetryable:
                    return .failure(.transport(key: key, error: error))
                }
            } catch {
                if Task.isCancelled || error is CancellationError { return .failure(.cancelled(key: key)) }
                return .failure(.transportFailed(key: key, error: error))
            }

            let elapsed = UInt64(max(0, (ProcessInfo.processInfo.systemUptime - started) * 1000))
            let decision: RetryDecision
            do {
                decision = try policy.decide(
                    attempt: attempt, elapsedMilliseconds: elapsed, outcome: outcome, jitter: jitter())
            } catch {
                return .failure(.retryPolicy(key: key, error: RetryPolicyError(ffiError: error)))
            }
            switch decision {
            case .retry(let delayMs):
                do {
                    try await Task.sleep(nanoseconds: delayMs.multipliedReportingOverflow(by: 1_000_000).partialValue)
                } catch {
                    return .failure(.cancelled(key: key))
                }
            case .stop(let reason):
                if reason.settlesIntent, let intent {
                    // A definitive answer: the intent is settled. If removing its record fails the
                    // answer is still returned; the record stays, and a later send of the intent
                    // is answered with the server's replay.
                    try? await keyStore.removePendingIntent(for: intent)
                }
                return Self.finish(reason: reason, last: last, key: key, attempts: Int(attempt))
            }
        }
    }

    private static func finish(
        reason: StopReason, last: IdempotentClientError.LastAttempt, key: IdempotencyKey, attempts: Int
    ) -> Result<IdempotentResponse, IdempotentClientError> {
        switch (reason, last) {
        case (.attemptsExhausted, _), (.timeBudgetExhausted, _), (.retryAfterBeyondBudget, _):
            return .failure(.gaveUp(key: key, reason: reason, attempts: attempts, lastAttempt: last))
        case (.outcomeUnknown, .response(let response)):
            return .failure(.outcomeUnknown(key: key, attempts: attempts, response: response))
        case (.keyReusedWithDifferentRequest, .response(let response)):
            return .failure(.keyReusedWithDifferentRequest(key: key, response: response))
        case (_, .response(let response)):
            return .success(IdempotentResponse(response: response, key: key, attempts: attempts, stopReason: reason))
        case (_, .timeout), (_, .connectionError):
            // Core stops a timeout or connection error only for budget reasons (handled above).
            return .failure(.gaveUp(key: key, reason: reason, attempts: attempts, lastAttempt: last))
        }
    }

    private struct AttemptTimedOut: Error {}

    /// One attempt, bounded by ``attemptTimeout`` (the transport's task is cancelled when it
    /// runs out).
    private func send(_ request: URLRequest) async throws -> HTTPResponse {
        guard let attemptTimeout, attemptTimeout > 0 else { return try await transport.send(request) }
        let transport = self.transport
        let nanoseconds = UInt64(min(attemptTimeout, 86_400) * 1_000_000_000)
        return try await withThrowingTaskGroup(of: HTTPResponse?.self) { group in
            group.addTask { try await transport.send(request) }
            group.addTask {
                try await Task.sleep(nanoseconds: nanoseconds)
                return nil
            }
            defer { group.cancelAll() }
            guard let first = try await group.next() else { throw AttemptTimedOut() }
            guard let response = first else { throw AttemptTimedOut() }
            return response
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
