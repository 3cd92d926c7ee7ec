import BoxkeyPAMWire
import CPAM

/// Module arguments from the PAM configuration line (pam_boxkey(8)).
struct ModuleOptions {
    /// After Enter, the longest wait for the push of the phone whose proximity offer is at the
    /// prompt: default 10, clamped to 5...600 (a huge value must not trap inside the host
    /// process). Nobody waits for a phone that is not coming: otherwise Enter is answered at once.
    var timeoutSeconds = 10
    var socket = PAMWire.defaultSocketPath
    var debug = false
    /// Return PAM_IGNORE instead of PAM_AUTHINFO_UNAVAIL when no push is used.
    var ignoreUnavailable = false
    /// Also answer the next module's first hidden prompt with the pushed password, for
    /// verifiers that always ask and have no use_first_pass (pam_matrix).
    var answerPrompt = false
    /// When no push is used, ask for the password here (pam_get_authtok) and leave it for the
    /// next module. pam-auth-update gives the modules after the first one use_first_pass
    /// (pam_sss, pam_krb5, pam_ldap), which never ask: without this they would fail every
    /// password login. The pam-auth-update profile sets it.
    var askPassword = false
    /// Key mode: return PAM_SUCCESS for a key login the daemon hands over (an enrolled phone,
    /// a user and service the box puts in key mode), so the line must be `sufficient` or
    /// `[success=done ...]`. Without it a key login is refused here.
    var keyLogins = false
    var unknown: [String] = []

    /// What the module returns when no push is used.
    var unavailableCode: Int32 { ignoreUnavailable ? PAM_IGNORE : PAM_AUTHINFO_UNAVAIL }

    static let minimumTimeout = 5
    static let maximumTimeout = 600

    init(argc: Int32, argv: UnsafeMutablePointer<UnsafePointer<CChar>?>?) {
        for i in 0..<Int(argc) {
            guard let raw = argv?[i] else { continue }
            let arg = String(cString: raw)
            if arg.hasPrefix("timeout=") {
                // Out-of-range and unparsable numbers clamp; they never reach an integer conversion that traps.
                let digits = arg.dropFirst(8)
                let n = Int(digits) ?? (digits.allSatisfy(\.isNumber) && !digits.isEmpty ? Self.maximumTimeout : Self.minimumTimeout)
                timeoutSeconds = min(max(n, Self.minimumTimeout), Self.maximumTimeout)
            } else if arg.hasPrefix("socket="), arg.count > 7 {
                socket = String(arg.dropFirst(7))
            } else if arg == "debug" {
                debug = true
            } else if arg == "ignore_unavailable" {
                ignoreUnavailable = true
            } else if arg == "answer_prompt" {
                answerPrompt = true
            } else if arg == "key" {
                keyLogins = true
            } else if arg == "ask_password" {
                askPassword = true
            } else {
                unknown.append(arg)
            }
        }
    }
}
