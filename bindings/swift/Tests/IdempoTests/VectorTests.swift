import Foundation
import XCTest
@testable import Idempo

/// The shared vectors of spec/vectors, read at run time: the Swift package must give the same
/// answers as Rust (and Python and Node) byte for byte.
final class VectorTests: XCTestCase {
    private func formName(_ form: IdempotencyKey.Form) -> String {
        switch form {
        case .quoted: return "sf_string"
        case .bare: return "bare"
        case .text: return "text"
        }
    }

    private func keyOptions(_ o: [String: Any]) throws -> IdempotencyKey.Options {
        guard let min = int(o["min_len"]), let max = int(o["max_len"]), let strict = o["strict"] as? Bool else {
            throw TestFailure("bad options \(o)")
        }
        return IdempotencyKey.Options(minimumLength: min, maximumLength: max, strict: strict)
    }

    func testKeyParseVectors() throws {
        let cases = try Repo.cases("key", "parse.json")
        for c in cases {
            let name = c["name"] as? String ?? "?"
            let input: Data
            if let text = c["input"] as? String {
                input = Data(text.utf8)
            } else if let hex = c["input_hex"] as? String {
                input = try hexBytes(hex)
            } else {
                throw TestFailure("\(name): no input")
            }
            let options = try keyOptions(c["options"] as? [String: Any] ?? [:])
            let expect = c["expect"] as? [String: Any] ?? [:]
            if let code = expect["error"] as? String {
                XCTAssertThrowsError(try IdempotencyKey.parse(headerValue: input, options: options), name) { error in
                    guard let error = error as? IdempotencyKeyError else {
                        return XCTFail("\(name): unexpected error \(error)")
                    }
                    XCTAssertEqual(error.code, code, name)
                    if let offset = int(expect["offset"]) {
                        guard case .malformed(_, let got, _) = error else {
                            return XCTFail("\(name): expected an offset, got \(error)")
                        }
                        XCTAssertEqual(got, offset, name)
                    }
                    XCTAssertTrue(error.description.unicodeScalars.allSatisfy { $0.value >= 0x20 && $0.value < 0x7F }, name)
                }
            } else {
                let parsed = try IdempotencyKey.parse(headerValue: input, options: options)
                XCTAssertEqual(parsed.key.text, expect["key"] as? String, name)
                XCTAssertEqual(formName(parsed.form), expect["form"] as? String, name)
                XCTAssertEqual(parsed.ignoredParameters, int(expect["ignored_parameters"]), name)
                XCTAssertEqual(parsed.key.headerValue, expect["header_value"] as? String, name)
                let strict = IdempotencyKey.Options(
                    minimumLength: options.minimumLength, maximumLength: options.maximumLength, strict: true)
                XCTAssertEqual(try IdempotencyKey(headerValue: parsed.key.headerValue, options: strict), parsed.key, name)
            }
        }
        print("key/parse.json: \(cases.count) cases")
    }

    func testKeyOptionsVectors() throws {
        let cases = try Repo.cases("key", "options.json")
        for c in cases {
            let name = c["name"] as? String ?? "?"
            guard let min = int(c["min_len"]), let max = int(c["max_len"]), let expect = c["expect"] as? String else {
                throw TestFailure("\(name): bad case")
            }
            let options = IdempotencyKey.Options(minimumLength: min, maximumLength: max)
            var refused: String?
            do {
                _ = try IdempotencyKey(validating: "options-probe", options: options)
            } catch let IdempotencyKeyError.invalidOptions(code, _) {
                refused = code
            } catch {
                // Length errors mean the options themselves were accepted.
            }
            XCTAssertEqual(refused ?? "ok", expect, name)
        }
    }

    func testKeyGenerateVectors() throws {
        let cases = try Repo.cases("key", "generate.json")
        for c in cases {
            let name = c["name"] as? String ?? "?"
            let entropy = try hexBytes(c["entropy_hex"] as? String ?? "")
            XCTAssertEqual(try IdempotencyKey.generate(entropy: entropy).text, c["key"] as? String, name)
        }
        XCTAssertThrowsError(try IdempotencyKey.generate(entropy: Data(count: 15))) { error in
            XCTAssertEqual(error as? IdempotencyKeyError, .invalidEntropy(length: 15))
        }
    }

    func testScopeVectors() throws {
        let cases = try Repo.cases("scope", "scope.json")
        for c in cases {
            let name = c["name"] as? String ?? "?"
            guard let principal = c["principal"] as? String, let method = c["method"] as? String,
                let route = c["route"] as? String, let key = c["key"] as? String
            else { throw TestFailure("\(name): bad case") }
            let id = ScopeID(principal: principal, method: method, route: route, keyText: key)
            XCTAssertEqual(id.hex, c["scope_hex"] as? String, name)
        }
    }

    private func policy(_ p: [String: Any]) throws -> RetryPolicy {
        guard let attempts = int(p["max_attempts"]), let base = uint64(p["base_delay_ms"]),
            let maxDelay = uint64(p["max_delay_ms"]), let maxElapsed = uint64(p["max_elapsed_ms"]),
            let jitter = p["jitter"] as? String
        else { throw TestFailure("bad policy \(p)") }
        return try RetryPolicy(
            maxAttempts: UInt32(clamping: attempts), baseDelayMilliseconds: base, maxDelayMilliseconds: maxDelay,
            maxElapsedMilliseconds: maxElapsed, jitter: jitter == "full" ? .full : .equal)
    }

    private func outcome(_ o: [String: Any]) throws -> AttemptOutcome {
        switch o["kind"] as? String {
        case "response":
            guard let status = int(o["status"]) else { throw TestFailure("bad outcome \(o)") }
            return .response(status: status, retryAfterMilliseconds: uint64(o["retry_after_ms"]))
        case "timeout": return .timeout
        case "connection_error": return .connectionError
        case "outcome_unknown": return .outcomeUnknown
        case "key_reused": return .keyReused
        case "response_not_retained": return .responseNotRetained
        case "in_flight": return .inFlight(retryAfterMilliseconds: uint64(o["retry_after_ms"]))
        default: throw TestFailure("bad outcome \(o)")
        }
    }

    func testRetryDecideVectors() throws {
        guard let groups = try Repo.vectors("retry", "decide.json")["groups"] as? [[String: Any]], !groups.isEmpty else {
            throw TestFailure("retry/decide.json has no groups")
        }
        var count = 0
        for g in groups {
            let policy = try policy(g["policy"] as? [String: Any] ?? [:])
            for c in g["cases"] as? [[String: Any]] ?? [] {
                count += 1
                let name = "\(g["name"] ?? "?")/\(c["name"] ?? "?")"
                guard let attempt = int(c["attempt"]), let elapsed = uint64(c["elapsed_ms"]),
                    let jitter = double(c["jitter"]), let expect = c["expect"] as? [String: Any]
                else { throw TestFailure("\(name): bad case") }
                let outcome = try outcome(c["outcome"] as? [String: Any] ?? [:])
                let run = {
                    try policy.decide(
                        attempt: UInt32(clamping: attempt), elapsedMilliseconds: elapsed, outcome: outcome, jitter: jitter)
                }
                if let code = expect["error"] as? String {
                    XCTAssertThrowsError(try run(), name) { error in
                        XCTAssertEqual((error as? RetryPolicyError)?.code, code, name)
                    }
                    continue
                }
                let decision = try run()
                if let delay = uint64(expect["retry"]) {
                    XCTAssertEqual(decision, .retry(delayMilliseconds: delay), name)
                } else if let code = expect["stop"] as? String {
                    guard case .stop(let reason) = decision else {
                        XCTFail("\(name): expected stop \(code), got \(decision)")
                        continue
                    }
                    XCTAssertEqual(reason.code, code, name)
                    switch reason {
                    case .clientError(let status), .serverErrorNotRetryable(let status):
                        XCTAssertEqual(status, int(expect["status"]), name)
                    default:
                        XCTAssertNil(expect["status"], name)
                    }
                } else {
                    throw TestFailure("\(name): bad expectation \(expect)")
                }
            }
        }
        XCTAssertGreaterThan(count, 0)
        print("retry/decide.json: \(count) cases")
    }

    func testRetryConfigVectors() throws {
        for c in try Repo.cases("retry", "config.json") {
            let name = c["name"] as? String ?? "?"
            let expect = c["expect"] as? String
            do {
                _ = try policy(c["policy"] as? [String: Any] ?? [:])
                XCTAssertEqual(expect, "ok", name)
            } catch let error as RetryPolicyError {
                XCTAssertEqual(error.code, expect, name)
            }
        }
    }

    func testRetryOutcomeVectors() throws {
        let cases = try Repo.cases("retry", "outcome.json")
        XCTAssertGreaterThan(cases.count, 0)
        for c in cases {
            let name = c["name"] as? String ?? "?"
            guard let status = int(c["status"]), let body = c["body"] as? String, let expect = c["expect"] as? String
            else { throw TestFailure("\(name): bad case") }
            var headers: [String: String] = [:]
            if let ct = c["content_type"] as? String { headers["Content-Type"] = ct }
            let retryAfter = uint64(c["retry_after_ms"])
            if let ms = retryAfter {
                guard ms % 1000 == 0 else { throw TestFailure("\(name): retry_after_ms must be whole seconds here") }
                headers["Retry-After"] = String(ms / 1000)
            }
            let got = RetryPolicy.outcome(of: HTTPResponse(status: status, headers: headers, body: Data(body.utf8)))
            switch expect {
            case "outcome_unknown":
                XCTAssertEqual(got, .outcomeUnknown, name)
            case "key_reused":
                XCTAssertEqual(got, .keyReused, name)
            case "response_not_retained":
                XCTAssertEqual(got, .responseNotRetained, name)
            case "in_flight":
                XCTAssertEqual(got, .inFlight(retryAfterMilliseconds: retryAfter), name)
            case "response":
                XCTAssertEqual(got, .response(status: status, retryAfterMilliseconds: retryAfter), name)
            default:
                throw TestFailure("\(name): bad expectation \(expect)")
            }
        }
        print("retry/outcome.json: \(cases.count) cases")
    }

    func testRetryAfterVectors() throws {
        for c in try Repo.cases("retry", "retry_after.json") {
            let name = c["name"] as? String ?? "?"
            guard let value = c["value"] as? String, let now = uint64(c["now_ms"]) else {
                throw TestFailure("\(name): bad case")
            }
            let got = RetryPolicy.retryAfterMilliseconds(value, nowUnixMilliseconds: now)
            XCTAssertEqual(got, uint64(c["expect_ms"]), name)
        }
    }
}
