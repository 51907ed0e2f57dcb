import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import IdempoBindings

/// The versioned fingerprint of a request (`v1:<64 hex>`, or `h1:<64 hex>` with an HMAC key),
/// computed by idempo's core exactly as the server computes it: method, route template, the
/// configured headers, the content-type class and the body (canonical JSON for JSON bodies).
///
/// A client can use it to check, before retrying, that a stored intent still describes the same
/// request, or to log what the server will compare.
public struct Fingerprint: Sendable, Hashable, Codable, CustomStringConvertible {
    /// The text form, e.g. `v1:3e4b…`.
    public let text: String

    /// How fingerprints are computed. Must match the server's configuration.
    public struct Configuration: Sendable, Hashable {
        /// Header names that take part (case-insensitive).
        public var headerNames: [String]
        /// RFC 6901 pointers of JSON values left out (e.g. `/client_timestamp`).
        public var exclude: [String]
        /// Number policy for JSON bodies (core's default refuses precision loss).
        public var numbers: NumberMode
        /// Limits for JSON bodies.
        public var maxInputBytes: Int
        /// Deepest accepted JSON nesting.
        public var maxDepth: Int
        /// Most members accepted in one JSON object.
        public var maxMembers: Int
        /// HMAC-SHA256 key for `h1:` fingerprints; `nil` for plain SHA-256 (`v1:`).
        public var hmacKey: Data?

        /// Core's defaults: no headers, no exclusions, precision loss refused, default limits,
        /// plain SHA-256.
        public static let standard: Configuration = {
            let c = defaultFingerprintConfig()
            return Configuration(
                headerNames: c.headerNames, exclude: c.exclude, numbers: NumberMode(c.numbers),
                maxInputBytes: Int(clamping: c.maxInputBytes), maxDepth: Int(clamping: c.maxDepth),
                maxMembers: Int(clamping: c.maxMembers), hmacKey: c.hmacKey)
        }()

        /// A configuration with explicit values.
        public init(
            headerNames: [String] = [], exclude: [String] = [], numbers: NumberMode = .rejectPrecisionLoss,
            maxInputBytes: Int = CanonicalJSON.Options.standard.maxInputBytes,
            maxDepth: Int = CanonicalJSON.Options.standard.maxDepth,
            maxMembers: Int = CanonicalJSON.Options.standard.maxMembers, hmacKey: Data? = nil
        ) {
            self.headerNames = headerNames
            self.exclude = exclude
            self.numbers = numbers
            self.maxInputBytes = maxInputBytes
            self.maxDepth = maxDepth
            self.maxMembers = maxMembers
            self.hmacKey = hmacKey
        }

        var ffi: FingerprintConfig {
            FingerprintConfig(
                headerNames: headerNames, exclude: exclude, numbers: numbers.ffi,
                maxInputBytes: UInt64(clamping: maxInputBytes), maxDepth: UInt64(clamping: maxDepth),
                maxMembers: UInt64(clamping: maxMembers), hmacKey: hmacKey)
        }
    }

    /// Reads a fingerprint text.
    ///
    /// - Throws: ``FingerprintError/invalidFingerprint(code:message:)``.
    public init(parsing text: String) throws {
        self.text = try callFFI(IdempoBindings.FingerprintError.self, FingerprintError.init) {
            try parseFingerprint(text: text)
        }
    }

    /// The fingerprint of a request given by its parts.
    ///
    /// - Parameters:
    ///   - route: the route *template* the server uses (`/payments/{id}`), not the concrete path.
    ///   - headers: request headers as (name, value) pairs; only configured names are used.
    /// - Throws: ``FingerprintError``.
    public init(
        method: String, route: String, headers: [(name: String, value: String)] = [],
        contentType: String?, body: Data, configuration: Configuration = .standard
    ) throws {
        let request = FingerprintRequest(
            method: method, route: route, headers: headers.map { Header(name: $0.name, value: $0.value) },
            contentType: contentType, body: body)
        self.text = try callFFI(IdempoBindings.FingerprintError.self, FingerprintError.init) {
            try fingerprint(request: request, config: configuration.ffi)
        }
    }

    /// The fingerprint of a `URLRequest` (method, headers, `Content-Type` and body) under the
    /// server's route template.
    ///
    /// - Throws: ``FingerprintError``.
    public init(of request: URLRequest, route: String, configuration: Configuration = .standard) throws {
        let headers = (request.allHTTPHeaderFields ?? [:]).sorted { $0.key < $1.key }.map { (name: $0.key, value: $0.value) }
        try self.init(
            method: request.httpMethod ?? "GET", route: route, headers: headers,
            contentType: request.value(forHTTPHeaderField: "Content-Type"), body: request.httpBody ?? Data(),
            configuration: configuration)
    }

    /// The text form.
    public var description: String { text }

    /// Compares two fingerprints in constant time (core's comparison).
    public func constantTimeEquals(_ other: Fingerprint) -> Bool {
        // Both texts were validated by core when the values were made.
        (try? fingerprintsEqual(a: text, b: other.text)) ?? false
    }

    /// Encodes the text form.
    public func encode(to encoder: Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(text)
    }

    /// Decodes and validates the text form.
    public init(from decoder: Decoder) throws {
        let container = try decoder.singleValueContainer()
        let text = try container.decode(String.self)
        do {
            try self.init(parsing: text)
        } catch {
            throw DecodingError.dataCorruptedError(in: container, debugDescription: "invalid fingerprint: \(error)")
        }
    }
}
