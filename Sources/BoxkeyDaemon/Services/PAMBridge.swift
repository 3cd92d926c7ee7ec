import BoxkeyCore
import BoxkeyPAMWire
import CBoxkeySys
import FoundationEssentials
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import ServiceLifecycle

/// The PAM socket, where `pam_boxkey.so` opens a prompt, waits for a push and reports the
/// stack's verdict. Each connection's requests follow `PAMConnectionState`'s table; anything
/// else closes it. (The admin's requests have a socket of their own: `AdminSocket`.)
public struct PAMBridge: Service, CustomStringConvertible {
    public var description: String { "PAMBridge(\(socket.path))" }
    let box: Box
    let socket: RootSocket
    let logger: Logger

    public init(box: Box, path: String, allowedUIDs: [UInt32], logger: Logger, readiness: Readiness? = nil) {
        self.box = box
        self.socket = RootSocket(name: "PAM", path: path, allowedUIDs: allowedUIDs, logger: logger, readiness: readiness)
        self.logger = logger
    }

    public func run() async throws {
        try await socket.run { peer, connection in await serve(connection, peer: peer) }
    }

    /// A reply, or a prompt's answer whose password is still in secure memory.
    enum Outgoing: Sendable {
        case reply(PAMReply)
        case answer(PromptAnswer)
    }

    private func serve(_ connection: NIOAsyncChannel<ByteBuffer, ByteBuffer>, peer: PAMPeer) async {
        let channel = connection.channel
        try? await connection.executeThenClose { inbound, outbound in
            let (replies, replyContinuation) = AsyncStream.makeStream(of: Outgoing.self)
            try await withThrowingTaskGroup(of: Void.self) { group in
                // One writer, so replies go out whole and in order.
                group.addTask { try await Self.write(replies, to: outbound, channel: channel) }
                var pam = PAMConnection(box: box, peer: peer, logger: logger, replies: replyContinuation)
                // A connection that fails (reset as the module's process ends) ends as one that
                // closes: the prompt is closed either way, and an Enter waiting on it answered.
                do {
                    for try await frame in inbound {
                        var body = Array(buffer: frame)
                        // A captured password came in this frame: wipe the socket's buffer in place
                        // (a write through a copy would wipe only the copy) and our copy of it.
                        defer {
                            frame.withUnsafeReadableBytes { if let b = $0.baseAddress { memset(UnsafeMutableRawPointer(mutating: b), 0, $0.count) } }
                            secureZero(&body)
                        }
                        guard await pam.handle(body, in: &group) else { break }
                    }
                } catch {
                    logger.debug("PAM socket: \(error)")
                }
                if let prompt = pam.prompt { await box.promptClosed(prompt) }
                replyContinuation.finish()
                try await group.waitForAll()
            }
        }
    }

    /// The connection's writer: each reply, and a push's password straight from secure memory.
    private static func write(_ replies: AsyncStream<Outgoing>, to outbound: NIOAsyncChannelOutboundWriter<ByteBuffer>,
                              channel: any Channel) async throws {
        for await item in replies {
            switch item {
            case .reply(let reply):
                try await outbound.write(ByteBuffer(bytes: reply.encode()))
            case .answer(.noPush(let reason)):
                try await outbound.write(ByteBuffer(bytes: PAMReply.noPush(reason).encode()))
            case .answer(.nothingYetNewCode(let code, let seconds)):
                try await outbound.write(ByteBuffer(bytes: PAMReply.nothingYetNewCode(pairingCode: code, codeSeconds: seconds).encode()))
            case .answer(.escrowCapture(let user, let ticket)):
                try await outbound.write(ByteBuffer(bytes: PAMReply.escrowCapture(user: user, ticket: ticket).encode()))
            case .answer(.keyLogin(let user, let ticket)):
                try await outbound.write(ByteBuffer(bytes: PAMReply.keyLogin(user: user, ticket: ticket).encode()))
            case .answer(.push(let user, let password, let ticket)):
                try await writePush(user: user, password: password, ticket: ticket, to: channel)
            }
        }
    }
}

/// One PAM connection: its place in `PAMConnectionState`'s table, its prompt, and what each
/// request does. Anything the table does not allow, or that does not decode, ends it.
struct PAMConnection {
    let box: Box
    let peer: PAMPeer
    let logger: Logger
    let replies: AsyncStream<PAMBridge.Outgoing>.Continuation
    var state = PAMConnectionState.fresh
    /// Set by the answer to Enter once it carries a push (or key login, capture): the stack
    /// verifies it now, and may report. The bridge's own record of what it handed the module,
    /// not a question to the box.
    let delivered = NIOLockedValueBox(false)
    private(set) var prompt: UInt64?
    var wait = Duration.zero

    /// Handles one frame; false when the connection is over.
    mutating func handle(_ body: [UInt8], in group: inout ThrowingTaskGroup<Void, any Error>) async -> Bool {
        let request: PAMRequest
        do { request = try PAMRequest.decode(body) } catch {
            if body.count >= 2, let name = AdminRequest.name(ofType: body[1]) {
                logger.warning("PAM socket: \(name) belongs on the admin socket; closing")
                replies.yield(.reply(.error("\(name) is not taken on the PAM socket")))
            } else {
                replies.yield(.reply(.error("malformed request: \(error)")))
            }
            return false
        }
        if state == .waiting, delivered.withLockedValue({ $0 }) { state = .pushed }
        guard let next = state.next(on: request) else {
            logger.warning("PAM socket: \(request.name) not allowed while \(state); closing")
            replies.yield(.reply(.error("request not allowed now")))
            return false
        }
        state = next
        switch request {
        case .waitForPush(let r):
            let (id, reply) = await box.registerPrompt(r, peer: peer)
            replies.yield(.reply(reply))
            guard let id else { return false }
            prompt = id
            wait = .milliseconds(Int(r.timeoutMilliseconds))
        case .cancel:
            if let prompt { await box.promptClosed(prompt) }
        case .intent:
            // Enter at the prompt. A wait for a phone on its way runs beside the read loop, so
            // a cancel or a hang-up ends it.
            if let prompt {
                let (box, wait, delivered, replies) = (box, wait, delivered, replies)
                group.addTask {
                    let answer = await box.take(prompt, wait: wait)
                    if answer.pushedUser != nil { delivered.withLockedValue { $0 = true } }
                    replies.yield(.answer(answer))
                }
            }
        case .capturedPassword(let password):
            if let prompt { await box.captured(prompt, password: SecureBytes(copying: password)) }
            // Wiped in place: the request still holds this storage, so a mutable copy would be
            // wiped instead of it.
            password.withUnsafeBytes { if let b = $0.baseAddress { memset(UnsafeMutableRawPointer(mutating: b), 0, $0.count) } }
        case .reportOutcome(let verdict, let reason):
            // Acknowledged at once: what the box then checks (a pending phone's password through
            // its own PAM service, which pam_unix delays ~2 s when it fails) must not hold up
            // the login, nor outlast the module's 1 s wait for this answer.
            replies.yield(.reply(.ok))
            if let prompt { await box.report(prompt, verdict, reason: reason) }
        case .openSession(let user, let session, let service, let ticket):
            await box.openSession(user: user, sessionID: session, service: service, ticket: ticket)
            replies.yield(.reply(.ok))
        case .closeSession(let session):
            await box.closeSession(sessionID: session)
            replies.yield(.reply(.ok))
        }
        return state != .done
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
