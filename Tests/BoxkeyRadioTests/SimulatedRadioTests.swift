import BoxkeyRadio
@testable import BoxkeySimRadio
import Testing

/// Model checks on the in-process air with a manual clock: every figure is a count of
/// connection events or a modelled timestamp, never wall time.
@Suite struct SimulatedRadioTests {
    func world(_ parameters: SimulationParameters = SimulationParameters()) async throws -> (ManualClock, SimulatedAir, SimulatedPeripheral, SimulatedCentral) {
        let clock = ManualClock(now: .seconds(10))
        let air = SimulatedAir(parameters: parameters, clock: clock, pacing: .instant)
        let p = air.peripheral(boxAddress, at: 0)
        let c = air.central(phoneAddress, at: 1)
        try await p.publish(TestService.definition)
        try await p.advertise(TestService.advertising)
        return (clock, air, p, c)
    }

    @Test func scanFindsTheBoxWithinOneAdvertisingInterval() async throws {
        let (clock, _, _, central) = try await world()
        let start = clock.now
        var results = central.scan(ScanFilter(serviceUUIDs: [TestService.service])).makeAsyncIterator()
        let first = try await results.next()
        let found = try #require(first)
        #expect(found.address == boxAddress)
        #expect(found.advertisement.manufacturerData[0xFFFF] == [0x10, 0x12, 0xD5, 0, 1, 0x42])
        // Modelled discovery time: the next advertising event, at most interval + advDelay.
        let delay = found.timestamp - start
        #expect(delay > .zero && delay <= .milliseconds(110), "found after \(delay)")
        #expect(found.rssi < -50 && found.rssi > -70)
    }

    @Test func scanFiltersByServiceAndRSSIAndCoalescesDuplicates() async throws {
        let (_, air, peripheral, central) = try await world()
        var other = central.scan(ScanFilter(serviceUUIDs: ["0000bbbb-0000-1000-8000-00805f9b34fb"])).makeAsyncIterator()
        let none = Task { try await other.next() }
        // Far away: below an RSSI floor of -70 dBm (about -96 dBm at 25 m).
        air.move(phoneAddress, to: 25)
        var strong = central.scan(ScanFilter(serviceUUIDs: [TestService.service], minimumRSSI: -70)).makeAsyncIterator()
        let weakTask = Task { try await strong.next() }
        air.move(phoneAddress, to: 1)
        let near = try await weakTask.value
        #expect(near != nil)
        none.cancel()

        // Without duplicates, an unchanged advertisement is reported once; a changed one again.
        var once = central.scan(ScanFilter(serviceUUIDs: [TestService.service])).makeAsyncIterator()
        let a = try await once.next()
        var changed = TestService.advertising
        changed.manufacturerData[0xFFFF] = [0x10, 0x12, 0xD5, 0, 2, 0x42]
        try await peripheral.advertise(changed)
        let b = try await once.next()
        #expect(a?.advertisement != b?.advertisement)
        #expect(b?.advertisement == changed)

        var all = central.scan(ScanFilter(serviceUUIDs: [TestService.service], duplicates: true)).makeAsyncIterator()
        let d1 = try #require(try await all.next()), d2 = try #require(try await all.next())
        #expect(d2.timestamp - d1.timestamp >= .milliseconds(90) && d2.timestamp - d1.timestamp <= .milliseconds(110))
    }

    /// BlueZ sends a characteristic's notification to every subscribed central, and carries at
    /// most MTU - 5 bytes of it (Multiple Handle Value Notification); the model does the same.
    @Test func notificationsReachEverySubscriberAndFitMTUMinus5() async throws {
        let (_, air, peripheral, central) = try await world()
        let other = air.central(DeviceAddress("00:00:5E:00:53:99")!, at: 2)
        var centrals: [CentralID] = []
        var links: [any CentralLink] = []
        for c in [central, other] {
            let link = try await c.connect(to: boxAddress, timeout: .seconds(5))
            try await link.subscribe(TestService.response)
            links.append(link)
        }
        for await e in peripheral.events {
            if case .subscribed(let id, _) = e { centrals.append(id) }
            if centrals.count == 2 { break }
        }
        let mtu = await links[0].mtu
        await #expect(throws: RadioError.invalidLength(length: mtu - 4, limit: mtu - 5)) {
            try await peripheral.notify(centrals[0], characteristic: TestService.response, value: [UInt8](repeating: 1, count: mtu - 4))
        }
        let value = [UInt8](repeating: 7, count: mtu - 5)
        try await peripheral.notify(centrals[0], characteristic: TestService.response, value: value)
        for link in links {
            var events = link.events.makeAsyncIterator()
            #expect(await events.next() == .notification(characteristic: TestService.response, value: value))
        }
        // A write to the notify-only characteristic is refused, as the ATT server refuses it.
        await #expect(throws: RadioError.self) { try await links[1].write(TestService.response, value: [1], withResponse: true) }
    }

    @Test func connectWaitsForAnAdvertisementAndExchangesMTU() async throws {
        var parameters = SimulationParameters()
        parameters.centralMTU = 517
        parameters.peripheralMTU = 247
        let (clock, _, peripheral, central) = try await world(parameters)
        let start = clock.now
        let link = try await central.connectLink(to: boxAddress, timeout: .seconds(5))
        #expect(await link.mtu == 247)
        // The MTU exchange is one round trip: request in event 1, response in event 2.
        #expect(link.trace.map { [$0.firstEvent, $0.lastEvent] } == [[1, 1], [2, 2]])
        #expect(link.anchor - start <= .milliseconds(113))
        var events = peripheral.events.makeAsyncIterator()
        guard case .connected(let id, let mtu) = await events.next() else { Issue.record("no connected event"); return }
        #expect(id.address == phoneAddress && mtu == 247)
    }

    /// The number of connection events a transfer of `bytes` needs with Write Commands.
    func predictedEvents(bytes: Int, mtu: Int, _ p: SimulationParameters) -> Int {
        let value = mtu - 3
        let full = bytes / value, rest = bytes % value
        let packets = full * p.packets(forValueLength: value) + (rest > 0 ? p.packets(forValueLength: rest) : 0)
        return (packets + p.packetsPerEvent - 1) / p.packetsPerEvent
    }

    @Test(arguments: [23, 247])
    func fourKiBCrossesInThePredictedNumberOfEvents(mtu: Int) async throws {
        var parameters = SimulationParameters()
        parameters.centralMTU = mtu
        parameters.peripheralMTU = mtu
        let (_, _, peripheral, central) = try await world(parameters)
        let link = try await central.connectLink(to: boxAddress, timeout: .seconds(5))
        let message = (0..<4096).map { UInt8(truncatingIfNeeded: $0) }
        let before = link.trace.count
        for start in stride(from: 0, to: message.count, by: mtu - 3) {
            try await link.write(TestService.request, value: Array(message[start..<min(start + mtu - 3, message.count)]), withResponse: false)
        }
        let transfer = link.trace[before...]
        let events = transfer.last!.lastEvent - transfer.first!.firstEvent + 1
        let predicted = predictedEvents(bytes: 4096, mtu: mtu, parameters)
        #expect(events == predicted, "MTU \(mtu): \(events) events, model predicts \(predicted)")
        #expect(predicted == (mtu == 23 ? 52 : 5))

        // Everything arrives, in order, whole.
        var received: [UInt8] = []
        for await event in peripheral.events {
            if case .wrote(_, _, let value, let m) = event { received += value; #expect(m == mtu) }
            if received.count == message.count { break }
        }
        #expect(received == message)
    }

    @Test func writeWithResponseIsOnePerRoundTrip() async throws {
        let (_, _, _, central) = try await world()
        let link = try await central.connectLink(to: boxAddress, timeout: .seconds(5))
        for _ in 0..<10 { try await link.write(TestService.request, value: [UInt8](repeating: 7, count: 20), withResponse: true) }
        let requests = link.trace.filter { $0.direction == .toPeripheral }.map(\.firstEvent)
        let responses = link.trace.filter { $0.direction == .toCentral }.map(\.firstEvent)
        // Request in event k, response in k+1, next request in k+2.
        #expect(zip(requests, responses).allSatisfy { $1 == $0 + 1 })
        #expect(zip(requests, requests.dropFirst()).allSatisfy { $1 == $0 + 2 })
    }

    @Test func writeWithoutResponseRespectsFlowControl() async throws {
        var parameters = SimulationParameters()
        parameters.packetsPerEvent = 3
        parameters.transmitBuffer = 6
        let (clock, air, _, central) = try await world(parameters)
        let link = try await central.connectLink(to: boxAddress, timeout: .seconds(5))
        let issued = air.issueTime(phoneAddress)
        var accepted: [Duration] = []
        for _ in 0..<30 {
            try await link.write(TestService.request, value: [1, 2, 3], withResponse: false)
            accepted.append(air.issueTime(phoneAddress))
        }
        // No event carries more than packetsPerEvent packets.
        var perEvent: [Int: Int] = [:]
        for e in link.trace where e.direction == .toPeripheral { perEvent[e.firstEvent, default: 0] += e.packets }
        #expect(perEvent.values.allSatisfy { $0 <= 3 })
        #expect(perEvent.count == 10)
        // The first buffer's worth is accepted at once; after that the writer is held back
        // one event per packetsPerEvent writes.
        #expect(accepted.prefix(6).allSatisfy { $0 == issued })
        #expect(accepted.last! > issued + parameters.connectionInterval * 7)
        #expect(clock.now == .seconds(10))   // no wall time needed for any of it
    }

    /// The central's GATT cache: a second connection to the same peripheral checks the
    /// Database Hash (one round trip) instead of discovering (three); a changed service is
    /// discovered in full again.
    @Test func aRepeatConnectionChecksTheDatabaseHashInsteadOfDiscovering() async throws {
        let (_, _, peripheral, central) = try await world()
        var trips: [Int] = []
        for change in [false, false, true, false] {
            if change {
                var changed = TestService.definition
                changed.characteristics.removeLast()
                try await peripheral.publish(changed)
            }
            let link = try await central.connectLink(to: boxAddress, timeout: .seconds(5))
            let before = link.trace.count
            _ = try await link.discover(service: TestService.service)
            trips.append((link.trace.count - before) / 2)
            await link.disconnect()
        }
        #expect(trips == [3, 1, 3, 1])
    }

    @Test func notificationsAndReadsCostRoundTrips() async throws {
        let (_, _, peripheral, central) = try await world()
        let link = try await central.connectLink(to: boxAddress, timeout: .seconds(5))
        _ = try await link.discover(service: TestService.service)
        #expect(link.trace.count == 6)   // three discovery round trips
        // 36 bytes at MTU 23: Read (22) + Read Blob (14).
        #expect(try await link.read(TestService.info) == TestService.infoValue)
        #expect(link.trace.count == 10)
        await #expect(throws: RadioError.notPermitted("notify on \(TestService.request)")) { try await link.subscribe(TestService.request) }
        try await link.subscribe(TestService.response)
        var pEvents = peripheral.events.makeAsyncIterator()
        _ = await pEvents.next()   // connected
        guard case .subscribed(let who, let c) = await pEvents.next() else { Issue.record("no subscribe"); return }
        #expect(c == TestService.response)
        try await peripheral.notify(who, characteristic: TestService.response, value: [9, 9])
        var lEvents = link.events.makeAsyncIterator()
        #expect(await lEvents.next() == .notification(characteristic: TestService.response, value: [9, 9]))
        await #expect(throws: RadioError.invalidLength(length: 21, limit: 20)) {
            try await link.write(TestService.request, value: [UInt8](repeating: 0, count: 21), withResponse: false)
        }
    }

    @Test func linkLeavingRangeIsReportedToBothSidesAfterTheSupervisionTimeout() async throws {
        let (clock, air, peripheral, central) = try await world()
        let link = try await central.connectLink(to: boxAddress, timeout: .seconds(5))
        var pEvents = peripheral.events.makeAsyncIterator()
        _ = await pEvents.next()   // connected
        let start = clock.now
        // Walk from 1 m to 61 m in 6 s: out of range (30 m) at 2.9 s, lost at 3.32 s.
        air.move(phoneAddress, to: 61, over: .seconds(6))
        let centralSaw = Task { () -> LinkEvent? in var i = link.events.makeAsyncIterator(); return await i.next() }
        let peripheralSaw = Task { () -> PeripheralEvent? in await pEvents.next() }
        clock.advance(to: start + .milliseconds(3310))
        try await Task.sleep(for: .milliseconds(50))
        #expect(await link.mtu == 23)
        await #expect(throws: Never.self) { _ = try await link.rssi() }
        clock.advance(to: start + .milliseconds(3330))
        #expect(await centralSaw.value == .disconnected(.supervisionTimeout))
        guard case .disconnected(_, .supervisionTimeout) = await peripheralSaw.value else { Issue.record("peripheral not told"); return }
        await #expect(throws: RadioError.disconnected(.supervisionTimeout)) { try await link.rssi() }
    }

    @Test func droppedLinkIsNoticedOnlyAfterTheSupervisionTimeout() async throws {
        let (clock, air, _, central) = try await world()
        let link = try await central.connectLink(to: boxAddress, timeout: .seconds(5))
        let t0 = clock.now
        air.dropLinks(of: phoneAddress)
        let saw = Task { () -> LinkEvent? in var i = link.events.makeAsyncIterator(); return await i.next() }
        clock.advance(to: t0 + .milliseconds(419))
        try await Task.sleep(for: .milliseconds(30))
        clock.advance(to: t0 + .milliseconds(420))
        #expect(await saw.value == .disconnected(.supervisionTimeout))
    }

    @Test func shortGapLosesNothing() async throws {
        let (clock, air, peripheral, central) = try await world()
        let link = try await central.connectLink(to: boxAddress, timeout: .seconds(5))
        air.move(phoneAddress, to: 40)             // out of range now
        try await link.write(TestService.request, value: [1], withResponse: false)
        clock.advance(by: .milliseconds(200))
        air.move(phoneAddress, to: 2)              // back before 420 ms
        try await link.write(TestService.request, value: [2], withResponse: false)
        var values: [[UInt8]] = []
        for await e in peripheral.events {
            if case .wrote(_, _, let v, _) = e { values.append(v) }
            if values.count == 2 { break }
        }
        #expect(values == [[1], [2]])
        clock.advance(by: .seconds(1))
        #expect(try await link.rssi() > -70)
    }

    @Test func rssiFollowsDistance() async throws {
        let (_, air, _, central) = try await world()
        let link = try await central.connectLink(to: boxAddress, timeout: .seconds(5))
        var near = 0, far = 0
        for _ in 0..<20 { near += try await link.rssi() }
        air.move(phoneAddress, to: 20)
        for _ in 0..<20 { far += try await link.rssi() }
        let nearMean = Double(near) / 20, farMean = Double(far) / 20
        let farModel: Double = -59.0 - 25.0 * 1.30103
        #expect(abs(nearMean + 59.0) < 2)
        #expect(abs(farMean - farModel) < 2)
    }

    @Test func refusedAndSlowPeers() async throws {
        let (clock, air, peripheral, central) = try await world()
        air.refuseConnections(to: boxAddress)
        let attempt = Task { try await central.connect(to: boxAddress, timeout: .seconds(2)) }
        try await Task.sleep(for: .milliseconds(20))
        clock.advance(by: .seconds(2))
        await #expect(throws: RadioError.connectionFailed("connection refused by \(boxAddress)")) { _ = try await attempt.value }
        air.refuseConnections(to: boxAddress, false)

        air.slow(boxAddress, by: .milliseconds(100))
        let link = try await central.connectLink(to: boxAddress, timeout: .seconds(5))
        try await link.subscribe(TestService.response)
        let request = try #require(link.trace.last { $0.direction == .toPeripheral })
        let before = link.trace.count
        let id = try #require(air.links(of: boxAddress).first).centralID
        try await peripheral.notify(id, characteristic: TestService.response, value: [1])
        // The box heard the subscription in event r; a host 100 ms slower misses three more
        // 30 ms events before its notification goes out: event r + 4, not r + 1.
        let entry = link.trace[before]
        #expect(entry.direction == .toCentral)
        #expect(entry.firstEvent == request.lastEvent + 4)
    }

    @Test func explicitDisconnectReasons() async throws {
        let (_, _, peripheral, central) = try await world()
        let link = try await central.connectLink(to: boxAddress, timeout: .seconds(5))
        await link.disconnect()
        var l = link.events.makeAsyncIterator()
        #expect(await l.next() == .disconnected(.localHost))
        #expect(await l.next() == nil)
        var p = peripheral.events.makeAsyncIterator()
        _ = await p.next()
        guard case .disconnected(_, .remoteUser) = await p.next() else { Issue.record("peripheral not told"); return }
        await #expect(throws: RadioError.disconnected(.localHost)) { try await link.write(TestService.request, value: [1], withResponse: true) }
    }
}
