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
    /// The entries a box reads: users with phones.
    static let rosterFilter = "(&(objectClass=\(userClass))(\(phoneAttribute)=*))"
    /// The entries a box follows: users with phones, and the containers that may hold them (a
    /// subtree moved out of the base is told of by its top entry only).
    static let followFilter = "(|\(rosterFilter)(objectClass=organizationalUnit)(objectClass=organization)(objectClass=domain)(objectClass=dcObject)(objectClass=locality)(objectClass=country))"

    public struct Failure: Error, CustomStringConvertible {
        public let description: String
        /// libldap's result code, where it gave one.
        public var code: Int32 = 0
        public init(description: String, code: Int32 = 0) { self.description = description; self.code = code }
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
        let handle = try open()
        defer { boxkey_ldap_close(handle) }
        return try body(handle)
    }

    /// An open, bound connection, for the caller to close (`boxkey_ldap_close`).
    func open() throws -> OpaquePointer {
        // Whoever can write the CA file can pose as the directory and hand out phones.
        if !settings.caFile.isEmpty, let problem = DaemonConfig.ownershipProblem(settings.caFile) {
            throw Failure(description: "[fleet] ca_file: \(problem)")
        }
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
        guard rc == 0, let handle else { throw Failure(description: "\(settings.uri): \(Self.text(err))", code: rc) }
        return handle
    }

    /// The bind password: the file's first line, NUL-terminated. The file must be private
    /// (no group or other access): it opens the directory.
    private func readPassword() throws -> [UInt8] {
        guard !bindDN.isEmpty, bindDN != "EXTERNAL" else { return [0] }
        var st = stat()
        guard stat(passwordFile, &st) == 0 else { throw Failure(description: "cannot read the bind password file \(passwordFile): \(String(cString: strerror(errno)))") }
        guard st.st_uid == geteuid() else { throw Failure(description: "the bind password file \(passwordFile) is not owned by this user (uid \(geteuid()))") }
        guard st.st_mode & 0o077 == 0 else { throw Failure(description: "the bind password file \(passwordFile) is readable by others (mode \(String(st.st_mode & 0o777, radix: 8))); chmod 600 it") }
        guard let data = FileManager.default.contents(atPath: passwordFile) else { throw Failure(description: "cannot read the bind password file \(passwordFile)") }
        var bytes = [UInt8](data)
        defer { secureZero(&bytes) }
        var line = Array(bytes.prefix { $0 != 0x0a && $0 != 0x0d })
        guard !line.isEmpty, !line.contains(0) else { throw Failure(description: "the bind password file \(passwordFile) holds no password on its first line") }
        line.append(0)
        return line
    }

    /// More entries with phones than this is not a fleet but a directory gone wrong: the read fails.
    public static let maxEntries = 200_000
    /// Names per filter when the roster's names are looked up among all entries.
    static let namesPerFilter = 200

    /// Every entry under the base with phones: the roster, the round trips it took, and what it
    /// left out (values that are not phone keys; entries whose login name is ambiguous).
    public func readRoster(now: Date = Date()) throws -> (roster: FleetRoster, requests: Int, skipped: Int) {
        try withConnection { ld in
            var entries: [(dn: String, names: [String], number: String?, values: [String])] = []
            var tooMany = false
            let requests = try search(ld, filter: Self.rosterFilter) { dn, names, number, values in
                entries.append((dn, names, number, values))
                tooMany = entries.count > Self.maxEntries
                return tooMany
            }
            if tooMany { throw Failure(description: "more than \(Self.maxEntries) entries with phones under \(settings.base)") }
            // A name vouches only if no other entry under the base has it, or one that looks
            // like it, phones or not (a renamed or copied entry).
            let (others, lookups) = try lookalikes(ld, of: Set(entries.flatMap(\.names)), besides: Set(entries.map(\.dn)))
            entries += others.map { ($0.dn, $0.names, $0.number, []) }
            var roster = FleetRoster(readAt: now)
            let skipped = roster.add(entries: entries.map { ($0.names, $0.number, $0.values) })
            return (roster, requests + lookups, skipped)
        }
    }

    /// Every entry but those in `besides` that the server matches to one of `names` (its own
    /// matching rules: case, width), in batches of one filter each; and the round trips.
    func lookalikes(_ ld: OpaquePointer, of names: Set<String>, besides: Set<String>) throws -> (entries: [FleetMirror.Entry], requests: Int) {
        // (`besides`: the DNs as the server gives them.)
        var found: [FleetMirror.Entry] = []
        var seen = besides
        var requests = 0
        // Each name and what it looks like (`Alice` → `alice`), where the fleet takes it.
        let names = FleetMirror.searched(names).sorted()
        for start in stride(from: 0, to: names.count, by: Self.namesPerFilter) {
            let batch = names[start..<min(start + Self.namesPerFilter, names.count)]
            let filter = "(|" + batch.map { "(\(settings.userAttribute)=\(Self.escape($0)))" }.joined() + ")"
            requests += try search(ld, base: settings.base, filter: filter, names: settings.userAttribute, values: "1.1") { dn, names, number, _ in
                if seen.insert(dn).inserted { found.append(.init(dn: dn, names: names, number: number, values: [])) }
                return false
            }
        }
        return (found, requests)
    }

    /// A user's entry: its DN and phone values (nil: no such user under the base).
    public func entry(of user: String) throws -> (dn: String, phones: [String])? {
        try withConnection { ld in try entry(ld, user).map { ($0.dn, $0.phones) } }
    }

    /// The one entry whose login name is exactly `user`. The server matches names its own way
    /// (caseIgnoreMatch finds `alice` for `Alice`, and for fullwidth `ａｌｉｃｅ`): every entry it
    /// returns is looked at, and any but one with exactly that name, and no other, is an error.
    private func entry(_ ld: OpaquePointer, _ user: String) throws -> (dn: String, number: String?, phones: [String])? {
        guard FleetRoster.isFleetName(user) else {
            throw Failure(description: "\"\(logSafe(user))\" is not a name the fleet takes (lower-case letters, digits, _ . -, as adduser makes them): directory servers match names regardless of case and width, so it could find another user's entry")
        }
        var found: [(dn: String, names: [String], number: String?, phones: [String])] = []
        _ = try search(ld, filter: "(\(settings.userAttribute)=\(Self.escape(user)))") { dn, names, number, values in
            found.append((dn, names, number, values))
            return found.count > 8
        }
        guard !found.isEmpty else { return nil }
        guard found.count == 1, found[0].names == [user] else {
            throw Failure(description: "the directory has \(found.count) entr\(found.count == 1 ? "y" : "ies") under \(settings.base) whose \(settings.userAttribute) looks like \(user) (\(found.flatMap(\.names).map { logSafe($0) }.joined(separator: ", "))): only one entry named exactly \(user) is written to")
        }
        return (found[0].dn, found[0].number, found[0].phones)
    }

    /// Publishes `key` as a phone of `user` (the entry gets the auxiliary class if it lacks it).
    /// `localUID`: the uid of the box's account of that exact name; the entry's uidNumber,
    /// where it has one, must be the same.
    public func add(key: PublicKey, name: String, user: String, localUID: UInt32? = nil) throws {
        try withConnection { ld in
            guard let (dn, number, values) = try entry(ld, user) else { throw Failure(description: "no entry for user \(user) under \(settings.base)") }
            if let localUID, let number, UInt32(number) != localUID {
                throw Failure(description: "the directory's \(user) has uidNumber \(number), this box's \(user) is uid \(localUID): not the same person")
            }
            if values.contains(where: { FleetRoster.parse($0)?.key == key }) { return }
            try change(ld, dn: dn, add: true, value: FleetRoster.value(key: key, name: name))
        }
    }

    /// Removes the phones of `user` whose fingerprint (or key) starts with `prefix`; returns
    /// the values removed. Ambiguous prefixes remove nothing.
    public func remove(phone prefix: String, user: String) throws -> [String] {
        try withConnection { ld in
            guard let (dn, _, values) = try entry(ld, user) else { throw Failure(description: "no entry for user \(user) under \(settings.base)") }
            let matching = values.filter { v in
                guard let (key, _) = FleetRoster.parse(v) else { return false }
                return Fingerprint.matches(key.fingerprint, prefix: prefix) || Fingerprint.matches(hex(key.bytes).uppercased(), prefix: prefix)
            }
            guard matching.count == 1 else {
                throw Failure(description: matching.isEmpty ? "\(user) has no phone \(prefix) in the directory" : "\(prefix) matches \(matching.count) of \(user)'s phones; give more of the fingerprint")
            }
            try change(ld, dn: dn, add: false, value: matching[0])
            return matching
        }
    }

    private func change(_ ld: OpaquePointer, dn: String, add: Bool, value: String) throws {
        try change(ld, dn: dn, operation: add ? Int32(BOXKEY_LDAP_ADD) : Int32(BOXKEY_LDAP_DELETE), attribute: Self.phoneAttribute, value: value,
                   objectClass: Self.userClass)
    }

    private func change(_ ld: OpaquePointer, dn: String, operation: Int32, attribute: String, value: String, objectClass: String) throws {
        var err = [CChar](repeating: 0, count: 512)
        let rc = boxkey_ldap_change(ld, dn, operation, attribute, value, objectClass, &err, err.count)
        guard rc == 0 else { throw Failure(description: "\(dn): \(Self.text(err))") }
    }

    // MARK: - The fleet's revocation list of box certificates

    public static let revocationsAttribute = "boxkeyBoxRevocations"
    public static let fleetClass = "boxkeyFleet"

    /// The signed revocation list on `[fleet] revocations_dn` (nil: none there yet).
    public func readRevocations() throws -> BoxRevocationList? {
        return try withConnection { ld in try readRevocations(ld) }
    }

    func readRevocations(_ ld: OpaquePointer) throws -> BoxRevocationList? {
        guard !settings.revocationsDN.isEmpty else { return nil }
        return try readRevocationsValue(ld)?.list
    }

    private func readRevocationsValue(_ ld: OpaquePointer) throws -> (value: String, list: BoxRevocationList)? {
        var values: [String] = []
        _ = try search(ld, base: settings.revocationsDN, filter: "(objectClass=*)", names: "cn", values: Self.revocationsAttribute) { _, _, _, v in values += v; return false }
        guard let value = values.first else { return nil }
        guard let bytes = base64Decode(value), let list = try? BoxRevocationList.decode(bytes) else {
            throw Failure(description: "\(settings.revocationsDN): \(Self.revocationsAttribute) is not a revocation list")
        }
        return (value, list)
    }

    /// Reads the current list, lets `change` make the next one from it, and writes it in place
    /// of exactly the value read (a concurrent change makes the write fail, not get lost).
    public func updateRevocations(_ change: (BoxRevocationList?) throws -> BoxRevocationList) throws -> BoxRevocationList {
        guard !settings.revocationsDN.isEmpty else { throw Failure(description: "[fleet] revocations_dn is not set") }
        return try withConnection { ld in
            let current = try readRevocationsValue(ld)
            let next = try change(current?.list)
            var err = [CChar](repeating: 0, count: 512)
            guard boxkey_ldap_swap(ld, settings.revocationsDN, Self.revocationsAttribute, current?.value, base64Encode(next.encode()), &err, err.count) == 0 else {
                throw Failure(description: "\(settings.revocationsDN): \(Self.text(err))")
            }
            return next
        }
    }

    /// Runs a paged search under the base; returns the round trips.
    /// Each entry: its DN, its login names, its uidNumber, its phone values; true stops.
    typealias Entry = (String, [String], String?, [String]) -> Bool

    private func search(_ ld: OpaquePointer, filter: String, _ each: Entry) throws -> Int {
        try search(ld, base: settings.base, filter: filter, names: settings.userAttribute, values: Self.phoneAttribute, each)
    }

    private func search(_ ld: OpaquePointer, base: String, filter: String, names: String, values: String, _ each: Entry) throws -> Int {
        final class Sink { var each: Entry; init(_ e: @escaping Entry) { each = e } }
        return try withoutActuallyEscaping(each) { each in
            let sink = Sink(each)
            var requests: Int32 = 0
            var err = [CChar](repeating: 0, count: 512)
            let rc = withExtendedLifetime(sink) {
                boxkey_ldap_search(ld, base, filter, names, values, Int32(Self.pageSize), { context, dn, names, nameCount, number, values, count in
                    let sink = Unmanaged<Sink>.fromOpaque(context!).takeUnretainedValue()
                    let strings = (0..<Int(count)).map { String(cString: values![$0]!) }
                    let nameStrings = (0..<Int(nameCount)).map { String(cString: names![$0]!) }
                    return sink.each(String(cString: dn!), nameStrings, number.map { String(cString: $0) }, strings) ? 1 : 0
                }, Unmanaged.passUnretained(sink).toOpaque(), &requests, &err, err.count)
            }
            guard rc == 0 else { throw Failure(description: "\(settings.uri): \(Self.text(err))", code: rc) }
            return Int(requests)
        }
    }

    /// A C error buffer's text.
    static func text(_ buffer: [CChar]) -> String {
        String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
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
