import BoxkeyPAMWire
import Logging
import NIOCore
import ServiceLifecycle

/// The admin socket (root only, whatever `[pam] allowed_uids` lets onto the PAM socket):
/// `boxkeyd status`, `phones`, `pair-code` and `reload` ask the running daemon here, one
/// request and its answer at a time. It takes `AdminRequest`s only.
public struct AdminSocket: Service, CustomStringConvertible {
    public var description: String { "AdminSocket(\(socket.path))" }
    let box: Box
    let socket: RootSocket
    let logger: Logger
    /// `reload`: re-reads the configuration and answers with the outcome (nil: the daemon
    /// has no file to re-read).
    let reload: (@Sendable () async -> AdminReply)?

    public init(box: Box, path: String, logger: Logger, readiness: Readiness? = nil, reload: (@Sendable () async -> AdminReply)? = nil) {
        self.box = box
        self.socket = RootSocket(name: "admin", path: path, allowedUIDs: [], logger: logger, readiness: readiness)
        self.logger = logger
        self.reload = reload
    }

    public func run() async throws {
        try await socket.run { _, connection in await serve(connection) }
    }

    private func serve(_ connection: NIOAsyncChannel<ByteBuffer, ByteBuffer>) async {
        try? await connection.executeThenClose { inbound, outbound in
            for try await frame in inbound {
                let body = Array(buffer: frame)
                let request: AdminRequest
                do { request = try AdminRequest.decode(body) } catch {
                    if body.count >= 2, let name = PAMRequest.name(ofType: body[1]) {
                        logger.warning("admin socket: \(name) belongs on the PAM socket; closing")
                        try await outbound.write(ByteBuffer(bytes: AdminReply.error("\(name) is not taken on the admin socket").encode()))
                    } else {
                        try await outbound.write(ByteBuffer(bytes: AdminReply.error("malformed request: \(error)").encode()))
                    }
                    return
                }
                var reply = await answer(request)
                // The client reads at most this much: say why rather than send what it refuses.
                if case .text(let text) = reply, text.utf8.count > AdminReply.maxTextBytes {
                    reply = .error("the answer is over \(AdminReply.maxTextBytes >> 20) MiB, more than the admin socket carries")
                }
                try await outbound.write(ByteBuffer(bytes: reply.encode()))
            }
        }
    }

    func answer(_ request: AdminRequest) async -> AdminReply {
        switch request {
        case .listPhones: .text(await box.phoneList())
        case .revokePhone(let fingerprint): await box.revoke(fingerprint: fingerprint)
        case .daemonStatus: .text(AdminJSON.encode(await box.status()))
        case .newPairingCode(let user): await box.newPairingCode(user: user)
        case .enrolPhone(let key, let user, let name): await box.enrolPhone(key: key, user: user, name: name)
        case .reload: await reload?() ?? .error("this daemon does not re-read a configuration file")
        }
    }
}
