import BoxkeyCore
import CBoxkeyLDAP
import FoundationEssentials
import Glibc
import NIOConcurrencyHelpers

/// One connection that follows the directory's users with phones (RFC 4533 refreshAndPersist):
/// the whole set first, then each change as the server makes it. Blocking, like
/// `FleetDirectory`: `FleetService` runs it on a thread of its own. Every call but
/// `interrupt` comes from that thread.
final class FleetFollower: @unchecked Sendable {
    let directory: FleetDirectory
    private var handle: OpaquePointer?
    private var msgid: Int32 = 0
    /// The socket, for `interrupt`; -1 once closed (a closed number may be someone else's).
    private let descriptor = NIOLockedValueBox<Int32>(-1)

    init(directory: FleetDirectory) { self.directory = directory }

    /// Messages handed over per `next`: a server that floods the stream fills no more memory
    /// than this at once, and the box checks its limits between batches.
    static let messagesPerCall: Int32 = 1000

    deinit { close() }

    /// Connects, binds and asks for the stream. A server without content synchronisation
    /// refuses it only at the first `next` (unavailableCriticalExtension).
    func start() throws {
        let ld = try directory.open()
        handle = ld
        descriptor.withLockedValue { $0 = boxkey_ldap_descriptor(ld) }
        var err = [CChar](repeating: 0, count: 512)
        let settings = directory.settings
        let rc = boxkey_ldap_sync_start(ld, settings.base, FleetDirectory.followFilter, settings.userAttribute, FleetDirectory.phoneAttribute, &msgid, &err, err.count)
        guard rc == 0 else { throw FleetDirectory.Failure(description: "\(settings.uri): \(FleetDirectory.text(err))", code: rc) }
    }

    /// The messages that arrive within `timeout` (none: the wait ended quietly). Throws when
    /// the stream ends or breaks, with libldap's code.
    func next(timeout: Duration) throws -> [FleetMirror.Change] {
        guard let handle else { throw FleetDirectory.Failure(description: "not started") }
        final class Sink { var changes: [FleetMirror.Change] = [] }
        let sink = Sink()
        var handled: Int32 = 0
        var err = [CChar](repeating: 0, count: 512)
        let ms = Int32(min(timeout.components.seconds * 1000 + timeout.components.attoseconds / 1_000_000_000_000_000, Int64(Int32.max)))
        let settings = directory.settings
        let rc = withExtendedLifetime(sink) {
            boxkey_ldap_sync_poll(handle, msgid, ms, Self.messagesPerCall, settings.userAttribute, FleetDirectory.phoneAttribute, { context, state, uuid, dn, names, nameCount, number, values, count in
                let sink = Unmanaged<Sink>.fromOpaque(context!).takeUnretainedValue()
                if state == Int32(BOXKEY_LDAP_SYNC_REFRESHED) {
                    sink.changes.append(.refreshed)
                    return 0
                }
                // Present (0) says an entry is as the consumer's cookie left it: the box sends no
                // cookie, so it has nothing to keep; one sent anyway is left out (fail closed).
                guard let uuid, state != 0 else { return 0 }
                let id = Array(UnsafeBufferPointer(start: uuid, count: 16))
                if state == 3 /* LDAP_SYNC_DELETE */ {
                    sink.changes.append(.deleted(uuid: id))
                } else {
                    let entry = FleetMirror.Entry(dn: String(cString: dn!), names: (0..<Int(nameCount)).map { String(cString: names![$0]!) },
                                                  number: number.map { String(cString: $0) }, values: (0..<Int(count)).map { String(cString: values![$0]!) })
                    sink.changes.append(.entry(uuid: id, entry))
                }
                return 0
            }, Unmanaged.passUnretained(sink).toOpaque(), &handled, &err, err.count)
        }
        guard rc == 0 else { throw FleetDirectory.Failure(description: "\(settings.uri): \(FleetDirectory.text(err))", code: rc) }
        return sink.changes
    }

    /// A one-entry read over the same connection: the server and the path to it are alive.
    func ping() throws {
        guard let handle else { throw FleetDirectory.Failure(description: "not started") }
        var err = [CChar](repeating: 0, count: 512)
        let rc = boxkey_ldap_ping(handle, directory.settings.base, &err, err.count)
        guard rc == 0 else { throw FleetDirectory.Failure(description: "\(directory.settings.uri): \(FleetDirectory.text(err))", code: rc) }
    }

    /// Entries the server matches to `names`, besides `besides` (see `FleetRoster.add`).
    func lookalikes(of names: Set<String>, besides: Set<String>) throws -> (entries: [FleetMirror.Entry], requests: Int) {
        guard let handle else { throw FleetDirectory.Failure(description: "not started") }
        return try directory.lookalikes(handle, of: names, besides: besides)
    }

    func readRevocations() throws -> BoxRevocationList? {
        guard let handle else { throw FleetDirectory.Failure(description: "not started") }
        return try directory.readRevocations(handle)
    }

    /// Wakes a `next` that waits, from another thread: it then fails. The connection stays
    /// for `close`.
    func interrupt() {
        descriptor.withLockedValue { fd in if fd >= 0 { _ = Glibc.shutdown(fd, Int32(SHUT_RDWR)) } }
    }

    func close() {
        descriptor.withLockedValue { $0 = -1 }
        if let handle { boxkey_ldap_close(handle) }
        handle = nil
    }
}
