import BoxkeyRadio
import BoxkeySimRadio
import Testing

/// One test body for every radio backend: what the box and the phone rely on.
@Suite(.timeLimit(.minutes(2))) struct RadioContractTests {
    func firstEvent(_ events: AsyncStream<PeripheralEvent>, where match: (PeripheralEvent) -> Bool) async -> PeripheralEvent? {
        for await e in events where match(e) { return e }
        return nil
    }

    @Test(arguments: Backend.allCases)
    func gattRoundTrip(_ backend: Backend) async throws {
        try await withRadioPair(backend) { pair in
            let link = pair.link
            #expect(link.peer == boxAddress)
            let service = try await link.discover(service: TestService.service)
            #expect(service.characteristic(TestService.request)?.properties == [.write, .writeWithoutResponse])
            #expect(try await link.read(TestService.info) == TestService.infoValue)

            try await link.subscribe(TestService.response)
            let subscribed = await firstEvent(pair.peripheral.events) { if case .subscribed = $0 { true } else { false } }
            guard case .subscribed(let central, let c) = subscribed else { Issue.record("no subscription seen"); return }
            #expect(central.address == phoneAddress && c == TestService.response)

            // Both write kinds arrive, in order, with the MTU.
            try await link.write(TestService.request, value: [1, 2, 3], withResponse: false)
            try await link.write(TestService.request, value: [4, 5], withResponse: true)
            var values: [[UInt8]] = []
            let linkMTU = await link.mtu
            for await e in pair.peripheral.events {
                if case .wrote(let who, let c, let v, let mtu) = e {
                    #expect(who == central && c == TestService.request && mtu == linkMTU)
                    values.append(v)
                }
                if values.count == 2 { break }
            }
            #expect(values == [[1, 2, 3], [4, 5]])

            try await pair.peripheral.notify(central, characteristic: TestService.response, value: [0xAB])
            var events = link.events.makeAsyncIterator()
            #expect(await events.next() == .notification(characteristic: TestService.response, value: [0xAB]))
            if backend.modelsRadio {
                #expect(try await link.rssi() < -40)
                #expect(try await pair.peripheral.rssi(of: central) < -40)
            }

            // The central hangs up: it sees localHost, the peripheral remoteUser.
            await link.disconnect()
            #expect(await events.next() == .disconnected(.localHost))
            let gone = await firstEvent(pair.peripheral.events) { if case .disconnected = $0 { true } else { false } }
            #expect(gone == .disconnected(central, reason: .remoteUser))
        }
    }

    // bluezoo 1.0.2 cannot disconnect from the peripheral's side (its Device1 there has no peer
    // and Disconnect raises); the VM lab covers this against real BlueZ.
    @Test(arguments: Backend.allCases.filter { $0 != .bluezoo })
    func peripheralHangsUp(_ backend: Backend) async throws {
        try await withRadioPair(backend) { pair in
            guard case .connected(let central, _) = await firstEvent(pair.peripheral.events, where: { _ in true }) else {
                Issue.record("no connection seen"); return
            }
            await pair.peripheral.disconnect(central)
            var events = pair.link.events.makeAsyncIterator()
            #expect(await events.next() == .disconnected(.remoteUser))
            #expect(await events.next() == nil)
            await #expect(throws: RadioError.self) { try await pair.link.write(TestService.request, value: [1], withResponse: true) }
        }
    }

    @Test(arguments: Backend.allCases)
    func largeMessageAtMTU247(_ backend: Backend) async throws {
        var parameters = SimulationParameters()
        parameters.centralMTU = 247
        parameters.peripheralMTU = 247
        try await withRadioPair(backend, parameters: parameters) { pair in
            let mtu = await pair.link.mtu
            if backend.modelsRadio { #expect(mtu == 247) }
            let message = (0..<4096).map { UInt8(truncatingIfNeeded: $0 * 7) }
            for start in stride(from: 0, to: message.count, by: mtu - 3) {
                try await pair.link.write(TestService.request, value: Array(message[start..<min(start + mtu - 3, message.count)]), withResponse: false)
            }
            await #expect(throws: RadioError.invalidLength(length: mtu - 2, limit: mtu - 3)) {
                try await pair.link.write(TestService.request, value: [UInt8](repeating: 0, count: mtu - 2), withResponse: false)
            }
            var received: [UInt8] = []
            for await e in pair.peripheral.events {
                if case .wrote(_, _, let v, _) = e { received += v }
                if received.count >= message.count { break }
            }
            #expect(received == message)
        }
    }

    /// The Response characteristic only notifies: a write to it gets an ATT error, not success.
    @Test(arguments: Backend.allCases)
    func writeToANotifyOnlyCharacteristicIsRefused(_ backend: Backend) async throws {
        try await withRadioPair(backend) { pair in
            _ = try await pair.link.discover(service: TestService.service)
            await #expect(throws: RadioError.self) { try await pair.link.write(TestService.response, value: [1, 2], withResponse: true) }
            try await pair.link.write(TestService.request, value: [3], withResponse: true)
        }
    }

    @Test(arguments: Backend.allCases)
    func scanSeesTheAdvertisement(_ backend: Backend) async throws {
        try await withRadioPair(backend) { pair in
            for try await result in pair.central.scan(ScanFilter(serviceUUIDs: [TestService.service])) {
                #expect(result.address == boxAddress)
                #expect(result.advertisement.manufacturerData[0xFFFF] == TestService.advertising.manufacturerData[0xFFFF])
                break
            }
        }
    }
}
