import Foundation

/// One result many callers wait for. Each waiter stops waiting (with `CancellationError`) when
/// its own task is cancelled; the result itself is produced elsewhere and is unaffected.
final class SharedResult<Value: Sendable>: @unchecked Sendable {
    private let lock = NSLock()
    private var result: Result<Value, IdempotentClientError>?
    private var waiters: [UInt64: CheckedContinuation<Value, any Error>] = [:]
    private var nextWaiter: UInt64 = 0

    /// Delivers the result to every waiter (only the first call counts).
    func resolve(_ value: Result<Value, IdempotentClientError>) {
        lock.lock()
        guard result == nil else {
            lock.unlock()
            return
        }
        result = value
        let pending = waiters
        waiters = [:]
        lock.unlock()
        for continuation in pending.values { continuation.resume(with: value.mapError { $0 as any Error }) }
    }

    private func newWaiterID() -> UInt64 {
        lock.lock()
        defer { lock.unlock() }
        nextWaiter += 1
        return nextWaiter
    }

    /// The result: the value, the `IdempotentClientError`, or `CancellationError` when the
    /// calling task is cancelled first.
    func value() async throws -> Value {
        let id = newWaiterID()
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Value, any Error>) in
                lock.lock()
                if let result {
                    lock.unlock()
                    continuation.resume(with: result.mapError { $0 as any Error })
                } else if Task.isCancelled {
                    lock.unlock()
                    continuation.resume(throwing: CancellationError())
                } else {
                    waiters[id] = continuation
                    lock.unlock()
                }
            }
        } onCancel: {
            lock.lock()
            let continuation = waiters.removeValue(forKey: id)
            lock.unlock()
            continuation?.resume(throwing: CancellationError())
        }
    }
}

/// The in-flight sends of one intent inside one client: the record (the store's get-or-create,
/// done once) and the attempt sequence (run once, for the request the record was minted for).
final class IntentFlight: @unchecked Sendable {
    let record = SharedResult<PendingIntent>()
    // The fields below are read and written only by the owning ``IntentFlights`` actor.
    var attempts: SharedResult<IdempotentResponse>?
    var worker: Task<Void, Never>?
    var waiters = 0
}

/// Single flight per intent: concurrent sends of one intent join one ``IntentFlight``; when the
/// last caller has left, the flight is gone and the next send starts a new one (under the same
/// pending key, which the store still holds unless the intent was settled).
actor IntentFlights {
    private var flights: [String: IntentFlight] = [:]

    /// Joins the flight of `intent`; `created` is true for the caller that must resolve its record.
    func join(_ intent: String) -> (flight: IntentFlight, created: Bool) {
        if let flight = flights[intent] {
            flight.waiters += 1
            return (flight, false)
        }
        let flight = IntentFlight()
        flight.waiters = 1
        flights[intent] = flight
        return (flight, true)
    }

    /// The flight's attempt sequence; `created` is true for the caller that must start it.
    func attempts(of flight: IntentFlight) -> (shared: SharedResult<IdempotentResponse>, created: Bool) {
        if let shared = flight.attempts { return (shared, false) }
        let shared = SharedResult<IdempotentResponse>()
        flight.attempts = shared
        return (shared, true)
    }

    /// Records the task running the flight's attempts (cancelled if every caller leaves early).
    func setWorker(_ worker: Task<Void, Never>, of flight: IntentFlight) {
        flight.worker = worker
    }

    /// A caller is done with the flight (answered, refused or cancelled).
    func leave(_ intent: String, _ flight: IntentFlight) {
        flight.waiters -= 1
        guard flight.waiters == 0 else { return }
        if flights[intent] === flight { flights[intent] = nil }
        // Nobody waits any more: stop the attempts (a no-op when they have finished).
        flight.worker?.cancel()
    }
}
