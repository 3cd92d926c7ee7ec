import CBoxkeySys
import Glibc

/// Runs `body` on a thread of its own, outside Swift concurrency: for work that waits in a
/// system call or on a condition variable (the task threads, the signal reader). Returns the
/// thread, detached unless `joinable`; the error number when none could be started.
@discardableResult
func startPlainThread(named name: String? = nil, joinable: Bool = false, _ body: @escaping () -> Void) -> Result<pthread_t, Errno> {
    final class Body {
        let name: String?
        let run: () -> Void
        init(_ name: String?, _ run: @escaping () -> Void) { self.name = name; self.run = run }
    }
    var thread = pthread_t()
    let rc = pthread_create(&thread, nil, { raw in
        let body = Unmanaged<Body>.fromOpaque(raw!).takeRetainedValue()
        if let name = body.name { boxkey_set_thread_name(name) }
        body.run()
        return nil
    }, Unmanaged.passRetained(Body(name, body)).toOpaque())
    guard rc == 0 else { return .failure(Errno(rc)) }
    if !joinable { pthread_detach(thread) }
    return .success(thread)
}

/// An error number, as pthread_create returns it.
struct Errno: Error {
    let code: Int32
    init(_ code: Int32) { self.code = code }
}
