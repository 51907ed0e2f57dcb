import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Keeps the ``PendingIntent`` of each intent whose outcome is not yet known, so that a retry,
/// a second tap, or a relaunch after the app was killed sends the same key (and the server
/// replays instead of charging twice).
///
/// ``IdempotentClient`` gets or creates the record before the first attempt and removes it once
/// the server gave a definitive answer; it stays while the outcome is unknown (timeouts,
/// connectivity loss, retries exhausted, outcome unknown, cancellation).
///
/// Implement this protocol to keep records in the Keychain, Core Data, etc.;
/// ``FilePendingKeyStore`` is the file-backed default. The one rule:
/// ``pendingIntent(for:orCreate:)`` must be **atomic**: read and insert in one step (one actor
/// turn with no `await` between them, a transaction, a lock), so two callers, processes or app
/// launches cannot mint two keys for one intent.
public protocol PendingKeyStore: Sendable {
    /// The record of `intent`, if one is stored.
    func pendingIntent(for intent: String) async throws -> PendingIntent?
    /// The record of `intent`; when there is none, stores `candidate` and returns it. Atomic.
    func pendingIntent(for intent: String, orCreate candidate: PendingIntent) async throws -> PendingIntent
    /// Forgets the record of `intent` (no error if there is none).
    func removePendingIntent(for intent: String) async throws
}

extension PendingKeyStore {
    /// The pending key of `intent`, if one is stored.
    public func pendingKey(for intent: String) async throws -> IdempotencyKey? {
        try await pendingIntent(for: intent)?.key
    }
}

/// A ``PendingKeyStore`` in memory (records do not survive a restart; for tests and previews).
public actor InMemoryPendingKeyStore: PendingKeyStore {
    private var records: [String: PendingIntent] = [:]

    /// An empty store.
    public init() {}

    public func pendingIntent(for intent: String) -> PendingIntent? { records[intent] }

    public func pendingIntent(for intent: String, orCreate candidate: PendingIntent) -> PendingIntent {
        if let existing = records[intent] { return existing }
        records[intent] = candidate
        return candidate
    }

    public func removePendingIntent(for intent: String) { records[intent] = nil }
}

/// Why a ``FilePendingKeyStore`` could not read or write its file.
public enum PendingKeyStoreError: Error, Sendable, CustomStringConvertible {
    /// The file exists but is not a pending-key file of a supported version (it is left as is).
    case unreadable(path: String, reason: String)
    /// The file could not be written.
    case writeFailed(path: String, reason: String)
    /// The lock file beside it could not be opened or locked.
    case lockFailed(path: String, errno: Int32)

    public var description: String {
        switch self {
        case .unreadable(let path, let reason): return "cannot read pending keys from \(path): \(reason)"
        case .writeFailed(let path, let reason): return "cannot write pending keys to \(path): \(reason)"
        case .lockFailed(let path, let code): return "cannot lock \(path) (errno \(code))"
        }
    }
}

/// The default ``PendingKeyStore``: a small JSON file, rewritten atomically on every change.
///
/// Every operation takes an exclusive `flock` on `<file>.lock` and reads the file afresh, so two
/// store instances, two processes or an app and its extension sharing the file see one record
/// per intent: ``pendingIntent(for:orCreate:)`` is atomic across all of them. Put the file in
/// Application Support (or a shared app-group container), not Caches: losing it means a retry
/// after a restart uses a new key.
///
/// File format (version 2): `{"version":2,"pending":{"<intent>":{"key":"<key text>",
/// "fingerprint":"v1:…","createdAt":<unix s>}}}`.
public actor FilePendingKeyStore: PendingKeyStore {
    private struct Entry: Codable {
        var key: IdempotencyKey
        var fingerprint: Fingerprint
        var createdAt: Double

        init(_ record: PendingIntent) {
            key = record.key
            fingerprint = record.fingerprint
            createdAt = record.createdAt.timeIntervalSince1970
        }

        var record: PendingIntent {
            PendingIntent(key: key, fingerprint: fingerprint, createdAt: Date(timeIntervalSince1970: createdAt))
        }
    }

    private struct File: Codable {
        var version: Int
        var pending: [String: Entry]
    }

    private static let version = 2

    /// The file's location.
    public let fileURL: URL
    /// The lock file beside it (`<file>.lock`).
    public nonisolated var lockURL: URL { fileURL.appendingPathExtension("lock") }

    /// A store backed by `fileURL` (created, with its folder, on the first save).
    public init(fileURL: URL) {
        self.fileURL = fileURL
    }

    public func pendingIntent(for intent: String) throws -> PendingIntent? {
        try locked { try load()[intent]?.record }
    }

    public func pendingIntent(for intent: String, orCreate candidate: PendingIntent) throws -> PendingIntent {
        try locked {
            var entries = try load()
            if let existing = entries[intent] { return existing.record }
            entries[intent] = Entry(candidate)
            try write(entries)
            return candidate
        }
    }

    public func removePendingIntent(for intent: String) throws {
        try locked {
            var entries = try load()
            guard entries.removeValue(forKey: intent) != nil else { return }
            try write(entries)
        }
    }

    /// Every pending intent and its record (e.g. to reconcile them at launch).
    public func allPending() throws -> [String: PendingIntent] {
        try locked { try load().mapValues(\.record) }
    }

    /// Runs `body` holding the exclusive lock on ``lockURL``.
    private func locked<T>(_ body: () throws -> T) throws -> T {
        do {
            try FileManager.default.createDirectory(
                at: fileURL.deletingLastPathComponent(), withIntermediateDirectories: true)
        } catch {
            throw PendingKeyStoreError.writeFailed(path: fileURL.path, reason: "\(error)")
        }
        let fd = open(lockURL.path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw PendingKeyStoreError.lockFailed(path: lockURL.path, errno: errno) }
        defer { close(fd) }
        while flock(fd, LOCK_EX) != 0 {
            guard errno == EINTR else { throw PendingKeyStoreError.lockFailed(path: lockURL.path, errno: errno) }
        }
        defer { _ = flock(fd, LOCK_UN) }
        return try body()
    }

    private func load() throws -> [String: Entry] {
        guard FileManager.default.fileExists(atPath: fileURL.path) else { return [:] }
        let data: Data
        do {
            data = try Data(contentsOf: fileURL)
        } catch {
            throw PendingKeyStoreError.unreadable(path: fileURL.path, reason: "\(error)")
        }
        struct Version: Decodable { var version: Int }
        let file: File
        do {
            let version = try JSONDecoder().decode(Version.self, from: data).version
            guard version == Self.version else {
                throw PendingKeyStoreError.unreadable(
                    path: fileURL.path,
                    reason: "unsupported version \(version) (this version reads \(Self.version), whose records "
                        + "carry the request fingerprint)")
            }
            file = try JSONDecoder().decode(File.self, from: data)
        } catch let error as PendingKeyStoreError {
            throw error
        } catch {
            throw PendingKeyStoreError.unreadable(path: fileURL.path, reason: "\(error)")
        }
        return file.pending
    }

    private func write(_ entries: [String: Entry]) throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        do {
            let data = try encoder.encode(File(version: Self.version, pending: entries))
            try data.write(to: fileURL, options: .atomic)
        } catch {
            throw PendingKeyStoreError.writeFailed(path: fileURL.path, reason: "\(error)")
        }
    }
}
