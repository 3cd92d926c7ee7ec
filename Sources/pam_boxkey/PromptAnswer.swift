import CPAM
import Glibc

/// A conversation in front of the application's, installed once a push arrived. It notes
/// whether any later hidden prompt (PAM_PROMPT_ECHO_OFF) reached the person at the keyboard:
/// then the password the stack verified may be theirs, not the phone's (`try_first_pass`
/// after a wrong push), and the phone gets no credit.
///
/// With the `answer_prompt` option it also answers the first hidden prompt (one message) with
/// the pushed password, once. That exists for verifiers that always prompt and cannot take
/// PAM_AUTHTOK (pam_matrix); with use_first_pass verifiers it is not needed. It is off by
/// default because a stack that asks for something else first (a one-time code) would be
/// given the password.
final class PromptAnswer {
    private var password: UnsafeMutablePointer<CChar>?
    let original: pam_conv
    private var conversation: pam_conv
    let answerFirst: Bool
    /// A hidden prompt went to the person after the push.
    fileprivate(set) var personAnswered = false

    private init(original: pam_conv, password: [UInt8], answerFirst: Bool) {
        self.answerFirst = answerFirst
        self.original = original
        let p = UnsafeMutablePointer<CChar>.allocate(capacity: password.count + 1)
        for (i, b) in password.enumerated() { p[i] = CChar(bitPattern: b) }
        p[password.count] = 0
        self.password = p
        conversation = pam_conv(conv: nil, appdata_ptr: nil)
    }

    deinit { wipe() }

    static func install(on pamh: PAMHandle, password: [UInt8], answerFirst: Bool) -> PromptAnswer? {
        var item: UnsafeRawPointer?
        guard pam_get_item(pamh.raw, PAM_CONV, &item) == PAM_SUCCESS, let item else { return nil }
        var current = item.assumingMemoryBound(to: pam_conv.self).pointee
        // A retry on the same handle: wrap the application's conversation, not our own.
        if let fn = current.conv, unsafeBitCast(fn, to: UnsafeRawPointer.self) == unsafeBitCast(proxy, to: UnsafeRawPointer.self),
           let data = current.appdata_ptr {
            current = Unmanaged<PromptAnswer>.fromOpaque(data).takeUnretainedValue().original
        }
        let answer = PromptAnswer(original: current, password: answerFirst ? password : [], answerFirst: answerFirst)
        answer.conversation = pam_conv(conv: proxy, appdata_ptr: Unmanaged.passUnretained(answer).toOpaque())
        guard withUnsafePointer(to: &answer.conversation, { pam_set_item(pamh.raw, PAM_CONV, $0) }) == PAM_SUCCESS else { return nil }
        return answer
    }

    func uninstall(from pamh: PAMHandle) {
        var original = self.original
        _ = withUnsafePointer(to: &original) { pam_set_item(pamh.raw, PAM_CONV, $0) }
    }

    func wipe() {
        guard let p = password else { return }
        var i = 0
        while p[i] != 0 { p[i] = 0; i += 1 }
        p.deallocate()
        password = nil
    }

    /// The password as a malloc'd C string (PAM frees responses with free), then forgotten.
    fileprivate func take() -> UnsafeMutablePointer<CChar>? {
        guard let p = password else { return nil }
        let copy = strdup(p)
        wipe()
        return copy
    }
}

private let proxy: @convention(c) (Int32, UnsafeMutablePointer<UnsafePointer<pam_message>?>?,
                                   UnsafeMutablePointer<UnsafeMutablePointer<pam_response>?>?, UnsafeMutableRawPointer?) -> Int32 = { count, messages, responses, data in
    guard let data else { return PAM_CONV_ERR }
    let answer = Unmanaged<PromptAnswer>.fromOpaque(data).takeUnretainedValue()
    if answer.answerFirst, count == 1, let m = messages?[0], m.pointee.msg_style == PAM_PROMPT_ECHO_OFF, let responses,
       let secret = answer.take() {
        let r = calloc(1, MemoryLayout<pam_response>.size)!.assumingMemoryBound(to: pam_response.self)
        r.pointee.resp = secret
        r.pointee.resp_retcode = 0
        responses.pointee = r
        return PAM_SUCCESS
    }
    if let messages, (0..<Int(count)).contains(where: { messages[$0]?.pointee.msg_style == PAM_PROMPT_ECHO_OFF }) {
        answer.personAnswered = true
    }
    guard let fn = answer.original.conv else { return PAM_CONV_ERR }
    return fn(count, messages, responses, answer.original.appdata_ptr)
}
