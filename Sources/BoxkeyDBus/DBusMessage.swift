import CDBus

/// A D-Bus error reply, or a local failure named the way D-Bus names errors.
public struct BusError: Error, Sendable, Equatable, CustomStringConvertible {
    public let name: String
    public let message: String

    public init(_ name: String, _ message: String) {
        self.name = name
        self.message = message
    }

    public var description: String { message.isEmpty ? name : "\(name): \(message)" }

    public static let noReplyName = "org.freedesktop.DBus.Error.NoReply"
    public static let disconnectedName = "org.freedesktop.DBus.Error.Disconnected"
    public static let unknownMethodName = "org.freedesktop.DBus.Error.UnknownMethod"
    public static let unknownObjectName = "org.freedesktop.DBus.Error.UnknownObject"
    public static let invalidArgsName = "org.freedesktop.DBus.Error.InvalidArgs"
    public static let serviceUnknownName = "org.freedesktop.DBus.Error.ServiceUnknown"
}

/// An incoming message, copied out of libdbus on the connection's thread so it can travel.
public struct DBusMessage: Sendable {
    public enum Kind: Sendable { case methodCall, methodReturn, error, signal }

    public var kind: Kind
    public var path: String?
    public var interface: String?
    public var member: String?
    public var sender: String?
    public var errorName: String?
    public var serial: UInt32
    public var replySerial: UInt32
    public var noReplyExpected: Bool
    public var arguments: [DBusValue]

    init?(_ message: OpaquePointer) {
        switch dbus_message_get_type(message) {
        case 1: kind = .methodCall
        case 2: kind = .methodReturn
        case 3: kind = .error
        case 4: kind = .signal
        default: return nil
        }
        func s(_ p: UnsafePointer<CChar>?) -> String? { p.map { String(cString: $0) } }
        path = s(dbus_message_get_path(message))
        interface = s(dbus_message_get_interface(message))
        member = s(dbus_message_get_member(message))
        sender = s(dbus_message_get_sender(message))
        errorName = s(dbus_message_get_error_name(message))
        serial = dbus_message_get_serial(message)
        replySerial = dbus_message_get_reply_serial(message)
        noReplyExpected = dbus_message_get_no_reply(message) != 0
        var iter = DBusMessageIter()
        arguments = dbus_message_iter_init(message, &iter) != 0 ? DBusValue.readAll(&iter) : []
    }

    /// The error this reply carries, with the first string argument as its message.
    var error: BusError? {
        guard kind == .error else { return nil }
        return BusError(errorName ?? "org.freedesktop.DBus.Error.Failed", arguments.first?.string ?? "")
    }
}

/// Matches signals by any of sender, path (or path prefix), interface and member.
public struct SignalMatch: Sendable, Hashable {
    public var sender: String?
    public var path: String?
    public var pathNamespace: String?
    public var interface: String?
    public var member: String?

    public init(sender: String? = nil, path: String? = nil, pathNamespace: String? = nil, interface: String? = nil, member: String? = nil) {
        self.sender = sender
        self.path = path
        self.pathNamespace = pathNamespace
        self.interface = interface
        self.member = member
    }

    /// The bus's match rule (AddMatch). It only selects what the bus broadcasts to us: a signal
    /// another client addresses to our connection arrives whatever the rule says, with that
    /// client's unique name as sender, which the bus stamps and no client can forge.
    var rule: String {
        var parts = ["type='signal'"]
        if let sender { parts.append("sender='\(sender)'") }
        if let path { parts.append("path='\(path)'") }
        if let pathNamespace, pathNamespace != "/" { parts.append("path_namespace='\(pathNamespace)'") }
        if let interface { parts.append("interface='\(interface)'") }
        if let member { parts.append("member='\(member)'") }
        return parts.joined(separator: ",")
    }

    /// The bus's own name: its signals (NameOwnerChanged) carry it as sender.
    static let busName = "org.freedesktop.DBus"

    /// Whether `sender` is a well-known name whose owner must be known to match (not a unique
    /// name, not the bus).
    var senderNeedsOwner: String? {
        guard let sender, !sender.hasPrefix(":"), sender != Self.busName else { return nil }
        return sender
    }

    /// `owner`: the unique name that owns `sender` now, when it is a well-known name. A signal
    /// from anyone else — another local client addressing it to us — does not match.
    func matches(_ m: DBusMessage, owner: String? = nil) -> Bool {
        guard m.kind == .signal else { return false }
        if let sender {
            if sender.hasPrefix(":") || sender == Self.busName {
                guard m.sender == sender else { return false }
            } else {
                guard let owner, !owner.isEmpty, m.sender == owner else { return false }
            }
        }
        if let path, m.path != path { return false }
        if let ns = pathNamespace, ns != "/", let p = m.path, p != ns, !p.hasPrefix(ns + "/") { return false }
        if let interface, m.interface != interface { return false }
        if let member, m.member != member { return false }
        return true
    }
}
