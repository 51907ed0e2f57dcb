import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import IdempoBindings

/// The pending record of one intent: its key, the request the key was minted for, and when.
///
/// A ``PendingKeyStore`` keeps one per intent from the first attempt until the intent is settled
/// (a definitive answer), so every retry, second tap and relaunch sends the same key, and a
/// changed request under the intent is refused instead of becoming a second charge
/// (`spec/KEYS.md` §3.6).
public struct PendingIntent: Sendable, Hashable, Codable {
    /// The key sent with every attempt of the intent.
    public let key: IdempotencyKey
    /// Core's fingerprint of the request the key was minted for (method, URL, content type and
    /// canonical body; see ``requestFingerprint(of:)``).
    public let fingerprint: Fingerprint
    /// When the record was created.
    public let createdAt: Date

    /// A record from its parts (stores that persist records rebuild them with this).
    public init(key: IdempotencyKey, fingerprint: Fingerprint, createdAt: Date) {
        self.key = key
        self.fingerprint = fingerprint
        self.createdAt = createdAt
    }

    /// The fingerprint that binds `request` to an intent's key: core's v1 fingerprint of the
    /// method, the full URL, the `Content-Type` and the body (JSON bodies canonically, so member
    /// order and whitespace do not matter). Headers do not take part.
    ///
    /// - Throws: only ``FingerprintError``: `invalidBody` for a body declared JSON that core
    ///   refuses.
    public static func requestFingerprint(of request: URLRequest) throws -> Fingerprint {
        try bind(request)
    }

    static func bind(_ request: URLRequest) throws(FingerprintError) -> Fingerprint {
        let text: String
        do {
            text = try intentRequestFingerprint(
                method: request.httpMethod ?? "GET", target: request.url?.absoluteString ?? "",
                contentType: request.value(forHTTPHeaderField: "Content-Type"), body: request.httpBody ?? Data())
        } catch let error as IdempoBindings.FingerprintError {
            throw FingerprintError(error)
        } catch {
            throw FingerprintError.invalidConfiguration(code: "ffi_internal", message: "\(error)")
        }
        do {
            return try Fingerprint(parsing: text)
        } catch {
            throw FingerprintError.invalidFingerprint(code: "ffi_internal", message: "\(error)")
        }
    }

    var ffi: PendingIntentRecord {
        PendingIntentRecord(
            key: key.text, fingerprint: fingerprint.text,
            createdMs: UInt64(clamping: Int64((createdAt.timeIntervalSince1970 * 1000).rounded(.down))))
    }
}

/// Core's answer for a send under an intent.
enum IntentSend: Sendable {
    case mint, reuse, changedWhilePending, keyDiffersFromPending

    /// Core's `decide_send` for `pending`, this request's fingerprint and an explicit key.
    static func decide(pending: PendingIntent?, request: Fingerprint, explicitKey: IdempotencyKey?) throws
        -> IntentSend
    {
        switch try intentDecideSend(pending: pending?.ffi, requestFingerprint: request.text, explicitKey: explicitKey?.text) {
        case .mint: return .mint
        case .reuse: return .reuse
        case .changedWhilePending: return .changedWhilePending
        case .keyDiffersFromPending: return .keyDiffersFromPending
        }
    }
}
