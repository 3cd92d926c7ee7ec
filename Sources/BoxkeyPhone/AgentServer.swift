import BoxkeyCore
import BoxkeyDBus
import CBoxkeySys
import Foundation
import NIOCore
import NIOPosix

/// Puts an `Agent` on `$XDG_RUNTIME_DIR/boxkey/agent.sock`: the directory is 0700 and the
/// socket 0600, and every connection's peer must be this user (SO_PEERCRED). One request per
/// connection. Besides the socket it runs the agent's clock (the credentials' lifetime), its
/// presence links, and a watch on logind's `PrepareForSleep` that drops the credentials before
/// the machine suspends.
public struct AgentServer: Sendable {
    let agent: Agent
    let path: String
    let log: @Sendable (String) -> Void

    public init(agent: Agent, dirs: PhoneDirectories, log: @escaping @Sendable (String) -> Void) throws(PhoneFailure) {
        do { try dirs.ensureRuntime() } catch { throw PhoneFailure(.failure, "\(error)") }
        self.agent = agent
        path = dirs.agentSocket
        self.log = log
    }

    /// Serves until `stop` is asked for or the task is cancelled. `ready` runs once the socket
    /// takes connections.
    public func run(ready: @Sendable () -> Void = {}) async throws {
        let server = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(ByteToMessageHandler(AgentFrameDecoder()))
                }
            }
            .bind(unixDomainSocketPath: path, cleanupExistingSocketFile: true) { channel in
                channel.eventLoop.makeCompletedFuture { try NIOAsyncChannel<ByteBuffer, ByteBuffer>(wrappingChannelSynchronously: channel) }
            }
        chmod(path, 0o600)
        // The suspend watch is in place before the agent says it is ready: a suspend right
        // after `boxkey agent start` returns must not be missed.
        let sleepSignals = await subscribeToSleep()
        log("agent listening on \(path)")
        ready()
        defer { unlink(path) }
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                try await server.executeThenClose { inbound in
                    try await withThrowingDiscardingTaskGroup { connections in
                        for try await connection in inbound {
                            connections.addTask { await serve(connection) }
                        }
                    }
                }
            }
            group.addTask {
                while !Task.isCancelled, !(await agent.isStopRequested) {
                    try await Task.sleep(for: .seconds(1))
                    await agent.tick()
                }
            }
            group.addTask {
                await withDiscardingTaskGroup { links in
                    for await job in agent.linkJobs {
                        switch job {
                        case .presence(let link): links.addTask { await agent.presenceEnded(link, await link.run()) }
                        case .detachAndClose(let link): links.addTask { try? await link.send(.detach); await link.close() }
                        }
                    }
                }
            }
            group.addTask { await watchSleep(sleepSignals) }
            // The clock task ends on `stop`; everything else goes with it.
            _ = try await group.next()
            group.cancelAll()
        }
    }

    private func serve(_ connection: NIOAsyncChannel<ByteBuffer, ByteBuffer>) async {
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
            guard var frame = try await iterator.next() else { return }
            let decoded = frame.withUnsafeReadableBytes { bytes in Result { () throws(AgentWire.DecodeError) in try AgentRequest.decode(bytes) } }
            // The frame may hold a PIN: zero NIO's copy now that it is in secure memory.
            frame.withUnsafeMutableReadableBytes { $0.initializeMemory(as: UInt8.self, repeating: 0) }
            let (replies, continuation) = AsyncStream.makeStream(of: AgentReply.self)
            try await withThrowingTaskGroup(of: Void.self) { group in
                switch decoded {
                case .failure(let error):
                    continuation.yield(.result(.failure, message: "malformed request: \(error)", details: ""))
                    continuation.finish()
                case .success(let request):
                    group.addTask {
                        await agent.handle(request) { reply in
                            continuation.yield(reply)
                            if case .progress = reply { return }
                            continuation.finish()
                        }
                    }
                }
                for await reply in replies {
                    try await outbound.write(ByteBuffer(bytes: reply.frame()))
                }
                try await group.waitForAll()
            }
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

    /// Drops the credentials when logind announces a suspend.
    private func watchSleep(_ subscription: (DBusConnection, AsyncStream<DBusMessage>)?) async {
        if let (bus, signals) = subscription {
            defer { bus.close() }
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

/// Two-byte length, then the body (`AgentWire`).
struct AgentFrameDecoder: ByteToMessageDecoder {
    typealias InboundOut = ByteBuffer

    mutating func decode(context: ChannelHandlerContext, buffer: inout ByteBuffer) throws -> DecodingState {
        guard let length = buffer.getInteger(at: buffer.readerIndex, as: UInt16.self) else { return .needMoreData }
        guard length > 0, Int(length) <= AgentWire.maxFrameLength else { throw AgentWire.DecodeError.truncated }
        guard buffer.readableBytes >= 2 + Int(length) else { return .needMoreData }
        buffer.moveReaderIndex(forwardBy: 2)
        context.fireChannelRead(wrapInboundOut(buffer.readSlice(length: Int(length))!))
        return .continue
    }
}
