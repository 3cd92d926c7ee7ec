import BoxkeyCore
import BoxkeyDBus
import CBoxkeySys
import FoundationEssentials
import NIOCore
import NIOPosix
import Synchronization

/// Puts an `Agent` on `$XDG_RUNTIME_DIR/boxkey/agent.sock`: the directory is 0700 and the
/// socket 0600, and every connection's peer must be this user (SO_PEERCRED). One request per
/// connection. Besides the socket it runs the agent's clock (the credentials' lifetime), its
/// presence links, and a watch on logind's `PrepareForSleep` that drops the credentials before
/// the machine suspends (holding a logind "delay" inhibitor while it holds credentials, so
/// the suspend waits for that).
public struct AgentServer: Sendable {
    let agent: Agent
    let path: String
    let log: @Sendable (String) -> Void
    private let stops = AsyncStream<Void>.makeStream(bufferingPolicy: .bufferingNewest(1))

    /// Stops the agent (as `boxkey agent stop` does): a presence link it holds ends as walking
    /// away, the credentials go, and `run` returns.
    public func stop() async {
        await agent.handle(.stop) { _ in }
        stops.continuation.yield()
    }

    public init(agent: Agent, dirs: PhoneDirectories, log: @escaping @Sendable (String) -> Void) throws(PhoneFailure) {
        do { try dirs.ensureRuntime() } catch { throw PhoneFailure(.failure, "\(error)") }
        self.agent = agent
        path = dirs.agentSocket
        self.log = log
    }

    /// Serves until `stop` is asked for or the task is cancelled. `ready` runs once the socket
    /// takes connections.
    public func run(ready: @Sendable () -> Void = {}) async throws {
        // Replacing a socket file is safe: the caller holds `AgentInstance`, so none of this
        // user's agents serves on it (it is a crashed one's).
        let socket = try await UserSocket.bind(path, log: log)
        // The suspend watch is in place before the agent says it is ready: a suspend right
        // after `boxkey agent start` returns must not be missed.
        let sleepSignals = await subscribeToSleep()
        log("agent listening on \(path)")
        ready()
        defer { socket.unlinkIfOurs() }
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                try await socket.serve({ request, withdrawal, reply in await agent.handle(request, withdrawal: withdrawal, reply: reply) }, answered: { request in
                    // The answer to `stop` is out: now the agent may end.
                    if case .stop = request { stops.continuation.yield() }
                })
            }
            group.addTask {
                while !Task.isCancelled {
                    try await Task.sleep(for: .seconds(1))
                    await agent.tick()
                    // Off the actor's request path: a scan must not hold up `lock` or `status`.
                    Task { await agent.proximityTick() }
                    // Removed or replaced (logind removes the runtime directory when the
                    // user's last session ends): nothing can reach this agent any more, so it
                    // must not go on holding credentials.
                    if !socket.isStillOurs {
                        log("the agent's socket \(path) was removed or replaced; stopping")
                        await stop()
                    }
                }
            }
            // A stop ends the run once its answer is out (`serve`), or at once from a signal.
            group.addTask { for await _ in stops.stream { return } }
            group.addTask {
                await withDiscardingTaskGroup { links in
                    for await job in agent.linkJobs {
                        switch job {
                        case .presence(let link): links.addTask { await agent.presenceEnded(link, await link.run()) }
                        case .detachAndClose(let link): links.addTask { try? await link.send(.detach); await link.close() }
                        }
                    }
                }
                // The jobs end at `stop`, before its answer is out: the run ends on `stops`.
                while !Task.isCancelled { try? await Task.sleep(for: .seconds(3600)) }
            }
            group.addTask { await watchSleep(sleepSignals) }
            // The stop task ends on `stop`; everything else goes with it.
            _ = try await group.next()
            group.cancelAll()
        }
    }

    /// Subscribes to logind's `PrepareForSleep`. Without a system bus (or logind) there is no
    /// suspend to watch; the lifetime still applies.
    private func subscribeToSleep() async -> (DBusConnection, AsyncStream<DBusMessage>)? {
        do {
            let bus = try DBusConnection(.system)
            do {
                let signals = try await bus.signals(SignalMatch(sender: "org.freedesktop.login1", path: "/org/freedesktop/login1",
                                                                interface: "org.freedesktop.login1.Manager", member: "PrepareForSleep"))
                return (bus, signals)
            } catch {
                bus.close()
                throw error
            }
        } catch {
            log("not watching for suspend (no logind on the system bus: \(error))")
            return nil
        }
    }

    /// Drops the credentials when logind announces a suspend. While credentials are held, a
    /// logind "delay" inhibitor makes the suspend wait (up to logind's InhibitDelayMaxSec) until
    /// they are gone; without it the machine could sleep, or hibernate to disk, first.
    private func watchSleep(_ subscription: (DBusConnection, AsyncStream<DBusMessage>)?) async {
        if let (bus, signals) = subscription {
            defer { bus.close() }
            let inhibitor = SleepInhibitor(bus: bus, log: log)
            await agent.onHoldingChanged { holding in
                if holding { await inhibitor.take() } else { inhibitor.release() }
            }
            defer { inhibitor.release() }
            // The drop releases the inhibitor (`onHoldingChanged`), or a login in progress does
            // when it ends; logind's InhibitDelayMaxSec bounds the wait either way.
            for await signal in signals where signal.arguments.first?.bool == true {
                await agent.forget("the machine is going to sleep")
            }
            // The bus went away: a suspend would go unnoticed from now on, so fail safe.
            if !Task.isCancelled {
                log("lost the system bus: suspends can no longer be seen")
                await agent.forget("no longer watching for suspend")
            }
        }
        // Ends with the agent, not before (the task group stops when a task ends).
        while !Task.isCancelled { try? await Task.sleep(for: .seconds(3600)) }
    }
}

typealias DecodedRequest = Result<AgentRequest, AgentWire.DecodeError>

/// A socket of this user's in the phone's runtime directory (the agent's, and the presence
/// link's of a `boxkey login` in the foreground): 0600, and every connection's peer must be
/// this user (SO_PEERCRED). One `AgentWire` request per connection, then its replies until a
/// `result`.
struct UserSocket: Sendable {
    let path: String
    let log: @Sendable (String) -> Void
    private let server: NIOAsyncChannel<NIOAsyncChannel<DecodedRequest, ByteBuffer>, Never>
    private let bound: SocketFile?
    /// Connections being served now.
    private let inFlight = InFlight()

    final class InFlight: Sendable {
        let count = Mutex(0)
    }

    /// Waits until no connection is being served (their answers are out), `limit` at most.
    func waitUntilIdle(limit: Duration) async {
        let deadline = ContinuousClock.now + limit
        while inFlight.count.withLock({ $0 }) > 0, ContinuousClock.now < deadline {
            try? await Task.sleep(for: .milliseconds(10))
        }
    }

    /// Binds `path`, replacing a socket file left there.
    static func bind(_ path: String, log: @escaping @Sendable (String) -> Void) async throws -> UserSocket {
        let server = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            // A client that stops sending (Ctrl-C in `boxkey login`: `AgentClient.stopAsking`)
            // still reads its answer.
            .childChannelOption(.allowRemoteHalfClosure, value: true)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(AgentFrameReader())
                }
            }
            .bind(unixDomainSocketPath: path, cleanupExistingSocketFile: true) { channel in
                channel.eventLoop.makeCompletedFuture { try NIOAsyncChannel<DecodedRequest, ByteBuffer>(wrappingChannelSynchronously: channel) }
            }
        chmod(path, 0o600)
        return UserSocket(path: path, log: log, server: server, bound: SocketFile(path))
    }

    /// Whether `path` still names the socket bound here (logind removes the runtime directory
    /// when the user's last session ends; another process may bind the path anew).
    var isStillOurs: Bool { bound == nil || SocketFile(path) == bound }

    /// Removes the socket file, only if it is still ours: after the directory was replaced,
    /// the path may be another's.
    func unlinkIfOurs() {
        if bound != nil, SocketFile(path) == bound { unlink(path) }
    }

    /// A request, its `Withdrawal` (asked when the client goes away before the answer: Ctrl-C
    /// in `boxkey login` takes a push back) and the function that sends its replies.
    typealias Handler = @Sendable (AgentRequest, Withdrawal, @escaping @Sendable (AgentReply) -> Void) async -> Void

    /// Serves until cancelled: `handle` gets each request and a function that sends its replies
    /// (the connection ends after a `result` or `needPIN`); `answered` runs once they are out.
    func serve(_ handle: @escaping Handler, answered: @escaping @Sendable (AgentRequest) -> Void = { _ in }) async throws {
        try await server.executeThenClose { inbound in
            try await withThrowingDiscardingTaskGroup { connections in
                for try await connection in inbound {
                    connections.addTask { await serve(connection, handle, answered) }
                }
            }
        }
    }

    private func serve(_ connection: NIOAsyncChannel<DecodedRequest, ByteBuffer>, _ handle: @escaping Handler,
                       _ answered: @escaping @Sendable (AgentRequest) -> Void) async {
        inFlight.count.withLock { $0 += 1 }
        defer { inFlight.count.withLock { $0 -= 1 } }
        guard let provider = connection.channel as? SocketOptionProvider,
              let peer: boxkey_ucred = try? await provider.unsafeGetSocketOption(
                level: SocketOptionLevel(boxkey_sol_socket()), name: SocketOptionName(boxkey_so_peercred())).get(),
              peer.uid == getuid() else {
            log("refused a connection from another user")
            try? await connection.executeThenClose { _, _ in }
            return
        }
        try? await connection.executeThenClose { inbound, outbound in
            var iterator = inbound.makeAsyncIterator()
            guard let decoded = try await iterator.next() else { return }
            let (replies, continuation) = AsyncStream.makeStream(of: AgentReply.self)
            let withdrawal = Withdrawal()
            // One request per connection: the client's end closing before the answer means it
            // went away (Ctrl-C), and what it asked for is taken back where it can be.
            let gone = Task { [iterator] in
                var rest = iterator
                while (try? await rest.next()) != nil {}
                if !Task.isCancelled { withdrawal.ask() }
            }
            defer { gone.cancel() }
            try await withThrowingTaskGroup(of: Void.self) { group in
                switch decoded {
                case .failure(let error):
                    continuation.yield(.result(.failure, message: "malformed request: \(error)", details: ""))
                    continuation.finish()
                case .success(let request):
                    group.addTask {
                        await handle(request, withdrawal) { reply in
                            continuation.yield(reply)
                            switch reply {
                            case .progress, .say: return
                            case .needPIN, .result: continuation.finish()
                            }
                        }
                    }
                }
                for await reply in replies {
                    try? await outbound.write(ByteBuffer(bytes: reply.frame()))
                }
                try await group.waitForAll()
            }
            if case .success(let request) = decoded { answered(request) }
        }
    }
}

/// Which file a path names now (device and inode), or nil when there is none.
struct SocketFile: Equatable {
    let device: UInt64
    let inode: UInt64

    init?(_ path: String) {
        var s = stat()
        guard lstat(path, &s) == 0 else { return nil }
        device = UInt64(s.st_dev)
        inode = UInt64(s.st_ino)
    }
}

/// Two-byte length, then the body (`AgentWire`). A body may hold a PIN, so every byte read
/// is copied into one buffer of fixed capacity (never reallocated, so never left behind in
/// an old one) and zeroed where NIO received it; the buffer is zeroed as frames are decoded
/// and when the connection ends. NIO's ByteToMessageHandler would keep fragments in buffers
/// of its own that are freed unzeroed.
final class AgentFrameReader: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = DecodedRequest

    private var pending: [UInt8] = []

    init() { pending.reserveCapacity(2 + AgentWire.maxFrameLength) }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        var tooMuch = false
        buffer.withUnsafeReadableBytes { bytes in
            if pending.count + bytes.count <= pending.capacity {
                pending.append(contentsOf: bytes)
            } else {
                tooMuch = true
            }
            // The read buffer is done with: no one else reads these bytes.
            UnsafeMutableRawBufferPointer(mutating: bytes).initializeMemory(as: UInt8.self, repeating: 0)
        }
        guard !tooMuch else { return fail(context) }
        while pending.count >= 2 {
            let length = Int(pending[0]) << 8 | Int(pending[1])
            guard length > 0, length <= AgentWire.maxFrameLength else { return fail(context) }
            guard pending.count >= 2 + length else { return }
            let decoded = pending.withUnsafeBytes { all in
                Result { () throws(AgentWire.DecodeError) in try AgentRequest.decode(UnsafeRawBufferPointer(rebasing: all[2..<(2 + length)])) }
            }
            consume(2 + length)
            context.fireChannelRead(wrapInboundOut(decoded))
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        wipe()
        context.fireChannelInactive()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        wipe()
    }

    private func fail(_ context: ChannelHandlerContext) {
        wipe()
        pending.removeAll(keepingCapacity: true)
        context.fireErrorCaught(AgentWire.DecodeError.truncated)
        context.close(promise: nil)
    }

    private func wipe() {
        pending.withUnsafeMutableBytes { p in
            guard let base = p.baseAddress else { return }
            memset(base, 0, p.count)
        }
    }

    /// Drops the first `n` bytes: the rest moves to the front and what it leaves is zeroed
    /// (Array's own removeFirst would leave a copy of it behind the new end).
    private func consume(_ n: Int) {
        pending.withUnsafeMutableBytes { p in
            guard let base = p.baseAddress else { return }
            let rest = p.count - n
            memset(base, 0, n)
            if rest > 0 { memmove(base, base + n, rest) }
            memset(base + rest, 0, n)
        }
        pending.removeLast(n)
    }
}

/// A logind "delay" inhibitor for sleep (org.freedesktop.login1.Manager.Inhibit): an open file
/// descriptor that makes a suspend wait until it is closed.
final class SleepInhibitor: Sendable {
    private let bus: DBusConnection
    private let log: @Sendable (String) -> Void
    /// The inhibitor's descriptor (-1: none), and whether one is wanted: a `release` that
    /// comes while `take` waits for logind wins.
    private let state = Mutex<(fd: Int32, wanted: Bool)>((-1, false))

    init(bus: DBusConnection, log: @escaping @Sendable (String) -> Void) {
        self.bus = bus
        self.log = log
    }

    func take() async {
        let needed = state.withLock { s -> Bool in
            s.wanted = true
            return s.fd < 0
        }
        guard needed else { return }
        do {
            let reply = try await bus.call("org.freedesktop.login1", "/org/freedesktop/login1", "org.freedesktop.login1.Manager", "Inhibit",
                                           [.string("sleep"), .string("boxkey agent"), .string("drops the held credentials before the machine sleeps"), .string("delay")],
                                           timeout: .seconds(5))
            guard case .unixFD(let taken)? = reply.first, taken >= 0 else { throw PhoneError("no file descriptor in the reply") }
            let kept = state.withLock { s -> Bool in
                guard s.wanted, s.fd < 0 else { return false }
                s.fd = taken
                return true
            }
            if !kept { close(taken) }
        } catch {
            log("cannot delay suspends until the credentials are dropped (logind Inhibit: \(error))")
        }
    }

    func release() {
        let old = state.withLock { s -> Int32 in
            defer { s = (-1, false) }
            return s.fd
        }
        if old >= 0 { close(old) }
    }
}
