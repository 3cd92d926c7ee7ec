import BoxkeyCore
@testable import BoxkeyDaemon
import BoxkeyPAMWire
import BoxkeyRadio
import Testing

/// The box's decisions as pure values, driven by an injected clock (no sleeping).
struct PolicyTests {
    let phone = KeyPair.generate().publicKey
    let other = KeyPair.generate().publicKey

    // MARK: Enrolment

    @Test func aCodeLastsItsLifetimeAndItsTries() {
        var e = Enrolment(lifetime: .seconds(120), tries: 3, pendingWindow: .seconds(300))
        let code = e.codeForPrompt(user: nil, now: .zero)!
        #expect(e.codeForPrompt(user: "bob", now: .seconds(10)) == code)      // one live code per box
        e.attempted(now: .seconds(11)); e.attempted(now: .seconds(12))
        #expect(e.current(now: .seconds(13))?.triesLeft == 1)
        e.attempted(now: .seconds(14))
        #expect(e.current(now: .seconds(15)) == nil)                            // out of tries
        let next = e.codeForPrompt(user: nil, now: .seconds(16))!
        #expect(next.code != code.code || next.expires != code.expires)
        #expect(e.current(now: .seconds(16) + .seconds(120)) == nil)            // expired
    }

    @Test func theRightCodeOnTheLastTryStillPairs() {
        var e = Enrolment(lifetime: .seconds(120), tries: 3, pendingWindow: .seconds(300))
        let code = e.codeForPrompt(user: nil, now: .zero)!
        e.attempted(now: .seconds(1)); e.attempted(now: .seconds(2))           // two wrong guesses
        e.attempted(now: .seconds(3))                                           // the third begins
        #expect(e.current(now: .seconds(4)) == nil)                             // no fourth handshake
        var confirms = e.confirmable(code.code, now: .seconds(4))
        #expect(confirms)                                                       // the third completes
        let shown = e.codeForPrompt(user: nil, now: .seconds(4))!               // prompts move on
        #expect(shown.code != code.code)
        confirms = e.confirmable(code.code, now: .seconds(3) + Enrolment.handshakeTime)
        #expect(!confirms)                                                      // only for a handshake's time
        var f = Enrolment(lifetime: .seconds(120), tries: 1, pendingWindow: .seconds(300))
        let only = f.codeForPrompt(user: nil, now: .zero)!
        f.attempted(now: .seconds(1))
        _ = f.paired(phone, code: only, now: .seconds(2))
        confirms = f.confirmable(only.code, now: .seconds(3))
        #expect(!confirms)                                                      // single use
    }

    @Test func provingTheCodeUsesItUpAndLeavesThePhonePendingForAWhile() {
        var e = Enrolment(lifetime: .seconds(120), tries: 3, pendingWindow: .seconds(300))
        let code = e.codeForPrompt(user: "alice", now: .zero)!
        #expect(e.paired(phone, code: code, now: .seconds(5)) == nil)
        #expect(e.current(now: .seconds(6)) == nil)                             // single use
        #expect(e.pendingEnrolment(of: phone, now: .seconds(100))?.user == "alice")
        #expect(e.pendingEnrolment(of: other, now: .seconds(100)) == nil)
        #expect(e.pendingEnrolment(of: phone, now: .seconds(306)) == nil)       // the window closed
    }

    @Test func anAdminCodeForAUserEnrolsAtPairingAndIsNeverShownAtAPrompt() {
        var e = Enrolment()
        let code = e.mint(user: "alice", enrolsAtPairing: true, byAdmin: true, now: .zero)
        #expect(e.codeForPrompt(user: nil, now: .seconds(1)) == nil)
        #expect(e.paired(phone, code: code, now: .seconds(1)) == "alice")
        #expect(e.pendingEnrolment(of: phone, now: .seconds(2)) == nil)
    }

    // MARK: Prompts

    func request(_ service: String, tty: String, user: String = "") -> PAMRequest.WaitRequest {
        .init(service: service, tty: tty, display: "", expectedUser: user, timeoutMilliseconds: 30_000)
    }

    @Test func aPushGoesOnlyToTheOnePromptThatMayTakeIt() {
        var t = PromptTable()
        #expect(t.choose(for: "alice") == .none)
        // A greeter's prompt that names nobody yet takes no push: Enter there would log in
        // whoever's push happened to wait.
        let (other, _) = t.add(request("lightdm", tty: ":1"), owner: nil)
        #expect(t.choose(for: "alice") == .namesNobody)
        #expect(t.takingPushes.isEmpty)
        let (locker, _) = t.add(request("swaylock", tty: "", user: "bob"), owner: nil)
        #expect(t.choose(for: "alice") == .otherUser)
        #expect(t.choose(for: "bob") == .prompt(locker))
        let (greeter, _) = t.add(request("lightdm", tty: ":0", user: "alice"), owner: nil)
        #expect(t.choose(for: "alice") == .prompt(greeter))
        #expect(t.takingPushes.map(\.id) == [locker, greeter])
        // bob's push could reach his locker or a greeter with bob chosen: the box does not guess.
        _ = t.add(request("lightdm", tty: ":2", user: "bob"), owner: nil)
        guard case .ambiguous(let names) = t.choose(for: "bob") else { Issue.record("\(t.choose(for: "bob"))"); return }
        #expect(names.count == 2)
        #expect(t[other]!.request.expectedUser.isEmpty)
    }

    @Test func aNewPromptOnTheSameTerminalSupersedesTheOld() {
        var t = PromptTable()
        let (first, _) = t.add(request("login", tty: "tty1"), owner: nil)
        t[first]!.waiting = true
        let (_, superseded) = t.add(request("login", tty: "tty1"), owner: nil)
        #expect(superseded == [first])
    }

    @Test func localityFollowsLogindNotTheCaller() {
        let greeter = LoginSession(id: "c1", uid: 113, user: "gdm", seat: "seat0", sessionClass: "greeter")
        let alices = LoginSession(id: "2", uid: 1000, user: "alice", tty: "tty2")
        let remote = LoginSession(id: "9", uid: 1000, user: "alice", seat: "", remote: true)
        #expect(Locality.refusal(request("gdm-password", tty: "", user: "alice"), owner: greeter) == nil)
        #expect(Locality.refusal(request("swaylock", tty: "", user: "alice"), owner: alices) == nil)
        #expect(Locality.refusal(request("swaylock", tty: "", user: "bob"), owner: alices) != nil)   // bob's prompt in alice's session
        #expect(Locality.refusal(request("login", tty: "tty1"), owner: remote) != nil)
        #expect(Locality.refusal(request("login", tty: "tty1"), owner: nil) == nil)                  // getty's login
        #expect(Locality.refusal(request("login", tty: "pts/3"), owner: nil) != nil)
        var r = request("login", tty: "tty1"); r.remoteHost = "localhost"
        #expect(Locality.refusal(r, owner: nil) != nil)                                              // localhost is remote...
        #expect(Locality.refusal(r, owner: alices) == nil)                                           // ...unless logind says local
        r.remoteHost = "10.0.0.5"
        #expect(Locality.refusal(r, owner: alices) != nil)
        #expect(Locality.isLocalDisplay(":0") && Locality.isLocalDisplay(":1.0") && !Locality.isLocalDisplay("host:0"))
    }

    // MARK: Sessions

    @Test func ticketsAreSingleUseForOneUserAndExpire() {
        var r = SessionRegistry()
        let t = r.issueTicket(phone: phone, user: "alice", now: .zero)
        #expect(r.redeem(t, user: "mallory", now: .seconds(1)) == nil)           // another user: burnt
        #expect(r.redeem(t, user: "alice", now: .seconds(1)) == nil)
        let u = r.issueTicket(phone: phone, user: "alice", now: .zero)
        #expect(r.redeem(u, user: "alice", now: .seconds(1)) == phone)
        #expect(r.redeem(u, user: "alice", now: .seconds(2)) == nil)
        let late = r.issueTicket(phone: phone, user: "alice", now: .zero)
        #expect(r.redeem(late, user: "alice", now: .seconds(121)) == nil)
    }

    @Test func closingOneSessionKeepsTheOthers() {
        var r = SessionRegistry()
        r.register(LoginSession(id: "42", uid: 1000, user: "alice", tty: "tty1"), service: "login", phone: phone)
        r.register(LoginSession(id: "43", uid: 1000, user: "alice", tty: "tty2"), service: "login", phone: nil)
        r.close("43")
        #expect(r.sessions(of: "alice").map(\.id) == ["42"])
        #expect(r.sessions(boundTo: phone).map(\.id) == ["42"])
    }

    // MARK: Presence

    let settings = PresenceMonitor.Settings(keepaliveTimeout: .seconds(6), rssiInterval: .seconds(1), samples: 3,
                                            lockThreshold: -80, returnThreshold: -60, awayAfter: .seconds(5))

    @Test func missedKeepalivesAreWalkingAway() {
        var p = PresenceMonitor(phone: phone, user: "alice", settings: settings, now: .zero)
        p.keepalive(now: .seconds(2))
        #expect(p.away(now: .seconds(7)) == nil)
        #expect(p.away(now: .seconds(8)) != nil)                                // 6 s since the last one
        #expect(p.keepaliveDeadline == .seconds(8))
        #expect(p.away(now: .seconds(8)) == "no keepalive for 6.0 s")          // in words
    }

    @Test func anActionInFlightIsNoMissedKeepaliveButTheSignalStillCounts() {
        var p = PresenceMonitor(phone: phone, user: "alice", settings: settings, now: .zero)
        p.keepalive(now: .seconds(2))
        p.actionStarted()                                                        // the phone waits on the box's lock
        #expect(p.away(now: .seconds(30)) == nil && p.keepaliveDeadline == nil)
        p.actionEnded(now: .seconds(30))                                         // the timeout starts again
        #expect(p.away(now: .seconds(35)) == nil && p.away(now: .seconds(36)) != nil)
        var q = PresenceMonitor(phone: phone, user: "alice", settings: settings, now: .zero)
        q.actionStarted()
        for s in 1...6 { q.sample(nil, now: .seconds(s)) }
        #expect(q.away(now: .seconds(6)) == "signal unreadable for 5.0 s")
    }

    @Test func durationsAreSpokenInWords() {
        #expect(spokenDuration(.milliseconds(450)) == "450 ms")
        #expect(spokenDuration(.nanoseconds(6_000_501_567)) == "6.0 s")
        #expect(spokenDuration(.seconds(125)) == "2 min 5 s")
        #expect(spokenDuration(.seconds(120)) == "2 min")
        #expect(spokenDuration(.seconds(3 * 3600 + 600)) == "3 h 10 min")
        #expect(spokenDuration(.seconds(-2)) == "-2.0 s")
    }

    @Test func failedReadsAreNoSampleNeverSpinAndSustainedFailureIsAway() {
        var p = PresenceMonitor(phone: phone, user: "alice", settings: settings, now: .zero)
        for s in 1...5 {
            p.keepalive(now: .seconds(s))
            p.sample(nil, now: .seconds(s))
            #expect(p.nextSample == .seconds(s + 1))                            // always moves on
        }
        #expect(p.away(now: .seconds(5)) == nil)
        p.keepalive(now: .seconds(6))
        p.sample(nil, now: .seconds(6))
        #expect(p.away(now: .seconds(6)) != nil)                                // unreadable for 5 s
        // A good reading clears it.
        var q = PresenceMonitor(phone: phone, user: "alice", settings: settings, now: .zero)
        q.sample(nil, now: .seconds(1)); q.sample(-50, now: .seconds(4)); q.keepalive(now: .seconds(6))
        #expect(q.away(now: .seconds(6)) == nil)
    }

    @Test func weakSignalWithHysteresis() {
        var p = PresenceMonitor(phone: phone, user: "alice", settings: settings, now: .zero)
        #expect(p.sample(-90, now: .seconds(1)) == nil && p.sample(-90, now: .seconds(2)) == nil)
        #expect(p.sample(-90, now: .seconds(3)) == .weak(mean: -90))            // the countdown starts, said once
        for s in 1...3 { p.keepalive(now: .seconds(s)) }
        #expect(p.sample(-75, now: .seconds(4)) == nil); p.keepalive(now: .seconds(4))   // mean -85: counting
        #expect(p.sample(-70, now: .seconds(5)) == nil); p.keepalive(now: .seconds(5))   // mean -78: not above -60, no reset
        p.keepalive(now: .seconds(8))
        #expect(p.away(now: .seconds(8)) != nil)                                // below since 3 s, 5 s on
        // Above the return threshold, the countdown ends (said once too).
        var q = p
        #expect(q.sample(-40, now: .seconds(6)) == nil)                          // mean -62
        #expect(q.sample(-35, now: .seconds(7)) == .back(mean: -145.0 / 3))      // (-70 - 40 - 35) / 3
        #expect(q.away(now: .seconds(8)) == nil)
    }
}
