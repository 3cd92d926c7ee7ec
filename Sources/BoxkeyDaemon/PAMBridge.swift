import BoxkeyCore
import BoxkeyPAMWire
import CBoxkeySys
import FoundationEssentials
import Logging
import NIOCore
import NIOPosix
import ServiceLifecycle

/// A root-only Unix socket of the daemon's, in one of two roles: the PAM socket, where
/// `pam_boxkey.so` waits for pushes and reports outcomes, or the admin socket, where `boxkeyd
/// status`, `phones`, `pair-code` and `reload` ask the running daemon. Each takes only its own
/// requests. Every connection's peer is checked with SO_PEERCRED, and its requests with
/// `PAMConnectionState`'s table.
public struct PAMBridge: Service, CustomStringConvertible {
    public enum Role: String, Sendable { case prompts = "PAM", admin }
    public var description: String { "PAMBridge(\(role), \(path))" }
    let box: Box
    let role: Role
    let path: String
    let allowedUIDs: Set<UInt32>
    let logger: Logger
    let readiness: Readiness?
    /// The admin's `reload`: re-reads the configuration and answers with the outcome.
    let reload: (@Sendable () async -> PAMReply)?

    public init(box: Box, role: Role = .prompts, path: String, allowedUIDs: [UInt32], logger: Logger, readiness: Readiness? = nil,
                reload: (@Sendable () async -> PAMReply)? = nil) {
        self.readiness = readiness
        self.box = box
        self.role = role
        self.path = path
        self.allowedUIDs = Set(allowedUIDs + [0])
        self.logger = logger
        self.reload = reload
    }

    public func run() async throws {
        let directory = path.parentDirectory
        if !FileManager.default.fileExists(atPath: directory) {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o755])
        }
        let server = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(ByteToMessageHandler(PAMFrameDecoder()))
                }
            }
            .bind(unixDomainSocketPath: path, cleanupExistingSocketFile: true) { channel in
                channel.eventLoop.makeCompletedFuture {
                    try NIOAsyncChannel<ByteBuffer, ByteBuffer>(wrappingChannelSynchronously: channel)
                }
            }
        // Root only: the mode keeps others out, SO_PEERCRED checks whoever is let in.
        chmod(path, 0o600)
        if let first = allowedUIDs.first(where: { $0 != 0 }), getuid() == 0 { chown(path, first, gid_t(bitPattern: -1)) }
        logger.info("\(role.rawValue) socket listening on \(path)")
        readiness?.ready("\(role.rawValue) socket")
        // Graceful shutdown cancels the work below; that is a normal end, not an error.
        do { try await cancelWhenGracefulShutdown {
            try await server.executeThenClose { inbound in
                try await withThrowingDiscardingTaskGroup { group in
                    for try await connection in inbound {
                        group.addTask { await serve(connection) }
                    }
                }
            }
        } } catch is CancellationError {}
        unlink(path)
    }

    private func peer(_ channel: any Channel) async -> PAMPeer? {
        guard let provider = channel as? SocketOptionProvider else { return nil }
        let credentials: boxkey_ucred? = try? await provider.unsafeGetSocketOption(
            level: SocketOptionLevel(boxkey_sol_socket()), name: SocketOptionName(boxkey_so_peercred())).get()
        return credentials.map { PAMPeer(pid: $0.pid, uid: UInt32($0.uid)) }
    }

    /// A reply, or a prompt's answer whose password is still in secure memory.
    enum Outgoing: Sendable {
        case reply(PAMReply)
        case answer(PromptAnswer)
    }

    private func serve(_ connection: NIOAsyncChannel<ByteBuffer, ByteBuffer>) async {
        guard let peer = await peer(connection.channel), allowedUIDs.contains(peer.uid) else {
            logger.warning("\(role.rawValue) socket: refused a connection from a process that is not root")
            try? await connection.executeThenClose { _, _ in }
            return
        }
        let channel = connection.channel
        try? await connection.executeThenClose { inbound, outbound in
            let (replies, replyContinuation) = AsyncStream.makeStream(of: Outgoing.self)
            try await withThrowingTaskGroup(of: Void.self) { group in
                // One writer, so replies go out whole and in order.
                group.addTask {
                    for await item in replies {
                        switch item {
                        case .reply(let reply):
                            try await outbound.write(ByteBuffer(bytes: reply.encode()))
                        case .answer(.noPush(let reason)):
                            try await outbound.write(ByteBuffer(bytes: PAMReply.noPush(reason).encode()))
                        case .answer(.escrowCapture(let user, let ticket)):
                            try await outbound.write(ByteBuffer(bytes: PAMReply.escrowCapture(user: user, ticket: ticket).encode()))
                        case .answer(.keyLogin(let user, let ticket)):
                            try await outbound.write(ByteBuffer(bytes: PAMReply.keyLogin(user: user, ticket: ticket).encode()))
                        case .answer(.push(let user, let password, let ticket)):
                            try await writePush(user: user, password: password, ticket: ticket, to: channel)
                        }
                    }
                }
                var state = PAMConnectionState.fresh
                var prompt: UInt64?
                var wait = Duration.zero
                requests: for try await frame in inbound {
                    let request: PAMRequest
                    var body = Array(buffer: frame)
                    // A captured password came in this frame: wipe the socket's buffer in place
                    // (a write through a copy would wipe only the copy) and our copy of it.
                    defer {
                        frame.withUnsafeReadableBytes { if let b = $0.baseAddress { memset(UnsafeMutableRawPointer(mutating: b), 0, $0.count) } }
                        secureZero(&body)
                    }
                    do { request = try PAMRequest.decode(body) } catch {
                        replyContinuation.yield(.reply(.error("malformed request: \(error)")))
                        break
                    }
                    // Each socket takes only its own requests.
                    guard request.isAdmin == (role == .admin) else {
                        logger.warning("\(role.rawValue) socket: \(request.name) belongs on the \(role == .admin ? "PAM" : "admin") socket; closing")
                        replyContinuation.yield(.reply(.error("\(request.name) is not taken on the \(role.rawValue) socket")))
                        break
                    }
                    if state == .waiting, let prompt, await box.hasPush(prompt) { state = .pushed }
                    guard let next = state.next(on: request) else {
                        logger.warning("PAM socket: \(request.name) not allowed while \(state); closing")
                        replyContinuation.yield(.reply(.error("request not allowed now")))
                        break
                    }
                    state = next
                    switch request {
                    case .waitForPush(let r):
                        let (id, reply) = await box.registerPrompt(r, peer: peer)
                        replyContinuation.yield(.reply(reply))
                        guard let id else { break requests }
                        prompt = id
                        wait = .milliseconds(Int(r.timeoutMilliseconds))
                    case .cancel:
                        if let prompt { await box.promptClosed(prompt) }
                    case .intent:
                        // Enter at the prompt. A wait for a phone on its way runs beside this read
                        // loop, so a cancel or a hang-up ends it.
                        if let prompt {
                            let wait = wait
                            group.addTask { replyContinuation.yield(.answer(await box.take(prompt, wait: wait))) }
                        }
                    case .capturedPassword(var password):
                        if let prompt { await box.captured(prompt, password: SecureBytes(copying: password)) }
                        secureZero(&password)
                    case .reportOutcome(let verdict, let reason):
                        if let prompt { await box.report(prompt, verdict, reason: reason) }
                        replyContinuation.yield(.reply(.ok))
                    case .openSession(let user, let session, let service, let ticket):
                        await box.openSession(user: user, sessionID: session, service: service, ticket: ticket)
                        replyContinuation.yield(.reply(.ok))
                    case .closeSession(let session):
                        await box.closeSession(sessionID: session)
                        replyContinuation.yield(.reply(.ok))
                    case .listPhones:
                        replyContinuation.yield(.reply(.text(await box.phoneList())))
                    case .revokePhone(let fingerprint):
                        replyContinuation.yield(.reply(await box.revoke(fingerprint: fingerprint)))
                    case .daemonStatus:
                        replyContinuation.yield(.reply(.text(AdminJSON.encode(await box.status()))))
                    case .newPairingCode(let user):
                        replyContinuation.yield(.reply(await box.newPairingCode(user: user)))
                    case .enrolPhone(let key, let user, let name):
                        replyContinuation.yield(.reply(await box.enrolPhone(key: key, user: user, name: name)))
                    case .reload:
                        replyContinuation.yield(.reply(await reload?() ?? .error("this daemon does not re-read a configuration file")))
                    }
                    if state == .done { break requests }
                }
                if let prompt { await box.promptClosed(prompt) }
                replyContinuation.finish()
                try await group.waitForAll()
            }
        }
    }
}

/// Writes a push frame from secure memory straight into a buffer of our own, sends it, and
/// wipes that buffer once the socket has taken it: the only copy of the password outside
/// secure memory is then the kernel's socket buffer.
private func writePush(user: String, password: SecureBytes, ticket: String, to channel: any Channel) async throws {
    let length = PAMReply.pushFrameLength(user: user, passwordLength: password.count, ticket: ticket)
    var buffer = channel.allocator.buffer(capacity: length)
    buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: length) { out in
        password.withUnsafeBytes { p in
            PAMReply.writePushFrame(user: user, password: p, ticket: ticket, into: UnsafeMutableRawBufferPointer(rebasing: out[0..<length]))
        }
        return length
    }
    defer {
        // The storage the socket read from, in place. A mutable view would copy it first while
        // the channel still holds a reference (copy on write: under load NIO releases its
        // reference a moment after the write's future completes), and the original would be
        // freed with the frame in it; the read-only view of the whole storage never copies.
        buffer.withVeryUnsafeBytes { storage in
            if let base = storage.baseAddress { memset(UnsafeMutableRawPointer(mutating: base), 0, storage.count) }
        }
    }
    try await channel.writeAndFlush(buffer)
}

extension PAMRequest {
    /// For logs: the request's kind, never its fields (a push reply holds a password).
    var name: String {
        switch self {
        case .waitForPush: "waitForPush"
        case .cancel: "cancel"
        case .reportOutcome: "reportOutcome"
        case .capturedPassword: "capturedPassword"
        case .intent: "intent"
        case .openSession: "openSession"
        case .closeSession: "closeSession"
        case .listPhones: "listPhones"
        case .revokePhone: "revokePhone"
        case .daemonStatus: "daemonStatus"
        case .newPairingCode: "newPairingCode"
        case .enrolPhone: "enrolPhone"
        case .reload: "reload"
        }
    }
}

/// Splits the byte stream into frames: a 2-byte big-endian length, then that many bytes.
struct PAMFrameDecoder: ByteToMessageDecoder {
    typealias InboundOut = ByteBuffer

    mutating func decode(context: ChannelHandlerContext, buffer: inout ByteBuffer) throws -> DecodingState {
        guard let length = buffer.getInteger(at: buffer.readerIndex, as: UInt16.self) else { return .needMoreData }
        guard Int(length) <= PAMWire.maxFrameLength else { throw PAMWire.DecodeError.tooLong(Int(length)) }
        guard buffer.readableBytes >= 2 + Int(length) else { return .needMoreData }
        buffer.moveReaderIndex(forwardBy: 2)
        context.fireChannelRead(wrapInboundOut(buffer.readSlice(length: Int(length))!))
        return .continue
    }
}
