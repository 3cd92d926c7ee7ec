import BoxkeyRadio

/// The peripheral role on the simulated air.
public final class SimulatedPeripheral: PeripheralRadio {
    public let address: DeviceAddress
    public let events: AsyncStream<PeripheralEvent>
    let air: SimulatedAir

    init(air: SimulatedAir, address: DeviceAddress, mailbox: TimedMailbox<PeripheralEvent>) {
        self.air = air
        self.address = address
        self.events = AsyncStream(unfolding: { await mailbox.next() })
    }

    public func publish(_ service: GATTService) async throws {
        air.state.withLockedValue { $0.peripherals[address]?.service = service }
        air.peripheralChanged(address)
    }

    public func setValue(_ value: [UInt8], of characteristic: String) async {
        air.state.withLockedValue { $0.peripherals[address]?.service?.setValue(value, of: characteristic) }
        air.peripheralChanged(address)
    }

    public func advertise(_ data: AdvertisingData) async throws {
        let now = air.issueTime(address)
        air.state.withLockedValue { s in
            let since = s.peripherals[address]?.advertising?.since ?? now
            s.peripherals[address]?.advertising = (data, since)
        }
        air.peripheralChanged(address)
        air.signalChange()
    }

    public func stopAdvertising() async {
        air.state.withLockedValue { $0.peripherals[address]?.advertising = nil }
        air.peripheralChanged(address)
        air.signalChange()
    }

    /// Notifies `central`, and, as BlueZ does, every other central subscribed to the
    /// characteristic. A value longer than a link carries in a notification (BlueZ's Multiple
    /// Handle Value Notification: MTU - 5, at most 512) is refused for the target and cut
    /// short for the others, as BlueZ cuts it.
    public func notify(_ central: CentralID, characteristic: String, value: [UInt8]) async throws {
        let t = air.issueTime(address)
        let uuid = characteristic.lowercased()
        guard let c = air.state.withLockedValue({ $0.peripherals[address]?.service })?.characteristic(uuid) else {
            throw RadioError.characteristicNotFound(uuid)
        }
        guard c.properties.contains(.notify) else { throw RadioError.notPermitted("notify on \(uuid)") }
        let remote = air.remoteCentral(central)
        let link = remote == nil ? air.link(for: central) : nil
        if remote == nil, link?.peripheral != address { throw RadioError.notConnected }
        if let reason = remote?.downReason ?? link?.downReason(at: t) { throw RadioError.disconnected(reason) }
        guard remote?.isSubscribed(uuid) ?? link!.isSubscribed(uuid) else {
            throw RadioError.notPermitted("central \(central) has not subscribed to \(uuid)")
        }
        let limit = ATTLimits.notificationValue(mtu: remote?.mtu ?? link!.mtu)
        guard value.count <= limit else { throw RadioError.invalidLength(length: value.count, limit: limit) }

        for other in air.remoteCentrals() where other.peripheral == address && other.id != central && other.downReason == nil && other.isSubscribed(uuid) {
            other.notify(characteristic: uuid, value: Array(value.prefix(ATTLimits.notificationValue(mtu: other.mtu))), issuedAt: t)
        }
        for other in air.links(of: address) where other.peripheral == address && other.centralID != central
            && other.downReason(at: t) == nil && other.isSubscribed(uuid) {
            let cut = Array(value.prefix(ATTLimits.notificationValue(mtu: other.mtu)))
            _ = other.sendToCentral(packets: air.parameters.packets(forValueLength: cut.count), valueBytes: cut.count,
                                    issuedAt: t, event: .notification(characteristic: uuid, value: cut), air: air)
        }
        if let remote {
            remote.notify(characteristic: uuid, value: value, issuedAt: t)
            return
        }
        let placement = link!.sendToCentral(packets: air.parameters.packets(forValueLength: value.count), valueBytes: value.count,
                                            issuedAt: t, event: .notification(characteristic: uuid, value: value), air: air)
        try await air.finish(address, at: placement.acceptedAt)
    }

    public func rssi(of central: CentralID) async throws -> Int {
        let t = air.issueTime(address)
        if let remote = air.remoteCentral(central) {
            if let reason = remote.downReason { throw RadioError.disconnected(reason) }
            return remote.rssi(at: t, peripheralPosition: air.position(of: address) ?? 0, air: air)
        }
        guard let link = air.link(for: central), link.peripheral == address else { throw RadioError.notConnected }
        if let reason = link.downReason(at: t) { throw RadioError.disconnected(reason) }
        guard let rssi = air.rssi(address, central.address, at: t) else { throw RadioError.notConnected }
        return rssi
    }

    public func disconnect(_ central: CentralID) async {
        let t = air.issueTime(address)
        if let remote = air.remoteCentral(central) { remote.disconnect(at: t); return }
        air.link(for: central)?.close(by: .toCentral, at: t, air: air)
    }
}
