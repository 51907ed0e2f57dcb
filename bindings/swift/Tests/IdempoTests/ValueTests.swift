import Foundation
import XCTest
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
@testable import Idempo

/// A deterministic generator for key-generation tests (never use outside tests).
struct CountingGenerator: RandomNumberGenerator {
    var state: UInt64
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        return state
    }
}

final class ValueTests: XCTestCase {
    func testGeneratedKeysAreFreshValidAndSentInSfStringForm() throws {
        let a = IdempotencyKey.generate()
        let b = IdempotencyKey.generate()
        XCTAssertNotEqual(a, b)
        XCTAssertEqual(a.text.count, 36)
        XCTAssertEqual(a.headerValue, "\"\(a.text)\"")
        XCTAssertEqual(try IdempotencyKey(headerValue: a.headerValue), a)
        XCTAssertEqual(a.description, "IdempotencyKey(36 chars)")
        XCTAssertFalse(a.description.contains(a.text))

        var g1 = CountingGenerator(state: 7)
        var g2 = CountingGenerator(state: 7)
        XCTAssertEqual(IdempotencyKey.generate(using: &g1), IdempotencyKey.generate(using: &g2))
    }

    func testValidationErrorsAreTyped() {
        XCTAssertThrowsError(try IdempotencyKey(validating: "short")) { error in
            XCTAssertEqual(error as? IdempotencyKeyError, .tooShort(length: 5, minimum: 8, message: "\(error)"))
        }
        XCTAssertThrowsError(try IdempotencyKey(validating: "has\u{7}bell-char")) { error in
            guard case .malformed(let code, let offset, _)? = error as? IdempotencyKeyError else {
                return XCTFail("unexpected \(error)")
            }
            XCTAssertEqual(code, "invalid_character")
            XCTAssertEqual(offset, 3)
        }
        XCTAssertThrowsError(
            try IdempotencyKey(validating: "abcdefgh", options: .init(minimumLength: 9, maximumLength: 3))
        ) { error in
            XCTAssertEqual((error as? IdempotencyKeyError)?.code, "min_above_max")
        }
        XCTAssertThrowsError(try IdempotencyKey(headerValue: "abcdefgh", options: .init(minimumLength: 8, maximumLength: 128, strict: true))) {
            XCTAssertEqual(($0 as? IdempotencyKeyError)?.code, "bare_form_not_allowed")
        }
    }

    func testKeyCodableRoundTripsAndRevalidates() throws {
        struct Pending: Codable, Equatable { let key: IdempotencyKey }
        let value = Pending(key: try IdempotencyKey(validating: #"quote"and\backslash"#))
        let data = try JSONEncoder().encode(value)
        XCTAssertEqual(try JSONDecoder().decode(Pending.self, from: data), value)
        XCTAssertEqual(value.key.headerValue, #""quote\"and\\backslash""#)
        let bad = Data(#"{"key":"tab\there"}"#.utf8)
        XCTAssertThrowsError(try JSONDecoder().decode(Pending.self, from: bad)) { error in
            guard case DecodingError.dataCorrupted = error else { return XCTFail("unexpected \(error)") }
        }
    }

    func testCanonicalJSON() throws {
        let out = try CanonicalJSON.canonicalize(Data(#"{"b":[1.50,true],"a":"\u00e9"}"#.utf8))
        XCTAssertEqual(String(decoding: out, as: UTF8.self), #"{"a":"é","b":[1.5,true]}"#)
        XCTAssertThrowsError(try CanonicalJSON.canonicalize(Data(#"{"a":1,"a":2}"#.utf8))) { error in
            guard case .invalidJSON(let code, _, let offset, let pointer)? = error as? CanonicalJSONError else {
                return XCTFail("unexpected \(error)")
            }
            XCTAssertEqual(code, "duplicate_member")
            XCTAssertGreaterThan(offset, 0)
            XCTAssertNotNil(pointer)
        }
        var options = CanonicalJSON.Options.standard
        options.maxDepth = 1
        XCTAssertThrowsError(try CanonicalJSON.canonicalize(Data("[[1]]".utf8), options: options)) { error in
            guard case .limitExceeded(let code, _, _, let limit, _)? = error as? CanonicalJSONError else {
                return XCTFail("unexpected \(error)")
            }
            XCTAssertEqual(code, "depth_limit")
            XCTAssertEqual(limit, 1)
        }
    }

    func testFingerprintMatchesForSameMeaningAndDiffersOtherwise() throws {
        let a = try Fingerprint(method: "post", route: "/payments", contentType: "application/json",
                                body: Data(#"{"amount":100,"currency":"EUR"}"#.utf8))
        let b = try Fingerprint(method: "POST", route: "/payments", contentType: "application/json; charset=utf-8",
                                body: Data(#"{ "currency": "EUR", "amount": 1e2 }"#.utf8))
        let c = try Fingerprint(method: "POST", route: "/payments", contentType: "application/json",
                                body: Data(#"{"amount":101,"currency":"EUR"}"#.utf8))
        XCTAssertEqual(a, b)
        XCTAssertTrue(a.constantTimeEquals(b))
        XCTAssertNotEqual(a, c)
        XCTAssertTrue(a.text.hasPrefix("v1:"))
        XCTAssertEqual(try Fingerprint(parsing: a.text), a)

        var request = URLRequest(url: URL(string: "https://api.example/payments/42")!)
        request.httpMethod = "POST"
        request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        request.httpBody = Data(#"{"currency":"EUR","amount":100}"#.utf8)
        XCTAssertEqual(try Fingerprint(of: request, route: "/payments"), a)

        var keyed = Fingerprint.Configuration.standard
        keyed.hmacKey = Data("server-secret".utf8)
        let h = try Fingerprint(method: "POST", route: "/payments", contentType: "application/json",
                                body: Data("{}".utf8), configuration: keyed)
        XCTAssertTrue(h.text.hasPrefix("h1:"))

        XCTAssertThrowsError(try Fingerprint(parsing: "v9:abc")) {
            XCTAssertEqual(($0 as? FingerprintError)?.code, "unknown_fingerprint_version")
        }
        XCTAssertThrowsError(try Fingerprint(method: "POST", route: "/p", contentType: "application/json",
                                             body: Data("9007199254740993".utf8))) {
            XCTAssertEqual(($0 as? FingerprintError)?.code, "precision_loss")
        }
    }

    func testRetryPolicyValidationAndDecisions() throws {
        XCTAssertThrowsError(try RetryPolicy(maxAttempts: 0, baseDelayMilliseconds: 1, maxDelayMilliseconds: 1, maxElapsedMilliseconds: 1)) {
            XCTAssertEqual(($0 as? RetryPolicyError)?.code, "zero_attempts")
        }
        let policy = RetryPolicy.standard
        XCTAssertEqual(try policy.decide(attempt: 1, elapsedMilliseconds: 0, outcome: .inFlight(retryAfterMilliseconds: 2000), jitter: 0),
                       .retry(delayMilliseconds: 2000))
        XCTAssertEqual(try policy.decide(attempt: 1, elapsedMilliseconds: 0, outcome: .keyReused, jitter: 0),
                       .stop(reason: .keyReusedWithDifferentRequest))
        // The application's own 409 and 422 are its answers: stopped as client errors.
        XCTAssertEqual(try policy.decide(attempt: 1, elapsedMilliseconds: 0, outcome: .response(status: 409, retryAfterMilliseconds: 2000), jitter: 0),
                       .stop(reason: .clientError(status: 409)))
        XCTAssertEqual(try policy.decide(attempt: 1, elapsedMilliseconds: 0, outcome: .response(status: 422, retryAfterMilliseconds: nil), jitter: 0),
                       .stop(reason: .clientError(status: 422)))
        XCTAssertEqual(try policy.decide(attempt: 1, elapsedMilliseconds: 0, outcome: .responseNotRetained, jitter: 0),
                       .stop(reason: .responseNotRetained))
        XCTAssertEqual(StopReason.keyReusedWithDifferentRequest.code, "key_reused_with_different_request")
        // The public vocabulary is the package's own Swift types, not the generated FFI ones.
        XCTAssertEqual(String(reflecting: StopReason.self), "Idempo.StopReason")
        XCTAssertEqual(String(reflecting: RetryDecision.self), "Idempo.RetryDecision")
        XCTAssertEqual(String(reflecting: IdempotencyKey.Form.self), "Idempo.IdempotencyKey.Form")
        XCTAssertEqual("\(StopReason.success)", "success")
        XCTAssertEqual("\(StopReason.clientError(status: 422))", "client_error(422)")
        XCTAssertEqual(String(reflecting: AttemptOutcome.timeout), "Idempo.AttemptOutcome.timeout")
        XCTAssertEqual("\(JitterMode.equal)", "equal")
        XCTAssertEqual("\(NumberMode.rejectPrecisionLoss)", "reject_precision_loss")
        XCTAssertTrue(StopReason.clientError(status: 422).settlesIntent)
        XCTAssertFalse(StopReason.outcomeUnknown.settlesIntent)
        XCTAssertThrowsError(try policy.decide(attempt: 1, elapsedMilliseconds: 0, outcome: .timeout, jitter: .nan)) {
            XCTAssertEqual(($0 as? RetryPolicyError)?.code, "invalid_jitter")
        }
        XCTAssertEqual(RetryPolicy.retryAfterMilliseconds("Sun, 06 Nov 1994 08:49:37 GMT", nowUnixMilliseconds: 784_111_776_000), 1000)
    }

    func testFileStoreSurvivesNewInstancesAndRefusesCorruptFiles() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("idempo-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: dir) }
        let file = dir.appendingPathComponent("nested/pending.json")
        let key = IdempotencyKey.generate()
        let fingerprint = try Fingerprint(method: "POST", route: "/p", contentType: "application/json", body: Data("{}".utf8))
        let record = PendingIntent(key: key, fingerprint: fingerprint, createdAt: Date(timeIntervalSince1970: 1_764_633_600))
        let stored = try await FilePendingKeyStore(fileURL: file).pendingIntent(for: "checkout-1", orCreate: record)
        XCTAssertEqual(stored, record)
        let reopened = FilePendingKeyStore(fileURL: file)
        let found = try await reopened.pendingKey(for: "checkout-1")
        XCTAssertEqual(found, key)
        let missing = try await reopened.pendingKey(for: "checkout-2")
        XCTAssertNil(missing)
        let again = try await reopened.pendingIntent(
            for: "checkout-1", orCreate: PendingIntent(key: .generate(), fingerprint: fingerprint, createdAt: Date()))
        XCTAssertEqual(again, record, "get-or-create returns the stored record")
        try await reopened.removePendingIntent(for: "checkout-1")
        let afterRemove = try await FilePendingKeyStore(fileURL: file).allPending()
        XCTAssertEqual(afterRemove, [:])

        try Data("not json".utf8).write(to: file)
        do {
            _ = try await FilePendingKeyStore(fileURL: file).pendingKey(for: "checkout-1")
            XCTFail("a corrupt file must not read as empty")
        } catch PendingKeyStoreError.unreadable {
        }
        // A version-1 file (keys without request fingerprints) is refused, not read as unbound keys.
        try Data(#"{"version":1,"pending":{"a":{"key":"3f6c1e0a-77c4-4b2e","savedAt":1}}}"#.utf8).write(to: file)
        do {
            _ = try await FilePendingKeyStore(fileURL: file).allPending()
            XCTFail("a version-1 file must be refused")
        } catch PendingKeyStoreError.unreadable(_, let reason) {
            XCTAssertTrue(reason.contains("version 1"), reason)
        }
    }
}
