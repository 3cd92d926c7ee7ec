import BoxkeyCore
import FoundationEssentials
import Glibc

/// A `boxkey login` in the foreground keeps its presence link in its own process. Every other
/// `boxkey` of this user that would act on that box (`lock`, `logout`, `status`, a new `login`)
/// goes through it, on `$XDG_RUNTIME_DIR/boxkey/presence-<box>.sock` (0600, this user only, the
/// agent's wire format): a second link from the same phone would be taken by the box as this
/// phone's link, and push the presence link aside.
public enum PresenceHolder {
    /// What `status` shows of a foreground holder.
    public struct Status: Codable, Sendable, Equatable {
        public var box: String
        public var pid: Int32
        public var connected: Bool
    }

    /// Serves `presence`'s socket until cancelled. `say` prints to the holder's terminal what
    /// another command had it do; `answered` is told when the answer to a lock or logout is out
    /// (the link ends with the action, and the holder must not end before its answer is sent).
    public static func serve(_ presence: PresenceLink, dirs: PhoneDirectories, say: @escaping @Sendable (String) -> Void,
                             answered: @escaping @Sendable () -> Void = {}) async throws {
        do { try dirs.ensureRuntime() } catch { throw PhoneFailure(.failure, "\(error)") }
        let path = dirs.presenceSocket(presence.box)
        // A socket left at the path is a crashed holder's, or one whose link this login's link
        // replaced at the box: either way it holds no link to this box any more.
        let socket = try await UserSocket.bind(path, log: { _ in })
        defer { socket.unlinkIfOurs() }
        try await socket.serve({ request, reply in
            await handle(request, presence: presence, say: say, reply: reply)
        }, answered: { request in
            if case .act = request { answered() }
        })
    }

    static func handle(_ request: AgentRequest, presence: PresenceLink, say: @escaping @Sendable (String) -> Void,
                       reply: @escaping @Sendable (AgentReply) -> Void) async {
        let box = presence.box
        switch request {
        case .status:
            let status = Status(box: box.description, pid: getpid(), connected: presence.isConnected)
            reply(.result(.success, message: tr("presence link to box {box} held by boxkey login (pid {pid})", ("box", box), ("pid", getpid())),
                          details: Agent.json(status)))
        case .act(let action, let asked) where asked == nil || asked == box:
            let result = await withCheckedContinuation { (c: CheckedContinuation<Result<Void, PhoneFailure>?, Never>) in
                presence.act(action) { c.resume(returning: $0) }
            }
            switch result {
            case .success?:
                let sentence = action == .lock ? tr("Locked your session on box {box}.", ("box", box)) : tr("Logged out of box {box}.", ("box", box))
                say(sentence)
                reply(.result(.success, message: sentence, details: ""))
            case .failure(let f)?:
                say(f.message)
                reply(.result(f.outcome, message: f.message, details: ""))
            case nil:
                // Lost while looking for the box again: the asker uses a link of its own.
                reply(.result(.agentUnavailable, message: tr("the presence link to box {box} is being found again", ("box", box)), details: ""))
            }
        case .stop:
            // Another login to this box takes the presence link over: this one leaves without
            // a walk-away, so the box does not act on the session.
            presence.leave(detach: true)
            say(tr("Another boxkey login took the presence link to box {box} over.", ("box", box)))
            reply(.result(.success, message: "", details: ""))
        default:
            reply(.result(.failure, message: tr("boxkey login (pid {pid}) holds only the presence link to box {box}: it takes lock, logout and status", ("pid", getpid()), ("box", box)),
                          details: ""))
        }
    }

    /// The foreground holder of the presence link to `box`, if one answers.
    public static func client(_ dirs: PhoneDirectories, box: BoxID) -> AgentClient? {
        AgentClient(path: dirs.presenceSocket(box))
    }
}
