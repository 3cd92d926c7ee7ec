@testable import BoxkeyHost
import CBoxkeySys
import Glibc
import NIOConcurrencyHelpers
import Testing

/// boxkeyd's executors (QuietExecutors): the queue its threads wait on, and the pool running
/// tasks. The program-wide install runs only in boxkeyd; e2e and the bench's idle figure (no
/// wake-up over its window) cover that.
struct QuietExecutorTests {
    @Test func jobsDueLaterComeOutByDeadlineAfterTheReadyOnes() {
        let queue = JobQueue<String>()
        let start = monotonicNanoseconds()
        queue.append("late", after: 40_000_000)
        queue.append("soon", after: 10_000_000)
        queue.append("now")
        #expect(queue.next() == "now")
        #expect(queue.next() == "soon")
        #expect(monotonicNanoseconds() - start >= 10_000_000)
        #expect(queue.next() == "late")
        #expect(monotonicNanoseconds() - start >= 40_000_000)
    }

    @Test func aSoonerDeadlineWakesAThreadWaitingForALaterOne() {
        let queue = JobQueue<String>()
        queue.append("in a minute", after: 60_000_000_000)
        let got = NIOLockedValueBox<String?>(nil)
        let thread = try! startPlainThread(joinable: true) { got.withLockedValue { $0 = queue.next() } }.get()
        usleep(20_000)   // let the thread wait for the minute
        let start = monotonicNanoseconds()
        queue.append("in 5 ms", after: 5_000_000)
        pthread_join(thread, nil)
        #expect(got.withLockedValue { $0 } == "in 5 ms")
        #expect(monotonicNanoseconds() - start < 5_000_000_000)
    }

    @Test func stopEndsAWaitingThread() {
        let queue = JobQueue<Int>()
        let got = NIOLockedValueBox<Int?>(0)
        let thread = try! startPlainThread(joinable: true) { got.withLockedValue { $0 = queue.next() } }.get()
        queue.stop()
        pthread_join(thread, nil)
        #expect(got.withLockedValue { $0 } == nil)
    }

    @Test func delaysInNanoseconds() {
        #expect(nanoseconds(Duration.milliseconds(1500)) == 1_500_000_000)
        #expect(nanoseconds(Duration.zero) == 0)
        #expect(nanoseconds(Duration.seconds(-3)) == 0)
        #expect(nanoseconds(Duration.seconds(Int64.max)) == UInt64.max)
    }

    @Test func thePoolRunsManyTasksOnItsThreads() async {
        let pool = ThreadPoolExecutor(threads: 2)
        defer { pool.stop() }
        let names = NIOLockedValueBox<Set<String>>([])
        let sum = await withTaskGroup(of: Int.self) { group in
            for i in 1...2_000 {
                group.addTask(executorPreference: pool) {
                    var name = [CChar](repeating: 0, count: 16)
                    boxkey_thread_name(&name, name.count)
                    names.withLockedValue { _ = $0.insert(String(cString: name)) }
                    await Task.yield()
                    return i
                }
            }
            return await group.reduce(0, +)
        }
        #expect(sum == 2_000 * 2_001 / 2)
        // The threads beyond the two end a second after nothing waits.
        for _ in 0..<200 where pool.queue.threads > 2 { usleep(50_000) }
        #expect(pool.queue.threads == 2)
        #expect(names.withLockedValue { $0 } == [ThreadPoolExecutor.threadName])
    }

    @Test func aJobDoesNotWaitBehindThreadsThatBlock() async {
        let pool = ThreadPoolExecutor(threads: 2)
        defer { pool.stop() }
        // Both threads blocked in a system call (a slow NSS lookup, an HCI read) until the new
        // job runs: libdispatch adds a thread after a second, this pool after 100 ms without
        // progress. Without a new thread the blockers give up after 30 s and the job runs late,
        // so the test says whether the job ran while they blocked, not how fast (a sanitizer
        // build is slow).
        let blocking = (0..<2).map { _ in ConditionLock(value: false) }
        let released = ConditionLock(value: false)
        let blockers = blocking.map { started in
            Task(executorPreference: pool) { () -> Bool in
                started.lock()
                started.unlock(withValue: true)
                guard released.lock(whenValue: true, timeoutSeconds: 30) else { return false }
                released.unlock()
                return true
            }
        }
        for started in blocking {
            started.lock(whenValue: true)
            started.unlock()
        }
        await Task(executorPreference: pool) {
            released.lock()
            released.unlock(withValue: true)
        }.value
        for blocker in blockers { #expect(await blocker.value, "the job waited behind the blocked threads") }
    }
}
