import BoxkeyCore
@testable import BoxkeyDaemon
import BoxkeyPAMWire
@testable import BoxkeyPhone
import BoxkeyRadio
import Foundation
import Logging
import Testing

/// The PAM bridge and the admin socket of a harness's box, on sockets in its state folder,
/// driven by the blocking client the admin commands use (each step on a thread of its own).
struct SocketHarness {
    let h: BoxHarness
    let pam: String
    let admin: String

    init(_ backend: AirBackend = .inProcess, configure: (inout DaemonConfig) -> Void = { _ in }) async throws {
        h = try await BoxHarness(backend, configure: configure)
        pam = h.state + "/pam.sock"
        admin = h.state + "/admin.sock"
    }

    func run(_ body: @Sendable @escaping () async throws -> Void) async throws {
        let (box, pam, admin, journal) = (h.box, pam, admin, h.journal)
        try await h.run {
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { try await PAMBridge(box: box, path: pam, allowedUIDs: [], logger: journal.logger("pam")).run() }
                group.addTask { try await AdminSocket(box: box, path: admin, logger: journal.logger("admin")).run() }
                try await journal.line(containing: "socket listening on \(pam)")
                try await journal.line(containing: "socket listening on \(admin)")
                try await body()
                group.cancelAll()
            }
        }
    }

    func connect(_ path: String) async throws -> Client { try await onThread { Client(try DaemonSocketClient(path: path)) } }

    /// An enrolled phone's push to the box; returns its link.
    func push() async throws -> BoxLink { try await h.push(0x41) }
}

/// A connection of the blocking client; its calls run off the cooperative threads.
final class Client: @unchecked Sendable {
    let client: DaemonSocketClient
    init(_ client: DaemonSocketClient) { self.client = client }

    func ask(_ request: PAMRequest) async throws -> PAMReply {
        try await onThread { try self.client.send(request); return try self.client.receive(timeoutMilliseconds: 5000) }
    }
    func tell(_ request: PAMRequest) async throws { try await onThread { try self.client.send(request) } }
    func ask(_ request: AdminRequest) async throws -> AdminReply {
        try await onThread { try self.client.send(request); return try self.client.receiveAdmin(timeoutMilliseconds: 5000) }
    }
    /// What comes next on a PAM connection (or why nothing does).
    func next() async -> Result<PAMReply, DaemonSocketClient.Error> {
        await onThread { Result { () throws(DaemonSocketClient.Error) in try self.client.receive(timeoutMilliseconds: 5000) } }
    }
}

func onThread<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { c in Thread { c.resume(with: Result { try work() }) }.start() }
}

func onThread<T: Sendable>(_ work: @escaping @Sendable () -> T) async -> T {
    await withCheckedContinuation { c in Thread { c.resume(returning: work()) }.start() }
}

let consolePrompt = PAMRequest.waitForPush(.init(service: "login", tty: "tty1", display: "", expectedUser: "alice", timeoutMilliseconds: 5000))

@Suite(.serialized, .timeLimit(.minutes(1))) struct BridgeTests {
    @Test(arguments: AirBackend.allCases) func aPromptOverTheSocketTakesThePushAtEnterAndReportsTheVerdict(_ air: AirBackend) async throws {
        let s = try await SocketHarness(air)
        try await s.run {
            let module = try await s.connect(s.pam)
            guard case .prompt(let boxID, let fingerprint, _, _) = try await module.ask(consolePrompt) else { Issue.record("no prompt"); return }
            #expect(boxID == "4821" && fingerprint == s.h.box.identity.fingerprint)
            let link = try await s.push()
            guard case .awaitingEnter = try await link.next(timeout: .seconds(5)) else { Issue.record("the push did not wait for Enter"); return }
            guard case .push(let user, let password, _) = try await module.ask(.intent) else { Issue.record("Enter got no push"); return }
            #expect(user == "alice" && password == Array("pw".utf8))
            #expect(try await module.ask(.reportOutcome(.accepted, reason: "")) == .ok)
            guard case .loginResult(let result) = try await link.next(timeout: .seconds(5)) else { Issue.record("no result"); return }
            #expect(result.outcome == .accepted)
            await link.close()
        }
    }

    @Test func enterWithNothingThereIsAnsweredAtOnceAndAVerdictBeforeAPushClosesTheConnection() async throws {
        let s = try await SocketHarness()
        try await s.run {
            let module = try await s.connect(s.pam)
            guard case .prompt = try await module.ask(consolePrompt) else { Issue.record("no prompt"); return }
            #expect(try await module.ask(.intent) == .noPush(.nothingYet))
            // No push was handed over: a verdict now is out of turn, and ends the connection.
            #expect(try await module.ask(.reportOutcome(.accepted, reason: "")) == .error("request not allowed now"))
            #expect(await module.next() == .failure(.closed))
            // A second prompt on a connection is refused the same way.
            let other = try await s.connect(s.pam)
            guard case .prompt = try await other.ask(consolePrompt) else { Issue.record("no prompt"); return }
            #expect(try await other.ask(consolePrompt) == .error("request not allowed now"))
        }
    }

    @Test func eachSocketTakesOnlyItsOwnRequests() async throws {
        let s = try await SocketHarness()
        try await s.run {
            let module = try await s.connect(s.pam)
            try await onThread { try module.client.send(AdminRequest.daemonStatus) }
            #expect(await module.next() == .success(.error("daemonStatus is not taken on the PAM socket")))
            #expect(await module.next() == .failure(.closed))
            let admin = try await s.connect(s.admin)
            #expect(try await onThread { try admin.client.send(PAMRequest.intent); return try admin.client.receiveAdmin(timeoutMilliseconds: 5000) }
                    == .error("intent is not taken on the admin socket"))
        }
    }

    @Test func theAdminSocketAnswersRequestAfterRequestAndLongListsWhole() async throws {
        let s = try await SocketHarness()
        try await s.run {
            let admin = try await s.connect(s.admin)
            #expect(try await admin.ask(.listPhones) == .text("[]"))
            for n in 0..<16 {
                let key = hex(KeyPair.generate().publicKey.bytes)
                guard case .text = try await admin.ask(.enrolPhone(key: key, user: "alice", name: "phone \(n) ✓")) else { Issue.record("not enrolled"); return }
            }
            guard case .text(let list) = try await admin.ask(.listPhones) else { Issue.record("no list"); return }
            #expect(list.utf8.count > PAMWire.maxFrameLength)
            #expect(try AdminJSON.decode([PhoneRegistry.Phone].self, list).count == 16)
            #expect(try await admin.ask(.enrolPhone(key: "ab", user: "alice", name: "")) == .error("a phone key is 64 hex digits (boxkey status shows it)"))
            #expect(try await admin.ask(.reload) == .error("this daemon does not re-read a configuration file"))
        }
    }
}
