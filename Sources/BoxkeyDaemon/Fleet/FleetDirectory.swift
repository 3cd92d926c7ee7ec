import BoxkeyCore
import CBoxkeyLDAP
import FoundationEssentials
import Glibc

/// The fleet's LDAP directory, through libldap (OpenLDAP's client library): TLS always
/// (ldaps://, or ldap:// with StartTLS; ldapi:// is a local socket), the server's certificate
/// checked, a simple bind as a service account (or SASL EXTERNAL over ldapi://). Blocking:
/// callers run it off the box's actor. Phones are the values of `boxkeyPhone` on the users'
/// entries (objectClass `boxkeyUser`, docs/fleet.md and `ldap/boxkey.ldif`).
public struct FleetDirectory: Sendable {
    public static let phoneAttribute = "boxkeyPhone"
    public static let userClass = "boxkeyUser"
    /// Entries per round trip when reading the roster.
    public static let pageSize = 1000

    public struct Failure: Error, CustomStringConvertible {
        public let description: String
    }

    public let settings: DaemonConfig.Fleet
    /// The bind DN and password file, when not the settings' service account (an admin).
    let bindDN: String
    let passwordFile: String

    public init(settings: DaemonConfig.Fleet, bindDN: String? = nil, passwordFile: String? = nil) {
        self.settings = settings
        self.bindDN = bindDN ?? settings.bindDN
        self.passwordFile = passwordFile ?? settings.bindPasswordFile
    }

    /// An open, bound connection; closed when the body returns.
    func withConnection<T>(_ body: (OpaquePointer) throws -> T) throws -> T {
        var password = try readPassword()
        defer { secureZero(&password) }
        var handle: OpaquePointer?
        var err = [CChar](repeating: 0, count: 512)
        let rc = password.withUnsafeBufferPointer { p in
            p.withMemoryRebound(to: CChar.self) { chars in
                boxkey_ldap_open(&handle, settings.uri, settings.startTLS ? 1 : 0, settings.caFile.isEmpty ? nil : settings.caFile,
                                 bindDN.isEmpty ? nil : bindDN, bindDN.isEmpty ? nil : chars.baseAddress, Int32(settings.timeout.components.seconds),
                                 &err, err.count)
            }
        }
        guard rc == 0, let handle else { throw Failure(description: "\(settings.uri): \(String(cString: err))") }
        defer { boxkey_ldap_close(handle) }
        return try body(handle)
    }

    /// The bind password: the file's first line, NUL-terminated. The file must be private
    /// (no group or other access): it opens the directory.
    private func readPassword() throws -> [UInt8] {
        guard !bindDN.isEmpty, bindDN != "EXTERNAL" else { return [0] }
        var st = stat()
        guard stat(passwordFile, &st) == 0 else { throw Failure(description: "cannot read the bind password file \(passwordFile): \(String(cString: strerror(errno)))") }
        guard st.st_mode & 0o077 == 0 else { throw Failure(description: "the bind password file \(passwordFile) is readable by others (mode \(String(st.st_mode & 0o777, radix: 8))); chmod 600 it") }
        guard let data = FileManager.default.contents(atPath: passwordFile) else { throw Failure(description: "cannot read the bind password file \(passwordFile)") }
        var bytes = [UInt8](data)
        defer { secureZero(&bytes) }
        var line = Array(bytes.prefix { $0 != 0x0a && $0 != 0x0d })
        guard !line.isEmpty, !line.contains(0) else { throw Failure(description: "the bind password file \(passwordFile) holds no password on its first line") }
        line.append(0)
        return line
    }

    /// Every entry under the base with phones: the roster, and the round trips it took.
    public func readRoster(now: Date = Date()) throws -> (roster: FleetRoster, requests: Int, skipped: Int) {
        try withConnection { ld in
            var roster = FleetRoster(readAt: now)
            var skipped = 0
            let requests = try search(ld, filter: "(&(objectClass=\(Self.userClass))(\(Self.phoneAttribute)=*))") { _, user, values in
                guard let user else { return }
                skipped += roster.add(user: user, values: values).count
            }
            return (roster, requests, skipped)
        }
    }

    /// A user's entry: its DN and phone values (nil: no such user under the base).
    public func entry(of user: String) throws -> (dn: String, phones: [String])? {
        try withConnection { ld in try entry(ld, user) }
    }

    private func entry(_ ld: OpaquePointer, _ user: String) throws -> (dn: String, phones: [String])? {
        var found: [(String, [String])] = []
        _ = try search(ld, filter: "(\(settings.userAttribute)=\(Self.escape(user)))") { dn, _, values in found.append((dn, values)) }
        guard found.count <= 1 else { throw Failure(description: "\(found.count) entries under \(settings.base) have \(settings.userAttribute)=\(user)") }
        return found.first
    }

    /// Publishes `key` as a phone of `user` (the entry gets the auxiliary class if it lacks it).
    public func add(key: PublicKey, name: String, user: String) throws {
        try withConnection { ld in
            guard let (dn, values) = try entry(ld, user) else { throw Failure(description: "no entry for user \(user) under \(settings.base)") }
            if values.contains(where: { FleetRoster.parse($0)?.key == key }) { return }
            try change(ld, dn: dn, add: true, value: FleetRoster.value(key: key, name: name))
        }
    }

    /// Removes the phones of `user` whose fingerprint (or key) starts with `prefix`; returns
    /// the values removed. Ambiguous prefixes remove nothing.
    public func remove(phone prefix: String, user: String) throws -> [String] {
        try withConnection { ld in
            guard let (dn, values) = try entry(ld, user) else { throw Failure(description: "no entry for user \(user) under \(settings.base)") }
            let wanted = prefix.uppercased().filter { $0 != "-" }
            let matching = values.filter { v in
                guard let (key, _) = FleetRoster.parse(v) else { return false }
                return !wanted.isEmpty && (key.fingerprint.filter { $0 != "-" }.hasPrefix(wanted) || hex(key.bytes).uppercased().hasPrefix(wanted))
            }
            guard matching.count == 1 else {
                throw Failure(description: matching.isEmpty ? "\(user) has no phone \(prefix) in the directory" : "\(prefix) matches \(matching.count) of \(user)'s phones; give more of the fingerprint")
            }
            try change(ld, dn: dn, add: false, value: matching[0])
            return matching
        }
    }

    private func change(_ ld: OpaquePointer, dn: String, add: Bool, value: String) throws {
        var err = [CChar](repeating: 0, count: 512)
        let rc = boxkey_ldap_change(ld, dn, add ? 1 : 0, Self.phoneAttribute, value, add ? Self.userClass : nil, &err, err.count)
        guard rc == 0 else { throw Failure(description: "\(dn): \(String(cString: err))") }
    }

    /// Runs a paged search under the base; returns the round trips.
    private func search(_ ld: OpaquePointer, filter: String, _ each: (String, String?, [String]) -> Void) throws -> Int {
        final class Sink { var each: (String, String?, [String]) -> Void; init(_ e: @escaping (String, String?, [String]) -> Void) { each = e } }
        return try withoutActuallyEscaping(each) { each in
            let sink = Sink(each)
            var requests: Int32 = 0
            var err = [CChar](repeating: 0, count: 512)
            let rc = withExtendedLifetime(sink) {
                boxkey_ldap_search(ld, settings.base, filter, settings.userAttribute, Self.phoneAttribute, Int32(Self.pageSize), { context, dn, first, values, count in
                    let sink = Unmanaged<Sink>.fromOpaque(context!).takeUnretainedValue()
                    let strings = (0..<Int(count)).map { String(cString: values![$0]!) }
                    sink.each(String(cString: dn!), first.map { String(cString: $0) }, strings)
                    return 0
                }, Unmanaged.passUnretained(sink).toOpaque(), &requests, &err, err.count)
            }
            guard rc == 0 else { throw Failure(description: "\(settings.uri): \(String(cString: err))") }
            return Int(requests)
        }
    }

    /// RFC 4515: a value inside a search filter.
    static func escape(_ value: String) -> String {
        let special: Set<UInt8> = [UInt8(ascii: "*"), UInt8(ascii: "("), UInt8(ascii: ")"), UInt8(ascii: "\\"), 0]
        var out = [UInt8]()
        for byte in value.utf8 {
            if special.contains(byte) { out += Array("\\\(byte < 16 ? "0" : "")\(String(byte, radix: 16))".utf8) } else { out.append(byte) }
        }
        return String(decoding: out, as: UTF8.self)
    }
}
