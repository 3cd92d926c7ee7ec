import ArgumentParser
import BoxkeyCore
import BoxkeyPhone
import Dispatch
import FoundationEssentials
import Glibc
import NIOConcurrencyHelpers

extension Boxkey {
    struct Login: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Log in to a box: push the stored credentials, print the box's answer, then stay connected as the presence link.",
            discussion: "With an agent running (boxkey agent start), the agent logs in with the credentials it holds and keeps the presence link; this command returns after the box's answer. Without one, this command opens the vault (asking the PIN), and stays connected in the foreground until Ctrl-C (walking away), unless --no-stay.")
        @Argument(help: "The box ID (default: the paired box).") var id: BoxID?
        @Flag(help: "Exit after the box's answer instead of staying connected as the presence link.") var noStay = false
        @Flag(help: "Keep the presence link in the background: starts an agent if none runs, and logs in through it.") var background = false
        @Flag(help: "Do not use a running agent.") var noAgent = false
        @Flag(help: "Simulated radio: also print the connection events and bytes on air the login used.") var stats = false
        @Option(help: .hidden) var keepalive = Double(BoxkeyProtocol.keepaliveInterval.components.seconds)
        @OptionGroup var radio: RadioOptions

        func run() async throws {
            try await Terminal.run {
                var phone = try Phone.open()
                let boxID = try phone.boxID(id)
                try phone.checkReachable(boxID)
                try Self.refuseIfLoggedIn(phone, boxID, throughAgent: !noAgent)
                if !noAgent {
                    if background, AgentClient(phone.dirs) == nil {
                        try AgentCommand.Start.spawnAgent(phone: phone, radio: radio, lifetime: AgentCommand.defaultLifetime)
                    }
                    if AgentClient(phone.dirs) != nil {
                        try loginThroughAgent(phone, boxID)
                        Self.retireLostHolder(phone, boxID)
                        return
                    }
                }
                var vault = try phone.vault()
                if vault.isWiped { throw Vault.Failure.wiped.asPhoneFailure }
                guard vault.hasCredentials else { throw Vault.Failure.noCredentials.asPhoneFailure }
                let phoneRadio = try await radio.open(phone)
                defer { phoneRadio.shutdown() }
                var result: (LoginReport, BoxLink)?
                let withdrawal = Withdrawal()
                do {
                    // The PIN and the password live only until the push: the presence link
                    // below may run for hours and needs neither.
                    let pin = vault.hasPIN ? try Terminal.readPIN() : nil
                    let (user, password): (String, SecureBytes)
                    do { (user, password) = try vault.credentials(pin: pin, now: vaultNow()) } catch let f as Vault.Failure { throw f.asPhoneFailure }
                    // Ctrl-C while the push waits for Enter takes it back (the box answers
                    // "withdrawn"); before the push, or a second time, it just stops.
                    Terminal.onInterrupt { sig in
                        if withdrawal.isAsked || !withdrawal.ask() { Terminal.clearProgress(); Glibc.exit(128 + sig) }
                        Terminal.say(tr("Taking the push back from box {box}…", ("box", boxID)))
                    }
                    defer { Terminal.onInterrupt(nil) }
                    while result == nil {
                        do {
                            result = try await phone.login(to: boxID, user: user, password: password, radio: phoneRadio.central, withdrawal: withdrawal,
                                                           progress: { Terminal.progress(tr("looking for box {box}… {seconds} s", ("box", boxID), ("seconds", $0.components.seconds))) },
                                                           awaitingEnter: { Terminal.say($0.sentence(box: boxID)) })
                        } catch let f as PhoneFailure where f.outcome == .notFound && Terminal.offerToSearchAgain(boxID) {
                            continue
                        }
                    }
                }
                let (report, link) = result!
                if withdrawal.isAsked {
                    // Enter at the box came first: logged in, and Ctrl-C means leaving, which
                    // is walking away (the link goes without a detach).
                    Terminal.clearProgress()
                    Terminal.say(report.sentence)
                    Terminal.say(tr("Too late to take the push back: Enter was already pressed at box {box}.", ("box", boxID)))
                    await link.close()
                    Terminal.say(tr("Left box {box}: that is walking away, so the box locks your session (or ends it, as its admin set it) unless this phone is back within its grace time ([presence] grace_s, 5 s unless set otherwise).", ("box", boxID)))
                    return
                }
                Self.retireLostHolder(phone, boxID)
                Terminal.clearProgress()
                Terminal.say(report.sentence)
                if stats, let air = report.airSentence { Terminal.say(air) }
                if noStay {
                    // Tell the box this is no walk-away: the session stays as it is.
                    try? await link.send(.detach)
                    await link.close()
                    return
                }
                Terminal.say(tr("Staying connected as the presence link; Ctrl-C, `boxkey lock` or `boxkey logout` ends it."))
                let presence = PresenceLink(box: boxID, link: link, phone: phone, radio: phoneRadio,
                                            keepalive: .milliseconds(Int(keepalive * 1000)), log: { Terminal.say($0) })
                // Ctrl-C: leaving is walking away, so the box acts by its policy.
                Terminal.onInterrupt { _ in presence.leave(detach: false) }
                // `boxkey lock`, `logout` and `status` from other shells come through this process.
                let holder: PresenceHolder?
                do { holder = try await PresenceHolder.start(presence, dirs: phone.dirs, say: { Terminal.say($0) }) } catch {
                    holder = nil
                    Terminal.warn(tr("boxkey: `boxkey lock` and `boxkey logout` cannot reach this login ({why}); they will use a link of their own, which ends this presence link", ("why", "\(error)")))
                }
                let ending = await presence.run()
                // A lock or logout asked from another shell ended the link: its answer is out
                // before this process ends.
                await holder?.finish()
                Terminal.onInterrupt(nil)
                if case .removed(let why) = ending { throw PhoneFailure(.refused, why) }
                if ending == .left(detached: false) {
                    Terminal.say(tr("Left box {box}: that is walking away, so the box locks your session (or ends it, as its admin set it) unless this phone is back within its grace time ([presence] grace_s, 5 s unless set otherwise).", ("box", boxID)))
                }
            }
        }

        /// A live presence link to the box means this phone's session there is open: a new
        /// login has nothing to do, and its link would push the presence link aside.
        static func refuseIfLoggedIn(_ phone: Phone, _ boxID: BoxID, throughAgent: Bool) throws {
            if let held = PresenceHolder.status(phone.dirs, box: boxID), held.connected {
                throw PhoneFailure(.failure, tr("you are logged in on box {box}: boxkey login (pid {pid}) holds its presence link. Use `boxkey lock` or `boxkey logout`, or end that login (Ctrl-C there) first.", ("box", boxID), ("pid", held.pid)))
            }
            // The agent replaces a presence link of its own; a login beside it would not.
            if !throughAgent, let agent = AgentCommand.runningStatus(phone.dirs), let p = agent.presence, p.box == boxID.description, p.connected {
                throw PhoneFailure(.failure, tr("you are logged in on box {box}: the agent (pid {pid}) holds its presence link. Use `boxkey lock` or `boxkey logout` first.", ("box", boxID), ("pid", agent.pid)))
            }
        }

        /// After this login was accepted: a foreground login whose presence link to the box was
        /// lost (and is looking for it) stops looking, without a walk-away; finding the box again
        /// it would push this login's link aside.
        static func retireLostHolder(_ phone: Phone, _ boxID: BoxID) {
            if let holder = PresenceHolder.client(phone.dirs, box: boxID) {
                _ = try? holder.send(.stop, timeout: .seconds(5))
            }
        }

        /// The agent holds the credentials and the radio; this process only asks and prints.
        private func loginThroughAgent(_ phone: Phone, _ boxID: BoxID) throws {
            while true {
                guard let agent = AgentClient(phone.dirs) else { throw PhoneFailure(.agentUnavailable, tr("the agent went away")) }
                // Ctrl-C while the agent's push waits for Enter takes it back: the agent reads
                // this side's end and answers "withdrawn". A second Ctrl-C just stops.
                let asked = NIOLockedValueBox(false)
                Terminal.onInterrupt { sig in
                    let again = asked.withLockedValue { seen in
                        defer { seen = true }
                        return seen
                    }
                    if again { Terminal.clearProgress(); Glibc.exit(128 + sig) }
                    agent.stopAsking()
                }
                defer { Terminal.onInterrupt(nil) }
                let reply = try agent.send(.login(box: boxID, stay: !noStay), progress: Terminal.progress,
                                           say: { Terminal.clearProgress(); Terminal.say($0) })
                switch reply {
                case .needPIN:
                    let pin = try Terminal.readPIN()
                    guard let agent = AgentClient(phone.dirs) else { throw PhoneFailure(.agentUnavailable, tr("the agent went away")) }
                    if case .result(let outcome, let message, _) = try agent.send(.unlock(pin: pin)), outcome != .success {
                        throw PhoneFailure(outcome, message)
                    }
                case .result(.success, let message, let details):
                    Terminal.clearProgress()
                    Terminal.say(message)
                    if stats, let report = try? JSONDecoder().decode(LoginReport.self, from: Data(details.utf8)), let air = report.airSentence {
                        Terminal.say(air)
                    }
                    return
                case .result(.notFound, let message, _):
                    guard Terminal.offerToSearchAgain(boxID) else { throw PhoneFailure(.notFound, message) }
                case .result(let outcome, let message, _):
                    throw PhoneFailure(outcome, message)
                case .progress, .say:
                    continue
                }
            }
        }
    }

    struct Lock: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Lock your session on a box now (an agent also drops the credentials it holds).")
        @Argument(help: "The box ID (default: the paired box).") var id: BoxID?
        @OptionGroup var radio: RadioOptions
        func run() async throws {
            try await Terminal.run {
                Terminal.say(try await sessionAction(.lock, id: id, radio: radio))
            }
        }
    }

    struct Logout: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "End your session on a box (asks first).")
        @Argument(help: "The box ID (default: the paired box).") var id: BoxID?
        @Flag(help: "Do not ask for confirmation.") var yes = false
        @OptionGroup var radio: RadioOptions
        func run() async throws {
            try await Terminal.run {
                guard yes || Terminal.confirm(tr("Log out of your session? Unsaved work will be lost.")) else {
                    throw PhoneFailure(.cancelled, tr("not logged out"))
                }
                Terminal.say(try await sessionAction(.logout, id: id, radio: radio))
            }
        }
    }
}

/// Lock or logout: through the process holding the box's presence link (a foreground `boxkey
/// login`, or the agent), else through the agent when one runs, else over a new link. Returns
/// the sentence to print.
func sessionAction(_ action: ActionResult.Action, id: BoxID?, radio: RadioOptions) async throws -> String {
    let dirs = PhoneDirectories()
    // A `boxkey login` in the foreground holding the presence link to the box: over that link
    // (a link of this process's own would push it aside at the box). A holder that does not
    // answer in 20 s (stopped, or the link lost meanwhile) counts as none.
    if let box = id ?? (try? Phone.open(dirs))?.boxes.defaultBox, let holder = PresenceHolder.client(dirs, box: box),
       case .result(let outcome, let message, _)? = try? holder.send(.act(action, box: box), timeout: .seconds(20)), outcome != .agentUnavailable {
        // A lock means the person is leaving: an agent drops the credentials it holds too.
        if action == .lock, let agent = AgentClient(dirs) { _ = try? agent.send(.forget, timeout: .seconds(10)) }
        guard outcome == .success else { throw PhoneFailure(outcome, message) }
        return message
    }
    // The agent next, by its socket alone: it knows the default box, and a lock must reach it
    // (and make it drop the credentials) even when this process cannot load the phone's files.
    if let agent = AgentClient(dirs) {
        guard case .result(let outcome, let message, _) = try agent.send(.act(action, box: id)) else {
            throw PhoneFailure(.failure, "unexpected answer from the agent")
        }
        guard outcome == .success else { throw PhoneFailure(outcome, message) }
        return message
    }
    var phone = try Phone.open()
    let boxID = try phone.boxID(id)
    let phoneRadio = try await radio.open(phone)
    defer { phoneRadio.shutdown() }
    let link = try await phone.connect(to: boxID, radio: phoneRadio.central)
    try await Phone.act(action, on: link, box: boxID)
    return action == .lock ? tr("Locked your session on box {box}.", ("box", boxID)) : tr("Logged out of box {box}.", ("box", boxID))
}
