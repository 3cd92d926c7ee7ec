import CDBus
import Glibc
import NIOConcurrencyHelpers

/// What an exported object answers to a method call.
public enum DBusReply: Sendable {
    case values([DBusValue])
    case error(BusError)

    public static let empty = DBusReply.values([])
}

/// A connection to a message bus, served by one thread of its own.
///
/// libdbus is used from that thread only: callers enqueue work and are woken through an
/// eventfd, and the thread sleeps in poll(2) on the bus socket and the eventfd, with a timeout
/// only when a method call has a deadline. Replies are matched to calls by serial in a filter,
/// so no libdbus pending-call or blocking API runs after the connection is open.
public final class DBusConnection: @unchecked Sendable {
    public typealias MethodHandler = @Sendable (DBusMessage) -> DBusReply

    public enum Bus: Sendable {
        /// `$DBUS_SYSTEM_BUS_ADDRESS` or the system bus socket.
        case system
        case session
        case address(String)
    }

    struct Pending {
        let continuation: CheckedContinuation<Void, any Error>
        let deadline: UInt64
        let slot: ReplySlot
    }

    /// Where a reply waits for its caller. It is written and read under the connection's lock,
    /// so the handoff between this thread and the caller's is a lock, not only the continuation
    /// (which ThreadSanitizer cannot see through).
    final class ReplySlot: @unchecked Sendable {
        var message: DBusMessage?
    }

    struct Subscription {
        let match: SignalMatch
        let continuation: AsyncStream<DBusMessage>.Continuation
    }

    struct State {
        var jobs: [@Sendable (OpaquePointer) -> Void] = []
        var pending: [UInt32: Pending] = [:]
        var subscriptions: [UInt64: Subscription] = [:]
        var matchRules: [String: Int] = [:]
        var objects: [String: MethodHandler] = [:]
        var nextSubscription: UInt64 = 0
        var closed = false
        /// The unique name owning each well-known sender a subscription names ("" for none),
        /// kept from GetNameOwner and the bus's NameOwnerChanged; `ownerChanges` counts the
        /// changes seen, so a GetNameOwner reply older than a change does not undo it.
        var owners: [String: String] = [:]
        var ownerChanges: [String: Int] = [:]
    }

    /// The connection's unique name on the bus (":1.42").
    public let uniqueName: String
    private let connection: OpaquePointer
    private let wakeFD: Int32
    let state = NIOLockedValueBox(State())
    private var thread: pthread_t?

    public init(_ bus: Bus) throws {
        dbus_threads_init_default()
        var error = CDBus.DBusError()
        dbus_error_init(&error)
        defer { dbus_error_free(&error) }
        let opened: OpaquePointer?
        switch bus {
        case .system: opened = dbus_bus_get_private(DBUS_BUS_SYSTEM, &error)
        case .session: opened = dbus_bus_get_private(DBUS_BUS_SESSION, &error)
        case .address(let address):
            opened = dbus_connection_open_private(address, &error)
            if let opened, dbus_bus_register(opened, &error) == 0 {
                dbus_connection_close(opened)
                dbus_connection_unref(opened)
                throw Self.error(from: &error, fallback: "cannot register on the bus")
            }
        }
        guard let opened else { throw Self.error(from: &error, fallback: "cannot connect to the bus") }
        dbus_connection_set_exit_on_disconnect(opened, 0)
        connection = opened
        uniqueName = dbus_bus_get_unique_name(opened).map { String(cString: $0) } ?? ""
        wakeFD = eventfd(0, Int32(EFD_CLOEXEC | EFD_NONBLOCK))
        guard wakeFD >= 0 else {
            dbus_connection_close(opened)
            dbus_connection_unref(opened)
            throw BusError("org.freedesktop.DBus.Error.Failed", "eventfd: \(String(cString: strerror(errno)))")
        }
        dbus_connection_add_filter(opened, { _, message, user in
            let me = Unmanaged<DBusConnection>.fromOpaque(user!).takeUnretainedValue()
            return me.filter(message!)
        }, Unmanaged.passUnretained(self).toOpaque(), nil)
        // The thread keeps the connection alive until close().
        let retained = Unmanaged.passRetained(self).toOpaque()
        var t = pthread_t()
        pthread_create(&t, nil, { arg in
            let me = Unmanaged<DBusConnection>.fromOpaque(arg!).takeRetainedValue()
            me.loop()
            return nil
        }, retained)
        thread = t
    }

    deinit {
        dbus_connection_close(connection)
        dbus_connection_unref(connection)
        Glibc.close(wakeFD)
    }

    private static func error(from error: inout CDBus.DBusError, fallback: String) -> BusError {
        if dbus_error_is_set(&error) != 0 {
            return BusError(String(cString: error.name), error.message.map { String(cString: $0) } ?? "")
        }
        return BusError("org.freedesktop.DBus.Error.Failed", fallback)
    }

    /// Ends the connection: pending calls fail, signal streams finish, the thread exits.
    public func close() {
        enqueue { _ in }
        state.withLockedValue { $0.closed = true }
        wake()
        if let thread, !pthread_equal(thread, pthread_self()).isTrue { pthread_join(thread, nil) }
        thread = nil
    }

    // MARK: Calls

    /// Calls a method and returns its reply's arguments, or throws the error reply. A call
    /// without an answer within `timeout` throws `org.freedesktop.DBus.Error.NoReply`.
    /// `sent` runs once the call is handed to the bus (or failed to be): calls made after that
    /// reach the peer after it, as the bus keeps one connection's messages in order.
    public func call(_ destination: String, _ path: String, _ interface: String, _ member: String,
                     _ arguments: [DBusValue] = [], timeout: Duration = .seconds(25),
                     sent: (@Sendable () -> Void)? = nil) async throws -> [DBusValue] {
        let (seconds, attoseconds) = timeout.components
        let deadline = Self.now() + UInt64(max(0, seconds)) * 1_000_000_000 + UInt64(max(0, attoseconds) / 1_000_000_000)
        let slot = ReplySlot()
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            enqueue { [self] connection in
                defer { sent?() }
                guard let message = dbus_message_new_method_call(destination, path, interface, member) else {
                    continuation.resume(throwing: BusError(BusError.invalidArgsName, "bad destination, path, interface or member: \(destination) \(path) \(interface).\(member)"))
                    return
                }
                defer { dbus_message_unref(message) }
                guard Self.appendArguments(arguments, to: message) else {
                    continuation.resume(throwing: BusError(BusError.invalidArgsName, "arguments do not marshal for \(interface).\(member)"))
                    return
                }
                var serial: UInt32 = 0
                guard dbus_connection_send(connection, message, &serial) != 0 else {
                    continuation.resume(throwing: BusError(BusError.disconnectedName, "cannot send \(interface).\(member)"))
                    return
                }
                state.withLockedValue { $0.pending[serial] = Pending(continuation: continuation, deadline: deadline, slot: slot) }
            }
        }
        guard let reply = state.withLockedValue({ _ in slot.message }) else {
            throw BusError(BusError.disconnectedName, "no reply")
        }
        if let error = reply.error { throw error }
        return reply.arguments
    }

    /// Sends a signal: broadcast, or to one connection (`destination`).
    public func emit(_ path: String, _ interface: String, _ member: String, _ arguments: [DBusValue], to destination: String? = nil) {
        enqueue { connection in
            guard let message = dbus_message_new_signal(path, interface, member) else { return }
            defer { dbus_message_unref(message) }
            if let destination { dbus_message_set_destination(message, destination) }
            if Self.appendArguments(arguments, to: message) { dbus_connection_send(connection, message, nil) }
        }
    }

    /// A method call whose reply nobody waits for.
    public func send(_ destination: String, _ path: String, _ interface: String, _ member: String, _ arguments: [DBusValue]) {
        enqueue { connection in
            guard let message = dbus_message_new_method_call(destination, path, interface, member) else { return }
            defer { dbus_message_unref(message) }
            dbus_message_set_no_reply(message, 1)
            if Self.appendArguments(arguments, to: message) { dbus_connection_send(connection, message, nil) }
        }
    }

    // MARK: Exported objects

    /// Answers method calls to `path` with `handler`, on the connection's thread: it must not
    /// block. The connection keeps the handler until `unexport` or `close`. Calls to paths nobody exports get `UnknownObject`.
    public func export(_ path: String, handler: @escaping MethodHandler) {
        state.withLockedValue { $0.objects[path] = handler }
    }

    public func unexport(_ path: String) {
        _ = state.withLockedValue { $0.objects.removeValue(forKey: path) }
    }

    // MARK: The connection's thread

    /// Once the thread has ended (closed, or the bus went away) nothing would run a queued
    /// job and its caller would wait forever: the job runs here instead, and fails at once
    /// (libdbus is thread-safe after `dbus_threads_init_default`).
    private func enqueue(_ job: @escaping @Sendable (OpaquePointer) -> Void) {
        let ended = state.withLockedValue { s -> Bool in
            if s.closed { return true }
            s.jobs.append(job)
            return false
        }
        guard ended else { return wake() }
        job(connection)
        // No thread will read a reply: whatever the job left waiting fails now.
        let orphans = state.withLockedValue { s -> [Pending] in let p = Array(s.pending.values); s.pending = [:]; return p }
        for p in orphans { p.continuation.resume(throwing: BusError(BusError.disconnectedName, "the bus connection closed")) }
    }

    private func wake() {
        var one: UInt64 = 1
        _ = Glibc.write(wakeFD, &one, 8)
    }

    private static func now() -> UInt64 {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return UInt64(ts.tv_sec) * 1_000_000_000 + UInt64(ts.tv_nsec)
    }

    private func loop() {
        var busFD: Int32 = -1
        dbus_connection_get_unix_fd(connection, &busFD)
        while true {
            let (jobs, closed) = state.withLockedValue { s in
                let j = s.jobs
                s.jobs = []
                return (j, s.closed)
            }
            for job in jobs { job(connection) }
            if closed || dbus_connection_get_is_connected(connection) == 0 { break }
            // Hand every complete incoming message to filter(), then write what the jobs and
            // the handlers queued (flushing may read more, hence the loop).
            repeat {
                while dbus_connection_dispatch(connection) == DBUS_DISPATCH_DATA_REMAINS {}
                if dbus_connection_has_messages_to_send(connection) != 0 { dbus_connection_flush(connection) }
            } while dbus_connection_get_dispatch_status(connection) == DBUS_DISPATCH_DATA_REMAINS
            expireCalls()
            // Read after the jobs ran: a call they just sent has a deadline to wake up for.
            let (stillQueued, nextDeadline) = state.withLockedValue { s in (!s.jobs.isEmpty, s.pending.values.map(\.deadline).min()) }
            if stillQueued { continue }

            var fds = [pollfd(fd: busFD, events: Int16(POLLIN), revents: 0), pollfd(fd: wakeFD, events: Int16(POLLIN), revents: 0)]
            var timeout: Int32 = -1
            if let nextDeadline {
                let now = Self.now()
                timeout = nextDeadline <= now ? 0 : Int32(min((nextDeadline - now) / 1_000_000 + 1, 60_000))
            }
            let n = poll(&fds, 2, timeout)
            if n < 0 && errno != EINTR { break }
            if fds[1].revents != 0 {
                var counter: UInt64 = 0
                _ = Glibc.read(wakeFD, &counter, 8)
            }
            if fds[0].revents & Int16(POLLIN | POLLHUP | POLLERR) != 0 {
                if dbus_connection_read_write(connection, 0) == 0 { break }
            }
        }
        shutDown()
    }

    private func expireCalls() {
        let now = Self.now()
        let expired = state.withLockedValue { s -> [Pending] in
            let due = s.pending.filter { $0.value.deadline <= now }
            for serial in due.keys { s.pending[serial] = nil }
            return Array(due.values)
        }
        for p in expired { p.continuation.resume(throwing: BusError(BusError.noReplyName, "no reply within the timeout")) }
    }

    private func shutDown() {
        let (pending, subscriptions, jobs) = state.withLockedValue { s in
            let r = (s.pending, s.subscriptions, s.jobs)
            s.pending = [:]
            s.subscriptions = [:]
            s.jobs = []
            s.closed = true
            // Exported handlers may hold what holds this connection.
            s.objects = [:]
            return r
        }
        // Jobs that never ran hold continuations of calls that never left.
        for job in jobs { job(connection) }
        for p in pending.values { p.continuation.resume(throwing: BusError(BusError.disconnectedName, "the bus connection closed")) }
        for s in subscriptions.values { s.continuation.finish() }
        let late = state.withLockedValue { s -> [Pending] in let p = Array(s.pending.values); s.pending = [:]; return p }
        for p in late { p.continuation.resume(throwing: BusError(BusError.disconnectedName, "the bus connection closed")) }
    }

    /// Runs on the connection's thread for every incoming message.
    private func filter(_ raw: OpaquePointer) -> DBusHandlerResult {
        guard let message = DBusMessage(raw) else { return DBUS_HANDLER_RESULT_NOT_YET_HANDLED }
        switch message.kind {
        case .methodReturn, .error:
            guard let pending = state.withLockedValue({ s -> Pending? in
                let p = s.pending.removeValue(forKey: message.replySerial)
                p?.slot.message = message
                return p
            }) else {
                return DBUS_HANDLER_RESULT_NOT_YET_HANDLED
            }
            pending.continuation.resume()
            return DBUS_HANDLER_RESULT_HANDLED
        case .signal:
            let subscribers = state.withLockedValue { s -> [Subscription] in
                if message.sender == SignalMatch.busName, message.interface == "org.freedesktop.DBus", message.member == "NameOwnerChanged",
                   let name = message.arguments.first?.string, s.ownerChanges[name] != nil {
                    s.owners[name] = message.arguments.count > 2 ? message.arguments[2].string ?? "" : ""
                    s.ownerChanges[name, default: 0] += 1
                }
                return s.subscriptions.values.filter { $0.match.matches(message, owner: $0.match.senderNeedsOwner.flatMap { s.owners[$0] }) }
            }
            for s in subscribers { s.continuation.yield(message) }
            return DBUS_HANDLER_RESULT_NOT_YET_HANDLED
        case .methodCall:
            let handler = message.path.flatMap { path in state.withLockedValue { $0.objects[path] } }
            let reply: DBusReply = handler?(message)
                ?? .error(BusError(BusError.unknownObjectName, "no object at \(message.path ?? "?")"))
            if !message.noReplyExpected { answer(raw, with: reply) }
            return DBUS_HANDLER_RESULT_HANDLED
        }
    }

    private func answer(_ call: OpaquePointer, with reply: DBusReply) {
        let message: OpaquePointer?
        switch reply {
        case .values(let values):
            message = dbus_message_new_method_return(call)
            if let message, !Self.appendArguments(values, to: message) {
                dbus_message_unref(message)
                answer(call, with: .error(BusError("org.freedesktop.DBus.Error.Failed", "the reply did not marshal")))
                return
            }
        case .error(let error):
            message = dbus_message_new_error(call, error.name, error.message)
        }
        guard let message else { return }
        dbus_connection_send(connection, message, nil)
        dbus_message_unref(message)
    }

    private static func appendArguments(_ values: [DBusValue], to message: OpaquePointer) -> Bool {
        var iter = DBusMessageIter()
        dbus_message_iter_init_append(message, &iter)
        return values.allSatisfy { $0.append(to: &iter) }
    }
}

private extension Int32 {
    var isTrue: Bool { self != 0 }
}
