import NIOConcurrencyHelpers

/// A tree of exported objects under one root, with the standard interfaces peers expect:
/// `org.freedesktop.DBus.ObjectManager` at the root (BlueZ reads a GATT application with
/// `GetManagedObjects`), `Properties` (Get, GetAll, and PropertiesChanged when a value
/// changes) and `Introspectable` on every object.
public final class DBusObjectTree: Sendable {
    public struct Interface: Sendable {
        public var properties: [String: DBusValue]
        public var methods: [String: DBusConnection.MethodHandler]

        public init(properties: [String: DBusValue] = [:], methods: [String: DBusConnection.MethodHandler] = [:]) {
            self.properties = properties
            self.methods = methods
        }
    }

    public static let propertiesInterface = "org.freedesktop.DBus.Properties"
    public static let objectManagerInterface = "org.freedesktop.DBus.ObjectManager"
    static let introspectableInterface = "org.freedesktop.DBus.Introspectable"

    public let root: String
    private let connection: DBusConnection
    private let objects = NIOLockedValueBox([String: [String: Interface]]())

    public init(connection: DBusConnection, root: String) {
        self.connection = connection
        self.root = root
        connection.export(root) { [self] in handle($0) }
    }

    /// Adds (or replaces) an object. Peers are told through `InterfacesAdded` when `announce`.
    public func add(_ path: String, _ interfaces: [String: Interface], announce: Bool = false) {
        objects.withLockedValue { $0[path] = interfaces }
        if path != root {
            connection.export(path) { [self] in handle($0) }
        }
        if announce {
            connection.emit(root, Self.objectManagerInterface, "InterfacesAdded",
                            [.objectPath(path), Self.interfacesValue(interfaces)])
        }
    }

    /// Removes every object at or under `path`.
    public func remove(under path: String, announce: Bool = false) {
        let removed = objects.withLockedValue { o -> [String: [String: Interface]] in
            let gone = o.filter { $0.key == path || $0.key.hasPrefix(path + "/") }
            for k in gone.keys { o[k] = nil }
            return gone
        }
        for (p, interfaces) in removed {
            if p != root { connection.unexport(p) }
            if announce {
                connection.emit(root, Self.objectManagerInterface, "InterfacesRemoved",
                                [.objectPath(p), .strings(interfaces.keys.sorted())])
            }
        }
    }

    /// Changes a property and signals `PropertiesChanged` (BlueZ reads GATT notifications and
    /// advertisement updates from this signal).
    public func set(_ path: String, _ interface: String, _ name: String, _ value: DBusValue) {
        let known = objects.withLockedValue { o -> Bool in
            guard o[path]?[interface] != nil else { return false }
            o[path]![interface]!.properties[name] = value
            return true
        }
        guard known else { return }
        connection.emit(path, Self.propertiesInterface, "PropertiesChanged",
                        [.string(interface), .vardict([name: value]), .strings([])])
    }

    public func property(_ path: String, _ interface: String, _ name: String) -> DBusValue? {
        objects.withLockedValue { $0[path]?[interface]?.properties[name] }
    }

    private static func interfacesValue(_ interfaces: [String: Interface]) -> DBusValue {
        .dict(keySignature: "s", valueSignature: "a{sv}",
              interfaces.keys.sorted().map { (.string($0), .vardict(interfaces[$0]!.properties)) })
    }

    private func handle(_ call: DBusMessage) -> DBusReply {
        guard let path = call.path, let member = call.member else {
            return .error(BusError(BusError.unknownMethodName, "no member"))
        }
        let snapshot = objects.withLockedValue { $0 }
        switch (call.interface, member) {
        case (Self.objectManagerInterface, "GetManagedObjects") where path == root:
            let managed = snapshot.filter { $0.key != root }.keys.sorted().map { p in
                (DBusValue.objectPath(p), Self.interfacesValue(snapshot[p]!))
            }
            return .values([.dict(keySignature: "o", valueSignature: "a{sa{sv}}", managed)])
        case (Self.introspectableInterface, "Introspect"):
            return .values([.string(introspection(of: path, in: snapshot))])
        case (Self.propertiesInterface, "GetAll"):
            guard let name = call.arguments.first?.string, let interface = snapshot[path]?[name] else {
                return .error(BusError(BusError.invalidArgsName, "no such interface"))
            }
            return .values([.vardict(interface.properties)])
        case (Self.propertiesInterface, "Get"):
            guard call.arguments.count == 2, let i = call.arguments[0].string, let n = call.arguments[1].string,
                  let value = snapshot[path]?[i]?.properties[n] else {
                return .error(BusError(BusError.invalidArgsName, "no such property"))
            }
            return .values([.variant(value)])
        case (Self.propertiesInterface, "Set"):
            return .error(BusError("org.freedesktop.DBus.Error.PropertyReadOnly", "properties are read-only"))
        default:
            guard let object = snapshot[path] else {
                return .error(BusError(BusError.unknownObjectName, "no object at \(path)"))
            }
            let handler = call.interface.map { object[$0]?.methods[member] }
                ?? object.values.lazy.compactMap { $0.methods[member] }.first
            guard let handler else {
                return .error(BusError(BusError.unknownMethodName, "\(call.interface ?? "").\(member) is not handled at \(path)"))
            }
            return handler(call)
        }
    }

    private func introspection(of path: String, in snapshot: [String: [String: Interface]]) -> String {
        var xml = "<!DOCTYPE node PUBLIC \"-//freedesktop//DTD D-BUS Object Introspection 1.0//EN\" \"http://www.freedesktop.org/standards/dbus/1.0/introspect.dtd\">\n<node>\n"
        for (name, interface) in (snapshot[path] ?? [:]).sorted(by: { $0.key < $1.key }) {
            xml += "  <interface name=\"\(name)\">\n"
            for m in interface.methods.keys.sorted() { xml += "    <method name=\"\(m)\"/>\n" }
            for (p, v) in interface.properties.sorted(by: { $0.key < $1.key }) {
                xml += "    <property name=\"\(p)\" type=\"\(v.signature)\" access=\"read\"/>\n"
            }
            xml += "  </interface>\n"
        }
        let prefix = path == "/" ? "/" : path + "/"
        let children = Set(snapshot.keys.filter { $0.hasPrefix(prefix) }.compactMap { $0.dropFirst(prefix.count).split(separator: "/").first })
        for c in children.sorted() { xml += "  <node name=\"\(c)\"/>\n" }
        return xml + "</node>\n"
    }
}
