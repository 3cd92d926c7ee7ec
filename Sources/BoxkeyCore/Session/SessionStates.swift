/// Which application message is legal in which state, on each side. These tables are the whole
/// session logic; `BoxConnection` and `PhoneConnection` add the crypto and the envelopes.
///
/// Box:
///
///     awaitingHandshake --msg 1 ok--> awaitingCommand
///     awaitingHandshake --pairing msg 1 ok--> awaitingPairConfirm --pair--> acting(pair) --any--> closed
///     awaitingCommand --credentialPush--> verifying --accepted--> present
///                                                   --otherwise--> closed
///     verifying --withdraw--> verifying (answered: withdrawn, or the verdict if Enter came first)
///     awaitingCommand --offer--> offering --intent (box)--> awaitingCommand (then the push)
///                                         --loginResult (box refuses)--> closed
///     awaitingCommand --lock | logout | attach--> acting(action)
///     present --lock | logout--> acting(action, guarding)
///     acting(attach) --done--> present        acting(lock | logout) --any--> closed
///     acting(attach) --noSession | failed--> closed
///     acting(lock | logout, guarding) --done--> closed, --otherwise--> present (a session
///         that was not locked or ended stays guarded by the presence link it asked on)
///     present --keepalive--> present (box answers keepalive)
///     present --detach--> closed (the phone leaves on purpose: no walk-away action)
///     any --error, illegal message, timeout--> closed
///
/// One credential push per handshake: a second push is illegal in every state but
/// awaitingCommand, and the box never leaves verifying back to awaitingCommand.
public enum BoxSessionState: Equatable, Sendable {
    case awaitingHandshake
    /// A pairing handshake is done: only `pair` is legal (a pairing channel never pushes).
    case awaitingPairConfirm
    case awaitingCommand
    case verifying
    /// A proximity offer waits for the person's intent at the box.
    case offering
    /// `guarding`: asked on the presence link, which goes on guarding a session the action did
    /// not lock or end.
    case acting(ActionResult.Action, guarding: Bool = false)
    case present
    case closed

    /// The state after the phone's `message`, or nil if the message is illegal here.
    public func next(onPhone message: AppMessage.MessageType) -> BoxSessionState? {
        switch (self, message) {
        case (.awaitingPairConfirm, .pair): return .acting(.pair)
        case (.present, .lock): return .acting(.lock, guarding: true)
        case (.present, .logout): return .acting(.logout, guarding: true)
        case (.awaitingCommand, .credentialPush): return .verifying
        // The box answers with the login's result: `withdrawn` if the push still waited for
        // Enter, else the stack's verdict (Enter came first).
        case (.verifying, .withdraw): return .verifying
        case (.awaitingCommand, .offer): return .offering
        case (.awaitingCommand, .lock): return .acting(.lock)
        case (.awaitingCommand, .logout): return .acting(.logout)
        case (.awaitingCommand, .attach): return .acting(.attach)
        case (.present, .keepalive): return .present
        case (.present, .detach): return .closed
        case (_, .error) where self != .closed: return .closed
        default: return nil
        }
    }

    /// The state after the box has the outcome of a push.
    public func next(onLoginResult outcome: LoginResult.Outcome) -> BoxSessionState? {
        switch self {
        case .verifying: return outcome == .accepted ? .present : .closed
        case .offering: return outcome == .accepted ? nil : .closed   // an offer is only refused
        default: return nil
        }
    }

    /// The state after the box tells an offering phone the person asked (`intent`).
    public var onIntent: BoxSessionState? { self == .offering ? .awaitingCommand : nil }

    /// The state after the box has carried out a lock, logout or attach.
    public func next(onActionResult result: ActionResult) -> BoxSessionState? {
        guard case .acting(let action, let guarding) = self, action == result.action else { return nil }
        if action == .attach { return result.outcome == .done ? .present : .closed }
        return guarding && result.outcome != .done ? .present : .closed
    }
}

/// Phone:
///
///     idle --send msg 1--> awaitingHandshakeResponse --msg 2 ok--> ready
///     ready --credentialPush--> awaitingLoginResult --accepted--> present
///                                                    --otherwise--> closed
///     awaitingLoginResult --awaitingEnter--> awaitingLoginResult (the push waits for Enter)
///     awaitingLoginResult --withdraw--> awaitingLoginResult (Ctrl-C: take the push back)
///     ready --offer--> awaitingIntent --intent--> ready (then the push)
///                                     --loginResult (refused)--> closed
///     ready --lock | logout | attach--> awaitingActionResult(action)
///     present --lock | logout--> awaitingActionResult(action, guarding)
///     ready (after a pairing handshake) --pair--> awaitingActionResult(pair) --any--> closed
///     awaitingActionResult(attach) --done--> present
///     awaitingActionResult(lock | logout, guarding) --not done--> present
///     every other answer --> closed
///     present --keepalive (either way)--> present
///     present --detach--> closed
///     any --refusal, error, illegal message--> closed
public enum PhoneSessionState: Equatable, Sendable {
    case idle
    case awaitingHandshakeResponse
    case ready
    case awaitingLoginResult
    case awaitingIntent
    /// `guarding`: asked on the presence link (see `BoxSessionState.acting`).
    case awaitingActionResult(ActionResult.Action, guarding: Bool = false)
    case present
    case closed

    /// The state after the phone sends `message`, or nil if sending it here is illegal.
    public func next(onSend message: AppMessage.MessageType) -> PhoneSessionState? {
        switch (self, message) {
        case (.ready, .credentialPush): return .awaitingLoginResult
        case (.awaitingLoginResult, .withdraw): return .awaitingLoginResult
        case (.ready, .offer): return .awaitingIntent
        case (.ready, .lock): return .awaitingActionResult(.lock)
        case (.ready, .logout): return .awaitingActionResult(.logout)
        case (.present, .lock): return .awaitingActionResult(.lock, guarding: true)
        case (.present, .logout): return .awaitingActionResult(.logout, guarding: true)
        case (.ready, .attach): return .awaitingActionResult(.attach)
        case (.ready, .pair): return .awaitingActionResult(.pair)
        case (.present, .keepalive): return .present
        case (.present, .detach): return .closed
        case (_, .error) where self != .closed && self != .idle: return .closed
        default: return nil
        }
    }

    /// The state after the box's `message`, or nil if the box may not send it here.
    public func next(onBox message: AppMessage) -> PhoneSessionState? {
        switch (self, message) {
        case (.awaitingLoginResult, .loginResult(let r)): return r.outcome == .accepted ? .present : .closed
        case (.awaitingLoginResult, .awaitingEnter): return .awaitingLoginResult
        case (.awaitingIntent, .intent): return .ready
        case (.awaitingIntent, .loginResult): return .closed
        case (.awaitingActionResult(let a, let guarding), .actionResult(let r)) where r.action == a:
            if a == .attach { return r.outcome == .done ? .present : .closed }
            return guarding && r.outcome != .done ? .present : .closed
        // A keepalive answer may cross a lock or logout the phone just sent.
        case (.present, .keepalive), (.awaitingActionResult, .keepalive): return self
        case (_, .error) where self != .closed: return .closed
        default: return nil
        }
    }
}
