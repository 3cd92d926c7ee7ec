import BoxkeyCore
import CPAM
import FoundationEssentials
import Glibc

/// Verifies a pushed password through the box's own PAM service, as root, for screen lockers
/// that run as the user and so cannot reach the root-only socket. The site's verifier still
/// decides (the password reaches `pam_unix`, `pam_sss`, ...); the box then unlocks the session
/// through logind's `UnlockSession`, which GNOME's and KDE's lockers honour and xss-lock or
/// swayidle pass on to the locker they started. A locker that ignores logind stays locked. Runs `pam_authenticate` and `pam_acct_mgmt` on a thread of its own: PAM
/// blocks (a failed `pam_unix` waits about 2 s) and must not hold a concurrency thread.
public struct PAMVerifier: Sendable {
    public let service: String

    public init(service: String) { self.service = service }

    public enum Verdict: Sendable, Equatable {
        case accepted
        case rejected(String)
    }

    public func verify(user: String, password: SecureBytes) async -> Verdict {
        await withCheckedContinuation { (c: CheckedContinuation<Verdict, Never>) in
            let service = service
            Self.onThreadOfItsOwn { c.resume(returning: Self.run(service: service, user: user, password: password)) }
        }
    }

    /// A detached pthread running `body` (Foundation's Thread, without Foundation).
    private static func onThreadOfItsOwn(_ body: @escaping @Sendable () -> Void) {
        final class Job { let body: @Sendable () -> Void; init(_ b: @escaping @Sendable () -> Void) { body = b } }
        var thread = pthread_t()
        let job = Unmanaged.passRetained(Job(body)).toOpaque()
        let rc = pthread_create(&thread, nil, { raw in
            Unmanaged<Job>.fromOpaque(raw!).takeRetainedValue().body()
            return nil
        }, job)
        if rc == 0 {
            pthread_detach(thread)
        } else {
            Unmanaged<Job>.fromOpaque(job).takeRetainedValue().body()  // no thread to be had: run here
        }
    }

    /// The conversation's state: the password, given once to the first hidden prompt.
    private final class Answer: PAMVerifierAnswerTaking {
        var password: SecureBytes?
        init(_ p: SecureBytes) { password = p }
        /// The password as a C string for PAM (which frees it), once.
        func take() -> UnsafeMutablePointer<CChar>? {
            guard let p = password else { return nil }
            password = nil
            let out = malloc(p.count + 1)!.assumingMemoryBound(to: CChar.self)
            p.withUnsafeBytes { b in for i in 0..<b.count { out[i] = CChar(bitPattern: b[i]) } }
            out[p.count] = 0
            return out
        }
    }

    private static func run(service: String, user: String, password: SecureBytes) -> Verdict {
        let answer = Answer(password)
        let data = Unmanaged.passRetained(answer)
        defer { data.release() }
        var conversation = pam_conv(conv: converse, appdata_ptr: data.toOpaque())
        var handle: OpaquePointer?
        guard pam_start(service, user, &conversation, &handle) == PAM_SUCCESS, let handle else {
            return .rejected("cannot start PAM service \(service)")
        }
        var rc = pam_authenticate(handle, Int32(PAM_SILENT))
        if rc == PAM_SUCCESS { rc = pam_acct_mgmt(handle, Int32(PAM_SILENT)) }
        let reason = rc == PAM_SUCCESS ? "" : String(cString: pam_strerror(handle, rc))
        pam_end(handle, rc)
        return rc == PAM_SUCCESS ? .accepted : .rejected(reason)
    }
}

/// Answers the first hidden prompt with the password (a malloc'd copy, which PAM frees after
/// the module wiped it); every other prompt gets no answer, so a stack that asks for more
/// than the password fails closed.
private let converse: @convention(c) (Int32, UnsafeMutablePointer<UnsafePointer<pam_message>?>?,
                                      UnsafeMutablePointer<UnsafeMutablePointer<pam_response>?>?, UnsafeMutableRawPointer?) -> Int32 = { count, messages, responses, data in
    guard count > 0, let messages, let responses, let data else { return PAM_CONV_ERR }
    let answer = Unmanaged<AnyObject>.fromOpaque(data).takeUnretainedValue()
    let replies = calloc(Int(count), MemoryLayout<pam_response>.size)!.assumingMemoryBound(to: pam_response.self)
    for i in 0..<Int(count) {
        guard let m = messages[i] else { continue }
        switch m.pointee.msg_style {
        case PAM_PROMPT_ECHO_OFF:
            guard let holder = answer as? PAMVerifierAnswerTaking, let secret = holder.take() else {
                free(replies)
                return PAM_CONV_ERR
            }
            replies[i].resp = secret
        case PAM_PROMPT_ECHO_ON:
            free(replies)
            return PAM_CONV_ERR
        default:
            break   // PAM_TEXT_INFO / PAM_ERROR_MSG: nobody to show them to
        }
    }
    responses.pointee = replies
    return PAM_SUCCESS
}

protocol PAMVerifierAnswerTaking: AnyObject { func take() -> UnsafeMutablePointer<CChar>? }
