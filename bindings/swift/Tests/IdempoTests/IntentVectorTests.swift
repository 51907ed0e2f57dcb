import Foundation
import XCTest
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import IdempoBindings
@testable import Idempo

/// spec/vectors/intent through the Swift package: the request binding through the public API,
/// core's send decision and settle rule through the FFI (the corrupt-record cases cannot be built
/// with the public, validated types).
final class IntentVectorTests: XCTestCase {
    func testIntentVectors() throws {
        for c in try Repo.cases("intent", "fingerprint.json") {
            let name = c["name"] as? String ?? "?"
            func fp(_ r: Any?) throws -> Result<Idempo.Fingerprint, Idempo.FingerprintError> {
                guard let r = r as? [String: Any], let method = r["method"] as? String,
                    let target = r["target"] as? String, let body = r["body"] as? String, let url = URL(string: target)
                else { throw TestFailure("\(name): bad request") }
                var request = URLRequest(url: url)
                request.httpMethod = method
                request.setValue(r["content_type"] as? String, forHTTPHeaderField: "Content-Type")
                request.httpBody = Data(body.utf8)
                do { return .success(try PendingIntent.requestFingerprint(of: request)) } catch { return .failure(error as! Idempo.FingerprintError) }
            }
            let a = try fp(c["a"])
            if let code = c["error"] as? String {
                guard case .failure(let e) = a else { XCTFail("\(name): expected \(code)"); continue }
                XCTAssertEqual(e.code, code, name)
                continue
            }
            let b = try fp(c["b"])
            XCTAssertEqual(try a.get() == b.get(), c["same"] as? Bool, name)
        }
        for c in try Repo.cases("intent", "send.json") {
            let name = c["name"] as? String ?? "?"
            let got: Result<IdempoBindings.IntentSendDecision, Error> = Result {
                var pending: IdempoBindings.PendingIntentRecord?
                if let p = c["pending"] as? [String: Any] {
                    pending = IdempoBindings.PendingIntentRecord(
                        key: p["key"] as? String ?? "", fingerprint: p["fingerprint"] as? String ?? "",
                        createdMs: uint64(p["created_ms"]) ?? 0)
                }
                return try IdempoBindings.intentDecideSend(
                    pending: pending, requestFingerprint: c["request"] as? String ?? "", explicitKey: c["explicit_key"] as? String)
            }
            if let code = c["error"] as? String {
                guard case .failure(IdempoBindings.IntentError.InvalidInput(let got, _)) = got else {
                    XCTFail("\(name): expected \(code), got \(got)"); continue
                }
                XCTAssertEqual(got, code, name)
            } else {
                XCTAssertEqual(try IdempoBindings.intentSendCode(decision: got.get()), c["expect"] as? String, name)
            }
        }
        for c in try Repo.cases("intent", "settle.json") {
            let name = c["name"] as? String ?? "?"
            let o = c["outcome"] as? [String: Any] ?? [:]
            let outcome: Idempo.AttemptOutcome
            switch o["kind"] as? String {
            case "response": outcome = .response(status: int(o["status"]) ?? 0, retryAfterMilliseconds: uint64(o["retry_after_ms"]))
            case "timeout": outcome = .timeout
            case "connection_error": outcome = .connectionError
            case "outcome_unknown": outcome = .outcomeUnknown
            case "key_reused": outcome = .keyReused
            case "response_not_retained": outcome = .responseNotRetained
            case "in_flight": outcome = .inFlight(retryAfterMilliseconds: uint64(o["retry_after_ms"]))
            default: throw TestFailure("\(name): bad outcome")
            }
            let decision = try RetryPolicy.standard.decide(
                attempt: UInt32(int(c["attempt"]) ?? 0), elapsedMilliseconds: uint64(c["elapsed_ms"]) ?? 0,
                outcome: outcome, jitter: 0.5)
            guard case .stop(let reason) = decision else { XCTFail("\(name): expected a stop"); continue }
            XCTAssertEqual(reason.code, c["reason"] as? String, name)
            XCTAssertEqual(reason.settlesIntent, c["settles_intent"] as? Bool, name)
        }
    }
}
