import Foundation
import XCTest
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
@testable import Idempo

/// IdempotentClient against a real local HTTP server (bindings/swift/Tests/server.py).
final class ClientTests: XCTestCase {
    private var server: TestServer!
    private var tempDir: URL!

    /// Short backoff so the suite stays fast; Retry-After still applies as a floor.
    private let fastPolicy = try! RetryPolicy(
        maxAttempts: 5, baseDelayMilliseconds: 20, maxDelayMilliseconds: 100, maxElapsedMilliseconds: 20_000)

    override func setUpWithError() throws {
        server = try TestServer()
        tempDir = FileManager.default.temporaryDirectory.appendingPathComponent("idempo-client-\(UUID().uuidString)")
    }

    override func tearDown() {
        server.stop()
        try? FileManager.default.removeItem(at: tempDir)
    }

    private func client(store: any PendingKeyStore = InMemoryPendingKeyStore(), policy: RetryPolicy? = nil) -> IdempotentClient {
        IdempotentClient(keyStore: store, retryPolicy: policy ?? fastPolicy, jitter: { 0.5 })
    }

    func testLostResponseIsRetriedWithTheSameKeyAndExecutesOnce() async throws {
        let store = InMemoryPendingKeyStore()
        let request = server.paymentRequest(amount: 100, controls: ["X-Test-Lose-Response": "1"])
        let answer = try await client(store: store).send(request, intent: "checkout-lost")

        XCTAssertEqual(answer.status, 201)
        XCTAssertEqual(answer.attempts, 2)
        XCTAssertTrue(answer.isReplay, "the second attempt must be answered from the stored response")
        XCTAssertEqual(answer.stopReason, .success)
        let stats = try await server.stats(for: answer.key)
        XCTAssertEqual(stats.executions, 1)
        XCTAssertEqual(stats.requests, 2)
        XCTAssertEqual(stats.header_values, [answer.key.headerValue, answer.key.headerValue])
        let pending = try await store.pendingKey(for: "checkout-lost")
        XCTAssertNil(pending, "a definitive answer clears the pending key")
    }

    func testTimeoutThenInFlightConflictThenReplay() async throws {
        // The handler takes 1.5 s; the client gives up on each attempt after 1 s. (Whole seconds:
        // FoundationNetworking on Linux truncates fractional timeouts, 0.4 s times out at once.)
        let configuration = URLSessionConfiguration.ephemeral
        configuration.timeoutIntervalForRequest = 1
        let session = URLSession(configuration: configuration)
        let request = server.paymentRequest(amount: 7, controls: ["X-Test-Delay-Ms": "1500"], timeout: 1)
        let transport = RecordingTransport(URLSessionTransport(session: session))
        let answer: IdempotentResponse
        do {
            answer = try await IdempotentClient(transport: transport, retryPolicy: fastPolicy).send(request)
        } catch {
            XCTFail("\(error); attempts: \(transport.log)")
            return
        }
        XCTAssertEqual(answer.status, 201)
        XCTAssertTrue(answer.isReplay)
        XCTAssertGreaterThanOrEqual(answer.attempts, 2)
        XCTAssertEqual(transport.log.filter { $0.hasSuffix("URLError -1001") }.count, 1, "\(transport.log)")
        XCTAssertTrue(transport.log.contains { $0.hasSuffix("status 409") }, "\(transport.log)")
        let stats = try await server.stats(for: answer.key)
        XCTAssertEqual(stats.executions, 1)
        XCTAssertEqual(Set(stats.header_values), [answer.key.headerValue])
    }

    func testConflictWhileInFlightWaitsForRetryAfterThenGetsTheReplay() async throws {
        let key = IdempotencyKey.generate()
        // Another device (a plain request) is running the payment with this key for 0.8 s.
        var first = server.paymentRequest(amount: 42, controls: ["X-Test-Delay-Ms": "800"])
        first.setValue(key.headerValue, forHTTPHeaderField: "Idempotency-Key")
        let firstTask = Task { try await URLSessionTransport().send(first) }
        try await server.waitForRequests(key: key, count: 1)

        let started = Date()
        let answer = try await client().send(server.paymentRequest(amount: 42), key: key)
        let waited = Date().timeIntervalSince(started)

        XCTAssertEqual(answer.status, 201)
        XCTAssertTrue(answer.isReplay)
        XCTAssertEqual(answer.attempts, 2, "one 409, then the replay")
        XCTAssertGreaterThanOrEqual(waited, 0.95, "Retry-After: 1 is a floor for the delay")
        let original = try await firstTask.value
        XCTAssertEqual(original.status, 201)
        XCTAssertEqual(answer.body, original.body, "the replay carries the original answer")
        let stats = try await server.stats(for: key)
        XCTAssertEqual(stats.executions, 1)
    }

    func testKeyReusedWithDifferentRequestStopsAt422AndDropsTheKey() async throws {
        let store = InMemoryPendingKeyStore()
        let key = IdempotencyKey.generate()
        let c = client(store: store)
        _ = try await c.send(server.paymentRequest(amount: 10), key: key)
        do {
            _ = try await c.send(server.paymentRequest(amount: 11), intent: "checkout-422", key: key)
            XCTFail("a 422 must throw")
        } catch IdempotentClientError.keyReusedWithDifferentRequest(let got, let response) {
            XCTAssertEqual(got, key)
            XCTAssertEqual(response.status, 422)
        }
        let stats = try await server.stats(for: key)
        XCTAssertEqual(stats.requests, 2, "no retry after 422")
        XCTAssertEqual(stats.executions, 1)
        let pending = try await store.pendingKey(for: "checkout-422")
        XCTAssertNil(pending, "a new intent needs a new key")
    }

    func testAnApplications422IsItsAnswerNotKeyReuse() async throws {
        let store = InMemoryPendingKeyStore()
        let answer = try await client(store: store).send(
            server.paymentRequest(amount: 5, controls: ["X-Test-App-Status": "422"]), intent: "checkout-app-422")
        XCTAssertEqual(answer.status, 422)
        XCTAssertEqual(answer.attempts, 1)
        XCTAssertEqual(answer.stopReason, .clientError(status: 422), "the application's 422 is not key reuse")
        let pending = try await store.pendingKey(for: "checkout-app-422")
        XCTAssertNil(pending, "a definitive answer clears the pending key")
    }

    func testAnApplications409IsNotRetried() async throws {
        let answer = try await client().send(server.paymentRequest(amount: 5, controls: ["X-Test-App-Status": "409"]))
        XCTAssertEqual(answer.status, 409)
        XCTAssertEqual(answer.attempts, 1, "an application's conflict is its answer: no retry")
        XCTAssertEqual(answer.stopReason, .clientError(status: 409))
        let stats = try await server.stats(for: answer.key)
        XCTAssertEqual(stats.requests, 1)
    }

    func testOtherClientErrorsStopWithoutRetry() async throws {
        var request = server.paymentRequest(amount: 1)
        request.httpBody = Data("not json".utf8)
        let answer = try await client().send(request)
        XCTAssertEqual(answer.status, 400)
        XCTAssertEqual(answer.attempts, 1)
        XCTAssertEqual(answer.stopReason, .clientError(status: 400))
    }

    func testOutcomeUnknownStopsAtOnceWithATypedErrorAndKeepsThePendingKey() async throws {
        let store = InMemoryPendingKeyStore()
        let c = client(store: store)
        let request = server.paymentRequest(amount: 9, controls: ["X-Test-Outcome-Unknown": "1"])
        do {
            _ = try await c.send(request, intent: "checkout-unknown")
            XCTFail("expected outcomeUnknown")
        } catch IdempotentClientError.outcomeUnknown(let key, let attempts, let response) {
            XCTAssertEqual(attempts, 1)
            XCTAssertEqual(response.status, 500)
            // No further attempt: the server saw exactly one request, and ran nothing.
            let stats = try await server.stats(for: key)
            XCTAssertEqual(stats.requests, 1)
            XCTAssertEqual(stats.executions, 0)
            // The intent is not settled: its key stays pending for reconciliation.
            let pending = try await store.pendingKey(for: "checkout-unknown")
            XCTAssertEqual(pending, key)
        }
    }

    func testServerErrorsAreRetriedWithTheSameKey() async throws {
        let request = server.paymentRequest(amount: 5, controls: ["X-Test-Fail-Times": "2"])
        let answer = try await client().send(request)
        XCTAssertEqual(answer.status, 201)
        XCTAssertEqual(answer.attempts, 3)
        XCTAssertFalse(answer.isReplay)
        let stats = try await server.stats(for: answer.key)
        XCTAssertEqual(stats.requests, 3)
        XCTAssertEqual(stats.executions, 1)
        XCTAssertEqual(Set(stats.header_values), [answer.key.headerValue])
    }

    func testPendingKeySurvivesARestart() async throws {
        let file = tempDir.appendingPathComponent("pending-keys.json")
        let request = server.paymentRequest(amount: 250, controls: ["X-Test-Fail-Times": "3"])
        let twoAttempts = try RetryPolicy(
            maxAttempts: 2, baseDelayMilliseconds: 20, maxDelayMilliseconds: 100, maxElapsedMilliseconds: 20_000)

        // First app run: the server keeps failing, the client gives up, the key stays pending.
        let firstKey: IdempotencyKey
        do {
            _ = try await client(store: FilePendingKeyStore(fileURL: file), policy: twoAttempts)
                .send(request, intent: "checkout-restart")
            XCTFail("the first run must give up")
            return
        } catch IdempotentClientError.gaveUp(let key, let reason, let attempts, let last) {
            XCTAssertEqual(reason, .attemptsExhausted)
            XCTAssertEqual(attempts, 2)
            guard case .response(let response) = last else { return XCTFail("expected a 503, got \(last)") }
            XCTAssertEqual(response.status, 503)
            firstKey = key
        }
        XCTAssertTrue(FileManager.default.fileExists(atPath: file.path))

        // Second app run: new store instance on the same file, new client, same intent.
        let reopened = FilePendingKeyStore(fileURL: file)
        let stored = try await reopened.pendingKey(for: "checkout-restart")
        XCTAssertEqual(stored, firstKey)
        let answer = try await client(store: reopened).send(request, intent: "checkout-restart")
        XCTAssertEqual(answer.key, firstKey, "the retry after a restart reuses the pending key")
        XCTAssertEqual(answer.status, 201)
        let stats = try await server.stats(for: firstKey)
        XCTAssertEqual(stats.requests, 4)
        XCTAssertEqual(stats.executions, 1)
        XCTAssertEqual(Set(stats.header_values), [firstKey.headerValue])
        let after = try await FilePendingKeyStore(fileURL: file).pendingKey(for: "checkout-restart")
        XCTAssertNil(after, "done: nothing pending any more")
    }

    func testCancellationKeepsThePendingKey() async throws {
        let store = InMemoryPendingKeyStore()
        let c = client(store: store)
        let request = server.paymentRequest(amount: 3, controls: ["X-Test-Delay-Ms": "1500"])
        let task = Task { try await c.send(request, intent: "checkout-cancel") }
        var sent: IdempotencyKey?
        while sent == nil {
            try await Task.sleep(nanoseconds: 10_000_000)
            sent = try await store.pendingKey(for: "checkout-cancel")
        }
        try await server.waitForRequests(key: sent!, count: 1)
        task.cancel()
        do {
            _ = try await task.value
            XCTFail("a cancelled send must throw")
        } catch IdempotentClientError.cancelled(let reported) {
            XCTAssertEqual(reported, sent, "the cancellation reports the key it leaves pending")
        }
        let pending = try await store.pendingKey(for: "checkout-cancel")
        let key = try XCTUnwrap(pending, "the outcome is unknown: the key stays pending")

        // Sending the intent again reuses it and gets the stored answer of the first execution.
        try await Task.sleep(nanoseconds: 1_500_000_000)
        let answer = try await c.send(server.paymentRequest(amount: 3), intent: "checkout-cancel")
        XCTAssertEqual(answer.key, key)
        XCTAssertTrue(answer.isReplay)
        let stats = try await server.stats(for: key)
        XCTAssertEqual(stats.executions, 1)
    }

    func testConnectionRefusedGivesUpAndKeepsTheKey() async throws {
        let store = InMemoryPendingKeyStore()
        let port = server.baseURL.port!
        server.stop()
        var request = URLRequest(url: URL(string: "http://127.0.0.1:\(port)/payments")!)
        request.httpMethod = "POST"
        request.httpBody = Data("{}".utf8)
        let policy = try RetryPolicy(maxAttempts: 3, baseDelayMilliseconds: 5, maxDelayMilliseconds: 10, maxElapsedMilliseconds: 5_000)
        do {
            _ = try await client(store: store, policy: policy).send(request, intent: "offline")
            XCTFail("nothing listens: the client must give up")
        } catch IdempotentClientError.gaveUp(let key, let reason, let attempts, let last) {
            XCTAssertEqual(reason, .attemptsExhausted)
            XCTAssertEqual(attempts, 3)
            guard case .connectionError = last else { return XCTFail("expected a connection error, got \(last)") }
            let pending = try await store.pendingKey(for: "offline")
            XCTAssertEqual(pending, key)
        }
    }
}
