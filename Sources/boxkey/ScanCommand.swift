import ArgumentParser
import BoxkeyCore
import BoxkeyPhone
import BoxkeyRadio
import BoxkeyHost
import FoundationEssentials
import Glibc
import Synchronization

extension Boxkey {
    struct Scan: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "List nearby boxes live: ID, signal strength, paired or not.",
            discussion: "On a terminal the list redraws as advertisements arrive, with a progress line; piped, it prints one plain line per box as it is first heard (with --json, one object per advertisement). With --watch it goes on until Ctrl-C, as a phone's list of nearby boxes does.")
        @Option(help: "How long to scan, in seconds.") var seconds = 4.0
        @Flag(help: "Keep scanning until Ctrl-C: boxes appear, change (a login prompt waiting, the signal by 5 dB or more) and leave (not heard for 5 s). Piped, one line per change; with --json, one object per change with a \"change\" key (new, changed, gone).")
        var watch = false
        @Flag(help: "One JSON object per advertisement heard, per line.") var json = false
        @Option(help: "Stop as soon as this box is found (exit 3 if it is not).") var id: BoxID?
        @OptionGroup var radio: RadioOptions

        func run() async throws {
            try await Terminal.run {
                let phone = try Phone.open()
                let phoneRadio = try await radio.open(phone)
                defer { phoneRadio.shutdown() }
                let live = isatty(1) == 1 && !json
                if watch {
                    await watchNearby(phoneRadio, boxes: phone.boxes, live: live)
                    return
                }
                let (found, count) = await scan(phoneRadio.central, boxes: phone.boxes, live: live)
                if let id, !found { throw PhoneFailure(.notFound, tr("box {box} not found nearby", ("box", id))) }
                if count == 0, !json, !live { Terminal.say(tr("no boxes found")) }
            }
        }

        /// Boxes not heard for this long leave the watched list.
        static let goneAfter: Duration = .seconds(5)

        /// `--watch`: the list of nearby boxes, kept up to date until Ctrl-C or SIGTERM.
        private func watchNearby(_ radio: any PhoneRadio, boxes: PairedBoxes, live: Bool) async {
            let central = radio.central
            let clock = MonotonicClock()
            final class Watched: Sendable {
                let table: Mutex<ScanTable>
                init(_ t: ScanTable) { table = Mutex(t) }
            }
            let watched = Watched(ScanTable(boxes: boxes))
            let results = central.scan(ScanFilter(serviceUUIDs: [BoxkeyProtocol.serviceUUID], duplicates: true))
            let json = json
            let (stops, stop) = AsyncStream<Void>.makeStream()
            let sources = Terminal.onSignals([SIGINT, SIGTERM]) { stop.yield() }
            defer { sources.forEach { $0.cancel() } }
            @Sendable func report(_ row: ScanTable.Row, _ change: ScanTable.Change) {
                if json { Terminal.say(ScanTable.json(row, change: change)) } else if !live { Terminal.say("\(change.rawValue): \(row.line)") }
            }
            @Sendable func draw(_ t: inout ScanTable) {
                guard live else { return }
                let n = t.rows.count
                Console.out(t.redraw(status: "\(n) box\(n == 1 ? "" : "es") nearby · watching, Ctrl-C stops"))
            }
            watched.table.withLock { draw(&$0) }
            await withTaskGroup(of: Void.self) { group in
                group.addTask { for await _ in stops { return } }
                group.addTask {
                    do {
                        for try await r in results {
                            watched.table.withLock { t in
                                guard let (row, change) = t.watch(r, at: clock.now) else { return }
                                report(row, change)
                                draw(&t)
                            }
                        }
                    } catch {}
                    // The radio ended the scan (the adapter went away): nothing more to watch.
                }
                group.addTask {
                    while !Task.isCancelled {
                        try? await Task.sleep(for: .milliseconds(500))
                        // Simulated radio: the phone walks where `boxkey sim move` says.
                        radio.followMoves(log: { _ in })
                        watched.table.withLock { t in
                            for row in t.expire(at: clock.now, after: Self.goneAfter) { report(row, .gone) }
                            draw(&t)
                        }
                    }
                }
                await group.next()
                group.cancelAll()
            }
        }

        private func scan(_ central: any CentralRadio, boxes: PairedBoxes, live: Bool) async -> (Bool, Int) {
            let clock = MonotonicClock()
            let start = clock.now
            let end = start + .milliseconds(Int(seconds * 1000))
            let results = central.scan(ScanFilter(serviceUUIDs: [BoxkeyProtocol.serviceUUID], duplicates: live || json))
            let (json, wanted, seconds) = (json, id, seconds)
            return await withTaskGroup(of: (Bool, Int)?.self) { group in
                group.addTask { try? await clock.sleep(until: end); return nil }
                group.addTask {
                    var table = ScanTable(boxes: boxes)
                    var lastDraw = clock.now - .seconds(1)
                    let spinner = Array("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏")
                    func draw(final: Bool = false) {
                        guard live else { return }
                        let elapsed = Double((clock.now - start).nanoseconds) / 1e9
                        let n = table.rows.count
                        let status = final ? "\(n) box\(n == 1 ? "" : "es") found"
                            : "\(spinner[Int(elapsed * 10) % spinner.count]) scanning… \(Int(max(0, seconds - elapsed).rounded(.up))) s left"
                        Console.out(table.redraw(status: status))
                        lastDraw = clock.now
                    }
                    draw()
                    do {
                        for try await r in results {
                            guard let (row, isNew) = table.add(r) else { continue }
                            if json {
                                Terminal.say(ScanTable.json(row))
                            } else if live {
                                if isNew || clock.now - lastDraw >= .milliseconds(100) { draw() }
                            } else if isNew {
                                Terminal.say(row.line)
                            }
                            if row.id == wanted?.description { draw(final: true); return (true, table.rows.count) }
                        }
                    } catch {}
                    draw(final: true)
                    return (false, table.rows.count)
                }
                var result: (Bool, Int) = (false, 0)
                if let first = await group.next(), let r = first { result = r } else {
                    group.cancelAll()
                    for await r in group { if let r { result = r } }
                }
                group.cancelAll()
                return result
            }
        }
    }
}
