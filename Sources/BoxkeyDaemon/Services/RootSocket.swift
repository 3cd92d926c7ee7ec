import BoxkeyCore
import BoxkeyPAMWire
import CBoxkeySys
import FoundationEssentials
import Glibc
import Logging
import NIOCore
import NIOPosix
import ServiceLifecycle

/// A root-only Unix socket of the daemon's (the PAM socket, the admin socket): listens with
/// mode 0600, checks every connection's peer with SO_PEERCRED, and hands the allowed ones,
/// split into frames (`PAMFrameDecoder`), to `serve`. Ends on graceful shutdown.
struct RootSocket: Sendable {
    /// For logs: "PAM", "admin".
    let name: String
    let path: String
    /// Root always; the PAM socket may also let in what `[pam] allowed_uids` names.
    let allowedUIDs: Set<UInt32>
    let logger: Logger
    let readiness: Readiness?

    init(name: String, path: String, allowedUIDs: [UInt32], logger: Logger, readiness: Readiness?) {
        self.name = name
        self.path = path
        self.allowedUIDs = Set(allowedUIDs + [0])
        self.logger = logger
        self.readiness = readiness
    }

    func run(serve: @escaping @Sendable (PAMPeer, NIOAsyncChannel<ByteBuffer, ByteBuffer>) async -> Void) async throws {
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
        // Root only: the mode keeps others out, SO_PEERCRED checks whoever is let in. Neither
        // call follows a symbolic link put in the socket's place meanwhile (a folder the allowed
        // account can write would let it aim root's chown at any file).
        fchmodat(AT_FDCWD, path, 0o600, AT_SYMLINK_NOFOLLOW)
        if let owner = allowedUIDs.filter({ $0 != 0 }).min(), getuid() == 0 { lchown(path, owner, gid_t(bitPattern: -1)) }
        logger.info("\(name) socket listening on \(path)")
        readiness?.ready("\(name) socket")
        // Graceful shutdown cancels the work below; that is a normal end, not an error.
        do { try await cancelWhenGracefulShutdown {
            try await server.executeThenClose { inbound in
                try await withThrowingDiscardingTaskGroup { group in
                    for try await connection in inbound {
                        group.addTask {
                            guard let peer = await peer(connection.channel), allowedUIDs.contains(peer.uid) else {
                                logger.warning("\(name) socket: refused a connection from a process that is not root")
                                try? await connection.executeThenClose { _, _ in }
                                return
                            }
                            await serve(peer, connection)
                        }
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
}
