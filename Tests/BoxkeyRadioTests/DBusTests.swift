import BoxkeyTestWorlds
import BoxkeyDBus
import CDBus
import Foundation
import Testing

/// The D-Bus layer against a real dbus-daemon: two connections, one exporting, one calling.
@Suite(.timeLimit(.minutes(1))) struct DBusTests {
    static let echoInterface = "org.boxkey.Test1"

    /// A server connection exporting `/test` (ObjectManager root) and `/test/thing`.
    func server(_ bus: PrivateBus) throws -> (DBusConnection, DBusObjectTree) {
        let connection = try DBusConnection(bus.bus)
        let tree = DBusObjectTree(connection: connection, root: "/test")
        tree.add("/test/thing", [Self.echoInterface: .init(properties: ["Name": .string("thing"), "Level": .int16(-3)], methods: [
            "Echo": { call in .values(call.arguments) },
            "Fail": { _ in .error(BusError("org.boxkey.Error.Nope", "as asked")) },
            "Socket": { _ in
                var fds: [Int32] = [0, 0]
                guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds) == 0 else { return .error(BusError("org.boxkey.Error.Io", "socketpair")) }
                let (mine, theirs) = (fds[0], fds[1])
                _ = "through the fd".withCString { write(mine, $0, strlen($0)) }
                close(mine)
                // libdbus duplicates the descriptor into the message; ours can close after sending.
                DispatchQueue.global().asyncAfter(deadline: .now() + 1) { close(theirs) }
                return .values([.unixFD(theirs)])
            },
        ])])
        return (connection, tree)
    }

    @Test func valuesSurviveTheRoundTrip() async throws {
        let bus = try PrivateBus()
        defer { bus.close() }
        let (server, _) = try server(bus)
        let client = try DBusConnection(bus.bus)
        defer { client.close(); server.close() }
        let values: [DBusValue] = [
            .byte(7), .bool(true), .int16(-2), .uint16(65535), .int32(-70000), .uint32(4_000_000_000),
            .int64(-1 << 40), .uint64(1 << 63), .double(2.5), .string("héllo"), .objectPath("/a/b_c"), .signature("a{sv}"),
            .bytes([]), .bytes([0, 1, 255]), .strings(["x", "y"]),
            .vardict(["device": .objectPath("/org/bluez/hci0/dev_00_11"), "mtu": .uint16(517), "nested": .vardict(["k": .bool(false)])]),
            .dict(keySignature: "q", valueSignature: "v", [(.uint16(0xFFFF), .variant(.bytes([1, 2])))]),
            .structure([.string("s"), .array(elementSignature: "(iy)", [.structure([.int32(1), .byte(2)])])]),
            .variant(.variant(.uint32(5))),
        ]
        let echoed = try await client.call(server.uniqueName, "/test/thing", Self.echoInterface, "Echo", values)
        #expect(echoed == values)
        #expect(echoed[15].vardict?["mtu"]?.int == 517)
        #expect(echoed[16].entries?.first?.value.unwrapped.bytes == [1, 2])
    }

    @Test func objectManagerPropertiesAndSignals() async throws {
        let bus = try PrivateBus()
        defer { bus.close() }
        let (server, tree) = try server(bus)
        let client = try DBusConnection(bus.bus)
        defer { client.close(); server.close() }
        let managed = try await client.call(server.uniqueName, "/test", "org.freedesktop.DBus.ObjectManager", "GetManagedObjects")
        let thing = managed.first?.entries?.first { $0.key.string == "/test/thing" }?.value
        #expect(thing?.entries?.first?.key.string == Self.echoInterface)
        #expect(thing?.entries?.first?.value.vardict?["Name"]?.string == "thing")

        let level = try await client.call(server.uniqueName, "/test/thing", "org.freedesktop.DBus.Properties", "Get",
                                          [.string(Self.echoInterface), .string("Level")])
        #expect(level.first?.int == -3)
        let all = try await client.call(server.uniqueName, "/test/thing", "org.freedesktop.DBus.Properties", "GetAll", [.string(Self.echoInterface)])
        #expect(all.first?.vardict?.keys.sorted() == ["Level", "Name"])

        let changes = try await client.signals(SignalMatch(sender: server.uniqueName, pathNamespace: "/test", interface: "org.freedesktop.DBus.Properties", member: "PropertiesChanged"))
        tree.set("/test/thing", Self.echoInterface, "Name", .string("renamed"))
        tree.set("/test/thing", Self.echoInterface, "Name", .string("again"))
        var iterator = changes.makeAsyncIterator()
        #expect(await iterator.next()?.arguments[1].vardict?["Name"]?.string == "renamed")
        #expect(await iterator.next()?.arguments[1].vardict?["Name"]?.string == "again")
        let introspection = try await client.call(server.uniqueName, "/test", "org.freedesktop.DBus.Introspectable", "Introspect")
        #expect(introspection.first?.string?.contains("<node name=\"thing\"/>") == true)
    }

    /// Any local client may address a signal to our connection, and the bus delivers it
    /// whatever our match rules say. One that names a well-known sender (bluetoothd, logind)
    /// or the bus itself is taken only from that name's owner: a forged Connected=false or
    /// NameOwnerChanged would otherwise walk a phone away and lock alice's session.
    @Test func aSignalFromAnyoneButTheNamesOwnerIsNotTaken() async throws {
        let bus = try PrivateBus()
        defer { bus.close() }
        let real = try DBusConnection(bus.bus), victim = try DBusConnection(bus.bus), forger = try DBusConnection(bus.bus)
        defer { victim.close(); forger.close(); real.close() }
        try await real.requestName("org.boxkey.Real")
        let fromReal = try await victim.signals(SignalMatch(sender: "org.boxkey.Real", interface: Self.echoInterface, member: "Changed"))
        let fromBus = try await victim.signals(SignalMatch(sender: "org.freedesktop.DBus", interface: "org.freedesktop.DBus", member: "NameOwnerChanged"))

        forger.emit("/test", Self.echoInterface, "Changed", [.string("forged")], to: victim.uniqueName)
        forger.emit("/org/freedesktop/DBus", "org.freedesktop.DBus", "NameOwnerChanged",
                    [.string("org.boxkey.Real"), .string(real.uniqueName), .string(forger.uniqueName)], to: victim.uniqueName)
        forger.emit("/test", Self.echoInterface, "Changed", [.string("forged after claiming the name")], to: victim.uniqueName)
        // A round trip: the bus has passed the forger's signals on before this returns.
        _ = try await forger.call("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "GetId")
        real.emit("/test", Self.echoInterface, "Changed", [.string("real")])

        var changes = fromReal.makeAsyncIterator()
        let first = await changes.next()
        #expect(first?.arguments.first?.string == "real" && first?.sender == real.uniqueName, "\(String(describing: first))")

        // The real owner lets the name go: the bus's NameOwnerChanged is taken, the forged one
        // was not.
        _ = try await real.call("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "ReleaseName", [.string("org.boxkey.Real")])
        var owners = fromBus.makeAsyncIterator()
        while let change = await owners.next() {
            #expect(change.sender == "org.freedesktop.DBus", "a forged NameOwnerChanged from \(change.sender ?? "?")")
            if change.arguments.first?.string == "org.boxkey.Real" {
                #expect(change.arguments.count > 2 && change.arguments[2].string == "")
                break
            }
        }
    }

    @Test func errorsCarryTheirNames() async throws {
        let bus = try PrivateBus()
        defer { bus.close() }
        let (server, _) = try server(bus)
        let client = try DBusConnection(bus.bus)
        defer { client.close(); server.close() }
        await #expect(throws: BusError("org.boxkey.Error.Nope", "as asked")) {
            try await client.call(server.uniqueName, "/test/thing", Self.echoInterface, "Fail")
        }
        do {
            _ = try await client.call(server.uniqueName, "/test/thing", Self.echoInterface, "Missing")
            Issue.record("an unknown method answered")
        } catch let e as BusError { #expect(e.name == BusError.unknownMethodName) }
        do {
            _ = try await client.call(server.uniqueName, "/nowhere", Self.echoInterface, "Echo")
            Issue.record("an unknown object answered")
        } catch let e as BusError { #expect(e.name == BusError.unknownObjectName) }
        do {
            _ = try await client.call("org.boxkey.Nobody", "/", Self.echoInterface, "Echo")
            Issue.record("a missing service answered")
        } catch let e as BusError { #expect(e.name == BusError.serviceUnknownName) }
        // A value that cannot marshal is refused before it reaches the bus.
        await #expect(throws: BusError.self) {
            try await client.call(server.uniqueName, "/test/thing", Self.echoInterface, "Echo", [.objectPath("not a path")])
        }
        #expect(try await client.call(server.uniqueName, "/test/thing", Self.echoInterface, "Echo", [.byte(1)]) == [.byte(1)])
    }

    @Test func fileDescriptorsPass() async throws {
        let bus = try PrivateBus()
        defer { bus.close() }
        let (server, _) = try server(bus)
        let client = try DBusConnection(bus.bus)
        defer { client.close(); server.close() }
        let reply = try await client.call(server.uniqueName, "/test/thing", Self.echoInterface, "Socket")
        guard case .unixFD(let fd)? = reply.first else { Issue.record("no fd in \(reply)"); return }
        defer { close(fd) }
        var buffer = [UInt8](repeating: 0, count: 64)
        let n = read(fd, &buffer, buffer.count)
        #expect(String(decoding: buffer.prefix(max(n, 0)), as: UTF8.self) == "through the fd")
    }

    @Test func aCallWithoutAnswerTimesOut() async throws {
        let bus = try PrivateBus()
        defer { bus.close() }
        // A peer that is on the bus but never reads its messages.
        var error = CDBus.DBusError()
        dbus_error_init(&error)
        let silent = dbus_connection_open_private(bus.address, &error)!
        #expect(dbus_bus_register(silent, &error) != 0)
        let silentName = String(cString: dbus_bus_get_unique_name(silent))
        defer { dbus_connection_close(silent); dbus_connection_unref(silent) }
        let client = try DBusConnection(bus.bus)
        defer { client.close() }
        let start = ContinuousClock.now
        do {
            _ = try await client.call(silentName, "/", Self.echoInterface, "Echo", timeout: .milliseconds(300))
            Issue.record("the silent peer answered")
        } catch let e as BusError {
            #expect(e.name == BusError.noReplyName)
        }
        let waited = ContinuousClock.now - start
        #expect(waited >= .milliseconds(300) && waited < .seconds(3))
        // The connection still works after a timeout.
        let id = try await client.call("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "GetId")
        #expect(id.first?.string?.count == 32)
    }

    @Test func closingFailsPendingCalls() async throws {
        let bus = try PrivateBus()
        defer { bus.close() }
        var error = CDBus.DBusError()
        dbus_error_init(&error)
        let silent = dbus_connection_open_private(bus.address, &error)!
        _ = dbus_bus_register(silent, &error)
        let silentName = String(cString: dbus_bus_get_unique_name(silent))
        defer { dbus_connection_close(silent); dbus_connection_unref(silent) }
        let client = try DBusConnection(bus.bus)
        async let call = client.call(silentName, "/", Self.echoInterface, "Echo", timeout: .seconds(30))
        try await Task.sleep(for: .milliseconds(100))
        client.close()
        do { _ = try await call; Issue.record("answered") } catch let e as BusError { #expect(e.name == BusError.disconnectedName) }
    }

    /// After the connection's thread ended (closed here; the bus dying does the same), a new
    /// call fails at once. It used to be queued for a thread that was gone and never answered:
    /// boxkeyd then hung at shutdown once dbus-daemon had gone away.
    @Test func aCallAfterTheConnectionEndedFailsAtOnce() async throws {
        let bus = try PrivateBus()
        defer { bus.close() }
        let client = try DBusConnection(bus.bus)
        client.close()
        let outcome = await withTaskGroup(of: String.self) { group in
            group.addTask {
                do { _ = try await client.call("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "GetId"); return "answered" }
                catch let e as BusError { return e.name } catch { return "\(error)" }
            }
            group.addTask { try? await Task.sleep(for: .seconds(5)); return "hung" }
            let first = await group.next()!
            group.cancelAll()
            return first
        }
        #expect(outcome == BusError.disconnectedName)
    }
}
