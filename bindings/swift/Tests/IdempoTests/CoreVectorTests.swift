import Foundation
import XCTest
@testable import Idempo

/// spec/vectors/canonical and spec/vectors/fingerprint through the Swift API: the bytes and
/// fingerprints must equal Rust's exactly.
final class CoreVectorTests: XCTestCase {
    private func numberMode(_ name: Any?) throws -> NumberMode {
        switch name as? String {
        case "rfc": return .rfc
        case "reject_precision_loss": return .rejectPrecisionLoss
        default: throw TestFailure("unknown number mode \(String(describing: name))")
        }
    }

    private func bytes(_ c: [String: Any], text: String, hex: String) throws -> Data {
        if let s = c[text] as? String { return Data(s.utf8) }
        if let h = c[hex] as? String { return try hexBytes(h) }
        throw TestFailure("no \(text) or \(hex) in \(c["name"] ?? c)")
    }

    /// Checks a thrown error against `{code, offset?, pointer?}` (pointer `null` means none).
    private func check(
        _ error: Error, code: String, offset: Int?, pointer: Any?, hasPointer: Bool, _ name: String
    ) {
        let got: (code: String, offset: Int?, pointer: String?)
        switch error {
        case let e as CanonicalJSONError:
            switch e {
            case .invalidJSON(let c, _, let o, let p): got = (c, o, p)
            case .limitExceeded(let c, _, let o, _, let p): got = (c, o, p)
            case .invalidPointer(let c, _): got = (c, nil, nil)
            }
        case let e as FingerprintError:
            switch e {
            case .invalidBody(let c, _, let o, let p): got = (c, o, p)
            case .invalidConfiguration(let c, _), .invalidFingerprint(let c, _): got = (c, nil, nil)
            }
        default:
            return XCTFail("\(name): unexpected error \(error)")
        }
        XCTAssertEqual(got.code, code, name)
        if let offset { XCTAssertEqual(got.offset, offset, name) }
        if hasPointer { XCTAssertEqual(got.pointer, pointer as? String, name) }
    }

    func testCanonicalVectors() throws {
        let dir = Repo.root.appendingPathComponent("spec/vectors/canonical")
        let files = try FileManager.default.contentsOfDirectory(atPath: dir.path).filter { $0.hasSuffix(".json") }.sorted()
        XCTAssertFalse(files.isEmpty, "no canonical vectors")
        var count = 0
        for file in files {
            for c in try Repo.cases("canonical", file) {
                count += 1
                let name = "\(file)/\(c["name"] ?? "?")"
                let input = try bytes(c, text: "input", hex: "input_hex")
                var options = CanonicalJSON.Options.standard
                options.numbers = try numberMode(c["mode"])
                let limits = c["limits"] as? [String: Any] ?? [:]
                if let v = int(limits["max_input_bytes"]) { options.maxInputBytes = v }
                if let v = int(limits["max_depth"]) { options.maxDepth = v }
                if let v = int(limits["max_members"]) { options.maxMembers = v }
                let exclude = c["exclude"] as? [String] ?? []
                let run = { try CanonicalJSON.canonicalize(input, options: options, excluding: exclude) }
                if let expected = c["output"] as? String {
                    XCTAssertEqual(try run(), Data(expected.utf8), name)
                } else if let error = c["error"] as? [String: Any], let code = error["code"] as? String {
                    XCTAssertThrowsError(try run(), name) {
                        self.check($0, code: code, offset: int(error["offset"]), pointer: error["pointer"],
                                   hasPointer: error.keys.contains("pointer"), name)
                    }
                } else {
                    throw TestFailure("\(name): no output or error")
                }
            }
        }
        print("canonical vectors: \(count) cases")
    }

    func testFingerprintVectors() throws {
        let cases = try Repo.cases("fingerprint", "fingerprint.json")
        for c in cases {
            let name = c["name"] as? String ?? "?"
            let cfg = c["config"] as? [String: Any] ?? [:]
            var configuration = Fingerprint.Configuration.standard
            if let names = cfg["header_names"] as? [String] { configuration.headerNames = names }
            if let exclude = cfg["exclude"] as? [String] { configuration.exclude = exclude }
            if cfg["numbers"] != nil { configuration.numbers = try numberMode(cfg["numbers"]) }
            if let hex = cfg["hmac_key_hex"] as? String { configuration.hmacKey = try hexBytes(hex) }
            guard let request = c["request"] as? [String: Any], let method = request["method"] as? String,
                let route = request["route"] as? String
            else { throw TestFailure("\(name): bad request") }
            let headers = try (request["headers"] as? [[String]] ?? []).map { pair -> (name: String, value: String) in
                guard pair.count == 2 else { throw TestFailure("\(name): bad header \(pair)") }
                return (pair[0], pair[1])
            }
            let body = try bytes(request, text: "body", hex: "body_hex")
            let run = {
                try Fingerprint(method: method, route: route, headers: headers,
                                contentType: request["content_type"] as? String, body: body,
                                configuration: configuration)
            }
            if let expected = c["fingerprint"] as? String {
                XCTAssertEqual(try run().text, expected, name)
            } else if let error = c["error"] as? [String: Any], let code = error["code"] as? String {
                XCTAssertThrowsError(try run(), name) {
                    self.check($0, code: code, offset: int(error["offset"]), pointer: error["pointer"],
                               hasPointer: error.keys.contains("pointer"), name)
                }
            } else {
                throw TestFailure("\(name): no fingerprint or error")
            }
        }
        print("fingerprint vectors: \(cases.count) cases")
    }
}
