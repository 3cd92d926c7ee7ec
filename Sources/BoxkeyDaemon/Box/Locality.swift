import BoxkeyCore
import BoxkeyPAMWire

/// Which prompts are local enough for phone login (a phone near the box cannot vouch for
/// someone elsewhere). Decided from what logind says of the asking process, never from what
/// it says of itself, except for the terminal of a process logind has no session for (a
/// display manager's worker or getty's `login`, both root, before their session exists).
enum Locality {
    static func refusal(_ r: PAMRequest.WaitRequest, owner: LoginSession?) -> String? {
        if let owner {
            guard owner.isLocal else { return "the asking process is in \(owner.remote ? "a remote session" : "a session on no seat")" }
            if !r.remoteHost.isEmpty, !PAMWire.loopbackHosts.contains(r.remoteHost) { return "remote login from \(logSafe(r.remoteHost))" }
            if owner.sessionClass != "greeter", !r.expectedUser.isEmpty, owner.user != r.expectedUser {
                return "a prompt for \(logSafe(r.expectedUser)) inside \(logSafe(owner.user))'s session"
            }
            return nil
        }
        if !r.remoteHost.isEmpty { return "remote login from \(logSafe(r.remoteHost)) with no local session" }
        if isLocalTerminal(r.tty) || isLocalDisplay(r.display) || isLocalDisplay(r.tty) { return nil }
        return "not a local session (no logind session; terminal \"\(logSafe(r.tty))\")"
    }

    /// A virtual console: tty1 ... tty63 (with or without /dev/).
    static func isLocalTerminal(_ tty: String) -> Bool {
        let name = tty.hasPrefix("/dev/") ? String(tty.dropFirst(5)) : tty
        guard name.hasPrefix("tty"), let n = Int(name.dropFirst(3)) else { return false }
        return (1...63).contains(n)
    }

    /// A local X display: ":0", ":1.0" (a host part means a network display).
    static func isLocalDisplay(_ display: String) -> Bool {
        guard display.hasPrefix(":") else { return false }
        return display.dropFirst().allSatisfy { $0.isNumber || $0 == "." } && display.count > 1
    }
}

