import BoxkeyL10n
import CPAM
import Glibc

/// The few PAM calls the module makes, over the C API.
struct PAMHandle {
    let raw: OpaquePointer

    func item(_ type: Int32) -> String? {
        var value: UnsafeRawPointer?
        guard pam_get_item(raw, type, &value) == PAM_SUCCESS, let value else { return nil }
        let s = String(cString: value.assumingMemoryBound(to: CChar.self))
        return s.isEmpty ? nil : s
    }

    @discardableResult
    func setItem(_ type: Int32, _ bytes: [UInt8]) -> Int32 {
        var copy = bytes + [0]
        defer { for i in copy.indices { copy[i] = 0 } }
        return copy.withUnsafeBytes { pam_set_item(raw, type, $0.baseAddress) }
    }

    func env(_ name: String) -> String? {
        guard let v = pam_getenv(raw, name) else { return nil }
        let s = String(cString: v)
        return s.isEmpty ? nil : s
    }

    func log(_ priority: Int32, _ message: String) {
        boxkey_pam_log(raw, priority, "pam_boxkey: " + message)
    }

    /// Asks the person through the application's conversation, input hidden
    /// (PAM_PROMPT_ECHO_OFF). The answer's bytes are the caller's to wipe; nil when the
    /// conversation failed or gave no answer (the application has none, the person cancelled:
    /// Ctrl-D at a terminal is no answer, never Enter).
    func askHidden(_ text: String) -> [UInt8]? { ask(PAM_PROMPT_ECHO_OFF, text) }

    /// Asks with the answer shown (PAM_PROMPT_ECHO_ON): a user name.
    func askVisible(_ text: String) -> [UInt8]? { ask(PAM_PROMPT_ECHO_ON, text) }

    /// The application's prompt for a user name (PAM_USER_PROMPT), else Linux-PAM's "login: ".
    var userPrompt: String { item(PAM_USER_PROMPT) ?? (Translator.foreign(domain: "Linux-PAM", "login:") + " ") }

    private func ask(_ style: Int32, _ text: String) -> [UInt8]? {
        converse(style, text) { response -> [UInt8]? in
            guard let response, let answer = response.resp else { return nil }
            let n = strlen(answer)
            defer { memset(answer, 0, n) }
            return [UInt8](UnsafeRawBufferPointer(start: answer, count: n))
        } ?? nil
    }

    /// Shows a line to the user (PAM_TEXT_INFO) through the application's conversation.
    func info(_ text: String) {
        _ = converse(PAM_TEXT_INFO, text) { _ in () }
    }

    /// One message through the application's conversation; `read` sees the response (nil: the
    /// application gave none) before it is freed. nil when there is no conversation or it failed.
    private func converse<T>(_ style: Int32, _ text: String, read: (pam_response?) -> T) -> T? {
        var conv: UnsafeRawPointer?
        guard pam_get_item(raw, PAM_CONV, &conv) == PAM_SUCCESS, let conv else { return nil }
        let c = conv.assumingMemoryBound(to: pam_conv.self).pointee
        guard let fn = c.conv else { return nil }
        return text.withCString { cstring -> T? in
            var message = pam_message(msg_style: style, msg: cstring)
            return withUnsafePointer(to: &message) { m -> T? in
                var list: UnsafePointer<pam_message>? = m
                var response: UnsafeMutablePointer<pam_response>?
                let rc = fn(1, &list, &response, c.appdata_ptr)
                defer {
                    if let response {
                        if let r = response.pointee.resp { free(r) }
                        free(response)
                    }
                }
                guard rc == PAM_SUCCESS else { return nil }
                return read(response?.pointee)
            }
        }
    }
}
