import BoxkeyPAMWire
import BoxkeyDBus
import NIOConcurrencyHelpers

/// A logind session as the box needs to know it: whose it is and where it is.
public struct LoginSession: Sendable, Equatable {
    public var id: String
    public var uid: UInt32
    public var user: String
    public var seat: String
    public var tty: String
    public var display: String
    public var remote: Bool
    /// logind's Class: user, greeter, lock-screen, background.
    public var sessionClass: String
    public var locked: Bool
    /// logind's Type: tty, x11, wayland, mir, unspecified.
    public var type: String
    /// Its systemd scope ("session-6.scope"): the cgroup its processes are in.
    public var scope: String

    public init(id: String, uid: UInt32, user: String, seat: String = "seat0", tty: String = "", display: String = "",
                remote: Bool = false, sessionClass: String = "user", locked: Bool = false, type: String = "", scope: String = "") {
        self.id = id; self.uid = uid; self.user = user; self.seat = seat; self.tty = tty; self.display = display
        self.remote = remote; self.sessionClass = sessionClass; self.locked = locked; self.type = type; self.scope = scope
    }

    /// On a seat and not remote: someone sits at this box.
    public var isLocal: Bool { !remote && !seat.isEmpty }

    /// Where it is, for logs and the phone: "seat0 tty2", "seat0 :0".
    public var place: String { [seat, tty, display].filter { !$0.isEmpty }.joined(separator: " ") }
}

/// What the box asks of, and does through, systemd-logind. Session owners are what logind
/// says, never what a caller claims. Actions go through logind, never through a process of
/// the user's that the user could kill.
public protocol SessionControl: Sendable {
    /// The session a process belongs to (logind reads its cgroup), nil if none.
    func session(ofPID pid: Int32) async throws -> LoginSession?
    /// A session by ID, nil if logind does not know it.
    func session(id: String) async throws -> LoginSession?
    /// Every session of a user.
    func sessions(ofUID uid: UInt32) async throws -> [LoginSession]
    func lock(session: String) async throws
    func unlock(session: String) async throws
    func terminate(session: String) async throws
}

/// systemd-logind over the system bus (`$DBUS_SYSTEM_BUS_ADDRESS` when set), through the same
/// D-Bus layer as BlueZ: `org.freedesktop.login1.Manager` GetSessionByPID, GetSession,
/// ListSessions, LockSession, UnlockSession, TerminateSession, and the sessions' properties.
/// The connection is opened on first use and again after it drops (dbus-daemon or logind
/// restarted), so a failure costs one request, not every later one.
public final class LogindSessionControl: SessionControl {
    static let service = "org.freedesktop.login1"
    static let managerPath = "/org/freedesktop/login1"
    static let manager = "org.freedesktop.login1.Manager"
    static let sessionInterface = "org.freedesktop.login1.Session"
    private let timeout: Duration
    private let connection = NIOLockedValueBox<DBusConnection?>(nil)

    public init(timeout: Duration = .seconds(5)) {
        self.timeout = timeout
    }

    public func lock(session: String) async throws { _ = try await call("LockSession", [.string(session)]) }
    public func unlock(session: String) async throws { _ = try await call("UnlockSession", [.string(session)]) }
    public func terminate(session: String) async throws { _ = try await call("TerminateSession", [.string(session)]) }

    public func session(ofPID pid: Int32) async throws -> LoginSession? {
        do {
            let reply = try await call("GetSessionByPID", [.uint32(UInt32(bitPattern: pid))])
            guard let path = reply.first?.string else { return nil }
            return try await session(at: path)
        } catch let e as BusError where e.name.hasSuffix(".NoSessionForPID") || e.name.hasSuffix(".NoSuchSession") {
            return nil
        }
    }

    public func session(id: String) async throws -> LoginSession? {
        do {
            let reply = try await call("GetSession", [.string(id)])
            guard let path = reply.first?.string else { return nil }
            return try await session(at: path)
        } catch let e as BusError where e.name.hasSuffix(".NoSuchSession") || e.name == "org.freedesktop.DBus.Error.UnknownObject"
                    || e.name == "org.freedesktop.DBus.Error.UnknownMethod" {
            return nil
        }
    }

    public func sessions(ofUID uid: UInt32) async throws -> [LoginSession] {
        try await sessions { $0 == uid }
    }

    /// Every session logind knows (`boxkeyd doctor`).
    public func allSessions() async throws -> [LoginSession] {
        try await sessions { _ in true }
    }

    private func sessions(where wanted: (UInt32) -> Bool) async throws -> [LoginSession] {
        // a(susso): id, uid, user, seat, path
        let reply = try await call("ListSessions", [])
        var out: [LoginSession] = []
        for entry in reply.first?.elements ?? [] {
            guard case .structure(let f) = entry, f.count == 5, let uid = f[1].int, wanted(UInt32(uid)), let path = f[4].string else { continue }
            if let s = try? await session(at: path) { out.append(s) }
        }
        return out
    }

    private func session(at path: String) async throws -> LoginSession? {
        let reply = try await bus().call(Self.service, path, "org.freedesktop.DBus.Properties", "GetAll",
                                         [.string(Self.sessionInterface)], timeout: timeout)
        guard let p = reply.first?.vardict, let id = p["Id"]?.string else { return nil }
        func first(_ key: String) -> DBusValue? {
            if case .structure(let f)? = p[key], let v = f.first { return v }
            return nil
        }
        guard let uid = first("User")?.int, let user = p["Name"]?.string else { return nil }
        return LoginSession(id: id, uid: UInt32(uid), user: user, seat: first("Seat")?.string ?? "",
                            tty: p["TTY"]?.string ?? "", display: p["Display"]?.string ?? "",
                            remote: p["Remote"]?.bool ?? true, sessionClass: p["Class"]?.string ?? "",
                            locked: p["LockedHint"]?.bool ?? false, type: p["Type"]?.string ?? "", scope: p["Scope"]?.string ?? "")
    }

    private func bus() throws -> DBusConnection {
        try connection.withLockedValue { c -> DBusConnection in
            if let c { return c }
            let opened = try DBusConnection(.system)
            c = opened
            return opened
        }
    }

    private func call(_ method: String, _ arguments: [DBusValue]) async throws -> [DBusValue] {
        let bus = try bus()
        do {
            return try await bus.call(Self.service, Self.managerPath, Self.manager, method, arguments, timeout: timeout)
        } catch let error as BusError where error.name == BusError.disconnectedName {
            connection.withLockedValue { if $0 === bus { $0 = nil } }
            bus.close()
            throw error
        }
    }

    deinit { connection.withLockedValue { $0?.close() } }
}

extension SessionControl {
    /// The logind session of the process that asks for a prompt. A display manager's worker
    /// that names no terminal, display or host while it authenticates (greetd) has none: it is
    /// local if its parent, the display manager, runs a greeter in a local greeter session. The
    /// kernel says who the parent is, logind whose session its children are. A worker that
    /// names a terminal or a display is judged by them (an XDMCP display is remote whatever its
    /// siblings).
    func promptOwner(pid: Int32, _ request: PAMRequest.WaitRequest) async throws -> LoginSession? {
        if let owner = try await session(ofPID: pid) { return owner }
        guard request.tty.isEmpty, request.display.isEmpty, request.remoteHost.isEmpty,
              let parent = ProcessTree.parent(of: pid), parent > 1 else { return nil }
        for sibling in ProcessTree.children(of: parent) where sibling != pid {
            if let s = try await session(ofPID: sibling), s.sessionClass == "greeter", s.isLocal { return s }
        }
        return nil
    }
}
