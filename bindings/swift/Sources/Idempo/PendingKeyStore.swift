import Foundation

/// Remembers the key of each intent whose outcome is not yet known, so that a retry, even after
/// the app was killed and restarted, sends the same key (and the server replays instead of
/// charging twice).
///
/// ``IdempotentClient`` saves the key before the first attempt and removes it once the server
/// gave a definitive answer; it stays while the outcome is unknown (timeouts, connectivity loss,
/// retries exhausted, cancellation). Implement this protocol to keep keys in the Keychain, Core
/// Data, etc.; ``FilePendingKeyStore`` is the file-backed default.
public protocol PendingKeyStore: Sendable {
    /// The pending key of `intent`, if one is stored.
    func pendingKey(for intent: String) async throws -> IdempotencyKey?
    /// Stores `key` as the pending key of `intent`, replacing any previous one.
    func savePendingKey(_ key: IdempotencyKey, for intent: String) async throws
    /// Forgets the pending key of `intent` (no error if there is none).
    func removePendingKey(for intent: String) async throws
}

/// A ``PendingKeyStore`` in memory (keys do not survive a restart; for tests and previews).
public actor InMemoryPendingKeyStore: PendingKeyStore {
    private var keys: [String: IdempotencyKey] = [:]

    /// An empty store.
    public init() {}

    public func pendingKey(for intent: String) -> IdempotencyKey? { keys[intent] }
    public func savePendingKey(_ key: IdempotencyKey, for intent: String) { keys[intent] = key }
    public func removePendingKey(for intent: String) { keys[intent] = nil }
}

/// Why a ``FilePendingKeyStore`` could not read or write its file.
public enum PendingKeyStoreError: Error, Sendable, CustomStringConvertible {
    /// The file exists but is not a pending-key file of a supported version (it is left as is).
    case unreadable(path: String, reason: String)
    /// The file could not be written.
    case writeFailed(path: String, reason: String)

    public var description: String {
        switch self {
        case .unreadable(let path, let reason): return "cannot read pending keys from \(path): \(reason)"
        case .writeFailed(let path, let reason): return "cannot write pending keys to \(path): \(reason)"
        }
    }
}

/// The default ``PendingKeyStore``: a small JSON file, rewritten atomically on every change.
///
/// Use one instance per file (it is an actor, so calls on it are serialized). Put the file in
/// Application Support, not Caches: losing it means a retry after a restart uses a new key.
/// File format: `{"version":1,"pending":{"<intent>":{"key":"<key text>","savedAt":<unix s>}}}`.
public actor FilePendingKeyStore: PendingKeyStore {
    private struct Entry: Codable {
        var key: IdempotencyKey
        var savedAt: Double
    }

    private struct File: Codable {
        var version: Int
        var pending: [String: Entry]
    }

    private static let version = 1

    /// The file's location.
    public let fileURL: URL
    private var cache: [String: Entry]?

    /// A store backed by `fileURL` (created, with its folder, on the first save).
    public init(fileURL: URL) {
        self.fileURL = fileURL
    }

    public func pendingKey(for intent: String) throws -> IdempotencyKey? {
        try load()[intent]?.key
    }

    public func savePendingKey(_ key: IdempotencyKey, for intent: String) throws {
        var entries = try load()
        entries[intent] = Entry(key: key, savedAt: Date().timeIntervalSince1970)
        try write(entries)
    }

    public func removePendingKey(for intent: String) throws {
        var entries = try load()
        guard entries.removeValue(forKey: intent) != nil else { return }
        try write(entries)
    }

    /// Every pending intent and its key (e.g. to resume them at launch).
    public func allPending() throws -> [String: IdempotencyKey] {
        try load().mapValues(\.key)
    }

    private func load() throws -> [String: Entry] {
        if let cache { return cache }
        let data: Data
        do {
            data = try Data(contentsOf: fileURL)
        } catch let error as CocoaError where error.code == .fileReadNoSuchFile {
            cache = [:]
            return [:]
        } catch {
            if !FileManager.default.fileExists(atPath: fileURL.path) {
                cache = [:]
                return [:]
            }
            throw PendingKeyStoreError.unreadable(path: fileURL.path, reason: "\(error)")
        }
        let file: File
        do {
            file = try JSONDecoder().decode(File.self, from: data)
        } catch {
            throw PendingKeyStoreError.unreadable(path: fileURL.path, reason: "\(error)")
        }
        guard file.version == Self.version else {
            throw PendingKeyStoreError.unreadable(path: fileURL.path, reason: "unsupported version \(file.version)")
        }
        cache = file.pending
        return file.pending
    }

    private func write(_ entries: [String: Entry]) throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        do {
            let data = try encoder.encode(File(version: Self.version, pending: entries))
            try FileManager.default.createDirectory(
                at: fileURL.deletingLastPathComponent(), withIntermediateDirectories: true)
            try data.write(to: fileURL, options: .atomic)
        } catch {
            throw PendingKeyStoreError.writeFailed(path: fileURL.path, reason: "\(error)")
        }
        cache = entries
    }
}
