import BoxkeyCore
import BoxkeyPAMWire
import CSystemd
import Foundation
import Logging
import ServiceLifecycle

/// systemd's watchdog (`WatchdogSec=` in the unit): a ping each third of the period, each one
/// after a real round trip through the admin socket, as an admin command makes it (the socket's
/// event loop, then the `Box` actor). A hung actor or a stuck event loop stops the pings, and
/// systemd restarts the daemon (`Restart=on-failure`); what it guarded is in guard.json. Off
/// where systemd asked for no watchdog.
struct WatchdogService: Service {
    let adminSocket: String
    let logger: Logger

    func run() async throws {
        var usec: UInt64 = 0
        guard sd_watchdog_enabled(0, &usec) > 0, usec > 0 else {
            try? await gracefulShutdown()
            return
        }
        let period = Duration.microseconds(Int64(usec) / 3)
        // Until the socket first answers the daemon is starting (systemd arms the watchdog at
        // READY=1): nothing to say about it then.
        var started = false, failing = false
        while !Task.isCancelled, !Task.isShuttingDownGracefully {
            let answered = await roundTrip(within: period)
            if answered {
                SystemdNotify.send("WATCHDOG=1")
                if failing { logger.notice("the admin socket answers again: the watchdog is fed") }
                started = true
            } else if started, !failing {
                logger.warning("the admin socket did not answer within \(spokenDuration(period)): not feeding systemd's watchdog")
            }
            failing = started && !answered
            _ = try? await cancelOnGracefulShutdown { try await Task.sleep(for: period) }
        }
    }

    /// Asks the daemon's own admin socket for its status, on a thread of its own (the client
    /// blocks): true if it answered in time.
    private func roundTrip(within limit: Duration) async -> Bool {
        let path = adminSocket
        let ms = max(Int64(limit.components.seconds * 1000 + limit.components.attoseconds / 1_000_000_000_000_000), 100)
        return await withCheckedContinuation { (c: CheckedContinuation<Bool, Never>) in
            Thread.detachNewThread {
                var ok = false
                if let client = try? DaemonSocketClient(path: path) {
                    if (try? client.send(.daemonStatus)) != nil, case .text? = try? client.receiveAdmin(timeoutMilliseconds: ms) { ok = true }
                    client.close()
                }
                c.resume(returning: ok)
            }
        }
    }
}
