import CDBus
import Glibc
import NIOConcurrencyHelpers

/// What the connection asks of the bus daemon itself: signal subscriptions (match rules, and
/// the owners of the names they come from) and names.
extension DBusConnection {
    /// Signals matching `match`, from now on, in order. The match rule is on the bus before
    /// this returns, so nothing sent after it is missed.
    public func signals(_ match: SignalMatch) async throws -> AsyncStream<DBusMessage> {
        if let name = match.senderNeedsOwner { try await followOwner(of: name) }
        let (stream, continuation) = AsyncStream<DBusMessage>.makeStream(bufferingPolicy: .unbounded)
        let rule = match.rule
        let needsRule = state.withLockedValue { s -> Bool in
            s.matchRules[rule, default: 0] += 1
            return s.matchRules[rule] == 1
        }
        if needsRule {
            do {
                _ = try await call("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "AddMatch", [.string(rule)])
            } catch {
                state.withLockedValue { s in s.matchRules[rule]! -= 1; if s.matchRules[rule] == 0 { s.matchRules[rule] = nil } }
                throw error
            }
        }
        let id = state.withLockedValue { s -> UInt64 in
            s.nextSubscription += 1
            s.subscriptions[s.nextSubscription] = Subscription(match: match, continuation: continuation)
            return s.nextSubscription
        }
        continuation.onTermination = { [weak self] _ in
            guard let self else { return }
            let drop = self.state.withLockedValue { s -> Bool in
                s.subscriptions[id] = nil
                guard s.matchRules[rule] != nil else { return false }
                s.matchRules[rule]! -= 1
                if s.matchRules[rule] == 0 { s.matchRules[rule] = nil; return true }
                return false
            }
            if drop { self.send("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "RemoveMatch", [.string(rule)]) }
        }
        return stream
    }

    /// Keeps the owner of `name` known (for `SignalMatch.matches`): the bus's NameOwnerChanged
    /// for it, then GetNameOwner. Signals from a well-known name are taken only from its owner:
    /// any local client may address a signal to our connection, claiming to be bluetoothd or
    /// logind by its content (GLib had the same hole, CVE-2024-34397).
    private func followOwner(of name: String) async throws {
        // Followed from here on: a change the bus reports from now is recorded by the filter.
        let changes = state.withLockedValue { s -> Int? in
            guard s.owners[name] == nil else { return nil }
            let seen = s.ownerChanges[name] ?? 0
            s.ownerChanges[name] = seen
            return seen
        }
        guard let changes else { return }
        let rule = "type='signal',sender='\(SignalMatch.busName)',interface='org.freedesktop.DBus',member='NameOwnerChanged',arg0='\(name)'"
        _ = try await call("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "AddMatch", [.string(rule)])
        let owner: String
        do {
            owner = try await call("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "GetNameOwner", [.string(name)]).first?.string ?? ""
        } catch let e as BusError where e.name == "org.freedesktop.DBus.Error.NameHasNoOwner" {
            owner = ""
        }
        state.withLockedValue { s in
            // A change seen meanwhile (on this connection's thread) is newer than the reply.
            if s.ownerChanges[name, default: 0] == changes { s.owners[name] = owner } else if s.owners[name] == nil { s.owners[name] = "" }
        }
    }

    // MARK: Names

    /// Whether someone owns `name` now. Asked of the bus: a call to the name itself would
    /// D-Bus-activate its service (bluetoothd) when nobody does.
    public func nameHasOwner(_ name: String, timeout: Duration = .seconds(5)) async throws -> Bool {
        try await call("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "NameHasOwner",
                       [.string(name)], timeout: timeout).first?.bool == true
    }

    /// Asks the bus for a well-known name; fails if someone else has it.
    public func requestName(_ name: String) async throws {
        let reply = try await call("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "RequestName",
                                   [.string(name), .uint32(4 /* DO_NOT_QUEUE */)])
        guard let code = reply.first?.int, code == 1 || code == 4 else {
            throw BusError("org.freedesktop.DBus.Error.AccessDenied", "the name \(name) is taken")
        }
    }
}
