import BoxkeyBlueZ
import ArgumentParser
import BoxkeyCore
import BoxkeyPhone
import BoxkeyRadio
import BoxkeySimRadio
import CBoxkeySys
import Foundation
import NIOConcurrencyHelpers

/// Exit codes, distinct per outcome so scripts can act on them.
enum Exit: Int32 {
    case success = 0
    case failure = 1
    case rejected = 2
    case notFound = 3
    case notPaired = 4
    case vaultLocked = 5
    case radioUnavailable = 6
    case keyChanged = 7
    case notAtPrompt = 8
    case refused = 9
    case pairingFailed = 10

    var code: ExitCode { ExitCode(rawValue) }
}

@main
struct Boxkey: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "boxkey",
        abstract: "Log into a Boxkey box from this device over Bluetooth LE.",
        discussion: """
        Pair once (boxkey pair 4821), store your credentials once (boxkey credentials set), then \
        log in with one command (boxkey login). State: $XDG_CONFIG_HOME/boxkey (the phone key, \
        pinned boxes) and $XDG_DATA_HOME/boxkey/vault (credentials, sealed; optional PIN).

        Exit codes: 0 success, 1 other error, 2 rejected by the box's PAM stack, 3 box not \
        found, 4 box not paired, 5 vault locked, wiped or tampered, 6 radio unavailable, \
        7 box key changed, 8 box not at a login prompt (or more than one), 9 refused by the \
        box (not enrolled, revoked, rate limited, no pairing code, other version), 10 pairing \
        failed (wrong code).
        """,
        subcommands: [Scan.self, Pair.self, Forget.self, Credentials.self, PIN.self, Login.self, Lock.self,
                      Logout.self, Status.self, Sim.self])
}

// MARK: - Shared options and helpers

struct RadioOptions: ParsableArguments {
    @Option(help: "Radio: auto, simulated or bluez (default $BOXKEY_RADIO or auto). auto uses BlueZ when it has an adapter, the simulated radio otherwise.")
    var radio = ProcessInfo.processInfo.environment["BOXKEY_RADIO"] ?? "auto"

    @Option(help: "BlueZ: the adapter to use, e.g. hci1 (default $BOXKEY_ADAPTER or the first).")
    var adapter: String? = ProcessInfo.processInfo.environment["BOXKEY_ADAPTER"]

    @Option(help: "Simulated radio: the directory shared with the box (default $BOXKEY_SIM_DIR or /tmp/boxkey-sim).")
    var simDirectory: String?

    @Option(help: "Simulated radio: this device's distance from the box's origin, in metres.")
    var simPosition = 1.0

    func open(identity: PhoneIdentity) async -> PhoneRadio {
        switch radio {
        case "bluez":
            return await openBlueZ()
        case "auto":
            if await blueZAdapterPresent(named: adapter) { return await openBlueZ() }
            if let adapter { fail(.radioUnavailable, "no Bluetooth adapter \(adapter) (is bluetoothd running?)") }
            return openSimulated(identity)
        case "simulated":
            return openSimulated(identity)
        default:
            fail(.failure, "--radio must be auto, simulated or bluez")
        }
    }

    private func openBlueZ() async -> PhoneRadio {
        do { return PhoneRadio(bluez: try await BlueZCentral(adapter: adapter)) } catch {
            fail(.radioUnavailable, "Bluetooth is unavailable: \(error). Check `systemctl status bluetooth` and `bluetoothctl show`; --radio simulated talks to a box on this machine.")
        }
    }

    private func openSimulated(_ identity: PhoneIdentity) -> PhoneRadio {
        do {
            let air = try SocketAir(directory: simDirectory ?? SocketAir.defaultDirectory)
            return PhoneRadio(air: air, address: identity.simulatedAddress, position: simPosition)
        } catch {
            fail(.radioUnavailable, "the simulated radio is unavailable: \(error)")
        }
    }
}

func fail(_ exit: Exit, _ message: String) -> Never {
    FileHandle.standardError.write("boxkey: \(message)\n".data(using: .utf8)!)
    Foundation.exit(exit.rawValue)
}

/// Writes a line straight to standard output: unbuffered, so a log file follows live.
func say(_ message: String) {
    FileHandle.standardOutput.write((message + "\n").data(using: .utf8)!)
}

/// Reads a secret: without echo on a terminal, else one line of standard input.
func readSecret(_ prompt: String) -> SecureBytes? {
    if isatty(0) == 1 {
        FileHandle.standardError.write(prompt.data(using: .utf8)!)
        var old = termios()
        tcgetattr(0, &old)
        var quiet = old
        quiet.c_lflag &= ~tcflag_t(ECHO)
        tcsetattr(0, TCSAFLUSH, &quiet)
        defer { tcsetattr(0, TCSAFLUSH, &old); FileHandle.standardError.write("\n".data(using: .utf8)!) }
        return readLineSecure()
    }
    return readLineSecure()
}

/// One line of standard input into secure memory, without a String copy of it.
func readLineSecure() -> SecureBytes? {
    var bytes: [UInt8] = []
    defer { secureZero(&bytes) }
    bytes.reserveCapacity(600)
    var c: UInt8 = 0
    while read(0, &c, 1) == 1 {
        if c == 10 { break }
        if c != 13 { bytes.append(c) }
        if bytes.count > CredentialPush.maxPasswordLength { break }
    }
    if bytes.isEmpty, c != 10 { return nil }
    return SecureBytes(copying: bytes)
}

func confirm(_ question: String) -> Bool {
    FileHandle.standardError.write("\(question) [y/N] ".data(using: .utf8)!)
    guard let line = readLine() else { return false }
    return ["y", "yes"].contains(line.trimmingCharacters(in: .whitespaces).lowercased())
}

struct Phone {
    let dirs = PhoneDirectories()
    let identity: PhoneIdentity
    var boxes: PairedBoxes

    init() {
        // This process may hold a password: keep it out of core files.
        _ = boxkey_disable_core_dumps()
        umask(0o077)
        do {
            identity = try PhoneIdentity.loadOrCreate(dirs)
            boxes = try PairedBoxes.load(dirs)
        } catch {
            fail(.failure, "\(error)")
        }
    }

    func vault() -> Vault {
        do { return try Vault.load(dirs, identity: identity) } catch { fail(.vaultLocked, "\(error)") }
    }

    func boxID(_ argument: String?) -> BoxID {
        if let argument {
            guard let id = BoxID(argument) else { fail(.failure, "a box ID is four digits, like 4821") }
            return id
        }
        guard let id = boxes.defaultBox else { fail(.notPaired, "no box given and no default box: pair with one first (boxkey pair 4821)") }
        return id
    }

    func pinnedKey(_ id: BoxID) -> PublicKey {
        guard let key = boxes.key(of: id) else { fail(.notPaired, "box \(id) is not paired: run boxkey pair \(id)") }
        return key
    }

    /// Finds a paired box, warning loudly when only a box with another key answers to its ID.
    func find(_ id: BoxID, radio: any CentralRadio, timeout: Duration) async -> HeardBox {
        let key = pinnedKey(id)
        do {
            if let box = try await findBox(id, pinned: key, radio: radio, timeout: timeout) { return box }
            if try await findBox(id, pinned: nil, radio: radio, timeout: .milliseconds(300)) != nil { keyChangedWarning(id) }
        } catch {
            fail(.radioUnavailable, "scan failed: \(error)")
        }
        fail(.notFound, "box \(id) not found nearby (is boxkeyd running and advertising?)")
    }

    func keyChangedWarning(_ id: BoxID) -> Never {
        fail(.keyChanged, """

        @@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
        @    WARNING: BOX \(id) PRESENTS A DIFFERENT KEY!           @
        @@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
        Someone could be impersonating the box, or it was reinstalled. No credentials were sent.
        The key you paired with is \(pinnedKey(id).fingerprint).
        If the box was reinstalled, pair again at the box: its new pairing code proves its new key
            boxkey pair \(id) --replace
        """)
    }

    /// Opens a channel to a paired box, mapping every failure to its exit code.
    func open(_ id: BoxID, radio: any CentralRadio) async -> BoxLink {
        let heard = await find(id, radio: radio, timeout: .seconds(10))
        var pins = boxes
        try? pins.remember(id, address: heard.address)
        do {
            return try await BoxLink.open(to: heard, boxKey: pinnedKey(id), identity: identity, radio: radio)
        } catch let f as BoxLink.Failure {
            switch f {
            case .keyChanged: keyChangedWarning(id)
            case .refused(let r): fail(.refused, refusalText(r, box: id))
            case .radio(let s): fail(.radioUnavailable, "cannot connect to box \(id): \(s)")
            default: fail(.failure, "box \(id): \(f)")
            }
        } catch {
            fail(.failure, "box \(id): \(error)")
        }
    }

    /// Refusals come before any channel, unauthenticated: anyone in radio range can send one,
    /// so the wording is neutral and never advises forgetting keys.
    func refusalText(_ r: Refusal, box id: BoxID) -> String {
        switch r.code {
        case .notEnrolled: "box \(id) says this phone is not enrolled there: pair at the box with the code it shows (boxkey pair \(id)\(boxes.key(of: id) == nil ? "" : " --replace"))"
        case .noPairingCode: "box \(id) has no pairing code live: show one at its login prompt (or `boxkeyd pair-code`) and try again"
        case .handshakeFailed: "box \(id) refused the handshake (interference, or a box without the key you paired with); nothing was sent"
        case .phoneRevoked: "the box's administrator revoked this phone"
        case .rateLimited: "too many failed attempts; the box asks to wait before trying again"
        case .unsupportedVersion: "the box speaks protocol version \(r.versions.lowerBound)...\(r.versions.upperBound); this boxkey speaks \(BoxkeyProtocol.version)"
        case .busy: "the box is busy; try again"
        case .staleAdvertisement: "the box's advertisement changed while connecting; try again"
        default: "the box refused: \(r.code)"
        }
    }

    var deviceName: String {
        var name = [CChar](repeating: 0, count: 65)
        gethostname(&name, 64)
        return String(String(cString: name).prefix(CredentialPush.maxDeviceNameLength))
    }
}

// MARK: - Commands

extension Boxkey {
    struct Scan: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "List nearby boxes live: ID, signal strength, paired or not.",
            discussion: "On a terminal the list redraws as advertisements arrive, with a progress line; piped, it prints one plain line per box as it is first heard (with --json, one object per advertisement).")
        @Option(help: "How long to scan, in seconds.") var seconds = 4.0
        @Flag(help: "One JSON object per advertisement heard, per line.") var json = false
        @Option(help: "Stop as soon as this box is found.") var id: String?
        @OptionGroup var radio: RadioOptions

        struct Row: Sendable {
            var advert: Advertisement
            var rssi: Int
            var paired: Bool
            var address: DeviceAddress
            var line: String {
                "\(advert.boxID)  \(String(format: "%4d", rssi)) dBm  \(paired ? "paired    " : "not paired")\(advert.flags.contains(.loginPromptWaiting) ? "  at login prompt" : "")  \(address)"
            }
        }

        func run() async throws {
            let phone = Phone()
            let phoneRadio = await radio.open(identity: phone.identity)
            defer { phoneRadio.shutdown() }
            let central = phoneRadio.central
            let wanted = id.flatMap(BoxID.init)
            if id != nil, wanted == nil { fail(.failure, "--id takes four digits") }
            let live = isatty(1) == 1 && !json
            let clock = MonotonicClock()
            let start = clock.now
            let end = start + .milliseconds(Int(seconds * 1000))
            let boxes = phone.boxes
            let results = central.scan(ScanFilter(serviceUUIDs: [BoxkeyProtocol.serviceUUID], duplicates: live || json))
            let (found, count): (Bool, Int) = await withTaskGroup(of: (Bool, Int)?.self) { group in
                group.addTask { try? await clock.sleep(until: end); return nil }
                group.addTask {
                    var rows: [DeviceAddress: Row] = [:]
                    var drawn = 0
                    var lastDraw = clock.now - .seconds(1)
                    let spinner = Array("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏")
                    func draw(final: Bool = false) {
                        guard live else { return }
                        var out = drawn > 0 ? "\u{1B}[\(drawn)F" : ""
                        let sorted = rows.values.sorted { $0.rssi > $1.rssi }
                        for r in sorted { out += "\u{1B}[2K" + r.line + "\n" }
                        let elapsed = Double((clock.now - start).nanoseconds) / 1e9
                        let left = max(0, seconds - elapsed)
                        out += "\u{1B}[2K" + (final ? "\(sorted.count) box\(sorted.count == 1 ? "" : "es") found" : "\(spinner[Int(elapsed * 10) % spinner.count]) scanning… \(String(format: "%.0f", left.rounded(.up))) s left") + "\n"
                        drawn = sorted.count + 1
                        FileHandle.standardOutput.write(out.data(using: .utf8)!)
                        lastDraw = clock.now
                    }
                    draw()
                    do {
                        for try await r in results {
                            guard let advert = r.boxAdvertisement else { continue }
                            let paired = boxes.key(of: advert.boxID).map { $0.advertisementHint == advert.keyHint } ?? false
                            let first = rows[r.address] == nil
                            rows[r.address] = Row(advert: advert, rssi: r.rssi, paired: paired, address: r.address)
                            if json {
                                say(#"{"id":"\#(advert.boxID)","address":"\#(r.address)","rssi":\#(r.rssi),"paired":\#(paired),"loginPrompt":\#(advert.flags.contains(.loginPromptWaiting))}"#)
                            } else if live {
                                if first || clock.now - lastDraw >= .milliseconds(100) { draw() }
                            } else if first {
                                say(rows[r.address]!.line)
                            }
                            if advert.boxID == wanted { draw(final: true); return (true, rows.count) }
                        }
                    } catch {}
                    draw(final: true)
                    return (false, rows.count)
                }
                var result: (Bool, Int) = (false, 0)
                if let first = await group.next(), let r = first { result = r } else {
                    group.cancelAll()
                    for await r in group { if let r { result = r } }
                }
                group.cancelAll()
                return result
            }
            if wanted != nil, !found { throw Exit.notFound.code }
            if count == 0, !json, !live { say("no boxes found") }
        }
    }

    struct Pair: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Pair with a box: type the one-time code the box shows; it proves you stand at the box and that this is the box.",
            discussion: "The box shows a six-digit pairing code at its login prompt (or `boxkeyd pair-code` prints one). The code is bound into the handshake (CPace + Noise IKpsk2), so a wrong code or another box fails and nothing is pinned. After pairing, log in within 5 minutes (boxkey login) to finish enrolment at the box. For a phone an administrator enrolled with `boxkeyd phones enrol`, pin the box key instead with --box-key.")
        @Argument(help: "The box ID shown on the box.") var id: String
        @Option(help: "The pairing code shown on the box (asked for when missing).") var code: String?
        @Option(help: "Pin this box key (64 hex digits, from `boxkeyd status`) without a code: for a phone an administrator pre-enrolled.") var boxKey: String?
        @Flag(help: "Replace a key pinned earlier for this box ID (a reinstalled box).") var replace = false
        @Flag(help: .hidden) var yes = false
        @OptionGroup var radio: RadioOptions

        func run() async throws {
            var phone = Phone()
            guard let boxID = BoxID(id) else { throw ValidationError("a box ID is four digits, like 4821") }
            if let boxKey {
                guard let bytes = unhex(boxKey), let key = try? PublicKey(bytes) else { throw ValidationError("--box-key takes 64 hex digits") }
                if let old = phone.boxes.key(of: boxID), old != key, !replace {
                    fail(.failure, "box \(boxID) is pinned to another key (\(old.fingerprint)); use --replace for a reinstalled box")
                }
                do { try phone.boxes.pin(boxID, key: key, address: nil) } catch { fail(.failure, "\(error)") }
                say("Pinned box \(boxID) (key \(key.fingerprint)).")
                return
            }
            if phone.boxes.key(of: boxID) != nil, !replace {
                fail(.failure, "box \(boxID) is already paired; use --replace to pair again (a reinstalled box)")
            }
            let typed = code ?? {
                FileHandle.standardError.write("Pairing code shown on box \(boxID): ".data(using: .utf8)!)
                return readLine() ?? ""
            }()
            guard let pairingCode = PairingCode(typed) else { throw ValidationError("a pairing code is \(PairingCode.digits) digits") }
            let phoneRadio = await radio.open(identity: phone.identity)
            defer { phoneRadio.shutdown() }
            let central = phoneRadio.central
            let heard: HeardBox?
            do { heard = try await findBox(boxID, pinned: nil, radio: central, timeout: .seconds(10)) } catch {
                fail(.radioUnavailable, "scan failed: \(error)")
            }
            guard let heard else { fail(.notFound, "box \(boxID) not found nearby") }
            let info: BoxInfo
            do { info = try await BoxLink.readInfo(of: heard, radio: central) } catch { fail(.radioUnavailable, "cannot read box \(boxID): \(error)") }
            guard info.boxID == boxID else { fail(.failure, "the box answering as \(boxID) says it is \(info.boxID)") }
            // The key Info claims is unauthenticated; the handshake under the code proves it.
            let link: BoxLink
            do {
                link = try await BoxLink.open(to: heard, boxKey: info.staticKey, identity: phone.identity, radio: central, pairingCode: pairingCode)
            } catch BoxLink.Failure.pairingFailed {
                fail(.pairingFailed, "pairing failed: the code was wrong, or this is not the box that shows it; nothing was pinned. Check the code on box \(boxID) and try again.")
            } catch BoxLink.Failure.refused(let r) {
                fail(.refused, phone.refusalText(r, box: boxID))
            } catch {
                fail(.radioUnavailable, "cannot pair with box \(boxID): \(error)")
            }
            do {
                try await link.send(.pair)
                guard case .actionResult(let r) = try await link.next(timeout: .seconds(10)), r.action == .pair, r.outcome == .done else {
                    await link.close()
                    fail(.failure, "box \(boxID) did not confirm the pairing")
                }
            } catch {
                await link.close()
                fail(.pairingFailed, "pairing failed: \(error)")
            }
            await link.close()
            do { try phone.boxes.pin(boxID, key: info.staticKey, address: heard.address) } catch { fail(.failure, "\(error)") }
            say("Paired with box \(boxID) (key \(info.staticKey.fingerprint), verified by the code).")
            say("Unless an administrator's code enrolled it already, this phone's first login (boxkey login, within a few minutes) enrols it at the box.")
        }
    }

    struct Forget: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Forget a paired box (its pinned key).")
        @Argument(help: "The box ID.") var id: String
        func run() throws {
            var phone = Phone()
            guard let boxID = BoxID(id) else { fail(.failure, "a box ID is four digits") }
            guard (try? phone.boxes.forget(boxID)) == true else { fail(.notPaired, "box \(boxID) is not paired") }
            say("Forgot box \(boxID).")
        }
    }

    struct Credentials: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Store or clear the user name and password sealed in the vault.",
                                                        subcommands: [Set.self, Clear.self, Show.self], defaultSubcommand: Show.self)
        struct Set: ParsableCommand {
            static let configuration = CommandConfiguration(abstract: "Store user and password (the password is read without echo, or from standard input).")
            @Option(help: "The user name (asked for when missing).") var user: String?
            func run() throws {
                let phone = Phone()
                var vault = phone.vault()
                let name: String
                if let user { name = user } else {
                    FileHandle.standardError.write("User: ".data(using: .utf8)!)
                    name = readLine()?.trimmingCharacters(in: .whitespaces) ?? ""
                }
                guard !name.isEmpty, name.utf8.count <= CredentialPush.maxUserLength else { fail(.failure, "a user name of 1 to 128 bytes is needed") }
                guard let password = readSecret("Password: "), password.count > 0 else { fail(.failure, "no password given") }
                var pin: SecureBytes?
                if vault.hasPIN {
                    pin = readSecret("PIN: ")
                    do { try vault.verify(pin: pin, now: vaultNow()) } catch { fail(.vaultLocked, "\(error)") }
                }
                do { try vault.store(user: name, password: password, pin: pin) } catch { fail(.failure, "\(error)") }
                say("Credentials for \(name) stored\(pin == nil ? "" : " behind your PIN").")
            }
        }
        struct Clear: ParsableCommand {
            static let configuration = CommandConfiguration(abstract: "Erase the stored credentials (and the PIN).")
            func run() throws {
                let phone = Phone()
                var vault = phone.vault()
                do { try vault.clear() } catch { fail(.failure, "\(error)") }
                say("Credentials cleared.")
            }
        }
        struct Show: ParsableCommand {
            static let configuration = CommandConfiguration(abstract: "Say whether credentials are stored (never shows the password).")
            func run() throws {
                let vault = Phone().vault()
                say(vault.isWiped ? "wiped after \(Vault.maxFailures) wrong PINs" : vault.hasCredentials ? "stored\(vault.hasPIN ? ", behind a PIN" : "")" : "none stored")
            }
        }
    }

    struct PIN: ParsableCommand {
        static let configuration = CommandConfiguration(commandName: "pin", abstract: "Set, change or clear the vault PIN (Argon2id, 256 MiB; 10 wrong PINs wipe the credentials).",
                                                        subcommands: [Set.self, Change.self, Clear.self])
        static func reseal(newPIN: SecureBytes?, oldPIN: SecureBytes?) {
            let phone = Phone()
            var vault = phone.vault()
            do {
                let (user, password) = try vault.credentials(pin: oldPIN, now: vaultNow())
                try vault.store(user: user, password: password, pin: newPIN)
            } catch let f as Vault.Failure {
                fail(.vaultLocked, "\(f)")
            } catch {
                fail(.failure, "\(error)")
            }
        }
        struct Set: ParsableCommand {
            static let configuration = CommandConfiguration(abstract: "Protect the stored credentials with a PIN.")
            func run() throws {
                guard !Phone().vault().hasPIN else { fail(.failure, "a PIN is already set: use boxkey pin change") }
                guard let pin = readSecret("New PIN: "), pin.count >= 4 else { fail(.failure, "a PIN has at least 4 characters") }
                PIN.reseal(newPIN: pin, oldPIN: nil)
                say("PIN set.")
            }
        }
        struct Change: ParsableCommand {
            static let configuration = CommandConfiguration(abstract: "Change the PIN.")
            func run() throws {
                let old = readSecret("Current PIN: ")
                guard let pin = readSecret("New PIN: "), pin.count >= 4 else { fail(.failure, "a PIN has at least 4 characters") }
                PIN.reseal(newPIN: pin, oldPIN: old)
                say("PIN changed.")
            }
        }
        struct Clear: ParsableCommand {
            static let configuration = CommandConfiguration(abstract: "Remove the PIN (the credentials stay, protected by this device's key only).")
            func run() throws {
                PIN.reseal(newPIN: nil, oldPIN: readSecret("Current PIN: "))
                say("PIN cleared.")
            }
        }
    }

    struct Login: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Log in to a box: push the stored credentials, print the box's answer, then stay connected as the presence link.")
        @Argument(help: "The box ID (default: the paired box).") var id: String?
        @Flag(help: "Exit after the box's answer instead of staying connected as the presence link.") var noStay = false
        @Flag(help: "Keep the presence link in a detached background process (log: $XDG_STATE_HOME/boxkey/presence.log); this command returns once the box has answered.") var background = false
        @Flag(help: .hidden) var detachedChild = false
        @Flag(help: "Simulated radio: also print the connection events and bytes on air the login used.") var stats = false
        @Option(help: .hidden) var keepalive = Double(BoxkeyProtocol.keepaliveInterval.components.seconds)
        @OptionGroup var radio: RadioOptions

        func run() async throws {
            if background, !detachedChild { try runInBackground() }
            let phone = Phone()
            let boxID = phone.boxID(id)
            _ = phone.pinnedKey(boxID)
            var vault = phone.vault()
            if vault.isWiped { fail(.vaultLocked, "\(Vault.Failure.wiped)") }
            guard vault.hasCredentials else { fail(.vaultLocked, "\(Vault.Failure.noCredentials)") }
            let pin = vault.hasPIN ? readSecret("PIN: ") : nil
            let credentials: (user: String, password: SecureBytes)
            do { credentials = try vault.credentials(pin: pin, now: vaultNow()) } catch { fail(.vaultLocked, "\(error)") }

            let phoneRadio = await radio.open(identity: phone.identity)
            defer { phoneRadio.shutdown() }
            let central = phoneRadio.central
            let clock = MonotonicClock()
            let start = clock.now
            let link = await phone.open(boxID, radio: central)
            let push = CredentialPush(user: credentials.user, password: credentials.password, deviceName: phone.deviceName)
            let answer: PhoneConnection.Event
            do {
                try await link.send(.credentialPush(push))
                answer = try await link.next(timeout: .seconds(90))
            } catch {
                await link.close()
                fail(.failure, "box \(boxID): \(error)")
            }
            guard case .loginResult(let result) = answer else { fail(.failure, "unexpected answer from box \(boxID)") }
            let elapsed = clock.now - start
            switch result.outcome {
            case .accepted:
                let place = result.reason.isEmpty ? "" : ": \(result.reason)"
                say("Logged in to box \(boxID) as \(credentials.user)\(place) (\(elapsed.formatted(.units(allowed: [.milliseconds])))).")
                if stats, let s = link.airStatistics {
                    say("Air: \(s.events) connection events from connect to the answer, \(s.packets) link-layer packets, \(s.bytes) ATT value bytes both ways.")
                }
            case .rejected:
                await link.close()
                fail(.rejected, "box \(boxID) rejected the credentials for \(credentials.user): \(result.reason). If the password changed, run `boxkey credentials set` and log in again.")
            case .notAtPrompt, .wrongUser, .ambiguousPrompt:
                await link.close()
                fail(.notAtPrompt, result.reason.isEmpty ? "box \(boxID) is not at a login prompt" : "box \(boxID): \(result.reason)")
            case .timedOut:
                await link.close()
                fail(.failure, "box \(boxID): \(result.reason)")
            }
            if noStay {
                // Tell the box this is no walk-away: the session stays as it is.
                try? await link.send(.detach)
                await link.close()
                return
            }
            say("Staying connected as the presence link; Ctrl-C, `boxkey lock` or `boxkey logout` ends it.")
            if detachedChild { BackgroundPresence.detachOutput(phone.dirs) }
            await presence(link, boxID: boxID, phone: phone, radio: phoneRadio)
            if detachedChild { BackgroundPresence.clear(phone.dirs) }
        }

        /// Starts `boxkey login --detached-child` in a new session, passes it the PIN, shows what
        /// it says up to the box's answer, and exits with its status (0 once presence is up).
        func runInBackground() throws -> Never {
            let phone = Phone()
            let vault = phone.vault()
            var pin = vault.hasPIN ? readSecret("PIN: ") : nil
            var arguments = CommandLine.arguments.filter { $0 != "--background" } + ["--detached-child"]
            arguments[0] = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().path
            let status = BackgroundPresence.spawn(arguments, pin: pin)
            pin = nil
            Foundation.exit(status)
        }

        /// Keeps the presence link until Ctrl-C, an explicit lock or logout, or the session's
        /// end. After a link loss it keeps looking for the box and re-attaches when back in
        /// range (within the box's grace period that cancels the walk-away action). Under the
        /// simulated radio it also follows `boxkey sim move` (the phone walking).
        func presence(_ first: BoxLink, boxID: BoxID, phone: Phone, radio phoneRadio: PhoneRadio) async {
            for sig in [SIGINT, SIGTERM] {
                signal(sig, SIG_IGN)
                let source = DispatchSource.makeSignalSource(signal: sig)
                source.setEventHandler { interrupted.withLockedValue { $0 = true } }
                source.resume()
                signalSources.append(source)
            }
            let moves = phoneRadio.simulated.map { SimMoves(directory: $0.air.directory, address: $0.address) }
            let clock = MonotonicClock()
            var link = first
            var nextKeepalive = clock.now + .milliseconds(Int(keepalive * 1000))
            while !interrupted.withLockedValue({ $0 }) {
                if let move = moves?.take(), let (air, address) = phoneRadio.simulated {
                    say("Walking to \(move.to) m over \(move.over) s…")
                    air.air.move(address, to: move.to, over: .milliseconds(Int(move.over * 1000)))
                }
                do {
                    let event = try await link.next(timeout: .milliseconds(200))
                    if case .actionResult = event { return }
                } catch BoxLink.Failure.timedOut {
                    if clock.now >= nextKeepalive {
                        try? await link.send(.keepalive)
                        nextKeepalive = clock.now + .milliseconds(Int(keepalive * 1000))
                    }
                } catch BoxLink.Failure.linkLost(let reason) {
                    say("Presence link to box \(boxID) lost (\(reason)); looking for the box…")
                    guard let back = await reattach(boxID: boxID, phone: phone, radio: phoneRadio, moves: moves) else { return }
                    link = back
                    say("Back in range: presence link to box \(boxID) restored.")
                } catch {
                    say("Presence link to box \(boxID) ended: \(error)")
                    return
                }
            }
            // Ctrl-C: leaving is walking away, so the box acts by its policy.
            await link.close()
            say("Left box \(boxID).")
        }

        /// Finds the box again and asks to be its presence link again (`attach`).
        func reattach(boxID: BoxID, phone: Phone, radio phoneRadio: PhoneRadio, moves: SimMoves?) async -> BoxLink? {
            let central = phoneRadio.centralForReattach(defaultPosition: radio.simPosition)
            while !interrupted.withLockedValue({ $0 }) {
                if let move = moves?.take(), let (air, address) = phoneRadio.simulated {
                    say("Walking to \(move.to) m over \(move.over) s…")
                    air.air.move(address, to: move.to, over: .milliseconds(Int(move.over * 1000)))
                }
                guard let heard = try? await findBox(boxID, pinned: phone.pinnedKey(boxID), radio: central, timeout: .seconds(1)),
                      let link = try? await BoxLink.open(to: heard, boxKey: phone.pinnedKey(boxID), identity: phone.identity, radio: central) else { continue }
                do {
                    try await link.send(.attach)
                    if case .actionResult(let r) = try await link.next(timeout: .seconds(10)) {
                        if r.outcome == .done { return link }
                        say("Box \(boxID) has no session for this phone any more (it was locked or ended).")
                        await link.close()
                        return nil
                    }
                } catch {}
                await link.close()
            }
            return nil
        }
    }

    struct Lock: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Lock your session on a box now.")
        @Argument(help: "The box ID (default: the paired box).") var id: String?
        @OptionGroup var radio: RadioOptions
        func run() async throws { try await sessionAction(.lock, id: id, radio: radio) }
    }

    struct Logout: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "End your session on a box (asks first).")
        @Argument(help: "The box ID (default: the paired box).") var id: String?
        @Flag(help: "Do not ask for confirmation.") var yes = false
        @OptionGroup var radio: RadioOptions
        func run() async throws {
            if !yes, !confirm("Log out of your session? Unsaved work will be lost.") { fail(.failure, "not logged out") }
            try await sessionAction(.logout, id: id, radio: radio)
        }
    }

    struct Status: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Show this phone's key, paired boxes and the vault's state.")
        func run() throws {
            let phone = Phone()
            let vault = phone.vault()
            say("phone key:   \(hex(phone.identity.keyPair.publicKey.bytes))")
            say("fingerprint: \(phone.identity.keyPair.publicKey.fingerprint)")
            if let pid = BackgroundPresence.runningPID(phone.dirs) { say("presence:    background link running (pid \(pid))") }
            say("credentials: \(vault.isWiped ? "wiped" : vault.hasCredentials ? "stored" : "none")\(vault.hasPIN ? ", PIN set" : "")\(vault.failures > 0 ? ", \(vault.failures) wrong PIN(s)" : "")")
            if phone.boxes.boxes.isEmpty { say("boxes:       none paired") }
            for b in phone.boxes.boxes {
                say("box \(b.id):    key \(b.fingerprint)\(b.id == phone.boxes.defaultBox?.description ? " (default)" : "")")
            }
        }
    }

    struct Sim: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Simulated radio controls (demos and tests).", subcommands: [Move.self])
        struct Move: ParsableCommand {
            static let configuration = CommandConfiguration(abstract: "Walk this phone to a distance from the box: the running `boxkey login` follows.")
            @Argument(help: "Target distance in metres.") var metres: Double
            @Option(help: "Seconds the walk takes.") var over = 0.0
            @Option(help: "The simulated radio's directory.") var simDirectory: String?
            func run() throws {
                let phone = Phone()
                SimMoves(directory: simDirectory ?? SocketAir.defaultDirectory, address: phone.identity.simulatedAddress).post(to: metres, over: over)
                say("Moving to \(metres) m over \(over) s.")
            }
        }
    }
}

/// Kept for the life of the process: Ctrl-C ends the presence link cleanly.
nonisolated(unsafe) var signalSources: [any DispatchSourceSignal] = []
let interrupted = NIOLockedValueBox(false)

func sessionAction(_ action: ActionResult.Action, id: String?, radio: RadioOptions) async throws {
    let phone = Phone()
    let boxID = phone.boxID(id)
    let phoneRadio = await radio.open(identity: phone.identity)
    defer { phoneRadio.shutdown() }
    let central = phoneRadio.central
    let link = await phone.open(boxID, radio: central)
    defer { Task { await link.close() } }
    do {
        try await link.send(action == .lock ? .lock : .logout)
        guard case .actionResult(let r) = try await link.next(timeout: .seconds(15)) else { fail(.failure, "unexpected answer") }
        switch r.outcome {
        case .done: say(action == .lock ? "Locked your session on box \(boxID)." : "Logged out of box \(boxID).")
        case .noSession: fail(.notAtPrompt, "you have no session on box \(boxID)")
        case .failed: fail(.failure, "box \(boxID) could not \(action == .lock ? "lock" : "end") the session")
        }
    } catch {
        fail(.failure, "box \(boxID): \(error)")
    }
    await link.close()
}

/// `boxkey sim move` posts a walk in a file next to the simulated radio; the presence loop of
/// `boxkey login` picks it up.
struct SimMoves: Sendable {
    let path: String
    init(directory: String, address: DeviceAddress) {
        path = "\(directory)/\(address.string.replacingOccurrences(of: ":", with: "-")).move"
    }
    func post(to: Double, over: Double) {
        FileManager.default.createFile(atPath: path, contents: "\(to) \(over)".data(using: .utf8))
    }
    func take() -> (to: Double, over: Double)? {
        guard let data = FileManager.default.contents(atPath: path), let text = String(data: data, encoding: .utf8) else { return nil }
        unlink(path)
        let parts = text.split(separator: " ").compactMap { Double($0) }
        return parts.count == 2 ? (parts[0], parts[1]) : nil
    }
}
