@testable import BoxkeyDaemon
import BoxkeyCore
import BoxkeyHost
import FoundationEssentials
import Testing

@Suite struct FleetTests {
    let alicePhone = KeyPair.generate().publicKey
    let bobPhone = KeyPair.generate().publicKey

    @Test func theRosterMapsPhonesToUsersAndSkipsWhatIsNotAPhoneKey() {
        var roster = FleetRoster(readAt: Date())
        let skipped = roster.add(user: "alice", values: [FleetRoster.value(key: alicePhone, name: "Pixel 8"), "ssh-ed25519 AAAA", "zz" + String(repeating: "0", count: 62)])
        roster.add(user: "bob", values: [FleetRoster.value(key: alicePhone, name: ""), FleetRoster.value(key: bobPhone, name: "")])
        #expect(skipped.count == 2)
        #expect(roster.users(of: alicePhone, now: Date(), maxStale: .seconds(60)) == ["alice", "bob"])
        #expect(roster.users(of: bobPhone, now: Date(), maxStale: .seconds(60)) == ["bob"])
        #expect(roster.phones[hex(alicePhone.bytes)]?.name == "Pixel 8")
    }

    @Test(arguments: ["Alice", "\u{FF41}\u{FF4C}\u{FF49}\u{FF43}\u{FF45}", "alice\u{0301}", "alice ", " alice", "al\u{200B}ice", "ALICE"])
    func aLookAlikeOfAliceIsNotAFleetNameAndMakesAliceVouchForNobody(_ lookalike: String) {
        #expect(FleetRoster.isFleetName("alice"))
        #expect(!FleetRoster.isFleetName(lookalike))
        #expect(FleetRoster.lookalike(lookalike) == "alice")
        var roster = FleetRoster(readAt: Date())
        let phone = FleetRoster.value(key: alicePhone, name: "")
        let skipped = roster.add(entries: [(["alice"], "1000", [phone]), ([lookalike], "1003", [FleetRoster.value(key: bobPhone, name: "")])])
        #expect(skipped == 2)
        #expect(roster.users(of: alicePhone, now: Date(), maxStale: .seconds(60)).isEmpty)
        #expect(roster.users(of: bobPhone, now: Date(), maxStale: .seconds(60)).isEmpty)
    }

    @Test func fleetNamesAreWhatAdduserMakes() {
        for ok in ["alice", "_svc", "bob.smith", "user-01"] { #expect(FleetRoster.isFleetName(ok), "\(ok)") }
        for bad in ["", "1alice", "-x", "a b", String(repeating: "a", count: 33), "al\u{0}ice", "ali$"] { #expect(!FleetRoster.isFleetName(bad), "\(bad)") }
    }

    @Test func aValueIsTheKeyThenAPrintableName() throws {
        let value = FleetRoster.value(key: alicePhone, name: "  Алиса's\nphone\u{7f} ")
        #expect(value == hex(alicePhone.bytes) + " 'sphone")
        #expect(!value.contains("\n"))
        let parsed = try #require(FleetRoster.parse(value))
        #expect(parsed.key == alicePhone)
        // Upper-case hex (another tool) parses; anything else does not.
        #expect(FleetRoster.parse(hex(alicePhone.bytes).uppercased())?.key == alicePhone)
        #expect(FleetRoster.parse(String(hex(alicePhone.bytes).dropLast())) == nil)
        #expect(FleetRoster.parse("") == nil)
    }

    /// Past `max_stale_s` the roster vouches for nobody: fail closed for phone logins. A read
    /// stamped in the future (a clock set back) is not trusted either, beyond a minute's skew.
    @Test func aStaleRosterVouchesForNobody() {
        var roster = FleetRoster(readAt: Date(timeIntervalSinceNow: -3601))
        roster.add(user: "alice", values: [FleetRoster.value(key: alicePhone, name: "")])
        #expect(roster.users(of: alicePhone, now: Date(), maxStale: .seconds(3600)).isEmpty)
        #expect(roster.users(of: alicePhone, now: Date(), maxStale: .seconds(7200)) == ["alice"])
        roster.readAt = Date(timeIntervalSinceNow: 3600)
        #expect(roster.users(of: alicePhone, now: Date(), maxStale: .seconds(7200)).isEmpty)
    }

    @Test func whatARefreshTookAway() {
        var old = FleetRoster(readAt: Date())
        old.add(user: "alice", values: [FleetRoster.value(key: alicePhone, name: "")])
        old.add(user: "bob", values: [FleetRoster.value(key: alicePhone, name: ""), FleetRoster.value(key: bobPhone, name: "")])
        var new = FleetRoster(readAt: Date())
        new.add(user: "bob", values: [FleetRoster.value(key: bobPhone, name: "")])
        let lost = new.lost(since: old)
        #expect(lost.count == 1 && lost[0].key == hex(alicePhone.bytes) && lost[0].users == ["alice", "bob"])
    }

    @Test func theCacheRoundTripsPrivatelyAndACorruptOneIsAnError() throws {
        let dir = FileManager.default.temporaryDirectory.path + "/fleet-\(UInt64.random(in: 0...UInt64.max))"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let path = dir + "/fleet-roster.json", key = KeyPair.generate().privateKey
        var roster = FleetRoster(readAt: Date(timeIntervalSince1970: 1_800_000_000))
        roster.add(user: "alice", values: [FleetRoster.value(key: alicePhone, name: "p")])
        try roster.save(path: path, sealedBy: key)
        #expect(try FleetRoster.load(path: path, sealedBy: key) == roster)
        let mode = try FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? Int
        #expect(mode == 0o600)
        try Data("{".utf8).write(to: URL(fileURLWithPath: path))
        #expect(throws: (any Error).self) { try FleetRoster.load(path: path, sealedBy: key) }
        #expect(try FleetRoster.load(path: dir + "/none.json", sealedBy: key) == nil)
    }

    /// The attack: a cache with the right owner and mode that this box did not write (another
    /// program of root's, an edit, a restore from another box) vouches for nobody.
    @Test func theCacheJSONWrittenByHandIsWhatTheDecoderReads() throws {
        var roster = FleetRoster(readAt: Date(timeIntervalSince1970: 1_795_000_000))
        roster.add(user: "alice", values: [FleetRoster.value(key: alicePhone, name: "Pixel \"8\" \\ /a")])
        roster.add(user: "bob.x", values: [FleetRoster.value(key: alicePhone, name: ""), FleetRoster.value(key: bobPhone, name: "b")])
        roster.uidNumbers = ["alice": 1000, "bob.x": 4_000_000_000]
        roster.phones[hex(bobPhone.bytes)]?.name = "tab\there\u{1}\u{7f}é"
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        #expect(try decoder.decode(FleetRoster.self, from: Data(roster.cacheJSON())) == roster)
        #expect(try decoder.decode(FleetRoster.self, from: Data(FleetRoster(readAt: roster.readAt).cacheJSON())) == FleetRoster(readAt: roster.readAt))
    }

    @Test func aCacheThisBoxDidNotSealIsRefused() throws {
        let dir = FileManager.default.temporaryDirectory.path + "/fleet-\(UInt64.random(in: 0...UInt64.max))"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let path = dir + "/fleet-roster.json", key = KeyPair.generate().privateKey
        var roster = FleetRoster(readAt: Date())
        roster.add(user: "alice", values: [FleetRoster.value(key: alicePhone, name: "alice's")])

        func refused(_ why: String) {
            do {
                _ = try FleetRoster.load(path: path, sealedBy: key)
                Issue.record("took a cache that is \(why)")
            } catch {
                #expect("\(error)".contains("not") && "\(error)".contains("sealed by this box") || "\(error)".contains("not written by this box"), "\(error)")
            }
        }
        // Another box's cache, copied here.
        try roster.save(path: path, sealedBy: KeyPair.generate().privateKey)
        refused("from another box")
        // This box's cache with a key added for alice.
        try roster.save(path: path, sealedBy: key)
        var text = String(decoding: try Data(contentsOf: URL(fileURLWithPath: path)), as: UTF8.self)
        text = text.replacing(hex(alicePhone.bytes), with: hex(bobPhone.bytes))
        try PrivateFiles.write(Data(text.utf8), to: path)
        refused("edited")
        // An unsealed cache (the JSON alone, as 0.5 wrote it).
        let json = text.split(separator: "\n", maxSplits: 1)[1]
        try PrivateFiles.write(Data(json.utf8), to: path)
        refused("unsealed")
    }

    /// Crafted values are refused one by one; the good values of the same entry stay.
    @Test func craftedPhoneValuesAreRefusedOneByOne() {
        let keys = (0..<6).map { _ in hex(KeyPair.generate().publicKey.bytes) }
        var roster = FleetRoster(readAt: Date())
        let skipped = roster.add(user: "alice", values: [
            keys[0],
            keys[1] + " phone\u{0}evil",        // NUL
            String(keys[2].dropLast()),           // 63 digits
            keys[2] + "ab",                       // 66 digits
            " " + keys[3],                        // leading space
            keys[4] + " " + String(repeating: "x", count: 65),  // too long
            keys[3] + " t\u{e9}l\u{e9}phone",   // not ASCII
            keys[4] + "\nuid: bob",              // a line break
            keys[5] + " alice's phone",
        ])
        #expect(Set(roster.phones.keys) == [keys[0], keys[5]])
        #expect(roster.phones[keys[5]]?.name == "alice's phone")
        #expect(skipped.count == 7)
    }

    @Test func anEntryHoldsAtMostSixteenPhones() {
        let keys = (0..<20).map { _ in hex(KeyPair.generate().publicKey.bytes) }
        var roster = FleetRoster(readAt: Date())
        let skipped = roster.add(user: "alice", values: keys)
        #expect(roster.phones.count == FleetRoster.maxValuesPerEntry && skipped == Array(keys.suffix(4)))
    }

    @Test func filterValuesAreEscaped() {
        #expect(FleetDirectory.escape("alice") == "alice")
        #expect(FleetDirectory.escape("*)(uid=*") == "\\2a\\29\\28uid=\\2a")
        #expect(FleetDirectory.escape("a\\b\u{0}") == "a\\5cb\\00")
    }

    // MARK: - Following the directory (FleetMirror)

    func entry(_ dn: String, _ name: String, _ phones: [PublicKey], number: String? = nil) -> FleetMirror.Entry {
        .init(dn: dn.contains("=") ? dn : "uid=\(dn),ou=people", names: name.isEmpty ? [] : [name], number: number,
              values: phones.map { FleetRoster.value(key: $0, name: "") })
    }

    func users(_ mirror: FleetMirror, _ phone: PublicKey) -> [String] {
        mirror.roster(readAt: Date()).roster.users(of: phone, now: Date(), maxStale: .seconds(60))
    }

    let a: [UInt8] = Array(repeating: 1, count: 16), b: [UInt8] = Array(repeating: 2, count: 16), c: [UInt8] = Array(repeating: 3, count: 16)

    @Test func aFollowedDirectoryGivesTheRosterAWholeReadWouldGive() {
        var mirror = FleetMirror()
        let (changed, names) = mirror.apply([.entry(uuid: a, entry("alice", "alice", [alicePhone])), .entry(uuid: b, entry("bob", "bob", [bobPhone]))])
        #expect(changed && names == ["alice", "bob"])
        #expect(!mirror.refreshed)
        _ = mirror.apply([.refreshed])
        #expect(mirror.refreshed)
        #expect(users(mirror, alicePhone) == ["alice"])
        // The same entry again (someone rewrote her description): nothing to do.
        #expect(mirror.apply([.entry(uuid: a, entry("alice", "alice", [alicePhone]))]) == (false, []))
        // A revocation: bob's entry leaves the filter (it may still be there, without phones).
        #expect(mirror.apply([.deleted(uuid: b)]) == (true, []))
        #expect(users(mirror, bobPhone).isEmpty)
        #expect(mirror.roster(readAt: Date()).roster.phones.count == 1)
        // A rename (same entryUUID, new DN and name) is a new name to look up.
        let renamed = mirror.apply([.entry(uuid: a, entry("alice2", "alice2", [alicePhone]))])
        #expect(renamed.lookUp == ["alice2"])
        #expect(users(mirror, alicePhone) == ["alice2"])
    }

    @Test func aCopyOfAliceDoesNotInheritHerNameWhenHerOwnEntryLosesItsPhones() {
        var mirror = FleetMirror()
        let mallory = KeyPair.generate().publicKey
        let copy = "uid=alice,ou=others,ou=people"
        // alice's entry, and a copy named alice in another branch with mallory's phone: neither vouches.
        _ = mirror.apply([.entry(uuid: a, entry("alice", "alice", [alicePhone])), .entry(uuid: b, entry(copy, "alice", [mallory])), .refreshed])
        #expect(users(mirror, alicePhone).isEmpty && users(mirror, mallory).isEmpty)
        // alice's phone is revoked: her entry leaves the stream but still counts.
        #expect(mirror.apply([.deleted(uuid: a)]).changed)
        #expect(users(mirror, mallory).isEmpty)
        // Only a whole look-up that no longer finds her lets the copy's name vouch.
        mirror.lookedUp(nil, found: [entry("alice", "alice", [])])
        #expect(users(mirror, mallory).isEmpty)
        mirror.lookedUp(nil, found: [])
        #expect(users(mirror, mallory) == ["alice"])
    }

    @Test func aliceBackWithANewPhoneIsNotHeldBackByHerOldSelf() {
        var mirror = FleetMirror()
        _ = mirror.apply([.entry(uuid: a, entry("alice", "alice", [alicePhone])), .refreshed])
        _ = mirror.apply([.deleted(uuid: a)])
        let newPhone = KeyPair.generate().publicKey
        #expect(mirror.apply([.entry(uuid: a, entry("alice", "alice", [newPhone]))]).lookUp == ["alice"])
        mirror.lookedUp(["alice"], found: [entry("alice", "alice", [])])
        #expect(users(mirror, newPhone) == ["alice"])
    }

    /// Second review, H1: a look-up of a name the fleet does not take (`Alice`) searched
    /// nothing and cleared alice's look-alike; renamed away, it let a copy vouch for alice.
    @Test func aNameTheFleetDoesNotTakeIsLookedUpAsWhatItLooksLikeAndClearsNothingElse() {
        var mirror = FleetMirror()
        let mallory = KeyPair.generate().publicKey
        let copy = "uid=alice,ou=others,ou=people", alice = entry("alice", "alice", [])
        _ = mirror.apply([.entry(uuid: a, entry(copy, "alice", [mallory])), .refreshed])
        mirror.lookedUp(nil, found: [alice])
        #expect(users(mirror, mallory).isEmpty)
        let junk = FleetMirror.Entry(dn: "uid=Alice,ou=x,ou=people", names: ["Alice"], number: nil, values: ["junk"])
        let names = mirror.apply([.entry(uuid: b, junk)]).lookUp
        #expect(FleetMirror.searched(names) == ["alice"])
        #expect(mirror.roster(readAt: Date(), withholding: FleetMirror.searched(names)).roster.users(of: mallory, now: Date(), maxStale: .seconds(60)).isEmpty)
        mirror.lookedUp(FleetMirror.searched(names), found: [alice, entry(copy, "alice", []), junk])
        #expect(users(mirror, mallory).isEmpty)
        let renamed = mirror.apply([.entry(uuid: b, .init(dn: "uid=zzz,ou=x,ou=people", names: ["zzz"], number: nil, values: ["junk"]))]).lookUp
        mirror.lookedUp(FleetMirror.searched(renamed), found: [])
        #expect(users(mirror, mallory).isEmpty)  // alice's own entry still counts
    }

    @Test func namesNotYetLookedUpVouchForNobody() {
        var mirror = FleetMirror()
        _ = mirror.apply([.entry(uuid: a, entry("alice", "alice", [alicePhone])), .entry(uuid: b, entry("bob", "bob", [bobPhone])), .refreshed])
        let roster = mirror.roster(readAt: Date(), withholding: ["alice"]).roster
        #expect(roster.users(of: alicePhone, now: Date(), maxStale: .seconds(60)).isEmpty)
        #expect(roster.users(of: bobPhone, now: Date(), maxStale: .seconds(60)) == ["bob"])
    }

    /// Second review, ML2: after a container's rename, an entry sent again as it first was
    /// (moved back under a new container of the old name) passed as unchanged.
    @Test func anEntryMovedBackUnderANewContainerOfTheOldNameIsPlacedThere() {
        var mirror = FleetMirror()
        let d: [UInt8] = Array(repeating: 4, count: 16)
        let carol = entry("uid=carol,ou=a,ou=people", "carol", [alicePhone])
        _ = mirror.apply([.entry(uuid: a, entry("ou=a,ou=people", "", [])), .entry(uuid: b, carol), .refreshed])
        _ = mirror.apply([.entry(uuid: a, entry("ou=b,ou=people", "", []))])
        #expect(mirror.followedDNs.contains("uid=carol,ou=b,ou=people"))
        _ = mirror.apply([.entry(uuid: d, entry("ou=a,ou=people", "", [])), .entry(uuid: b, carol)])
        #expect(mirror.followedDNs.contains("uid=carol,ou=a,ou=people"))
        _ = mirror.apply([.deleted(uuid: d)])
        #expect(users(mirror, alicePhone).isEmpty)
        #expect(mirror.count == 0 && mirror.containers == 1)
    }

    /// Second review, ML1(b): a user's entry leaving sweeps nothing below it.
    @Test func aUserLeavingTheStreamTakesNoOneElse() {
        var mirror = FleetMirror()
        _ = mirror.apply([.entry(uuid: a, entry("alice", "alice", [alicePhone])),
                          .entry(uuid: b, entry("uid=bob,uid=alice,ou=people", "bob", [bobPhone])), .refreshed])
        _ = mirror.apply([.deleted(uuid: a)])
        #expect(users(mirror, bobPhone) == ["bob"])
    }

    @Test func aLookAlikeFoundLaterTakesTheNameUntilALookUpNoLongerFindsIt() {
        var mirror = FleetMirror()
        _ = mirror.apply([.entry(uuid: a, entry("alice", "alice", [alicePhone])), .refreshed])
        mirror.lookedUp(["alice"], found: [entry("alice", "alice", [])])  // the followed entry itself: not a look-alike
        #expect(users(mirror, alicePhone) == ["alice"])
        mirror.lookedUp(["alice"], found: [entry("uid=Alice,ou=others", "Alice", [])])
        #expect(users(mirror, alicePhone).isEmpty)
        mirror.lookedUp(["bob"], found: [])  // another name's look-up leaves alice's look-alike
        #expect(users(mirror, alicePhone).isEmpty)
        mirror.lookedUp(nil, found: [])
        #expect(users(mirror, alicePhone) == ["alice"])
    }

    @Test func aSubtreeMovedOutOfTheBaseTakesItsUsersAndOneMovedWithinKeepsThem() {
        var mirror = FleetMirror()
        _ = mirror.apply([.entry(uuid: a, entry("ou=team,ou=people", "", [])),
                          .entry(uuid: b, entry("uid=carol,ou=team,ou=people", "carol", [alicePhone])),
                          .entry(uuid: c, entry("uid=dave,ou=people", "dave", [bobPhone])), .refreshed])
        #expect(users(mirror, alicePhone) == ["carol"])
        #expect(mirror.roster(readAt: Date()).skipped == 0)  // the container is not a skipped entry
        // Renamed within the base: carol's entry is below the new name.
        #expect(mirror.apply([.entry(uuid: a, entry("ou=crew,ou=people", "", []))]).changed)
        #expect(mirror.followedDNs.contains("uid=carol,ou=crew,ou=people"))
        #expect(users(mirror, alicePhone) == ["carol"])
        // Moved out: the server tells of the container only.
        _ = mirror.apply([.deleted(uuid: a)])
        #expect(users(mirror, alicePhone).isEmpty)
        #expect(users(mirror, bobPhone) == ["dave"])
    }

    @Test func anEntryWithThousandsOfValuesIsHeldAsSixteen() {
        var mirror = FleetMirror()
        let values = (0..<5000).map { _ in FleetRoster.value(key: KeyPair.generate().publicKey, name: "") }
        _ = mirror.apply([.entry(uuid: a, .init(dn: "uid=alice,ou=people", names: ["alice"], number: nil, values: values)), .refreshed])
        let (roster, skipped) = mirror.roster(readAt: Date())
        #expect(roster.phones.count == FleetRoster.maxValuesPerEntry && skipped == 5000 - FleetRoster.maxValuesPerEntry)
    }

    @Test func theFleetSectionParses() throws {
        let c = try DaemonConfig.parse("""
            [fleet]
            uri = "ldaps://ldap.example.org"
            base = "ou=people,dc=example,dc=org"
            bind_dn = "cn=boxes,ou=services,dc=example,dc=org"
            refresh_s = 30
            max_stale_s = 7200
            publish = true
            follow = false
            """)
        let f = try #require(c.fleet)
        #expect(!f.follow)
        #expect(try DaemonConfig.parse("[fleet]\nuri = \"ldaps://a\"\nbase = \"dc=x\"").fleet?.follow == true)
        #expect(f.uri == "ldaps://ldap.example.org" && f.refresh == .seconds(30) && f.maxStale == .seconds(7200) && f.publish)
        #expect(f.userAttribute == "uid" && f.timeout == .seconds(5) && !f.startTLS)
        #expect(try DaemonConfig.parse("").fleet == nil)
        // The shipped file has the section with every key commented out: no fleet, no error.
        #expect(try DaemonConfig.parse("[fleet]\n# uri = \"ldaps://x\"\n").fleet == nil)
    }

    /// The service account's password never crosses the network in clear, and nonsense is
    /// refused with the line.
    @Test(arguments: [
        "[fleet]\nuri = \"ldap://ldap.example.org\"\nbase = \"dc=x\"",
        "[fleet]\nuri = \"http://ldap.example.org\"\nbase = \"dc=x\"\nstarttls = true",
        "[fleet]\nuri = \"ldaps://a\"",
        "[fleet]\nuri = \"ldaps://a ldap://b\"\nbase = \"dc=x\"",
        "[fleet]\nuri = \"ldaps://a\"\nbase = \"dc=x\"\nrefresh_s = 600\nmax_stale_s = 300",
        "[fleet]\nuri = \"ldaps://a\"\nbase = \"dc=x\"\nuser_attribute = \"uid)(x\"",
        "[fleet]\nuri = \"ldaps://a\"\nbase = \"dc=x\"\nbogus = 1",
    ])
    func badFleetSectionsAreRefused(_ text: String) {
        #expect(throws: DaemonConfig.Error.self) { try DaemonConfig.parse(text) }
    }

    /// The file the packages install (every key commented out) is every default; a section
    /// header left in it must not stop the daemon (it did, for [fleet], in package-test).
    @Test func theShippedConfigurationIsEveryDefault() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let text = try String(contentsOfFile: root.path + "/systemd/boxkeyd.conf", encoding: .utf8)
        #expect(try DaemonConfig.parse(text) == DaemonConfig())
    }

    @Test func theFleetSectionNeedsARestart() throws {
        let before = DaemonConfig()
        let after = try DaemonConfig.parse("[fleet]\nuri = \"ldaps://a\"\nbase = \"dc=x\"")
        let (next, needRestart) = before.reloading(after)
        #expect(next.fleet == nil && needRestart == ["[fleet]"])
    }
}
