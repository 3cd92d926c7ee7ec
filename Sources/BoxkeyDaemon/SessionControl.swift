import CDBus
import Foundation

/// Locks and ends login sessions. The daemon acts through logind, never through a process of
/// the user's that the user could kill.
public protocol SessionControl: Sendable {
    func lock(session: String) async throws
    func terminate(session: String) async throws
}

/// systemd-logind over the system bus (`$DBUS_SYSTEM_BUS_ADDRESS` when set), with libdbus-1:
/// `org.freedesktop.login1.Manager.LockSession(s)` and `TerminateSession(s)`.
public final class LogindSessionControl: SessionControl {
    public struct Error: Swift.Error, CustomStringConvertible {
        public let name: String
        public let message: String
        public var description: String { "\(name): \(message)" }
    }

    /// Calls are blocking in libdbus; they run here, off the cooperative thread pool.
    private let queue = DispatchQueue(label: "boxkeyd.logind")
    let timeoutMilliseconds: Int32

    public init(timeout: Duration = .seconds(5)) {
        timeoutMilliseconds = Int32(timeout.nanoseconds / 1_000_000)
    }

    public func lock(session: String) async throws { try await call("LockSession", session) }
    public func terminate(session: String) async throws { try await call("TerminateSession", session) }

    private func call(_ method: String, _ argument: String) async throws {
        try await withCheckedThrowingContinuation { (c: CheckedContinuation<Void, any Swift.Error>) in
            queue.async { [timeoutMilliseconds] in
                c.resume(with: Result { try Self.blockingCall(method, argument, timeoutMilliseconds) })
            }
        }
    }

    private static func blockingCall(_ method: String, _ argument: String, _ timeout: Int32) throws {
        var error = DBusError()
        dbus_error_init(&error)
        defer { dbus_error_free(&error) }
        func failure(_ fallback: String) -> Error {
            if dbus_error_is_set(&error) != 0 {
                return Error(name: String(cString: error.name), message: String(cString: error.message))
            }
            return Error(name: "org.boxkey.Error.Failed", message: fallback)
        }
        guard let connection = dbus_bus_get_private(DBUS_BUS_SYSTEM, &error) else { throw failure("cannot connect to the system bus") }
        dbus_connection_set_exit_on_disconnect(connection, 0)
        defer { dbus_connection_close(connection); dbus_connection_unref(connection) }
        guard let message = dbus_message_new_method_call("org.freedesktop.login1", "/org/freedesktop/login1",
                                                         "org.freedesktop.login1.Manager", method) else { throw failure("out of memory") }
        defer { dbus_message_unref(message) }
        var iterator = DBusMessageIter()
        dbus_message_iter_init_append(message, &iterator)
        let appended = argument.withCString { cstring -> dbus_bool_t in
            var pointer: UnsafePointer<CChar>? = cstring
            return dbus_message_iter_append_basic(&iterator, Int32(UInt8(ascii: "s")), &pointer)
        }
        guard appended != 0 else { throw failure("cannot build the call") }
        guard let reply = dbus_connection_send_with_reply_and_block(connection, message, timeout, &error) else {
            throw failure("\(method) failed")
        }
        dbus_message_unref(reply)
    }
}
