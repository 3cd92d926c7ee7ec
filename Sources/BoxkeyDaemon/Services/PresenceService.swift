import BoxkeyRadio
import ServiceLifecycle

/// Reads the connected-link RSSI of every presence link on its schedule and hands each reading
/// to the box — a failed read as nil, which the box's `PresenceMonitor` counts as no sample.
/// Sleeps until the next read is due, or until the box has a new presence link.
public struct PresenceService: Service, CustomStringConvertible {
    public var description: String { "PresenceService" }
    let box: Box
    let peripheral: any PeripheralRadio
    let clock: any RadioClock

    public init(box: Box, peripheral: any PeripheralRadio, clock: any RadioClock) {
        self.box = box
        self.peripheral = peripheral
        self.clock = clock
    }

    public func run() async throws {
        // Graceful shutdown cancels the loop; nothing in it throws.
        await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                // A new presence link after this point ends the wait below at once.
                let seen = box.presenceChanged.version
                for id in await box.presenceReadsDue() {
                    let rssi = try? await peripheral.rssi(of: id)
                    await box.rssiSample(id, rssi, now: clock.now)
                }
                let next = await box.nextPresenceRead().map { max($0, clock.now + .milliseconds(5)) }
                await box.presenceChanged.wait(since: seen, until: next, clock: clock)
            }
        }
    }
}
