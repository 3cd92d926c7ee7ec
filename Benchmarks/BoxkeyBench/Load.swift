// Figure 10: many phones logging in to one box at once, on the simulated radio in one process
// and across processes (the box here, the phones in a child `boxkey-bench --load-phones`).
import BoxkeyCore
import BoxkeyDaemon
import BoxkeyPhone
import BoxkeyRadio
import BoxkeySimRadio
import Foundation
import NIOConcurrencyHelpers

/// The load's users: load0, load1, ... (uid 20000 + n), one per phone, one prompt each.
func loadUserID(_ name: String) -> UInt32? {
    guard name.hasPrefix("load"), let n = UInt32(name.dropFirst(4)) else { return nil }
    return 20000 + n
}

/// What a run of one or more phones reports: each login's time from the search for the box
/// to its answer, and every login that did not end accepted.
struct LoadResult: Codable {
    var milliseconds: [Double] = []
    var failures: [String] = []
}

/// One phone's `rounds` logins, one after another; each is timed from the search to the answer.
/// The box's answer to a push: the "waiting for Enter" notice the box sends while the push is
/// held at the prompt comes first, and is passed over, as `boxkey login` does.
func loginResult(on link: BoxLink, timeout: Duration) async throws -> LoginResult {
    let deadline = ContinuousClock.now + timeout
    while true {
        switch try await link.next(timeout: deadline - ContinuousClock.now) {
        case .loginResult(let r): return r
        case .awaitingEnter, .keepalive: continue
        case let other: throw BenchError("expected the login's result, got \(other)")
        }
    }
}

func phoneLogins(index: Int, identity: PhoneIdentity, boxKey: PublicKey, radio: any CentralRadio, rounds: Int) async -> LoadResult {
    var result = LoadResult()
    let clock = ContinuousClock()
    for _ in 0..<rounds {
        let start = clock.now
        do {
            guard let heard = try await findBox(BoxID(4821)!, pinned: boxKey, radio: radio, timeout: .seconds(10)) else { throw BenchError("box not heard") }
            let link = try await BoxLink.open(to: heard, boxKey: boxKey, identity: identity, radio: radio)
            do {
                try await link.send(.credentialPush(CredentialPush(user: "load\(index)", password: SecureBytes(utf8: password), deviceName: "load \(index)")))
                let r = try await loginResult(on: link, timeout: .seconds(15))
                guard r.outcome == .accepted else { throw BenchError("\(r.outcome): \(r.reason)") }
                result.milliseconds.append(milliseconds(clock.now - start))
                // As `boxkey login --no-stay`: no walk-away, the session stays as it is.
                try? await link.send(.detach)
            } catch {
                await link.close()
                throw error
            }
            await link.close()
        } catch {
            result.failures.append("phone \(index): \(error)")
        }
    }
    return result
}

/// The phones' identities, the same in the box's process and the phones' (from a seed).
func loadIdentities(_ count: Int) -> [PhoneIdentity] {
    (0..<count).map { i in
        let seed = SecureBytes(copying: Array(repeating: UInt8(i + 1), count: 32))
        return PhoneIdentity(keyPair: try! KeyPair(privateKey: seed), deviceSecret: SecureBytes(copying: Array(repeating: UInt8(i + 101), count: 32)))
    }
}

/// A person at prompt `prompt` who presses Enter as soon as a push waits there (every 5 ms
/// until one does, or `stop`).
/// Without `stop` it gives up after 30 s: a login that failed must fail the bench, not hang it.
func pressEnter(_ box: Box, _ prompt: UInt64, until stop: NIOLockedValueBox<Bool>? = nil) async -> PromptAnswer {
    let giveUp = ContinuousClock.now + .seconds(30)
    while true {
        let answer = await box.take(prompt, wait: .seconds(10))
        let goOn = stop.map { !$0.withLockedValue { $0 } } ?? (ContinuousClock.now < giveUp)
        guard case .noPush(let why) = answer, why == .nothingYet || why == .timedOut, goOn else { return answer }
        try? await Task.sleep(for: .milliseconds(5))
    }
}

/// The box's side: a prompt for each load user, answered "accepted" whenever a push arrives,
/// until `stop`. Returns how many pushes arrived per user.
func servePrompts(_ box: Box, users: Int, until stop: NIOLockedValueBox<Bool>, counter: NIOLockedValueBox<Int>) async -> [Int] {
    await withTaskGroup(of: Int.self) { group in
        for i in 0..<users {
            group.addTask {
                func register() async -> UInt64? {
                    await box.registerPrompt(.init(service: "login", tty: "tty\(i + 1)", display: "", expectedUser: "load\(i)", timeoutMilliseconds: 1000),
                                             peer: PAMPeer(pid: getpid(), uid: 0)).id
                }
                var pushes = 0
                guard var prompt = await register() else { return 0 }
                while !stop.withLockedValue({ $0 }) {
                    let answer = await pressEnter(box, prompt, until: stop)
                    // The next prompt waits before this one reports, as a greeter that loops:
                    // a phone's next push never finds the user without a prompt.
                    guard let next = await register() else { return pushes }
                    if case .push(let user, _, _) = answer {
                        pushes += user == "load\(i)" ? 1 : 0
                        counter.withLockedValue { $0 += 1 }
                        await box.report(prompt, .accepted, reason: "")
                    }
                    prompt = next
                }
                return pushes
            }
        }
        var counts: [Int] = []
        for await c in group { counts.append(c) }
        return counts
    }
}

/// `phones` phones on `air` (phone i at address 00:50:4C:00:00:i), each doing `rounds`
/// logins, all at once; their results merged.
func runPhones(_ phones: Int, rounds: Int, on air: SimulatedAir, boxKey: PublicKey) async -> LoadResult {
    let identities = loadIdentities(phones)
    return await withTaskGroup(of: LoadResult.self) { group in
        for i in 0..<phones {
            let central = air.central(DeviceAddress(String(format: "00:50:4C:00:00:%02X", i))!, at: 1)
            group.addTask { await phoneLogins(index: i, identity: identities[i], boxKey: boxKey, radio: central, rounds: rounds) }
        }
        var all = LoadResult()
        for await r in group { all.milliseconds += r.milliseconds; all.failures += r.failures }
        return all
    }
}

/// CPU seconds this process has used (user + system).
func processCPUSeconds() -> Double {
    var u = rusage()
    getrusage(__rusage_who_t(RUSAGE_SELF.rawValue), &u)
    return Double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + Double(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6
}

/// The radio both processes use: MTU 247; `fast` (the memory run) at BLE's shortest
/// connection interval, which changes how soon each login ends, not what it does.
func loadParameters(fast: Bool) -> SimulationParameters {
    var p = SimulationParameters()
    p.centralMTU = 247
    p.peripheralMTU = 247
    if fast { p.connectionInterval = .microseconds(7500) }
    return p
}

/// The child process: `--load-phones N --rounds R --air DIR --box-key HEX [--fast]`; prints a LoadResult.
func loadPhonesMain() async throws {
    let args = CommandLine.arguments
    func value(_ name: String) -> String { args[args.firstIndex(of: name)! + 1] }
    let phones = Int(value("--load-phones"))!, rounds = Int(value("--rounds"))!
    let air = try SocketAir(directory: value("--air"), parameters: loadParameters(fast: args.contains("--fast")))
    defer { air.shutdown() }
    let boxKey = try PublicKey(unhex(value("--box-key")) ?? [])
    let merged = await runPhones(phones, rounds: rounds, on: air.air, boxKey: boxKey)
    print(String(decoding: try JSONEncoder().encode(merged), as: UTF8.self))
}

/// One load run: `phones` phones × `rounds` logins; in this process, or with `crossProcess`
/// in a child process on the socket air. Returns the phones' result, the box's pushes, and
/// the box process's CPU seconds and RSS (at the start, after `warmup` pushes, peak, at the end).
func loadRun(phones: Int, rounds: Int, crossProcess: Bool, warmup: Int = 0, fast: Bool = false) async throws
    -> (result: LoadResult, pushes: Int, cpu: Double, rss: (before: Int, warm: Int, peak: Int, after: Int)) {
    let p = loadParameters(fast: fast)
    let dir = FileManager.default.temporaryDirectory.appendingPathComponent("boxkey-bench-load-\(getpid())").path
    defer { try? FileManager.default.removeItem(atPath: dir) }
    let socketAir = crossProcess ? try SocketAir(directory: dir, parameters: p) : nil
    defer { socketAir?.shutdown() }
    let bench = try BoxUnderTest(parameters: p, socketAir: socketAir, userID: loadUserID, configure: {
        $0.phoneLoginServices = ["login"]
        $0.rejectedPushesPerUser = 1_000_000
        if fast { $0.advertisingInterval = .milliseconds(20) }
    })
    // Only the load's phones, for its users (the bench's own user is not one of them).
    try await bench.start(ownPhone: false)
    defer { bench.stop() }
    for (i, identity) in loadIdentities(phones).enumerated() {
        try await bench.enrol(key: hex(identity.keyPair.publicKey.bytes), user: "load\(i)", name: "load \(i)")
    }
    let stop = NIOLockedValueBox(false)
    let counter = NIOLockedValueBox(0)
    let serving = Task { await servePrompts(bench.box, users: phones, until: stop, counter: counter) }
    try await Task.sleep(for: .milliseconds(100))
    let before = rssBytes()
    let peak = NIOLockedValueBox(false)
    let sampler = Task { () -> (peak: Int, warm: Int) in
        var top = 0, warm = 0
        while !peak.withLockedValue({ $0 }) {
            let rss = rssBytes()
            top = max(top, rss)
            if warm == 0, counter.withLockedValue({ $0 }) >= warmup { warm = rss }
            try? await Task.sleep(for: .milliseconds(20))
        }
        return (top, warm)
    }
    let cpu0 = processCPUSeconds()
    let result: LoadResult
    if crossProcess {
        let child = Process()
        child.executableURL = URL(fileURLWithPath: CommandLine.arguments[0])
        child.arguments = ["--load-phones", "\(phones)", "--rounds", "\(rounds)", "--air", dir, "--box-key", hex(bench.box.identity.keyPair.publicKey.bytes)]
            + (fast ? ["--fast"] : [])
        let out = Pipe()
        child.standardOutput = out
        try child.run()
        let data = try await withCheckedThrowingContinuation { c in
            Thread { c.resume(returning: out.fileHandleForReading.readDataToEndOfFile()) }.start()
        }
        child.waitUntilExit()
        guard let r = try? JSONDecoder().decode(LoadResult.self, from: data) else { throw BenchError("load phones: \(String(decoding: data, as: UTF8.self))") }
        result = r
    } else {
        result = await runPhones(phones, rounds: rounds, on: bench.air, boxKey: bench.box.identity.keyPair.publicKey)
    }
    let cpu = processCPUSeconds() - cpu0
    peak.withLockedValue { $0 = true }
    stop.withLockedValue { $0 = true }
    let sampled = await sampler.value
    let pushes = await serving.value.reduce(0, +)
    return (result, pushes, cpu, (before, sampled.warm, sampled.peak, rssBytes()))
}

func loadFigures() async throws {
    let rounds = short ? 5 : 100
    let phones = 8
    for crossProcess in [false, true] {
        let single = try await loadRun(phones: 1, rounds: rounds, crossProcess: crossProcess)
        let many = try await loadRun(phones: phones, rounds: rounds, crossProcess: crossProcess)
        let s1 = Summary(single.result.milliseconds), s8 = Summary(many.result.milliseconds)
        let logins = phones * rounds
        let answered = many.result.milliseconds.count
        let where_ = crossProcess ? "across processes" : "in one process"
        let cpuWhat = crossProcess ? "box process CPU" : "CPU (box and phones)"
        row("10\(crossProcess ? "b" : "a"). load: \(phones) phones × \(rounds) logins at once, \(where_), MTU 247",
            String(format: "%d/%d accepted, %d pushes at the box, %d failed%@; p50 %.0f / p99 %.0f ms vs one phone p50 %.0f / p99 %.0f ms (p99 %.2f×); %@ %.2f ms per login; RSS %.1f → peak %.1f MiB",
                   answered, logins, many.pushes, many.result.failures.count,
                   many.result.failures.first.map { " (first: \($0))" } ?? "",
                   s8.median, s8.p99, s1.median, s1.p99, s8.p99 / s1.p99, cpuWhat, many.cpu * 1000 / Double(logins),
                   Double(many.rss.before) / 1_048_576, Double(many.rss.peak) / 1_048_576),
            "all answered, p99 ≤ 2× one phone", answered == logins && many.result.failures.isEmpty && s8.p99 <= 2 * s1.p99)
    }
}

/// Figure 5b: the box's process alone (no phone in it) over many logins through the
/// cross-process radio: how much its RSS grows after a warm-up.
func boxMemoryGrowth() async throws {
    let logins = short ? 50 : 1000
    let warmup = 20  // pools, caches, the first allocations
    let run = try await loadRun(phones: 1, rounds: warmup + logins, crossProcess: true, warmup: warmup, fast: true)
    let grew = run.rss.after - run.rss.warm
    let growth = Double(grew) / 1_048_576
    row("5b. box process memory growth over \(logins) logins after \(warmup) (phone in another process)",
        String(format: "%.2f MiB (%.1f KiB per login; %d failed; RSS %.1f → %.1f MiB)", growth, Double(grew) / 1024 / Double(logins),
               run.result.failures.count, Double(run.rss.warm) / 1_048_576, Double(run.rss.after) / 1_048_576),
        "≤ 1 MiB per 1,000", short ? nil : growth * 1000 / Double(logins) <= 1)
}
