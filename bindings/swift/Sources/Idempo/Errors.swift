import IdempoBindings

/// Why a value was refused as an idempotency key, or key options were refused.
///
/// Wraps the FFI's `KeyError`; `code` is core's stable snake_case code (the same in every
/// idempo binding and in `spec/vectors/key`).
public enum IdempotencyKeyError: Error, Sendable, Hashable, CustomStringConvertible {
    /// Not a well-formed key: empty, a character outside printable ASCII (or, in the bare
    /// form, a space, `"` or `,`), bad quoting or parameters, or the bare form in strict mode.
    case malformed(code: String, offset: Int?, message: String)
    /// Shorter than the minimum length.
    case tooShort(length: Int, minimum: Int, message: String)
    /// Longer than the maximum length.
    case tooLong(length: Int, maximum: Int, message: String)
    /// The ``IdempotencyKey/Options`` are out of range.
    case invalidOptions(code: String, message: String)
    /// Key generation was given entropy that is not exactly 16 bytes.
    case invalidEntropy(length: Int)

    /// Core's stable snake_case code, e.g. `invalid_character` or `too_short`.
    public var code: String {
        switch self {
        case .malformed(let code, _, _), .invalidOptions(let code, _): return code
        case .tooShort: return "too_short"
        case .tooLong: return "too_long"
        case .invalidEntropy: return "invalid_entropy"
        }
    }

    /// Core's message (input shown only as an escaped, truncated preview).
    public var description: String {
        switch self {
        case .malformed(_, _, let message), .tooShort(_, _, let message),
            .tooLong(_, _, let message), .invalidOptions(_, let message):
            return message
        case .invalidEntropy(let length):
            return "a key needs exactly 16 bytes of entropy, got \(length)"
        }
    }

    init(_ ffi: IdempoBindings.KeyError) {
        switch ffi {
        case .Malformed(let code, let message, let offset):
            self = .malformed(code: code, offset: offset.map(Int.init(clamping:)), message: message)
        case .TooShort(let len, let min, let message):
            self = .tooShort(length: Int(clamping: len), minimum: Int(clamping: min), message: message)
        case .TooLong(let len, let max, let message):
            self = .tooLong(length: Int(clamping: len), maximum: Int(clamping: max), message: message)
        case .InvalidOptions(let code, let message):
            self = .invalidOptions(code: code, message: message)
        case .InvalidEntropy(let len):
            self = .invalidEntropy(length: Int(clamping: len))
        }
    }
}

/// A JSON text that core refused to canonicalize (wraps the FFI's `CanonicalError`).
public enum CanonicalJSONError: Error, Sendable, Hashable, CustomStringConvertible {
    /// Not acceptable JSON: syntax, encoding, duplicate member names, numbers.
    case invalidJSON(code: String, message: String, offset: Int, pointer: String?)
    /// A configured limit (size, depth, members per object) was exceeded.
    case limitExceeded(code: String, message: String, offset: Int, limit: Int, pointer: String?)
    /// An exclusion pointer is malformed, the root pointer, or one too many.
    case invalidPointer(code: String, message: String)

    /// Core's stable snake_case code, e.g. `duplicate_member` or `depth_limit`.
    public var code: String {
        switch self {
        case .invalidJSON(let code, _, _, _), .limitExceeded(let code, _, _, _, _), .invalidPointer(let code, _):
            return code
        }
    }

    /// Core's message.
    public var description: String {
        switch self {
        case .invalidJSON(_, let message, _, _), .limitExceeded(_, let message, _, _, _), .invalidPointer(_, let message):
            return message
        }
    }

    init(_ ffi: IdempoBindings.CanonicalError) {
        switch ffi {
        case .InvalidJson(let code, let message, let offset, let pointer):
            self = .invalidJSON(code: code, message: message, offset: Int(clamping: offset), pointer: pointer)
        case .LimitExceeded(let code, let message, let offset, let limit, let pointer):
            self = .limitExceeded(
                code: code, message: message, offset: Int(clamping: offset), limit: Int(clamping: limit), pointer: pointer)
        case .InvalidPointer(let code, let message):
            self = .invalidPointer(code: code, message: message)
        }
    }
}

/// Why a fingerprint could not be computed or read (wraps the FFI's `FingerprintError`).
public enum FingerprintError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The body is declared JSON but core refuses it (syntax, duplicates, precision loss, limits).
    case invalidBody(code: String, message: String, offset: Int, pointer: String?)
    /// The configuration is unusable (bad exclusion pointer, empty HMAC key, bad header name).
    case invalidConfiguration(code: String, message: String)
    /// A text is not `v1:`/`h1:` followed by 64 lowercase hex characters.
    case invalidFingerprint(code: String, message: String)

    /// Core's stable snake_case code.
    public var code: String {
        switch self {
        case .invalidBody(let code, _, _, _), .invalidConfiguration(let code, _), .invalidFingerprint(let code, _):
            return code
        }
    }

    /// Core's message.
    public var description: String {
        switch self {
        case .invalidBody(_, let message, _, _), .invalidConfiguration(_, let message),
            .invalidFingerprint(_, let message):
            return message
        }
    }

    init(_ ffi: IdempoBindings.FingerprintError) {
        switch ffi {
        case .InvalidBody(let code, let message, let offset, let pointer):
            self = .invalidBody(code: code, message: message, offset: Int(clamping: offset), pointer: pointer)
        case .InvalidConfig(let code, let message):
            self = .invalidConfiguration(code: code, message: message)
        case .InvalidFingerprint(let code, let message):
            self = .invalidFingerprint(code: code, message: message)
        }
    }
}

/// A retry policy or decision input that core refused (wraps the FFI's `RetryError`).
public enum RetryPolicyError: Error, Sendable, Hashable, CustomStringConvertible {
    /// A policy number is out of range (`zero_attempts`, `base_above_max`, ...).
    case invalidConfiguration(code: String, message: String)
    /// A decision input is out of its domain (`zero_attempt`, `invalid_jitter`, `invalid_status`).
    case invalidInput(code: String, message: String)

    /// Core's stable snake_case code.
    public var code: String {
        switch self {
        case .invalidConfiguration(let code, _), .invalidInput(let code, _): return code
        }
    }

    /// Core's message.
    public var description: String {
        switch self {
        case .invalidConfiguration(_, let message), .invalidInput(_, let message): return message
        }
    }

    init(_ ffi: IdempoBindings.RetryError) {
        switch ffi {
        case .InvalidConfig(let code, let message): self = .invalidConfiguration(code: code, message: message)
        case .InvalidInput(let code, let message): self = .invalidInput(code: code, message: message)
        }
    }

    /// From whatever a uniffi call threw: core's typed error, or (a bug in the linked library)
    /// anything else, reported as `ffi_internal`.
    init(ffiError error: any Error) {
        if let e = error as? RetryPolicyError {
            self = e
        } else if let e = error as? IdempoBindings.RetryError {
            self.init(e)
        } else {
            self = .invalidInput(code: "ffi_internal", message: "\(error)")
        }
    }
}

/// Runs an FFI call and converts its typed error into the Swift error `wrap` builds. Any other
/// error (a uniffi internal error, which signals a bug) propagates unchanged.
@inline(__always)
func callFFI<T, F: Error, S: Error>(_ errorType: F.Type, _ wrap: (F) -> S, _ body: () throws -> T) throws -> T {
    do {
        return try body()
    } catch let error as F {
        throw wrap(error)
    }
}
