import Foundation
import IdempoBindings

/// The `Idempotency-Key` of one user intent (one "Pay" tap), validated by idempo's core.
///
/// There is deliberately no public `init()`: a key is either generated fresh for a new intent
/// (``generate()``), read back from a value you audited (``init(validating:options:)``, e.g. a key
/// you stored), or parsed from a header (``init(headerValue:options:)``). Reuse the same key for
/// every retry of that intent, including after an app restart (see ``PendingKeyStore``); use a
/// new key only for a new intent.
///
/// `description` shows only the length so keys do not end up in logs by accident; ``text`` is
/// the key itself and ``headerValue`` the form to send.
public struct IdempotencyKey: Sendable, Hashable, Codable, CustomStringConvertible {
    /// The key text (decoded: no quotes, no escapes).
    public let text: String
    /// The value to send in the `Idempotency-Key` header: the draft's sf-string form (`"..."`,
    /// with `\` and `"` escaped), as core writes it.
    public let headerValue: String

    /// Wraps text that core has just validated or generated, and asks core for its header form.
    private init(checked text: String) throws {
        self.text = text
        self.headerValue = try callFFI(KeyError.self, IdempotencyKeyError.init) { try keyHeaderValue(key: text) }
    }

    /// Length bounds and strictness for validating and parsing keys.
    public struct Options: Sendable, Hashable {
        /// Shortest accepted key, in characters (at least 1).
        public var minimumLength: Int
        /// Longest accepted key, in characters (at most 255).
        public var maximumLength: Int
        /// Accept only the draft's quoted sf-string form when parsing a header.
        public var strict: Bool

        /// Options with explicit bounds; checked by core when used.
        public init(minimumLength: Int, maximumLength: Int, strict: Bool = false) {
            self.minimumLength = minimumLength
            self.maximumLength = maximumLength
            self.strict = strict
        }

        /// Core's defaults: 8 to 128 characters, both header forms accepted.
        public static let standard: Options = {
            let o = defaultKeyOptions()
            return Options(minimumLength: Int(o.minLen), maximumLength: Int(o.maxLen), strict: o.strict)
        }()

        /// Any well-formed key of 1 to 255 characters (used to read back stored keys).
        public static let anyLength = Options(minimumLength: 1, maximumLength: 255)

        var ffi: KeyOptions {
            // Out-of-range values are clamped into UInt32 and then refused by core's checks.
            KeyOptions(minLen: UInt32(clamping: minimumLength), maxLen: UInt32(clamping: maximumLength), strict: strict)
        }
    }

    /// How a parsed header value was written.
    public enum Form: Sendable, Hashable, CaseIterable {
        /// The draft's quoted form (an RFC 9651 sf-string, possibly with ignored parameters).
        case quoted
        /// The bare form most clients send (unquoted printable ASCII without space, `"` or `,`).
        case bare
        /// Already-decoded key text (no header form).
        case text

        init(_ ffi: KeyForm) {
            switch ffi {
            case .sfString: self = .quoted
            case .bare: self = .bare
            case .text: self = .text
            }
        }
    }

    /// A fresh key for a new intent: core's UUIDv4 shape from 16 bytes of the system CSPRNG.
    public static func generate() -> IdempotencyKey {
        var generator = SystemRandomNumberGenerator()
        return generate(using: &generator)
    }

    /// A fresh key from `generator` (use a cryptographically secure one outside tests).
    public static func generate<G: RandomNumberGenerator>(using generator: inout G) -> IdempotencyKey {
        var entropy = Data(capacity: 16)
        for _ in 0..<2 {
            withUnsafeBytes(of: generator.next().littleEndian) { entropy.append(contentsOf: $0) }
        }
        do {
            return try generate(entropy: entropy)
        } catch {
            // Core accepts any 16 bytes and its keys always have a header form: reaching this
            // means the linked library breaks its contract.
            fatalError("idempo core refused 16 bytes of entropy: \(error)")
        }
    }

    /// A key from exactly 16 bytes of entropy you supply.
    ///
    /// - Throws: ``IdempotencyKeyError/invalidEntropy(length:)`` unless `entropy` has 16 bytes.
    public static func generate(entropy: Data) throws -> IdempotencyKey {
        try IdempotencyKey(checked: try callFFI(KeyError.self, IdempotencyKeyError.init) { try generateKey(entropy: entropy) })
    }

    /// Validates already-decoded key text you audited (e.g. read back from storage).
    ///
    /// - Throws: ``IdempotencyKeyError`` for a character outside printable ASCII or a length
    ///   outside `options`.
    public init(validating text: String, options: Options = .standard) throws {
        try self.init(checked: try callFFI(KeyError.self, IdempotencyKeyError.init) {
            try validateKeyText(text: text, options: options.ffi)
        })
    }

    /// Parses an `Idempotency-Key` header value (quoted sf-string or bare form).
    ///
    /// - Throws: ``IdempotencyKeyError`` describing the first problem.
    public init(headerValue: String, options: Options = .standard) throws {
        self = try Self.parse(headerValue: Data(headerValue.utf8), options: options).key
    }

    /// Parses a raw header value and also reports its form and ignored parameters.
    ///
    /// - Throws: ``IdempotencyKeyError`` describing the first problem.
    public static func parse(headerValue: Data, options: Options = .standard) throws
        -> (key: IdempotencyKey, form: Form, ignoredParameters: Int)
    {
        let parsed = try callFFI(KeyError.self, IdempotencyKeyError.init) {
            try parseKeyBytes(headerValue: headerValue, options: options.ffi)
        }
        return (try IdempotencyKey(checked: parsed.key), Form(parsed.form), Int(parsed.ignoredParameters))
    }

    /// `IdempotencyKey(<n> chars)`: the text stays out of logs.
    public var description: String { "IdempotencyKey(\(text.utf8.count) chars)" }

    /// Encodes the key text as a single string.
    public func encode(to encoder: Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(text)
    }

    /// Decodes and re-validates a key text (1 to 255 printable ASCII characters).
    public init(from decoder: Decoder) throws {
        let container = try decoder.singleValueContainer()
        let text = try container.decode(String.self)
        do {
            try self.init(validating: text, options: .anyLength)
        } catch {
            throw DecodingError.dataCorruptedError(
                in: container, debugDescription: "invalid idempotency key: \(error)")
        }
    }
}

/// The 32-byte identity of a stored record: SHA-256 over core's framing of (principal, method,
/// route template, key). Servers compute it; clients rarely need it except to correlate logs.
public struct ScopeID: Sendable, Hashable, CustomStringConvertible {
    /// 64 lowercase hex characters.
    public let hex: String

    /// The scope of `key` for `principal` (`""` for none), `method` and route template.
    public init(principal: String, method: String, route: String, key: IdempotencyKey) {
        hex = scopeIdHex(principal: principal, method: method, route: route, key: key.text)
    }

    /// The scope of an unvalidated key text (for tools and cross-implementation checks).
    public init(principal: String, method: String, route: String, keyText: String) {
        hex = scopeIdHex(principal: principal, method: method, route: route, key: keyText)
    }

    /// The hex form.
    public var description: String { hex }
}
