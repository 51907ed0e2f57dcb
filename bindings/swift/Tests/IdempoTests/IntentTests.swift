import Foundation
import XCTest
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
@testable import Idempo

/// A store whose every call takes 50 ms (as a Keychain read can). Its get-or-create is still
/// atomic: the delay comes before the check-and-insert, which runs in one actor turn.
actor SlowPendingKeyStore: PendingKeyStore {
    private var records: [String: PendingIntent] = [:]
    private(set) var creates = 0

    private func pause() async { try? await Task.sleep(nanoseconds: 50_000_000) }

    func pendingIntent(for intent: String) async -> PendingIntent? {
        await pause()
        return records[intent]
    }

    func pendingIntent(for intent: String, orCreate candidate: PendingIntent) async -> PendingIntent {
        await pause()
        if let existing = records[intent] { return existing }
        records[intent] = candidate
        creates += 1
        return candidate
    }

    func removePendingIntent(for intent: String) async {
        await pause()
        records[intent] = nil
    }
}

/// Intents against the real local server (bindings/swift/Tests/server.py): single flight, the
/// request bound to its pending key, and the defaults' per-attempt timeout.
final class IntentTests: XCTestCase {
    private var server: TestServer!
    private var tempDir: URL!

    private let fastPolicy = try! RetryPolicy(
        maxAttempts: 5, baseDelayMilliseconds: 20, maxDelayMilliseconds: 100, maxElapsedMilliseconds: 20_000)

    override func setUpWithError() throws {
        server = try TestServer()
        tempDir = FileManager.default.temporaryDirectory.appendingPathComponent("idempo-intent-\(UUID().uuidString)")
    }

    override func tearDown() {
        server.stop()
        try? FileManager.default.removeItem(at: tempDir)
    }

    /// `count` concurrent sends of one intent; every result (answer or error) in order of completion.
    private func concurrentSends(
        _ client: IdempotentClient, _ request: URLRequest, intent: String, count: Int
    ) async -> [Result<IdempotentResponse, IdempotentClientError>] {
        await withTaskGroup(of: Result<IdempotentResponse, IdempotentClientError>.self) { group in
            for _ in 0..<count {
                group.addTask {
                    do { return .success(try await client.send(request, intent: intent)) } catch {
                        return .failure(error as! IdempotentClientError)
                    }
                }
            }
            var out: [Result<IdempotentResponse, IdempotentClientError>] = []
            for await r in group { out.append(r) }
            return out
        }
    }

    private func assertOneChargeOneKey(
        _ results: [Result<IdempotentResponse, IdempotentClientError>], file: StaticString = #filePath, line: UInt = #line
    ) async throws {
        let answers = try results.map { try $0.get() }
        XCTAssertEqual(answers.count, 100, file: file, line: line)
        let keys = Set(answers.map(\.key))
        XCTAssertEqual(keys.count, 1, "one key for the intent", file: file, line: line)
        XCTAssertEqual(Set(answers.map(\.status)), [201], file: file, line: line)
        XCTAssertEqual(Set(answers.map(\.body)).count, 1, "every caller gets the same answer", file: file, line: line)
        let stats = try await server.stats(for: keys.first!)
        XCTAssertEqual(stats.executions, 1, "charged once", file: file, line: line)
        XCTAssertEqual(stats.requests, 1, "one attempt sequence: one request", file: file, line: line)
        let totals = try await server.totals()
        XCTAssertEqual(totals.executions, 1, "no other key charged", file: file, line: line)
        XCTAssertEqual(totals.requests, 1, file: file, line: line)
    }

    func testHundredConcurrentSendsOfOneIntentChargeOnceWithTheFileStore() async throws {
        let store = FilePendingKeyStore(fileURL: tempDir.appendingPathComponent("pending.json"))
        let client = IdempotentClient(keyStore: store, retryPolicy: fastPolicy, jitter: { 0.5 })
        let request = server.paymentRequest(amount: 100, controls: ["X-Test-Delay-Ms": "200"])
        try await assertOneChargeOneKey(await concurrentSends(client, request, intent: "checkout-1", count: 100))
        let left = try await store.allPending()
        XCTAssertEqual(left, [:], "settled: nothing pending")
    }

    func testHundredConcurrentSendsOfOneIntentChargeOnceWithASlowStore() async throws {
        let store = SlowPendingKeyStore()
        let client = IdempotentClient(keyStore: store, retryPolicy: fastPolicy, jitter: { 0.5 })
        let request = server.paymentRequest(amount: 100, controls: ["X-Test-Delay-Ms": "200"])
        try await assertOneChargeOneKey(await concurrentSends(client, request, intent: "checkout-slow", count: 100))
        let creates = await store.creates
        XCTAssertEqual(creates, 1, "one record created")
    }

    func testTwoLaunchesSharingTheFileCannotMintTwoKeys() async throws {
        // Two store instances on one file (two launches, or an app and its extension), many
        // concurrent get-or-creates with different candidates: one record wins everywhere.
        let file = tempDir.appendingPathComponent("shared.json")
        let stores = [FilePendingKeyStore(fileURL: file), FilePendingKeyStore(fileURL: file)]
        let fingerprint = try PendingIntent.requestFingerprint(of: server.paymentRequest(amount: 1))
        let keys = try await withThrowingTaskGroup(of: IdempotencyKey.self) { group in
            for i in 0..<40 {
                group.addTask {
                    let candidate = PendingIntent(key: .generate(), fingerprint: fingerprint, createdAt: Date())
                    return try await stores[i % 2].pendingIntent(for: "checkout-shared", orCreate: candidate).key
                }
            }
            var out = Set<IdempotencyKey>()
            for try await k in group { out.insert(k) }
            return out
        }
        XCTAssertEqual(keys.count, 1)
        // And two clients over the two instances: one charge.
        let clients = stores.map { IdempotentClient(keyStore: $0, retryPolicy: fastPolicy, jitter: { 0.5 }) }
        let request = server.paymentRequest(amount: 1)
        let answers = try await withThrowingTaskGroup(of: IdempotentResponse.self) { group in
            for i in 0..<20 { group.addTask { try await clients[i % 2].send(request, intent: "checkout-shared") } }
            var out: [IdempotentResponse] = []
            for try await a in group { out.append(a) }
            return out
        }
        XCTAssertEqual(Set(answers.map(\.key)), keys)
        let totals = try await server.totals()
        XCTAssertEqual(totals.executions, 1)
    }

    func testAChangedRequestUnderAPendingIntentThrowsAndSendsNothing() async throws {
        let store = FilePendingKeyStore(fileURL: tempDir.appendingPathComponent("pending.json"))
        let twoAttempts = try RetryPolicy(
            maxAttempts: 2, baseDelayMilliseconds: 20, maxDelayMilliseconds: 100, maxElapsedMilliseconds: 20_000)
        let client = IdempotentClient(keyStore: store, retryPolicy: twoAttempts, jitter: { 0.5 })
        // The first send gives up (the server keeps failing): its key stays pending.
        let pendingKey: IdempotencyKey
        do {
            _ = try await client.send(
                server.paymentRequest(amount: 100, controls: ["X-Test-Fail-Times": "5"]), intent: "checkout-change")
            return XCTFail("the first send must give up")
        } catch IdempotentClientError.gaveUp(let key, _, _, _) {
            pendingKey = key
        }
        let before = try await server.totals()

        // The amount changes while the key is pending: a typed error, nothing sent.
        do {
            _ = try await client.send(server.paymentRequest(amount: 250), intent: "checkout-change")
            XCTFail("a changed request under a pending intent must throw")
        } catch IdempotentClientError.intentChangedWhilePending(let intent, let pending) {
            XCTAssertEqual(intent, "checkout-change")
            XCTAssertEqual(pending.key, pendingKey)
        }
        let after = try await server.totals()
        XCTAssertEqual(after.requests, before.requests, "nothing was sent")
        let stillPending = try await store.pendingKey(for: "checkout-change")
        XCTAssertEqual(stillPending, pendingKey, "the pending key is kept for reconciliation")

        // The same request (member order and whitespace aside) is the same intent: it reuses the key.
        var same = server.paymentRequest(amount: 100)
        same.httpBody = Data(#"{ "currency": "EUR", "amount": 100 }"#.utf8)
        let answer = try await client.send(same, intent: "checkout-change")
        XCTAssertEqual(answer.key, pendingKey)
        XCTAssertEqual(answer.status, 201)
        let final = try await server.totals()
        XCTAssertEqual(final.executions, 1)
    }

    func testAChangedRequestWhileTheFirstIsInFlightThrowsAndSendsNothing() async throws {
        let client = IdempotentClient(retryPolicy: fastPolicy, jitter: { 0.5 })
        let firstRequest = server.paymentRequest(amount: 100, controls: ["X-Test-Delay-Ms": "600"])
        let first = Task { try await client.send(firstRequest, intent: "checkout-race") }
        while try await server.totals().requests < 1 { try await Task.sleep(nanoseconds: 10_000_000) }
        do {
            _ = try await client.send(server.paymentRequest(amount: 250), intent: "checkout-race")
            XCTFail("a changed request must throw")
        } catch IdempotentClientError.intentChangedWhilePending(_, let pending) {
            let answer = try await first.value
            XCTAssertEqual(pending.key, answer.key)
        }
        let totals = try await server.totals()
        XCTAssertEqual(totals.requests, 1, "only the first request was sent")
        XCTAssertEqual(totals.executions, 1)
    }

    func testAnApplications422UnderAnIntentIsItsAnswerForEveryCaller() async throws {
        let store = InMemoryPendingKeyStore()
        let client = IdempotentClient(keyStore: store, retryPolicy: fastPolicy, jitter: { 0.5 })
        let request = server.paymentRequest(amount: 5, controls: ["X-Test-App-Status": "422", "X-Test-Delay-Ms": "100"])
        let results = await concurrentSends(client, request, intent: "checkout-422", count: 10)
        for r in results {
            let answer = try r.get()
            XCTAssertEqual(answer.status, 422)
            XCTAssertEqual(answer.stopReason, .clientError(status: 422), "the application's 422 is not key reuse")
        }
        let totals = try await server.totals()
        XCTAssertEqual(totals.requests, 1)
        let pending = try await store.pendingKey(for: "checkout-422")
        XCTAssertNil(pending, "an application's answer settles the intent")
    }

    func testATimedOutAttemptIsRetriedUnderTheDefaults() async throws {
        // Defaults everywhere: URLSession.shared (60 s timeouts), RetryPolicy.standard (60 s budget)
        // and the client's default per-attempt timeout. The handler takes longer than one attempt.
        XCTAssertLessThan(IdempotentClient.defaultAttemptTimeout * 2 * 1000, Double(RetryPolicy.standard.maxElapsedMilliseconds))
        let delayMs = Int(IdempotentClient.defaultAttemptTimeout * 1000) + 500
        let request = server.paymentRequest(amount: 7, controls: ["X-Test-Delay-Ms": String(delayMs)], timeout: nil)
        XCTAssertEqual(request.timeoutInterval, 60, "URLRequest's own default")
        let transport = RecordingTransport(URLSessionTransport())
        let client = IdempotentClient(transport: transport)
        let answer: IdempotentResponse
        do {
            answer = try await client.send(request, intent: "checkout-timeout")
        } catch {
            return XCTFail("\(error); attempts: \(transport.log)")
        }
        XCTAssertEqual(answer.status, 201)
        XCTAssertTrue(answer.isReplay, "the retry got the first execution's stored answer")
        XCTAssertGreaterThanOrEqual(answer.attempts, 2)
        let stats = try await server.stats(for: answer.key)
        XCTAssertEqual(stats.executions, 1)
        XCTAssertEqual(Set(stats.header_values), [answer.key.headerValue])
    }
}
