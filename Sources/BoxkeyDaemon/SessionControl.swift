import BoxkeyDBus
import NIOConcurrencyHelpers

/// Locks and ends login sessions. The daemon acts through logind, never through a process of
/// the user's that the user could kill.
public protocol SessionControl: Sendable {
    func lock(session: String) async throws
    func terminate(session: String) async throws
}

/// systemd-logind over the system bus (`$DBUS_SYSTEM_BUS_ADDRESS` when set):
/// `org.freedesktop.login1.Manager.LockSession(s)` and `TerminateSession(s)`, through the same
/// D-Bus layer as BlueZ. The connection is opened on first use and again after it drops
/// (dbus-daemon or logind restarted), so a failure costs one action, not every later one.
public final class LogindSessionControl: SessionControl {
    private let timeout: Duration
    private let connection = NIOLockedValueBox<DBusConnection?>(nil)

    public init(timeout: Duration = .seconds(5)) {
        self.timeout = timeout
    }

    public func lock(session: String) async throws { try await call("LockSession", session) }
    public func terminate(session: String) async throws { try await call("TerminateSession", session) }

    private func call(_ method: String, _ session: String) async throws {
        let bus = try connection.withLockedValue { c -> DBusConnection in
            if let c { return c }
            let opened = try DBusConnection(.system)
            c = opened
            return opened
        }
        do {
            _ = try await bus.call("org.freedesktop.login1", "/org/freedesktop/login1", "org.freedesktop.login1.Manager",
                                   method, [.string(session)], timeout: timeout)
        } catch let error as BusError where error.name == BusError.disconnectedName {
            connection.withLockedValue { if $0 === bus { $0 = nil } }
            bus.close()
            throw error
        }
    }

    deinit { connection.withLockedValue { $0?.close() } }
}
