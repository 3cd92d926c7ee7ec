import BoxkeyCore
import FoundationEssentials
import Glibc

/// A `boxkey login` in the foreground keeps its presence link in its own process. Every other
/// `boxkey` of this user that would act on that box (`lock`, `logout`, `status`, a new `login`)
/// goes through it, on `$XDG_RUNTIME_DIR/boxkey/presence-<box>.sock` (0600, this user only, the
/// agent's wire format): a second link from the same phone would be taken by the box as this
/// phone's link, and push the presence link aside.
public final class PresenceHolder: Sendable {
    /// What `status` shows of a foreground holder.
    public struct Status: Codable, Sendable, Equatable {
        public var box: String
        public var pid: Int32
        public var connected: Bool
    }

    private let socket: UserSocket
    private let serving: Task<Void, Never>

    /// Starts serving `presence`'s socket. `say` prints to the holder's terminal what another
    /// command had it do.
    public static func start(_ presence: PresenceLink, dirs: PhoneDirectories, say: @escaping @Sendable (String) -> Void) async throws -> PresenceHolder {
        do { try dirs.ensureRuntime() } catch { throw PhoneFailure(.failure, "\(error)") }
        // A socket left at the path is a crashed holder's, or a holder's that handed the link
        // over: either way nobody serves it.
        let socket = try await UserSocket.bind(dirs.presenceSocket(presence.box), log: { _ in })
        let serving = Task<Void, Never> {
            do {
                try await socket.serve { request, _, reply in
                    await handle(request, presence: presence, say: say, reply: reply)
                }
            } catch {}
        }
        return PresenceHolder(socket: socket, serving: serving)
    }

    private init(socket: UserSocket, serving: Task<Void, Never>) {
        self.socket = socket
        self.serving = serving
    }

    /// Whether the socket file is still this holder's (not removed, not bound anew by another).
    public var isReachable: Bool { socket.isStillOurs }

    /// Stops serving once the answers in flight are out (2 s at most): the lock or logout that
    /// ended the link was asked from another shell, and it must hear the answer.
    public func finish() async {
        await socket.waitUntilIdle(limit: .seconds(2))
        serving.cancel()
        await serving.value
        socket.unlinkIfOurs()
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
                // Lost, or ended meanwhile: the asker uses a link of its own.
                reply(.result(.agentUnavailable, message: tr("the presence link to box {box} is being found again", ("box", box)), details: ""))
            }
        case .stop:
            // Only a link that is down is handed over: while it is up the session is open and
            // guarded, and a new login has nothing to do there (it is refused before asking).
            guard !presence.isConnected else {
                reply(.result(.failure, message: tr("boxkey login (pid {pid}) holds a live presence link to box {box}: you are logged in there", ("pid", getpid()), ("box", box)), details: ""))
                return
            }
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

    /// The foreground holder's status, if one answers within 5 s.
    public static func status(_ dirs: PhoneDirectories, box: BoxID) -> Status? {
        guard let holder = client(dirs, box: box), case .result(.success, _, let details)? = try? holder.send(.status, timeout: .seconds(5)) else { return nil }
        return try? JSONDecoder().decode(Status.self, from: Data(details.utf8))
    }
}
