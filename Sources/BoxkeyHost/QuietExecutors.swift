@_spi(ExperimentalCustomExecutors) @_spi(ExperimentalScheduling) import _Concurrency
import CBoxkeySys
import Glibc
import NIOCore

/// Swift concurrency without libdispatch, for a daemon that should sleep when idle.
///
/// On Linux the standard executors are libdispatch's, and its thread pool arms a timer that
/// fires every second to count its workers (`_dispatch_workq_monitor_pools`), idle or not. Here
/// tasks run on a pool of threads that wait on a condition variable: with no job queued they
/// wait with no timeout, and with only sleeps pending they wait until the first one is due. The
/// main actor drains its jobs on the main thread the same way.
///
/// The pool has a thread per CPU (at least two). As libdispatch's, it grows while jobs wait
/// behind threads that block in a system call (here after 100 ms without progress, there after
/// a second), and the threads it added end after a second with nothing to do.
///
/// `run` must be the program's first step (a synchronous `main`): executors cannot change once a
/// task has started. Nothing else in the program may use Dispatch queues, or its pool and timer
/// come back (signals: `SignalPipe`).
public enum QuietExecutors {
    /// Installs the executors, runs `body` as the program's first task and the main actor's
    /// jobs on this thread; exits 0 when `body` returns (`body` exits otherwise itself).
    public static func run(_ body: @escaping @Sendable () async -> Void) -> Never {
        _createExecutors(factory: Factory.self)
        Task.detached { await body(); exit(0) }
        MainThreadExecutor.shared.run()
        exit(0)
    }

    struct Factory: ExecutorFactory {
        static var mainExecutor: any MainExecutor { MainThreadExecutor.shared }
        static var defaultExecutor: any TaskExecutor { ThreadPoolExecutor.shared }
    }
}

/// A queue of jobs and of jobs due later, guarded by one mutex, and the count of threads that
/// drain it. Threads with nothing to do wait on a condition variable with no timeout; one of
/// them at a time waits for the soonest deadline instead, on a second one (CLOCK_MONOTONIC, so
/// a clock step does not move a deadline), so a sleep wakes one thread, not all.
final class JobQueue<Job>: @unchecked Sendable {
    private var mutex = pthread_mutex_t()
    private var idleCondition = pthread_cond_t()
    private var timerCondition = pthread_cond_t()
    private var monitorCondition = pthread_cond_t()
    private var ready = CircularBuffer<Job>()
    /// Sorted by deadline (nanoseconds of CLOCK_MONOTONIC), the soonest last: a daemon has a
    /// few sleeps pending at a time, so a sorted array beats a heap.
    private var later: [(deadline: UInt64, job: Job)] = []
    private var stopped = false
    /// Threads waiting with nothing to do (woken ones count until they run again).
    private var idle = 0
    /// Whether a thread waits for the soonest deadline.
    private var timing = false
    /// Threads draining the queue, and how many it may have: up to `maximumThreads`, one more
    /// when jobs waited `stallCheck` while every thread was busy and none was taken (a thread
    /// that blocks in a system call must not hold the rest back); past `minimumThreads`, a
    /// thread that had nothing to do for `retireAfter` ends.
    private var threadCount = 0
    let minimumThreads: Int
    let maximumThreads: Int
    let retireAfter: UInt64 = 1_000_000_000
    let stallCheck: UInt64 = 100_000_000
    /// Jobs handed out so far: progress, as the stall check sees it.
    private var taken: UInt64 = 0
    /// Jobs wait and no thread is free to take them.
    private var saturated: Bool { !ready.isEmpty && idle == 0 && !timing }

    init(minimumThreads: Int = 1, maximumThreads: Int = 1) {
        self.minimumThreads = minimumThreads
        self.maximumThreads = max(minimumThreads, maximumThreads)
        pthread_mutex_init(&mutex, nil)
        var attributes = pthread_condattr_t()
        pthread_condattr_init(&attributes)
        pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)
        pthread_cond_init(&idleCondition, &attributes)
        pthread_cond_init(&timerCondition, &attributes)
        pthread_cond_init(&monitorCondition, &attributes)
        pthread_condattr_destroy(&attributes)
    }

    var threads: Int {
        pthread_mutex_lock(&mutex)
        defer { pthread_mutex_unlock(&mutex) }
        return threadCount
    }

    /// Counts a thread that will call `next`; false when the queue has its maximum.
    func addThread(always: Bool = false) -> Bool {
        pthread_mutex_lock(&mutex)
        defer { pthread_mutex_unlock(&mutex) }
        guard always || threadCount < maximumThreads else { return false }
        threadCount += 1
        return true
    }

    /// Queues a job to run now.
    func append(_ job: Job) {
        pthread_mutex_lock(&mutex)
        defer { pthread_mutex_unlock(&mutex) }
        ready.append(job)
        wakeOne()
        if saturated, threadCount < maximumThreads { pthread_cond_signal(&monitorCondition) }
    }

    /// For the one thread that watches the others (`ThreadPoolExecutor`): returns true when
    /// jobs waited `stallCheck` while every thread was busy and none was taken, with the new
    /// thread already counted, which the caller then starts; false once stopped. While the
    /// threads keep up it waits with no timeout, so an idle pool has no timer.
    func waitForStall() -> Bool {
        pthread_mutex_lock(&mutex)
        defer { pthread_mutex_unlock(&mutex) }
        while !stopped {
            guard saturated, threadCount < maximumThreads else {
                pthread_cond_wait(&monitorCondition, &mutex)
                continue
            }
            let before = taken
            let deadline = monotonicNanoseconds() + stallCheck
            while !stopped, monotonicNanoseconds() < deadline { wait(&monitorCondition, until: deadline) }
            if saturated, taken == before, threadCount < maximumThreads {
                threadCount += 1
                return true
            }
        }
        return false
    }

    func append(_ job: Job, after nanoseconds: UInt64) {
        let deadline = monotonicNanoseconds().addingReportingOverflow(nanoseconds)
        let entry = (deadline: deadline.overflow ? UInt64.max : deadline.partialValue, job: job)
        pthread_mutex_lock(&mutex)
        defer { pthread_mutex_unlock(&mutex) }
        let index = later.firstIndex { $0.deadline <= entry.deadline } ?? later.endIndex
        later.insert(entry, at: index)
        guard index == later.endIndex - 1 else { return }
        // The new soonest deadline: the timing thread must wait less, or an idle one time it.
        if timing { pthread_cond_signal(&timerCondition) } else if idle > 0 { pthread_cond_signal(&idleCondition) }
    }

    /// The next job to run, waiting for one; nil once `stop` was called, or when this thread is
    /// past the minimum and had nothing to do for `retireAfter` (it is no longer counted).
    func next() -> Job? {
        pthread_mutex_lock(&mutex)
        defer { pthread_mutex_unlock(&mutex) }
        let idleSince = monotonicNanoseconds()
        while !stopped {
            let now = monotonicNanoseconds()
            if let due = later.last, due.deadline <= now {
                later.removeLast()
                if !ready.isEmpty || !later.isEmpty { wakeOne() }
                taken &+= 1
                return due.job
            }
            if let job = ready.popFirst() {
                if !ready.isEmpty || (!later.isEmpty && !timing) { wakeOne() }
                taken &+= 1
                return job
            }
            // A thread beyond the minimum ends once it found nothing to do for `retireAfter`
            // (at once, it would be started again for each job of a steady stream).
            let extra = threadCount > minimumThreads
            if extra, now >= idleSince + retireAfter {
                threadCount -= 1
                return nil
            }
            if let soonest = later.last?.deadline, !timing {
                timing = true
                wait(&timerCondition, until: extra ? min(soonest, idleSince + retireAfter) : soonest)
                timing = false
            } else {
                idle += 1
                if extra { wait(&idleCondition, until: idleSince + retireAfter) } else { pthread_cond_wait(&idleCondition, &mutex) }
                idle -= 1
            }
        }
        return nil
    }

    func stop() {
        pthread_mutex_lock(&mutex)
        stopped = true
        pthread_cond_broadcast(&idleCondition)
        pthread_cond_broadcast(&timerCondition)
        pthread_cond_broadcast(&monitorCondition)
        pthread_mutex_unlock(&mutex)
    }

    /// Wakes one waiting thread, an idle one first. Called with the mutex held.
    private func wakeOne() {
        if idle > 0 { pthread_cond_signal(&idleCondition) } else if timing { pthread_cond_signal(&timerCondition) }
    }

    private func wait(_ condition: inout pthread_cond_t, until deadline: UInt64) {
        var until = timespec(tv_sec: time_t(clamping: deadline / 1_000_000_000), tv_nsec: Int(deadline % 1_000_000_000))
        pthread_cond_timedwait(&condition, &mutex, &until)
    }
}

/// Nanoseconds in a delay; only `Duration` delays reach an executor (the standard clocks'
/// sleeps: a clock of one's own sleeps by itself). The delay runs on CLOCK_MONOTONIC for both
/// ContinuousClock and SuspendingClock: a box that suspends meanwhile wakes that much later.
func nanoseconds<D: DurationProtocol>(_ delay: D) -> UInt64 {
    guard let delay = delay as? Duration else { preconditionFailure("a delay that is not a Duration: \(D.self)") }
    let (seconds, attoseconds) = delay.components
    if seconds < 0 || (seconds == 0 && attoseconds <= 0) { return 0 }
    if seconds >= Int64.max / 1_000_000_000 - 1 { return UInt64.max }
    return UInt64(seconds) * 1_000_000_000 + UInt64(attoseconds / 1_000_000_000)
}

/// Runs a job as the standard global executor does (`swift_job_run` with the generic executor):
/// a task that then calls an actor that is free switches to it on this thread, where running it
/// "on" this executor would queue a job for every such hop.
@_silgen_name("swift_job_run")
private func swiftJobRun(_ job: UnownedJob, _ executor: UnownedSerialExecutor)

private func runOnGenericExecutor(_ job: UnownedJob) {
    // The generic executor's reference is all zeros (SerialExecutorRef::generic()).
    swiftJobRun(job, unsafeBitCast((0, 0) as (Int, Int), to: UnownedSerialExecutor.self))
}

func monotonicNanoseconds() -> UInt64 {
    var t = timespec()
    clock_gettime(CLOCK_MONOTONIC, &t)
    return UInt64(t.tv_sec) * 1_000_000_000 + UInt64(t.tv_nsec)
}

/// The default executor: a pool of threads, one per CPU (at least two), and up to four times
/// that while jobs wait behind threads that block.
final class ThreadPoolExecutor: TaskExecutor, SchedulingExecutor, @unchecked Sendable {
    static let shared = ThreadPoolExecutor(threads: max(2, Int(sysconf(Int32(_SC_NPROCESSORS_ONLN)))))
    static let threadName = "swift-tasks"
    let queue: JobQueue<UnownedJob>

    init(threads: Int) {
        queue = JobQueue(minimumThreads: threads, maximumThreads: threads * 4)
        for _ in 0..<threads where queue.addThread(always: true) { startThread() }
        // The watcher: a thread more while jobs wait behind threads that make no progress.
        if case .failure(let e) = startPlainThread(named: "swift-tasks-mon", { [self] in
            while queue.waitForStall() { startThread() }
        }) { preconditionFailure("cannot start the task threads' watcher: error \(e.code)") }
    }

    private func startThread() {
        if case .failure(let e) = startPlainThread(named: Self.threadName, { [self] in
            while let job = queue.next() { runOnGenericExecutor(job) }
        }) { preconditionFailure("cannot start a task thread: error \(e.code)") }
    }

    func enqueue(_ job: consuming ExecutorJob) { queue.append(UnownedJob(job)) }

    func enqueue<C: Clock>(_ job: consuming ExecutorJob, after delay: C.Duration, tolerance: C.Duration?, clock: C) {
        queue.append(UnownedJob(job), after: nanoseconds(delay))
    }

    /// Ends the threads; jobs still queued never run (for tests: the process's pool never stops).
    func stop() { queue.stop() }
}

/// The main actor's executor: its jobs, drained on the main thread.
final class MainThreadExecutor: MainExecutor, SchedulingExecutor, @unchecked Sendable {
    static let shared = MainThreadExecutor()
    let queue = JobQueue<UnownedJob>()
    private let thread = pthread_self()

    func enqueue(_ job: consuming ExecutorJob) { queue.append(UnownedJob(job)) }

    func enqueue<C: Clock>(_ job: consuming ExecutorJob, after delay: C.Duration, tolerance: C.Duration?, clock: C) {
        queue.append(UnownedJob(job), after: nanoseconds(delay))
    }

    func run() {
        _ = queue.addThread(always: true)
        while let job = queue.next() { job.runSynchronously(on: asUnownedSerialExecutor()) }
    }

    func stop() { queue.stop() }

    func isIsolatingCurrentContext() -> Bool? { pthread_equal(pthread_self(), thread) != 0 }

    func checkIsolated() {
        precondition(pthread_equal(pthread_self(), thread) != 0, "not on the main thread")
    }
}
