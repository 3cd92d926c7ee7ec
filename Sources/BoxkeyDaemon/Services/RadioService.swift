import BoxkeyCore
import BoxkeyRadio
import Logging
import ServiceLifecycle

/// Publishes the service and the advertisement, feeds radio events to the box, performs the
/// box's radio actions in order, rotates the advertisement nonce and runs the timers.
/// (Connected-link RSSI is `PresenceService`'s.)
public struct RadioService: Service, CustomStringConvertible {
    public var description: String { "RadioService" }
    let box: Box
    let peripheral: any PeripheralRadio
    let config: DaemonConfig
    let clock: any RadioClock
    let logger: Logger
    let readiness: Readiness?

    public init(box: Box, peripheral: any PeripheralRadio, config: DaemonConfig, clock: any RadioClock, logger: Logger, readiness: Readiness? = nil) {
        self.readiness = readiness
        self.box = box
        self.peripheral = peripheral
        self.config = config
        self.clock = clock
        self.logger = logger
    }

    public func run() async throws {
        try await peripheral.publish(await box.gattService)
        try await peripheral.advertise(await box.advertisingData)
        let radio = await box.radioDescription
        readiness?.status("advertising box \(box.identity.boxID) on \(radio); PAM and admin socket listening")
        logger.info("advertising box \(box.identity.boxID) (key \(box.identity.fingerprint)) on \(radio)")
        readiness?.settled()
        // Graceful shutdown cancels the work below; that is a normal end, not an error.
        do { try await cancelWhenGracefulShutdown {
            try await withThrowingDiscardingTaskGroup { group in
                group.addTask { for await event in peripheral.events { await box.handle(event) } }
                group.addTask { await performActions() }
                group.addTask { try await rotateNonces() }
                group.addTask { await runTimers() }
                group.addTask { await runWork() }
            }
        } } catch is CancellationError {}
        await peripheral.stopAdvertising()
    }

    /// Hang-ups run beside the queue: bluetoothd answers Disconnect only once the link is down
    /// (seconds), and every other phone's answers would wait behind it. What went to this
    /// phone before is already out.
    private func performActions() async {
        await withDiscardingTaskGroup { hangUps in
            let peripheral = peripheral
            func disconnect(_ id: CentralID) { hangUps.addTask { await peripheral.disconnect(id) } }
            for await action in box.outbox {
                switch action {
                case .notify(let id, let fragments):
                    do {
                        for fragment in fragments {
                            try await peripheral.notify(id, characteristic: BoxkeyProtocol.responseCharacteristicUUID, value: fragment)
                        }
                    } catch {
                        logger.info("cannot notify \(id.address): \(error)")
                        disconnect(id)
                    }
                case .disconnect(let id):
                    disconnect(id)
                case .advertise(let data):
                    do { try await peripheral.advertise(data) } catch { logger.error("advertising failed: \(error)") }
                case .setInfo(let value):
                    await peripheral.setValue(value, of: BoxkeyProtocol.infoCharacteristicUUID)
                }
            }
        }
    }

    /// The box's queued work (`BoxWork`), each job beside the others: a lock waiting on logind
    /// holds up no other phone's.
    private func runWork() async {
        await withDiscardingTaskGroup { group in
            let worker = BoxWorker(box: box)
            for await job in box.work { group.addTask { await worker.run(job) } }
        }
    }

    private func rotateNonces() async throws {
        while true {
            try await clock.sleep(for: config.nonceRotation)
            await box.rotateNonce()
        }
    }

    /// Sleeps until the box's next deadline (or until woken for a new one): an idle box has
    /// no timer of its own but the nonce rotation.
    private func runTimers() async {
        while !Task.isCancelled {
            // A ring after this point (a new deadline) ends the wait below at once.
            let seen = box.doorbell.version
            await box.tick()
            let deadline = await box.nextDeadline().map { max($0, clock.now + .milliseconds(5)) }
            await box.doorbell.wait(since: seen, until: deadline, clock: clock)
        }
    }
}
