import IdempoBindings

// Hand-written Swift forms of core's enumerations. The uniffi-generated types stay internal to
// this module (IdempoBindings is not a product); each type here converts to and from its
// generated twin, and its `code` is core's stable snake_case name.

/// How a random sample spreads the retry backoff.
public enum JitterMode: Sendable, Hashable, CaseIterable, CustomStringConvertible {
    /// At least half the backoff, the rest random (the default: no herd of instant retries).
    case equal
    /// Anywhere between zero and the backoff (spreads load most; may retry at once).
    case full

    init(_ ffi: IdempoBindings.Jitter) {
        switch ffi {
        case .equal: self = .equal
        case .full: self = .full
        }
    }

    var ffi: IdempoBindings.Jitter {
        switch self {
        case .equal: return .equal
        case .full: return .full
        }
    }

    /// `equal` or `full`.
    public var description: String { self == .equal ? "equal" : "full" }
}

/// How JSON number literals that a double cannot hold exactly are treated.
public enum NumberMode: Sendable, Hashable, CaseIterable, CustomStringConvertible {
    /// RFC 8785: round to the nearest double.
    case rfc
    /// Refuse a literal that rounding would change (so two amounts never share a fingerprint).
    case rejectPrecisionLoss

    init(_ ffi: IdempoBindings.NumberMode) {
        switch ffi {
        case .rfc: self = .rfc
        case .rejectPrecisionLoss: self = .rejectPrecisionLoss
        }
    }

    var ffi: IdempoBindings.NumberMode {
        switch self {
        case .rfc: return .rfc
        case .rejectPrecisionLoss: return .rejectPrecisionLoss
        }
    }

    /// `rfc` or `reject_precision_loss`.
    public var description: String { self == .rfc ? "rfc" : "reject_precision_loss" }
}

/// What happened to one attempt, as the client saw it.
public enum AttemptOutcome: Sendable, Hashable {
    /// The application's answer (any status; idempo's own problems are the cases below).
    case response(status: Int, retryAfterMilliseconds: UInt64?)
    /// No response within the attempt's timeout (the request may have run).
    case timeout
    /// The connection failed or broke (the request may have run).
    case connectionError
    /// idempo's 500 outcome-unknown problem: an earlier attempt may have taken effect.
    case outcomeUnknown
    /// idempo's 422 key-reused problem: the key belongs to another request.
    case keyReused
    /// idempo's 409 in-flight problem: the first attempt with this key is still running.
    case inFlight(retryAfterMilliseconds: UInt64?)
    /// idempo's 500 response-not-retained problem: it ran, but its answer was too large to keep.
    case responseNotRetained

    init(_ ffi: IdempoBindings.AttemptOutcome) {
        switch ffi {
        case .response(let status, let retryAfter):
            self = .response(status: Int(status), retryAfterMilliseconds: retryAfter)
        case .timeout: self = .timeout
        case .connectionError: self = .connectionError
        case .outcomeUnknown: self = .outcomeUnknown
        case .keyReused: self = .keyReused
        case .inFlight(let retryAfter): self = .inFlight(retryAfterMilliseconds: retryAfter)
        case .responseNotRetained: self = .responseNotRetained
        }
    }

    var ffi: IdempoBindings.AttemptOutcome {
        switch self {
        case .response(let status, let retryAfter):
            // Out-of-range statuses clamp to 0 or 65535, which core refuses (invalid_status).
            return .response(status: UInt16(clamping: status), retryAfterMs: retryAfter)
        case .timeout: return .timeout
        case .connectionError: return .connectionError
        case .outcomeUnknown: return .outcomeUnknown
        case .keyReused: return .keyReused
        case .inFlight(let retryAfter): return .inFlight(retryAfterMs: retryAfter)
        case .responseNotRetained: return .responseNotRetained
        }
    }
}

/// Why the client stopped retrying.
public enum StopReason: Sendable, Hashable, CustomStringConvertible {
    /// A 2xx (a replay of an earlier success too).
    case success
    /// A 3xx.
    case redirection
    /// A 1xx as a final status.
    case informational
    /// idempo's 422 key-reused problem: the key was used with a different request.
    case keyReusedWithDifferentRequest
    /// Another 4xx: the application's answer (its own 409 or 422 included), not retried.
    case clientError(status: Int)
    /// A 5xx that says a repeat cannot succeed (501, 505, 506, 508, 510, 511).
    case serverErrorNotRetryable(status: Int)
    /// Every attempt the policy allows was made.
    case attemptsExhausted
    /// The next attempt would start after the policy's time budget.
    case timeBudgetExhausted
    /// The server's `Retry-After` is longer than the remaining budget.
    case retryAfterBeyondBudget
    /// idempo's outcome-unknown problem: reconcile before any new key.
    case outcomeUnknown
    /// idempo's response-not-retained problem: it ran; look the resource up.
    case responseNotRetained

    init(_ ffi: IdempoBindings.StopReason) {
        switch ffi {
        case .success: self = .success
        case .redirection: self = .redirection
        case .informational: self = .informational
        case .keyReusedWithDifferentRequest: self = .keyReusedWithDifferentRequest
        case .clientError(let status): self = .clientError(status: Int(status))
        case .serverErrorNotRetryable(let status): self = .serverErrorNotRetryable(status: Int(status))
        case .attemptsExhausted: self = .attemptsExhausted
        case .timeBudgetExhausted: self = .timeBudgetExhausted
        case .retryAfterBeyondBudget: self = .retryAfterBeyondBudget
        case .outcomeUnknown: self = .outcomeUnknown
        case .responseNotRetained: self = .responseNotRetained
        }
    }

    var ffi: IdempoBindings.StopReason {
        switch self {
        case .success: return .success
        case .redirection: return .redirection
        case .informational: return .informational
        case .keyReusedWithDifferentRequest: return .keyReusedWithDifferentRequest
        case .clientError(let status): return .clientError(status: UInt16(clamping: status))
        case .serverErrorNotRetryable(let status): return .serverErrorNotRetryable(status: UInt16(clamping: status))
        case .attemptsExhausted: return .attemptsExhausted
        case .timeBudgetExhausted: return .timeBudgetExhausted
        case .retryAfterBeyondBudget: return .retryAfterBeyondBudget
        case .outcomeUnknown: return .outcomeUnknown
        case .responseNotRetained: return .responseNotRetained
        }
    }

    /// Core's stable snake_case code, e.g. `key_reused_with_different_request`.
    public var code: String { stopReasonCode(reason: ffi) }

    /// Whether this stop settles an intent (its pending key is removed) or leaves the key
    /// pending (core's rule, `spec/KEYS.md` §3.6).
    public var settlesIntent: Bool { stopReasonSettlesIntent(reason: ffi) }

    /// The code, with the status for `client_error` and `server_error_not_retryable`.
    public var description: String {
        switch self {
        case .clientError(let status), .serverErrorNotRetryable(let status): return "\(code)(\(status))"
        default: return code
        }
    }
}

/// What to do after an attempt.
public enum RetryDecision: Sendable, Hashable {
    /// Wait this many milliseconds, then send the same request with the same key.
    case retry(delayMilliseconds: UInt64)
    /// Do not retry.
    case stop(reason: StopReason)

    init(_ ffi: IdempoBindings.RetryDecision) {
        switch ffi {
        case .retry(let delay): self = .retry(delayMilliseconds: delay)
        case .stop(let reason): self = .stop(reason: StopReason(reason))
        }
    }
}
