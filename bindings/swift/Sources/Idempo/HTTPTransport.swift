import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// A finished HTTP exchange, as plain values.
public struct HTTPResponse: Sendable, Hashable {
    /// The status code.
    public let status: Int
    /// Header fields, names lower-cased.
    public let headers: [String: String]
    /// The body.
    public let body: Data

    /// A response from its parts; header names are lower-cased.
    public init(status: Int, headers: [String: String], body: Data) {
        self.status = status
        var lowered: [String: String] = [:]
        for (name, value) in headers { lowered[name.lowercased()] = value }
        self.headers = lowered
        self.body = body
    }

    /// The value of a header field (case-insensitive name).
    public func header(_ name: String) -> String? { headers[name.lowercased()] }
}

/// Sends one HTTP request. ``IdempotentClient`` calls it once per attempt.
///
/// Implementations throw `URLError` for transport failures so the client can tell timeouts
/// (`.timedOut`) and connectivity loss from other errors.
public protocol HTTPTransport: Sendable {
    /// Sends `request` and returns the response, or throws.
    func send(_ request: URLRequest) async throws -> HTTPResponse
}

/// ``HTTPTransport`` over a `URLSession` (on Linux, FoundationNetworking's).
public struct URLSessionTransport: HTTPTransport {
    /// `URLSession` is documented thread-safe; this box lets a Sendable struct hold one on
    /// platforms whose SDK does not mark it `Sendable`.
    private final class SessionBox: @unchecked Sendable {
        let session: URLSession
        init(_ session: URLSession) { self.session = session }
    }

    private let box: SessionBox

    /// A transport over `session` (default: `URLSession.shared`). Timeouts come from the
    /// request's `timeoutInterval` or the session configuration.
    public init(session: URLSession = .shared) {
        box = SessionBox(session)
    }

    /// Sends `request`; cancelling the calling task cancels the data task.
    public func send(_ request: URLRequest) async throws -> HTTPResponse {
        let handle = TaskHandle()
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<HTTPResponse, Error>) in
                let task = box.session.dataTask(with: request) { data, response, error in
                    if let error {
                        continuation.resume(throwing: error)
                    } else if let http = response as? HTTPURLResponse {
                        var headers: [String: String] = [:]
                        for (name, value) in http.allHeaderFields {
                            if let name = name as? String { headers[name] = "\(value)" }
                        }
                        continuation.resume(
                            returning: HTTPResponse(status: http.statusCode, headers: headers, body: data ?? Data()))
                    } else {
                        continuation.resume(throwing: URLError(.badServerResponse))
                    }
                }
                handle.set(task)
                task.resume()
            }
        } onCancel: {
            handle.cancel()
        }
    }
}

/// The data task of one send, shared between the sender and the cancellation handler.
private final class TaskHandle: @unchecked Sendable {
    private let lock = NSLock()
    private var task: URLSessionDataTask?
    private var cancelled = false

    func set(_ task: URLSessionDataTask) {
        lock.lock()
        self.task = task
        let cancelNow = cancelled
        lock.unlock()
        if cancelNow { task.cancel() }
    }

    func cancel() {
        lock.lock()
        cancelled = true
        let current = task
        lock.unlock()
        current?.cancel()
    }
}
