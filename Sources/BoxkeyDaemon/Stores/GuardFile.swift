import BoxkeyCore
import BoxkeyHost
import FoundationEssentials

/// What the box guards, kept across a restart of the daemon: the sessions on record (and the
/// phone whose push opened or unlocked each), the phones whose presence link is up or in its
/// grace time, and the users whose sessions it locked. Without it a restarted daemon (an
/// upgrade, a crash, `systemctl restart`) knew no session, and walking away found only
/// "every local session of the user", of which it ends none: a console stayed open for good.
///
/// Why a file and not logind alone: logind says which sessions exist, not which of them this
/// phone opened — the one fact walk-away's "end only what the phone opened" rests on. Why in
/// the runtime directory (/run/boxkey, kept across stops by `RuntimeDirectoryPreserve=yes`):
/// logind's session IDs are this boot's, and /run goes with the boot. Each session is checked
/// with logind again on load (it still exists, for the same uid, still local); nothing in the
/// file is believed unless the daemon's own account alone could have written it.
public struct GuardRecord: Codable, Sendable, Equatable {
    public struct Session: Codable, Sendable, Equatable {
        public var id: String
        public var uid: UInt32
        public var user: String
        public var service: String
        /// The phone whose push opened or unlocked it (hex key), if one did.
        public var phone: String?
        /// Where it is, as logind said at registration: kept when logind does not answer at
        /// start (its session is guarded as recorded, and checked when acted on).
        public var seat: String
        public var tty: String
        public var display: String
        public var type: String
        public var sessionClass: String

        init(_ entry: SessionRegistry.Entry) {
            let s = entry.session
            id = s.id; uid = s.uid; user = s.user; service = entry.service; phone = entry.phone.map { hex($0.bytes) }
            seat = s.seat; tty = s.tty; display = s.display; type = s.type; sessionClass = s.sessionClass
        }

        /// The session as recorded (registered sessions are local: `remote` is false).
        var recorded: LoginSession {
            LoginSession(id: id, uid: uid, user: user, seat: seat, tty: tty, display: display, remote: false, sessionClass: sessionClass, type: type)
        }
    }
    public struct Presence: Codable, Sendable, Equatable, Hashable {
        public var phone: String
        public var user: String
    }
    public var sessions: [Session] = []
    public var presences: [Presence] = []
    public var lockedUsers: [String] = []

    public init() {}
    public var isEmpty: Bool { sessions.isEmpty && presences.isEmpty && lockedUsers.isEmpty }
}

/// The file (`guard.json` beside `pam.sock`), written 0600 whenever the record changes.
struct GuardFile: Sendable {
    let path: String

    func load() throws(PrivateFiles.Failure) -> GuardRecord? {
        guard let bytes = try PrivateFiles.readOwn(path) else { return nil }
        do { return try JSONDecoder().decode(GuardRecord.self, from: Data(bytes)) } catch {
            throw PrivateFiles.Failure("\(path) does not parse (\(error))")
        }
    }

    func save(_ record: GuardRecord) throws(PrivateFiles.Failure) {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        let bytes: Data
        do { bytes = try encoder.encode(record) } catch { throw PrivateFiles.Failure("cannot encode \(path): \(error)") }
        try PrivateFiles.write(bytes, to: path)
    }
}
