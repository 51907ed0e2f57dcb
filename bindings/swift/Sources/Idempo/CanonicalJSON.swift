import Foundation
import IdempoBindings

/// RFC 8785 (JCS) canonical JSON, computed by idempo's core: the same bytes as the server and
/// every other binding.
public enum CanonicalJSON {
    /// Input limits and number policy.
    public struct Options: Sendable, Hashable {
        /// Largest accepted input, in bytes.
        public var maxInputBytes: Int
        /// Deepest accepted nesting of arrays and objects.
        public var maxDepth: Int
        /// Most members accepted in one object.
        public var maxMembers: Int
        /// Number policy.
        public var numbers: NumberMode

        /// Options with explicit limits.
        public init(maxInputBytes: Int, maxDepth: Int, maxMembers: Int, numbers: NumberMode) {
            self.maxInputBytes = maxInputBytes
            self.maxDepth = maxDepth
            self.maxMembers = maxMembers
            self.numbers = numbers
        }

        /// Core's defaults: 8 MiB, depth 128, 100,000 members, RFC 8785 number rounding.
        public static let standard: Options = {
            let o = defaultCanonicalOptions()
            return Options(
                maxInputBytes: Int(clamping: o.maxInputBytes), maxDepth: Int(clamping: o.maxDepth),
                maxMembers: Int(clamping: o.maxMembers), numbers: NumberMode(o.numbers))
        }()

        var ffi: CanonicalOptions {
            CanonicalOptions(
                maxInputBytes: UInt64(clamping: maxInputBytes), maxDepth: UInt64(clamping: maxDepth),
                maxMembers: UInt64(clamping: maxMembers), numbers: numbers.ffi)
        }
    }

    /// The canonical form of a JSON text, optionally leaving out the values at the RFC 6901
    /// pointers in `excluding` (they are still validated), as the fingerprint's `exclude` does.
    ///
    /// - Throws: ``CanonicalJSONError`` for any text core refuses, a limit exceeded or a bad
    ///   pointer.
    public static func canonicalize(_ json: Data, options: Options = .standard, excluding: [String] = []) throws
        -> Data
    {
        try callFFI(CanonicalError.self, CanonicalJSONError.init) {
            if excluding.isEmpty {
                return try canonicalizeWith(json: json, options: options.ffi)
            }
            return try canonicalizeExcluding(json: json, options: options.ffi, exclude: excluding)
        }
    }
}
