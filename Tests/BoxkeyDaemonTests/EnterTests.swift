import BoxkeyCore
@testable import BoxkeyDaemon
import BoxkeyPAMWire
@testable import BoxkeyPhone
import BoxkeyRadio
import Testing

/// A prompt is open while the program asks for the password; a phone's push waits there for
/// Enter (`Box.take`), and nothing waits for a phone that is not coming.
@Suite(.serialized, .timeLimit(.minutes(1))) struct EnterTests {
    func push(_ h: BoxHarness, _ n: UInt8 = 0x31, user: String = "alice", password: String = "pw") async throws -> BoxLink {
        try await h.push(n, user: user, password: password)
    }

    @Test func aPushWaitsForEnterAndThePhoneHearsWhere() async throws {
        let h = try await BoxHarness()
        try await h.run {
            let prompt = try await h.prompt(tty: "/dev/tty3")
            let link = try await push(h)
            guard case .awaitingEnter(let wait) = try await link.next(timeout: .seconds(5)) else { Issue.record("no awaitingEnter"); return }
            #expect(wait.place == "login on tty3")
            #expect(wait.seconds == 30)
            // Held, not delivered: the stack has nothing yet, and no other push takes the prompt.
            #expect(await h.box.hasPush(prompt) == false)
            guard case .push(let user, let password, _) = await h.box.take(prompt, wait: .seconds(5)) else { Issue.record("Enter found no push"); return }
            #expect(user == "alice")
            #expect(password.isEqual(to: SecureBytes(utf8: "pw")))
            #expect(await h.box.hasPush(prompt))
            await h.box.report(prompt, .accepted, reason: "")
            guard case .loginResult(let result) = try await link.next(timeout: .seconds(5)) else { Issue.record("no result"); return }
            #expect(result.outcome == .accepted)
            await link.close()
        }
    }

    @Test func enterWithNoPhoneIsAnsweredAtOnceAndThePromptStaysOpen() async throws {
        let h = try await BoxHarness()
        try await h.run {
            let prompt = try await h.prompt()
            let start = ContinuousClock.now
            guard case .noPush(.nothingYet) = await h.box.take(prompt, wait: .seconds(10)) else { Issue.record("Enter waited"); return }
            #expect(ContinuousClock.now - start < .milliseconds(100))
            // Still open: the phone's push after that Enter waits for the next one.
            let link = try await push(h)
            guard case .awaitingEnter = try await link.next(timeout: .seconds(5)) else { Issue.record("not held"); return }
            #expect(await h.box.take(prompt, wait: .seconds(5)).pushedUser == "alice")
            await h.box.report(prompt, .accepted, reason: "")
            await link.close()
        }
    }

    @Test func aConnectedPhoneMakesEnterWaitForNothing() async throws {
        let h = try await BoxHarness()
        try await h.run {
            let prompt = try await h.prompt()
            let (identity, central) = try await h.phone(0x32, enrolledFor: "alice")
            let key = h.box.identity.keyPair.publicKey
            let heard = try #require(try await findBox(BoxID(4821)!, pinned: key, radio: central, timeout: .seconds(5)))
            let link = try await BoxLink.open(to: heard, boxKey: key, identity: identity, radio: central)
            // A connection says nothing about whose push would come: Enter is answered at once.
            let start = ContinuousClock.now
            guard case .noPush(.nothingYet) = await h.box.take(prompt, wait: .seconds(5)) else { Issue.record("Enter waited for a connection"); return }
            #expect(ContinuousClock.now - start < .milliseconds(100))
            try await link.send(.credentialPush(CredentialPush(user: "alice", password: SecureBytes(utf8: "pw"), deviceName: "test")))
            guard case .awaitingEnter = try await link.next(timeout: .seconds(5)) else { Issue.record("not held"); return }
            #expect(await h.box.take(prompt, wait: .seconds(5)).pushedUser == "alice")
            await h.box.report(prompt, .accepted, reason: "")
            guard case .loginResult(let result) = try await link.next(timeout: .seconds(5)) else { Issue.record("no result"); return }
            #expect(result.outcome == .accepted)
            await link.close()
        }
    }

    @Test func aHeldPushNobodyTakesIsDroppedAndThePhoneIsTold() async throws {
        let h = try await BoxHarness { $0.enterWait = .seconds(1) }
        try await h.run {
            let prompt = try await h.prompt()
            let link = try await push(h)
            guard case .awaitingEnter(let wait) = try await link.next(timeout: .seconds(5)) else { Issue.record("not held"); return }
            #expect(wait.seconds == 1)
            guard case .loginResult(let result) = try await link.next(timeout: .seconds(5)) else { Issue.record("no result"); return }
            #expect(result.outcome == .timedOut)
            #expect(result.reason.contains("nobody pressed Enter"))
            // The push is gone: a late Enter gets nothing, and the prompt takes the next push.
            #expect(await h.box.take(prompt, wait: .seconds(1)).pushedUser == nil)
            await link.close()
            // The box may have hung up first; either way, the link is over before the next push.
            try await h.linkEnded(DeviceAddress("00:50:48:00:00:31")!, after: 0)
            let again = try await push(h, 0x33)
            guard case .awaitingEnter = try await again.next(timeout: .seconds(5)) else { Issue.record("the prompt did not reopen"); return }
            await again.close()
        }
    }

    @Test func aHeldPushGoesWithItsPhone() async throws {
        let h = try await BoxHarness()
        try await h.run {
            let prompt = try await h.prompt()
            let link = try await push(h)
            guard case .awaitingEnter = try await link.next(timeout: .seconds(5)) else { Issue.record("not held"); return }
            let mark = h.journal.mark
            await link.close()
            try await h.linkEnded(DeviceAddress("00:50:48:00:00:31")!, after: mark)
            // Someone presses Enter after the phone left: it must not log its user in.
            guard case .noPush = await h.box.take(prompt, wait: .seconds(1)) else { Issue.record("a departed phone's push was delivered"); return }
        }
    }

    @Test func aTypedPasswordLetsTheHeldPushGoWithoutCountingARejection() async throws {
        let h = try await BoxHarness { $0.rejectedPushesPerUser = 1 }
        try await h.run {
            let prompt = try await h.prompt()
            let link = try await push(h)
            guard case .awaitingEnter = try await link.next(timeout: .seconds(5)) else { Issue.record("not held"); return }
            await h.box.promptClosed(prompt)   // the module's cancel: the person typed a password
            guard case .loginResult(let result) = try await link.next(timeout: .seconds(5)) else { Issue.record("no result"); return }
            #expect(result.outcome == .notAtPrompt)
            await link.close()
            // One rejection would have used up alice's budget; this was none.
            try await h.honestLogin(0x34)
        }
    }

    @Test func anOfferGoesOnlyToAPromptAlreadyForItsUser() async throws {
        let h = try await BoxHarness { $0.proximity = true }
        try await h.run {
            // A greeter's prompt with nobody named: the password prompt is already on screen and
            // cannot say whose phone is near, so Enter there must not log anyone in by proximity.
            let open = try await h.prompt(user: "")
            let (identity, central) = try await h.phone(0x35, enrolledFor: "alice")
            let key = h.box.identity.keyPair.publicKey
            let heard = try #require(try await findBox(BoxID(4821)!, pinned: key, radio: central, timeout: .seconds(5)))
            let link = try await BoxLink.open(to: heard, boxKey: key, identity: identity, radio: central)
            try await link.send(.offer(ProximityOffer(user: "alice", deviceName: "test")))
            guard case .loginResult(let refused) = try await link.next(timeout: .seconds(5)) else { Issue.record("the offer was taken"); return }
            #expect(refused.outcome == .notAtPrompt && refused.reason.contains("names no user"))
            await link.close()
            await h.box.promptClosed(open)
            // alice's own console prompt takes it, and Enter there asks the phone to push.
            let alices = try await h.prompt(tty: "tty2", user: "alice")
            let again = try await BoxLink.open(to: heard, boxKey: key, identity: identity, radio: central)
            let mark = h.journal.mark
            try await again.send(.offer(ProximityOffer(user: "alice", deviceName: "test")))
            try await h.journal.line(after: mark, containing: "proximity offer:", "waiting for Enter there")
            async let answer = h.box.take(alices, wait: .seconds(5))
            guard case .intent = try await again.next(timeout: .seconds(5)) else { Issue.record("no intent after Enter"); return }
            try await again.send(.credentialPush(CredentialPush(user: "alice", password: SecureBytes(utf8: "pw"), deviceName: "test")))
            #expect(await answer.pushedUser == "alice")
            await h.box.report(alices, .accepted, reason: "")
            await again.close()
        }
    }

    @Test func aPushForAnotherUserNeverWaitsAtAConsoleLoginForAlice() async throws {
        let h = try await BoxHarness()
        try await h.run {
            _ = try await h.prompt(tty: "/dev/tty1", user: "alice")
            let link = try await push(h, user: "bob")
            guard case .loginResult(let result) = try await link.next(timeout: .seconds(5)) else { Issue.record("bob's push was held at alice's prompt"); return }
            #expect(result.outcome == .wrongUser)
            await link.close()
        }
    }
}
