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
/// The pool is as wide as libdispatch's (a thread per CPU, at least two), and, as there, code
/// that blocks holds one of its threads.
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

/// A queue of jobs and of jobs due later, guarded by one mutex; the threads that drain it wait
/// on its condition variable (CLOCK_MONOTONIC, so a clock step does not move a deadline).
final class JobQueue<Job>: @unchecked Sendable {
    private var mutex = pthread_mutex_t()
    private var condition = pthread_cond_t()
    private var ready = CircularBuffer<Job>()
    /// Sorted by deadline (nanoseconds of CLOCK_MONOTONIC), the soonest last: a daemon has a
    /// few sleeps pending at a time, so a sorted array beats a heap.
    private var later: [(deadline: UInt64, job: Job)] = []
    private var stopped = false

    init() {
        pthread_mutex_init(&mutex, nil)
        var attributes = pthread_condattr_t()
        pthread_condattr_init(&attributes)
        pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)
        pthread_cond_init(&condition, &attributes)
        pthread_condattr_destroy(&attributes)
    }

    func append(_ job: Job) {
        pthread_mutex_lock(&mutex)
        ready.append(job)
        pthread_cond_signal(&condition)
        pthread_mutex_unlock(&mutex)
    }

    func append(_ job: Job, after nanoseconds: UInt64) {
        let deadline = monotonicNanoseconds().addingReportingOverflow(nanoseconds)
        let entry = (deadline: deadline.overflow ? UInt64.max : deadline.partialValue, job: job)
        pthread_mutex_lock(&mutex)
        let index = later.firstIndex { $0.deadline <= entry.deadline } ?? later.endIndex
        later.insert(entry, at: index)
        // A waiting thread may be sleeping until a later deadline than this one.
        if index == later.endIndex - 1 { pthread_cond_signal(&condition) }
        pthread_mutex_unlock(&mutex)
    }

    /// The next job to run, waiting for one; nil once `stop` was called.
    func next() -> Job? {
        pthread_mutex_lock(&mutex)
        defer { pthread_mutex_unlock(&mutex) }
        while !stopped {
            if let due = later.last, due.deadline <= monotonicNanoseconds() {
                later.removeLast()
                // Others may be due too: another thread can take them meanwhile.
                if !later.isEmpty { pthread_cond_signal(&condition) }
                return due.job
            }
            if let job = ready.popFirst() { return job }
            if let soonest = later.last?.deadline {
                var until = timespec(tv_sec: Int(soonest / 1_000_000_000), tv_nsec: Int(soonest % 1_000_000_000))
                pthread_cond_timedwait(&condition, &mutex, &until)
            } else {
                pthread_cond_wait(&condition, &mutex)
            }
        }
        return nil
    }

    func stop() {
        pthread_mutex_lock(&mutex)
        stopped = true
        pthread_cond_broadcast(&condition)
        pthread_mutex_unlock(&mutex)
    }
}

/// Nanoseconds in a delay; only `Duration` delays reach an executor (the standard clocks'
/// sleeps: a clock of one's own sleeps by itself).
func nanoseconds<D: DurationProtocol>(_ delay: D) -> UInt64 {
    guard let delay = delay as? Duration else { preconditionFailure("a delay that is not a Duration: \(D.self)") }
    let (seconds, attoseconds) = delay.components
    if seconds < 0 || (seconds == 0 && attoseconds <= 0) { return 0 }
    if seconds >= Int64.max / 1_000_000_000 - 1 { return UInt64.max }
    return UInt64(seconds) * 1_000_000_000 + UInt64(attoseconds / 1_000_000_000)
}

func monotonicNanoseconds() -> UInt64 {
    var t = timespec()
    clock_gettime(CLOCK_MONOTONIC, &t)
    return UInt64(t.tv_sec) * 1_000_000_000 + UInt64(t.tv_nsec)
}

/// The default executor: a fixed pool of threads; each holds the pool until `stop`.
final class ThreadPoolExecutor: TaskExecutor, SchedulingExecutor, @unchecked Sendable {
    static let shared = ThreadPoolExecutor(threads: max(2, Int(sysconf(Int32(_SC_NPROCESSORS_ONLN)))))
    static let threadName = "swift-tasks"
    let queue = JobQueue<UnownedJob>()

    init(threads: Int) {
        for _ in 0..<threads {
            var thread = pthread_t()
            let rc = pthread_create(&thread, nil, { raw in
                let pool = Unmanaged<ThreadPoolExecutor>.fromOpaque(raw!).takeRetainedValue()
                boxkey_set_thread_name(ThreadPoolExecutor.threadName)
                while let job = pool.queue.next() { job.runSynchronously(on: pool.asUnownedTaskExecutor()) }
                return nil
            }, Unmanaged.passRetained(self).toOpaque())
            precondition(rc == 0, "cannot start the task threads: error \(rc)")
            pthread_detach(thread)
        }
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
        while let job = queue.next() { job.runSynchronously(on: asUnownedSerialExecutor()) }
    }

    func stop() { queue.stop() }

    func isIsolatingCurrentContext() -> Bool? { pthread_equal(pthread_self(), thread) != 0 }

    func checkIsolated() {
        precondition(pthread_equal(pthread_self(), thread) != 0, "not on the main thread")
    }
}
