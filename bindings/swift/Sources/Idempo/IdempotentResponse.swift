import Foundation

/// The server's final answer to an idempotent request.
public struct IdempotentResponse: Sendable {
    /// The response: a 2xx (possibly a replay), a 3xx, or a 4xx/5xx that retrying cannot change
    /// (an application's own 422 or 409 included, with ``stopReason`` `.clientError`).
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
