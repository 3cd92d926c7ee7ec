import ArgumentParser
import BoxkeyCore
import BoxkeyPhone
import BoxkeyTransports
import FoundationEssentials

extension Boxkey {
    struct Status: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Show this phone's key, paired boxes, stored credentials, the presence link and the agent.",
            discussion: "--json prints one object; every key is always there (null when it has no value). The keys are described in docs/phone-json.md.")
        @Flag(help: "As a JSON object.") var json = false

        struct Report: Encodable {
            struct Box: Encodable {
                var id: String
                var fingerprint: String
                var key: String
                var isDefault: Bool
                var address: String?
                func encode(to encoder: any Encoder) throws {
                    var c = encoder.container(keyedBy: CodingKeys.self)
                    try c.encode(id, forKey: .id); try c.encode(fingerprint, forKey: .fingerprint); try c.encode(key, forKey: .key)
                    try c.encode(isDefault, forKey: .isDefault); try c.encode(address, forKey: .address)
                }
                enum CodingKeys: String, CodingKey { case id, fingerprint, key, isDefault, address }
            }
            /// The presence link and who holds it: the agent, or a `boxkey login` in the foreground.
            struct Presence: Encodable {
                var box: String
                var holder: String  // "agent" or "login"
                var pid: Int32
                var connected: Bool
            }
            var phoneKey: String
            var fingerprint: String
            var vault: VaultReport
            var agent: AgentStatus?
            var presence: Presence?
            /// true while a presence link is up: the box keeps one only for a session it let
            /// this phone into that is open and unlocked. nil: not known (no presence link; a
            /// `login --no-stay` leaves nothing on the phone to tell).
            var loggedIn: Bool?
            var boxes: [Box]

            enum CodingKeys: String, CodingKey { case phoneKey, fingerprint, vault, agent, presence, loggedIn, boxes }
            func encode(to encoder: any Encoder) throws {
                var c = encoder.container(keyedBy: CodingKeys.self)
                try c.encode(phoneKey, forKey: .phoneKey); try c.encode(fingerprint, forKey: .fingerprint); try c.encode(vault, forKey: .vault)
                try c.encode(agent, forKey: .agent); try c.encode(presence, forKey: .presence); try c.encode(loggedIn, forKey: .loggedIn)
                try c.encode(boxes, forKey: .boxes)
            }
        }

        func run() async throws {
            try await Terminal.run {
                let phone = try Phone.open()
                let agent = AgentCommand.runningStatus(phone.dirs)
                var presence: Report.Presence?
                if let a = agent, let p = a.presence {
                    presence = .init(box: p.box, holder: "agent", pid: a.pid, connected: p.connected)
                }
                for box in phone.boxes.boxes where presence == nil {
                    guard let id = BoxID(box.id), let s = PresenceHolder.status(phone.dirs, box: id) else { continue }
                    presence = .init(box: s.box, holder: "login", pid: s.pid, connected: s.connected)
                }
                let report = Report(
                    phoneKey: hex(phone.identity.keyPair.publicKey.bytes), fingerprint: phone.identity.keyPair.publicKey.fingerprint,
                    vault: VaultReport(phone, agent: agent), agent: agent, presence: presence,
                    loggedIn: presence?.connected == true ? true : nil,
                    boxes: phone.boxes.boxes.map { .init(id: $0.id, fingerprint: $0.fingerprint, key: $0.key,
                                                         isDefault: $0.id == phone.boxes.defaultBox?.description, address: $0.address) })
                if json { Terminal.say(Terminal.json(report)); return }
                // Labels and sentences through the catalog; the values (keys, IDs, pids) as they are.
                var rows: [(label: String, text: String)] = []
                func line(_ label: String, _ text: String) { rows.append((label, text)) }
                line(tr("phone key:"), report.phoneKey)
                line(tr("fingerprint:"), report.fingerprint)
                line(tr("credentials:"), report.vault.sentence)
                if let p = presence {
                    let text = switch (p.holder == "agent", p.connected) {
                    case (true, true): tr("logged in on box {box} (presence link held by the agent, pid {pid})", ("box", p.box), ("pid", p.pid))
                    case (false, true): tr("logged in on box {box} (presence link held by boxkey login, pid {pid})", ("box", p.box), ("pid", p.pid))
                    case (true, false): tr("presence link to box {box} lost; the agent (pid {pid}) is looking for the box", ("box", p.box), ("pid", p.pid))
                    case (false, false): tr("presence link to box {box} lost; boxkey login (pid {pid}) is looking for the box", ("box", p.box), ("pid", p.pid))
                    }
                    line(tr("session:"), text)
                } else {
                    line(tr("session:"), tr("no presence link (whether you are logged in is not known here)"))
                }
                if let a = agent {
                    var parts = [a.credentialsHeld ? tr("pid {pid}, holding credentials for {user}", ("pid", a.pid), ("user", a.user ?? "?"))
                                                   : tr("pid {pid}, credentials not held", ("pid", a.pid))]
                    switch a.mode.flatMap(CredentialPush.Kind.init) {
                    case .password?: parts[0] += tr(" (a password)")
                    case .key?: parts[0] += tr(" (no password: key mode)")
                    case .escrow?: parts[0] += tr(" (an escrow secret)")
                    case nil: break
                    }
                    if let p = a.presence {
                        parts.append(p.connected ? tr("presence link to box {box}", ("box", p.box)) : tr("presence link to box {box} (looking for it)", ("box", p.box)))
                    }
                    if a.proximity == true {
                        parts.append(a.proximityOpen == true ? tr("proximity login on") : tr("proximity login on (its 30 min after the PIN are over)"))
                    }
                    line(tr("agent:"), parts.joined(separator: ", "))
                } else {
                    line(tr("agent:"), tr("not running"))
                }
                if report.boxes.isEmpty { line(tr("boxes:"), tr("none paired")) }
                for b in report.boxes {
                    line(tr("box {box}:", ("box", b.id)), b.isDefault ? tr("key {fingerprint} (default)", ("fingerprint", b.fingerprint)) : tr("key {fingerprint}", ("fingerprint", b.fingerprint)))
                }
                // One column for the values, as wide as the longest label (translated ones too).
                let width = max(13, (rows.map(\.label.count).max() ?? 0) + 1)
                for r in rows { Terminal.say(r.label.padding(width) + r.text) }
            }
        }
    }

    struct Sim: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Simulated radio controls (demos and tests).", subcommands: [Move.self])
        struct Move: AsyncParsableCommand {
            static let configuration = CommandConfiguration(abstract: "Walk this phone to a distance from the box: the running presence link follows.")
            @Argument(help: "Target distance in metres.") var metres: Double
            @Option(help: "Seconds the walk takes.") var over = 0.0
            @Option(help: "The simulated radio's directory.") var simDirectory: String?
            func run() async throws {
                try await Terminal.run {
                    let phone = try Phone.open()
                    guard metres.isFinite, metres >= 0, over.isFinite, over >= 0 else {
                        throw PhoneFailure(.usage, tr("a distance and a time are 0 or more"))
                    }
                    let directory = simDirectory ?? ProcessInfo.processInfo.environment["BOXKEY_SIM_DIR"] ?? "/tmp/boxkey-sim"
                    do { try SimMoves(directory: directory, address: phone.identity.simulatedAddress).post(to: metres, over: over) } catch {
                        throw PhoneFailure(.failure, tr("the phone did not move: {why} (the simulated radio's folder is BOXKEY_SIM_DIR or --sim-directory)", ("why", "\(error)")))
                    }
                    Terminal.say(tr("Moving to {metres} m over {seconds} s.", ("metres", metres), ("seconds", over)))
                }
            }
        }
    }
}
