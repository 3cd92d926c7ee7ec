import FoundationEssentials
import NIOCore
import NIOPosix
import Synchronization

/// What crosses a Unix socket between two processes' airs. JSON: this is a test radio and
/// legibility beats compactness.
enum SimFrame: Codable, Sendable {
    /// Central -> peripheral, first frame: who is connecting and where it is.
    case hello(central: DeviceAddressWire, trajectory: Trajectory)
    /// Central -> peripheral: an event for the peripheral's stream, due at `time`.
    case event(WireEvent, time: Int64, waitsForClock: Bool, tag: UInt64?)
    /// Central -> peripheral: withdraw the events carrying `tag` (a loss that did not happen).
    case cancel(tag: UInt64)
    /// Central -> peripheral: the central moved.
    case moved(Trajectory)
    /// Peripheral -> central: a notification issued at `time`.
    case notify(characteristic: String, value: [UInt8], time: Int64)
    /// Peripheral -> central: the peripheral disconnected at `time`.
    case disconnect(time: Int64)
}

typealias DeviceAddressWire = String

/// A peripheral event without the central's identity (each process numbers its own links).
enum WireEvent: Codable, Sendable {
    case connected(mtu: Int)
    case subscribed(String)
    case unsubscribed(String)
    case wrote(characteristic: String, value: [UInt8], mtu: Int)
    case disconnected(DisconnectReason)

    init(_ e: PeripheralEvent) {
        switch e {
        case .connected(_, let mtu): self = .connected(mtu: mtu)
        case .subscribed(_, let c): self = .subscribed(c)
        case .unsubscribed(_, let c): self = .unsubscribed(c)
        case .wrote(_, let c, let v, let m): self = .wrote(characteristic: c, value: v, mtu: m)
        case .disconnected(_, let r): self = .disconnected(r)
        }
    }

    func event(for id: CentralID) -> PeripheralEvent {
        switch self {
        case .connected(let mtu): .connected(id, mtu: mtu)
        case .subscribed(let c): .subscribed(id, characteristic: c)
        case .unsubscribed(let c): .unsubscribed(id, characteristic: c)
        case .wrote(let c, let v, let m): .wrote(id, characteristic: c, value: v, mtu: m)
        case .disconnected(let r): .disconnected(id, reason: r)
        }
    }
}

import BoxkeyRadio

/// A framed Unix-socket connection (4-byte length prefix) carrying `SimFrame`s. Reads arrive on
/// `frames`, which finishes at end of file; writes never block the caller.
final class FrameConnection: Sendable {
    let channel: any Channel
    let frames: AsyncStream<SimFrame>

    private init(channel: any Channel, frames: AsyncStream<SimFrame>) {
        self.channel = channel
        self.frames = frames
    }

    func send(_ frame: SimFrame) {
        guard let data = try? JSONEncoder().encode(frame), data.count <= SimFrameDecoder.maxLength else { return }
        var buffer = channel.allocator.buffer(capacity: 4 + data.count)
        buffer.writeInteger(UInt32(data.count))
        buffer.writeBytes(data)
        channel.writeAndFlush(buffer, promise: nil)
    }

    func close() {
        channel.close(promise: nil)
    }

    /// Adds the framing and the frame decoder to a new channel, and returns the connection.
    static func configure(_ channel: any Channel) -> EventLoopFuture<FrameConnection> {
        let (stream, continuation) = AsyncStream.makeStream(of: SimFrame.self)
        return channel.eventLoop.makeCompletedFuture {
            try channel.pipeline.syncOperations.addHandler(ByteToMessageHandler(SimFrameDecoder()))
            try channel.pipeline.syncOperations.addHandler(FrameReader(continuation: continuation))
            return FrameConnection(channel: channel, frames: stream)
        }
    }

    static func connect(path: String) async throws -> FrameConnection {
        try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .connect(unixDomainSocketPath: path)
            .flatMap { configure($0) }
            .get()
    }
}

/// A 4-byte big-endian length, then that many bytes of JSON.
struct SimFrameDecoder: ByteToMessageDecoder {
    typealias InboundOut = ByteBuffer
    /// Far above any frame (a notification is at most 512 bytes of value): a peer announcing
    /// more is not a simulated radio, and its connection is closed.
    static let maxLength = 1 << 20

    struct FrameTooLong: Error {}

    mutating func decode(context: ChannelHandlerContext, buffer: inout ByteBuffer) throws -> DecodingState {
        guard let length = buffer.getInteger(at: buffer.readerIndex, as: UInt32.self).map(Int.init) else { return .needMoreData }
        guard length <= Self.maxLength else { throw FrameTooLong() }
        guard buffer.readableBytes >= 4 + length else { return .needMoreData }
        buffer.moveReaderIndex(forwardBy: 4)
        context.fireChannelRead(wrapInboundOut(buffer.readSlice(length: length)!))
        return .continue
    }
}

private final class FrameReader: ChannelInboundHandler, Sendable {
    typealias InboundIn = ByteBuffer
    let continuation: AsyncStream<SimFrame>.Continuation

    init(continuation: AsyncStream<SimFrame>.Continuation) { self.continuation = continuation }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var buffer = unwrapInboundIn(data)
        if let bytes = buffer.readBytes(length: buffer.readableBytes),
           let frame = try? JSONDecoder().decode(SimFrame.self, from: Data(bytes)) {
            continuation.yield(frame)
        } else {
            // A peer speaking something else: drop it, as a radio would drop noise.
            context.close(promise: nil)
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        continuation.finish()
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }
}
