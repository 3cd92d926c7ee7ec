import ArgumentParser
import BoxkeyCore
import BoxkeyPhone
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
                    guard let id = BoxID(box.id), let holder = PresenceHolder.client(phone.dirs, box: id),
                          case .result(.success, _, let details) = try? holder.send(.status, timeout: .seconds(5)),
                          let s = try? JSONDecoder().decode(PresenceHolder.Status.self, from: Data(details.utf8)) else { continue }
                    presence = .init(box: s.box, holder: "login", pid: s.pid, connected: s.connected)
                }
                let report = Report(
                    phoneKey: hex(phone.identity.keyPair.publicKey.bytes), fingerprint: phone.identity.keyPair.publicKey.fingerprint,
                    vault: VaultReport(phone, agent: agent), agent: agent, presence: presence,
                    loggedIn: presence?.connected == true ? true : nil,
                    boxes: phone.boxes.boxes.map { .init(id: $0.id, fingerprint: $0.fingerprint, key: $0.key,
                                                         isDefault: $0.id == phone.boxes.defaultBox?.description, address: $0.address) })
                if json { Terminal.say(Terminal.json(report)); return }
                Terminal.say("phone key:   \(report.phoneKey)")
                Terminal.say("fingerprint: \(report.fingerprint)")
                Terminal.say("credentials: \(report.vault.sentence)")
                if let p = presence {
                    let who = p.holder == "agent" ? "the agent" : "boxkey login"
                    Terminal.say(p.connected ? "session:     logged in on box \(p.box) (presence link held by \(who), pid \(p.pid))"
                                             : "session:     presence link to box \(p.box) lost; \(who) (pid \(p.pid)) is looking for the box")
                } else {
                    Terminal.say("session:     no presence link (whether you are logged in is not known here)")
                }
                if let a = agent {
                    let mode = switch a.mode.flatMap(CredentialPush.Kind.init) {
                    case .password?: " (a password)"
                    case .key?: " (no password: key mode)"
                    case .escrow?: " (an escrow secret)"
                    case nil: ""
                    }
                    let proximity = a.proximity == true ? (a.proximityOpen == true ? ", proximity login on" : ", proximity login on (its 30 min after the PIN are over)") : ""
                    Terminal.say("agent:       pid \(a.pid), \(a.credentialsHeld ? "holding credentials for \(a.user ?? "?")\(mode)" : "credentials not held")\(a.presence.map { ", presence link to box \($0.box)\($0.connected ? "" : " (looking for it)")" } ?? "")\(proximity)")
                } else {
                    Terminal.say("agent:       not running")
                }
                if report.boxes.isEmpty { Terminal.say("boxes:       none paired") }
                for b in report.boxes { Terminal.say("box \(b.id):    key \(b.fingerprint)\(b.isDefault ? " (default)" : "")") }
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
                    SimMoves(directory: simDirectory ?? ProcessInfo.processInfo.environment["BOXKEY_SIM_DIR"] ?? "/tmp/boxkey-sim",
                             address: phone.identity.simulatedAddress).post(to: metres, over: over)
                    Terminal.say("Moving to \(metres) m over \(over) s.")
                }
            }
        }
    }
}
