import Foundation
import XCTest
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
@testable import Idempo

/// The repository root, found from this file's path (bindings/swift/Tests/IdempoTests/...), or
/// IDEMPO_REPO_ROOT when set. Vectors and the test server are read from the repository at run
/// time, never copied.
enum Repo {
    static let root: URL = {
        if let env = ProcessInfo.processInfo.environment["IDEMPO_REPO_ROOT"], !env.isEmpty {
            return URL(fileURLWithPath: env, isDirectory: true)
        }
        var url = URL(fileURLWithPath: #filePath)
        for _ in 0..<5 { url.deleteLastPathComponent() }
        return url
    }()

    /// A vector file as plain values (`Int`, `Double`, `String`, `Bool`, `NSNull`, arrays,
    /// dictionaries). Decoded with JSONDecoder, whose number parsing is correctly rounded
    /// (JSONSerialization on Linux reads 0.9999999999999999 as 1.0).
    static func vectors(_ kind: String, _ file: String) throws -> [String: Any] {
        let url = root.appendingPathComponent("spec/vectors/\(kind)/\(file)")
        let data = try Data(contentsOf: url)
        guard let doc = try JSONDecoder().decode(JSONValue.self, from: data).plain as? [String: Any] else {
            throw TestFailure("\(url.path) is not a JSON object")
        }
        return doc
    }

    static func cases(_ kind: String, _ file: String) throws -> [[String: Any]] {
        guard let cases = try vectors(kind, file)["cases"] as? [[String: Any]], !cases.isEmpty else {
            throw TestFailure("spec/vectors/\(kind)/\(file) has no cases")
        }
        return cases
    }
}

/// Any JSON value, decoded by JSONDecoder.
enum JSONValue: Decodable {
    case null, bool(Bool), int(Int), double(Double), string(String), array([JSONValue]), object([String: JSONValue])

    init(from decoder: Decoder) throws {
        let c = try decoder.singleValueContainer()
        if c.decodeNil() { self = .null }
        else if let b = try? c.decode(Bool.self) { self = .bool(b) }
        else if let i = try? c.decode(Int.self) { self = .int(i) }
        else if let d = try? c.decode(Double.self) { self = .double(d) }
        else if let s = try? c.decode(String.self) { self = .string(s) }
        else if let a = try? c.decode([JSONValue].self) { self = .array(a) }
        else { self = .object(try c.decode([String: JSONValue].self)) }
    }

    var plain: Any {
        switch self {
        case .null: return NSNull()
        case .bool(let b): return b
        case .int(let i): return i
        case .double(let d): return d
        case .string(let s): return s
        case .array(let a): return a.map(\.plain)
        case .object(let o): return o.mapValues(\.plain)
        }
    }
}

struct TestFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

func hexBytes(_ hex: String) throws -> Data {
    let chars = Array(hex.utf8)
    guard chars.count % 2 == 0 else { throw TestFailure("odd hex length: \(hex)") }
    var out = Data()
    for i in stride(from: 0, to: chars.count, by: 2) {
        guard let byte = UInt8(String(decoding: chars[i..<i + 2], as: UTF8.self), radix: 16) else {
            throw TestFailure("bad hex: \(hex)")
        }
        out.append(byte)
    }
    return out
}

/// JSON numbers from JSONSerialization as the integer types the API takes.
func int(_ value: Any?) -> Int? {
    if let n = value as? Int { return n }
    if let n = value as? NSNumber { return n.intValue }
    return nil
}

func uint64(_ value: Any?) -> UInt64? {
    if let n = value as? UInt64 { return n }
    if let n = value as? Int, n >= 0 { return UInt64(n) }
    if let n = value as? NSNumber { return n.uint64Value }
    return nil
}

func double(_ value: Any?) -> Double? {
    switch value {
    case let s as String:
        switch s {
        case "NaN": return .nan
        case "Infinity": return .infinity
        case "-Infinity": return -.infinity
        default: return nil
        }
    case let n as Double: return n
    case let n as Int: return Double(n)
    case let n as NSNumber: return n.doubleValue
    default: return nil
    }
}

/// Wraps a transport and records what each attempt ended with (for assertions and failure messages).
final class RecordingTransport: HTTPTransport, @unchecked Sendable {
    private let inner: any HTTPTransport
    private let lock = NSLock()
    private var entries: [String] = []
    private let start = Date()

    init(_ inner: any HTTPTransport) { self.inner = inner }

    var log: [String] {
        lock.lock()
        defer { lock.unlock() }
        return entries
    }

    private func record(_ s: String) {
        lock.lock()
        entries.append(String(format: "%.3f ", Date().timeIntervalSince(start)) + s)
        lock.unlock()
    }

    func send(_ request: URLRequest) async throws -> HTTPResponse {
        record("send")
        do {
            let r = try await inner.send(request)
            record("status \(r.status)")
            return r
        } catch let e as URLError {
            record("URLError \(e.code.rawValue)")
            throw e
        }
    }
}

/// The stdlib Python payments server of bindings/swift/Tests/server.py, on a free local port.
final class TestServer: @unchecked Sendable {
    let process = Process()
    let stdin = Pipe()
    let stdout = Pipe()
    let baseURL: URL

    init() throws {
        let script = Repo.root.appendingPathComponent("bindings/swift/Tests/server.py")
        let python = ProcessInfo.processInfo.environment["IDEMPO_PYTHON"] ?? "/usr/bin/python3"
        process.executableURL = URL(fileURLWithPath: python)
        process.arguments = [script.path]
        process.standardInput = stdin
        process.standardOutput = stdout
        try process.run()
        var line = Data()
        let deadline = Date().addingTimeInterval(20)
        while !line.contains(UInt8(ascii: "\n")) {
            let chunk = stdout.fileHandleForReading.availableData
            if chunk.isEmpty {
                if Date() > deadline || !process.isRunning { break }
                continue
            }
            line.append(chunk)
        }
        let text = String(decoding: line, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        guard text.hasPrefix("PORT "), let port = Int(text.dropFirst(5)) else {
            process.terminate()
            throw TestFailure("test server did not start (got \(text.debugDescription))")
        }
        baseURL = URL(string: "http://127.0.0.1:\(port)")!
    }

    func stop() {
        try? stdin.fileHandleForWriting.close()
        if process.isRunning { process.terminate() }
        process.waitUntilExit()
    }

    struct Stats: Decodable {
        let executions: Int
        let requests: Int
        let header_values: [String]
        let total_requests: Int
        let total_executions: Int
    }

    func stats(for key: IdempotencyKey) async throws -> Stats {
        var components = URLComponents(url: baseURL.appendingPathComponent("stats"), resolvingAgainstBaseURL: false)!
        components.queryItems = [URLQueryItem(name: "key", value: key.text)]
        let response = try await URLSessionTransport().send(URLRequest(url: components.url!))
        return try JSONDecoder().decode(Stats.self, from: response.body)
    }

    /// Waits until the server has received `count` requests with `key` (at most 10 s).
    func waitForRequests(key: IdempotencyKey, count: Int) async throws {
        let deadline = Date().addingTimeInterval(10)
        while try await stats(for: key).requests < count {
            if Date() > deadline { throw TestFailure("the server never saw \(count) request(s) with the key") }
            try await Task.sleep(nanoseconds: 10_000_000)
        }
    }

    /// Server-wide counts (every POST /payments).
    func totals() async throws -> (requests: Int, executions: Int) {
        let s = try await stats(for: IdempotencyKey(validating: "no-such-key"))
        return (s.total_requests, s.total_executions)
    }

    func paymentRequest(amount: Int, controls: [String: String] = [:], timeout: TimeInterval? = 10) -> URLRequest {
        var request = URLRequest(url: baseURL.appendingPathComponent("payments"))
        if let timeout { request.timeoutInterval = timeout }
        request.httpMethod = "POST"
        request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        request.httpBody = Data(#"{"amount":\#(amount),"currency":"EUR"}"#.utf8)
        for (name, value) in controls { request.setValue(value, forHTTPHeaderField: name) }
        return request
    }
}
