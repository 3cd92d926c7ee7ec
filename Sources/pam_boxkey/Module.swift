import BoxkeyPAMWire
import BoxkeyL10n
import CPAM
import Glibc

// pam_boxkey: turns a phone's push into a normal PAM authentication. The module waits (with
// a bound) for boxkeyd to deliver a pushed user and password, sets PAM_USER and PAM_AUTHTOK,
// and lets the next module (pam_unix use_first_pass, pam_sss, ...) verify them; the stack's
// outcome goes back to the daemon, which tells the phone. Everything here is synchronous:
// no threads, no Dispatch, no Swift concurrency inside a host process's login stack.

private let pendingKey = "pam_boxkey_pending"

/// The module's words, in the application's locale (a module never sets the locale itself).
private let tr = Translator(domain: "pam_boxkey", besideExecutable: false)

/// A push that is being verified by the rest of the stack; reported to the daemon once.
final class PendingLogin {
    let client: PAMSocketClient
    let debug: Bool
    let raw: OpaquePointer
    /// Names this push when the session opens (`pam_sm_open_session`).
    let ticket: String
    var reported = false
    var answer: PromptAnswer?
    /// Escrow capture: the password typed at this module's prompt, sent to the daemon to seal
    /// if the stack accepts it (PAM clears PAM_AUTHTOK before the verdict hook runs).
    var captured: [UInt8]?

    deinit { wipeCaptured() }

    func wipeCaptured() {
        captured?.withUnsafeMutableBytes { if let b = $0.baseAddress { memset(b, 0, $0.count) } }
        captured = nil
    }
    /// The application's PAM_FAIL_DELAY function, which the verdict hook chains to.
    var applicationDelay: UnsafeRawPointer?

    init(client: PAMSocketClient, debug: Bool, raw: OpaquePointer, ticket: String) {
        self.client = client
        self.debug = debug
        self.raw = raw
        self.ticket = ticket
    }

    /// Learns the stack's verdict: Linux-PAM calls the PAM_FAIL_DELAY function with the final
    /// status at the end of every pam_authenticate ("always call the application's delay
    /// function ... indicate status", libpam/pam_delay.c). The application's own function, if
    /// any, is chained; otherwise the delay a module asked for is applied, as PAM would.
    func hookVerdict() {
        var current: UnsafeRawPointer?
        _ = pam_get_item(raw, PAM_FAIL_DELAY, &current)
        applicationDelay = current
        pthread_setspecific(pendingSlot, Unmanaged.passUnretained(self).toOpaque())
        _ = pam_set_item(raw, PAM_FAIL_DELAY, unsafeBitCast(verdictHook, to: UnsafeRawPointer.self))
    }

    func unhookVerdict() {
        _ = pam_set_item(raw, PAM_FAIL_DELAY, applicationDelay)
        if pthread_getspecific(pendingSlot) == Unmanaged.passUnretained(self).toOpaque() { pthread_setspecific(pendingSlot, nil) }
    }

    func report(accepted: Bool, reason: String, pamh: PAMHandle?) {
        guard !reported else { return }
        reported = true
        // Credit only for what the phone did: a success after the person answered a hidden
        // prompt (the verifier asking again after a wrong push) is not the phone's.
        let verdict: PAMRequest.Verdict = !accepted ? .rejected : (answer?.personAnswered == true ? .acceptedOther : .accepted)
        if accepted, let captured { try? client.send(.capturedPassword(captured)) }
        wipeCaptured()
        do {
            try client.send(.reportOutcome(verdict, reason: reason))
            _ = try client.receive(timeoutMilliseconds: 1000)
        } catch {
            pamh?.log(LOG_WARNING, "could not report the outcome to boxkeyd: \(error)")
        }
        client.close()
        answer?.wipe()
    }
}

@_cdecl("pam_sm_authenticate")
public func pam_sm_authenticate(_ raw: OpaquePointer?, _ flags: Int32, _ argc: Int32,
                                _ argv: UnsafeMutablePointer<UnsafePointer<CChar>?>?) -> Int32 {
    guard let raw else { return PAM_SYSTEM_ERR }
    let pamh = PAMHandle(raw: raw)
    let options = ModuleOptions(argc: argc, argv: argv)
    for arg in options.unknown { pamh.log(LOG_ERR, "unknown option \(arg)") }
    // A retry on the same handle (login asks again after "Login incorrect"): the earlier
    // attempt's conversation proxy goes, so nothing of it answers this attempt's prompts.
    _ = pam_set_data(raw, pendingKey, nil, nil)
    _ = pam_set_data(raw, typedKey, nil, nil)

    // A module before this one already has the password (pam_krb5 ranks above pam_boxkey in
    // pam-auth-update): the person typed it, so asking again would only delay them.
    var typed: UnsafeRawPointer?
    if pam_get_item(raw, PAM_AUTHTOK, &typed) == PAM_SUCCESS, typed != nil {
        if options.debug { pamh.log(LOG_DEBUG, "a password is already set: not offering phone login") }
        return options.unavailableCode
    }

    // A phone near the box cannot vouch for someone logging in over the network. A loopback
    // host goes to the daemon, which accepts it only when logind says the session is local.
    let remoteHost = pamh.item(PAM_RHOST) ?? ""
    if !remoteHost.isEmpty, !PAMWire.loopbackHosts.contains(remoteHost) {
        if options.debug { pamh.log(LOG_DEBUG, "remote session from \(remoteHost): not offering phone login") }
        return stepAside(pamh, options)
    }

    // Nobody named yet (a greeter's "other user"): who, first, as the program would ask. A
    // prompt for nobody takes no push (Enter there would log in whoever's push waited).
    var user = pamh.item(PAM_USER) ?? ""
    for _ in 0..<maxEmptyEnters where user.isEmpty {
        guard let name = pamh.askVisible(pamh.userPrompt) else { return PAM_CONV_ERR }
        guard !name.isEmpty else { continue }
        guard let typed = String(validating: name, as: UTF8.self), pamh.setItem(PAM_USER, name) == PAM_SUCCESS else { return PAM_USER_UNKNOWN }
        user = typed
    }
    guard !user.isEmpty else { return PAM_CONV_ERR }

    // Nobody is made to wait here: the module opens the prompt with the daemon, then asks for
    // the password at once. A phone's push for this prompt waits at the box until Enter is
    // pressed here with nothing typed.
    do {
        let client: PAMSocketClient
        let offered: (box: String, fingerprint: String, code: String, seconds: UInt32)
        do {
            client = try PAMSocketClient(path: options.socket)
            try client.send(.waitForPush(.init(service: pamh.item(PAM_SERVICE) ?? "", tty: pamh.item(PAM_TTY) ?? "",
                                               display: pamh.item(PAM_XDISPLAY) ?? "", remoteHost: remoteHost, expectedUser: user,
                                               timeoutMilliseconds: UInt32(options.timeoutSeconds * 1000))))
            // Not offered (sudo, a remote session, ...), or a daemon slower than this: step aside
            // without a word, so the password prompt comes at once.
            switch try client.receive(timeoutMilliseconds: firstAnswerMilliseconds) {
            case .prompt(let box, let fingerprint, let code, let seconds): offered = (box, fingerprint, code, seconds)
            case .notOffered(let why):
                if options.debug { pamh.log(LOG_DEBUG, "phone login not offered: \(why)") }
                return stepAside(pamh, options)
            default: return stepAside(pamh, options)
            }
        } catch {
            if options.debug { pamh.log(LOG_DEBUG, "boxkeyd: \(error)") }
            return stepAside(pamh, options)
        }
        // One message: greeters that show one at a time (lightdm-gtk-greeter) keep both lines.
        var lines = [tr("Box {box} — push from your phone, then press Enter here (box key {fingerprint})",
                        ("box", offered.box), ("fingerprint", offered.fingerprint))]
        if !offered.code.isEmpty {
            lines.append(tr("New phone? Pairing code {code} — run: boxkey pair {box} (valid {minutes} min)",
                            ("code", offered.code), ("box", offered.box), ("minutes", max(1, (offered.seconds + 59) / 60))))
        }
        pamh.info(lines.joined(separator: "\n"))
        return converse(client: client, user: user, box: offered.box, pamh: pamh, options: options)
    }
}

/// How long the daemon has to say whether phone login is offered here. It answers in
/// milliseconds; a slower one (hung, or logind not answering) is skipped, and the password
/// prompt comes after at most this.
private let firstAnswerMilliseconds: Int64 = 1000

/// The prompt with the daemon open: asks the person for the password, and takes a phone's push
/// when Enter is pressed with nothing typed.
private func converse(client: PAMSocketClient, user: String, box: String, pamh: PAMHandle, options: ModuleOptions) -> Int32 {
    for attempt in 0..<maxEmptyEnters {
        if attempt > 0 {
            pamh.info(tr("No phone has pushed to box {box} yet: push from your phone, then press Enter — or type the password", ("box", box)))
        }
        guard var answer = pamh.askHidden(passwordPrompt) else {
            // The person cancelled (Ctrl-D, the greeter's Cancel) or the program has no conversation.
            try? client.send(.cancel)
            return PAM_CONV_ERR
        }
        defer { answer.withUnsafeMutableBytes { if let b = $0.baseAddress { memset(b, 0, $0.count) } } }
        if !answer.isEmpty {
            // The person's own password, handed on as typed; a push that waited is let go.
            try? client.send(.cancel)
            guard pamh.setItem(PAM_AUTHTOK, answer) == PAM_SUCCESS else { return PAM_SYSTEM_ERR }
            // A verifier that always asks gets the same answer instead of asking twice.
            if options.answerPrompt { keepTyped(answer, on: pamh) }
            return options.unavailableCode
        }
        // Enter with nothing typed: the phone.
        let reply: PAMReply
        let terminal = QuietTerminal(tty: pamh.item(PAM_TTY) ?? "")
        do {
            try client.send(.intent)
            reply = try client.receive(timeoutMilliseconds: Int64(options.timeoutSeconds + 1) * 1000)
        } catch {
            terminal.restore(discardTyped: false)
            if options.debug { pamh.log(LOG_DEBUG, "boxkeyd: \(error)") }
            return stepAside(pamh, options)
        }
        terminal.restore(discardTyped: reply.pushedUser != nil)
        switch reply {
        case .noPush(.nothingYet), .noPush(.timedOut):
            continue
        case .noPush(let why):
            if options.debug { pamh.log(LOG_DEBUG, "no push: \(why)") }
            return stepAside(pamh, options)
        case .escrowCapture(let pushed, let ticket):
            return (escrowCapture(user: pushed, ticket: ticket, expected: user, client: client, pamh: pamh, options: options) ?? stepAside(pamh, options))
        case .keyLogin(let pushed, let ticket):
            return (keyLogin(user: pushed, ticket: ticket, expected: user, client: client, pamh: pamh, options: options) ?? stepAside(pamh, options))
        case .push(let pushed, let password, let ticket):
            return (passwordPush(user: pushed, password: password, ticket: ticket, expected: user, client: client, pamh: pamh, options: options))
        default:
            try? client.send(.cancel)
            return stepAside(pamh, options)
        }
    }
    // A conversation that answers Enter every time (a program without a person): give up.
    try? client.send(.cancel)
    return stepAside(pamh, options)
}

private let typedKey = "pam_boxkey_typed"

/// `answer_prompt` after a typed password: the next module's hidden prompt is answered with it,
/// until pam_end restores the conversation.
private func keepTyped(_ password: [UInt8], on pamh: PAMHandle) {
    guard let answer = PromptAnswer.install(on: pamh, password: password, answerFirst: true) else { return }
    let stored = Unmanaged.passRetained(answer).toOpaque()
    if pam_set_data(pamh.raw, typedKey, stored, typedCleanup) != PAM_SUCCESS {
        answer.uninstall(from: pamh)
        Unmanaged<PromptAnswer>.fromOpaque(stored).release()
    }
}

private let typedCleanup: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?, Int32) -> Void = { raw, data, _ in
    guard let data else { return }
    let answer = Unmanaged<PromptAnswer>.fromOpaque(data).takeRetainedValue()
    if let raw { answer.uninstall(from: PAMHandle(raw: raw)) }
    answer.wipe()
}

/// Enters with nothing typed and no phone before the module leaves the prompt to the stack.
private let maxEmptyEnters = 5

/// The application's own words for the password: Linux-PAM's "Password: ", in its locale.
private var passwordPrompt: String { Translator.foreign(domain: "Linux-PAM", "Password: ") }

/// No phone here: step aside, having asked for the password when told to (ask_password).
private func stepAside(_ pamh: PAMHandle, _ options: ModuleOptions) -> Int32 {
    if options.askPassword {
        var token: UnsafePointer<CChar>?
        let rc = pam_get_authtok(pamh.raw, PAM_AUTHTOK, &token, nil)
        if rc != PAM_SUCCESS, options.debug { pamh.log(LOG_DEBUG, "asking for the password: \(String(cString: pam_strerror(pamh.raw, rc)))") }
    }
    return options.unavailableCode
}

/// A pushed password: PAM_USER and PAM_AUTHTOK for the verifier after this module.
private func passwordPush(user: String, password: [UInt8], ticket: String, expected: String, client: PAMSocketClient,
                          pamh: PAMHandle, options: ModuleOptions) -> Int32 {
    // Wipe the one buffer `reply` and `password` share, in place: a plain write would copy
    // it first (copy on write) and wipe only the copy.
    defer { password.withUnsafeBufferPointer { if let b = $0.baseAddress { memset(UnsafeMutableRawPointer(mutating: b), 0, $0.count) } } }
    if case .refused(let result) = claim(user, expected: expected, what: "push", client: client, pamh: pamh) { return result ?? stepAside(pamh, options) }
    guard pamh.setItem(PAM_AUTHTOK, password) == PAM_SUCCESS else {
        try? client.send(.reportOutcome(.rejected, reason: "the login stack failed"))
        return PAM_SYSTEM_ERR
    }
    let pending = PendingLogin(client: client, debug: options.debug, raw: pamh.raw, ticket: ticket)
    pending.answer = PromptAnswer.install(on: pamh, password: password, answerFirst: options.answerPrompt)
    guard keep(pending, on: pamh) else { return PAM_SYSTEM_ERR }
    pamh.log(LOG_INFO, "credentials received from a phone")
    // PAM_IGNORE, not PAM_SUCCESS: the module's result never counts towards the stack's.
    // Only the verifier after it decides, whatever the control lines around it say (with
    // success=ok, a verifier whose failure the stack ignores would have let any pushed
    // password in).
    return PAM_IGNORE
}

/// Whether a key login or capture may take the prompt for `user`; `refused` carries what the
/// caller returns (nil: step aside to the password prompt).
private enum Claim { case claimed, refused(Int32?) }

/// Takes `user` as the login's PAM_USER, unless the prompt is for someone else (a locker).
private func claim(_ user: String, expected: String, what: String, client: PAMSocketClient, pamh: PAMHandle) -> Claim {
    if !expected.isEmpty, expected != user {
        pamh.log(LOG_NOTICE, "refusing a \(what) for another user: this prompt is for \(expected)")
        try? client.send(.reportOutcome(.rejected, reason: "this prompt is for another user"))
        return .refused(nil)
    }
    guard pamh.setItem(PAM_USER, Array(user.utf8)) == PAM_SUCCESS else {
        try? client.send(.reportOutcome(.rejected, reason: "the login stack failed"))
        return .refused(PAM_SYSTEM_ERR)
    }
    return .claimed
}

/// Hooks the verdict and hands `pending` to PAM, which frees it at pam_end (`pendingCleanup`).
private func keep(_ pending: PendingLogin, on pamh: PAMHandle) -> Bool {
    pending.hookVerdict()
    let stored = Unmanaged.passRetained(pending).toOpaque()
    guard pam_set_data(pamh.raw, pendingKey, stored, pendingCleanup) == PAM_SUCCESS else {
        Unmanaged<PendingLogin>.fromOpaque(stored).release()
        return false
    }
    return true
}

/// Key mode: the daemon vouches that an enrolled phone asked, with its person's intent, to log
/// `user` in here. Success, and the stack's end result goes back to the phone as for a push;
/// nil: refused, step aside to the password prompt.
private func keyLogin(user: String, ticket: String, expected: String, client: PAMSocketClient, pamh: PAMHandle, options: ModuleOptions) -> Int32? {
    guard options.keyLogins else {
        pamh.log(LOG_NOTICE, "refusing a key login: this stack line has no `key` option")
        try? client.send(.reportOutcome(.rejected, reason: "this login stack does not take key logins"))
        return nil
    }
    if case .refused(let result) = claim(user, expected: expected, what: "key login", client: client, pamh: pamh) { return result }
    let pending = PendingLogin(client: client, debug: options.debug, raw: pamh.raw, ticket: ticket)
    guard keep(pending, on: pamh) else { return PAM_SYSTEM_ERR }
    pamh.log(LOG_INFO, "key login from an enrolled phone for \(user)")
    return PAM_SUCCESS
}

/// Escrow mode, no sealed copy yet: the person types the password here, once, with the phone
/// present; it goes on to the stack as PAM_AUTHTOK (and answers the verifier's prompt with
/// `answer_prompt`), and on success to the daemon, which seals it for the phone. nil: step aside.
private func escrowCapture(user: String, ticket: String, expected: String, client: PAMSocketClient, pamh: PAMHandle, options: ModuleOptions) -> Int32? {
    if case .refused(let result) = claim(user, expected: expected, what: "escrow capture", client: client, pamh: pamh) { return result }
    pamh.info(tr("{user}'s phone is here: type the password once, and the box keeps it sealed for that phone", ("user", user)))
    var token: UnsafePointer<CChar>?
    guard pam_get_authtok(pamh.raw, PAM_AUTHTOK, &token, nil) == PAM_SUCCESS, let token, token.pointee != 0 else {
        try? client.send(.reportOutcome(.rejected, reason: "no password was typed"))
        return nil
    }
    let pending = PendingLogin(client: client, debug: options.debug, raw: pamh.raw, ticket: ticket)
    pending.captured = [UInt8](UnsafeRawBufferPointer(start: token, count: strlen(token)))
    pending.answer = PromptAnswer.install(on: pamh, password: pending.captured!, answerFirst: options.answerPrompt)
    guard keep(pending, on: pamh) else { return PAM_SYSTEM_ERR }
    pamh.log(LOG_INFO, "escrow capture for \(user): the typed password goes to the stack")
    // As after a push: the verifier after this module decides.
    return PAM_IGNORE
}

/// At pam_end (or when a retry replaces the data): reports the stack's final status if the
/// module has not reported it yet, restores the conversation, and frees the context.
private let pendingCleanup: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?, Int32) -> Void = { raw, data, status in
    guard let data else { return }
    let pending = Unmanaged<PendingLogin>.fromOpaque(data).takeRetainedValue()
    let handle = raw.map { PAMHandle(raw: $0) }
    if raw != nil { pending.unhookVerdict() }
    if (status & PAM_DATA_REPLACE) != 0 {
        pending.report(accepted: false, reason: "the password was not accepted", pamh: handle)
    } else {
        let code = status & ~PAM_DATA_SILENT
        pending.report(accepted: code == PAM_SUCCESS, reason: code == PAM_SUCCESS ? "" : String(cString: pam_strerror(raw, code)), pamh: handle)
    }
    if let handle { pending.answer?.uninstall(from: handle) }
}

/// The pending login of the pam_authenticate running on this thread (the stack and its delay
/// hook run on one thread; the hook gets no other context).
let pendingSlot: pthread_key_t = {
    var key = pthread_key_t()
    pthread_key_create(&key, nil)
    return key
}()

private let verdictHook: @convention(c) (Int32, UInt32, UnsafeMutableRawPointer?) -> Void = { status, delay, appdata in
    guard let slot = pthread_getspecific(pendingSlot) else {
        if status != PAM_SUCCESS, delay > 0 { usleep(delay) }
        return
    }
    let pending = Unmanaged<PendingLogin>.fromOpaque(slot).takeUnretainedValue()
    pending.unhookVerdict()
    pending.report(accepted: status == PAM_SUCCESS,
                   reason: status == PAM_SUCCESS ? "" : String(cString: pam_strerror(pending.raw, status)), pamh: PAMHandle(raw: pending.raw))
    if let application = pending.applicationDelay {
        typealias DelayFunction = @convention(c) (Int32, UInt32, UnsafeMutableRawPointer?) -> Void
        let chained = unsafeBitCast(application, to: DelayFunction.self)
        // The application's function expects its own conversation data, not our proxy's.
        chained(status, delay, pending.answer?.original.appdata_ptr ?? appdata)
    } else if status != PAM_SUCCESS, delay > 0 {
        usleep(delay)
    }
}

/// Reports success as soon as the application goes on to establish credentials (login,
/// greeters, screen lockers all do this only after authentication and account checks passed).
private func reportAccepted(_ raw: OpaquePointer) {
    var data: UnsafeRawPointer?
    guard pam_get_data(raw, pendingKey, &data) == PAM_SUCCESS, let data else { return }
    Unmanaged<PendingLogin>.fromOpaque(data).takeUnretainedValue().report(accepted: true, reason: "", pamh: PAMHandle(raw: raw))
}

@_cdecl("pam_sm_setcred")
public func pam_sm_setcred(_ raw: OpaquePointer?, _ flags: Int32, _ argc: Int32,
                           _ argv: UnsafeMutablePointer<UnsafePointer<CChar>?>?) -> Int32 {
    guard let raw else { return PAM_SYSTEM_ERR }
    if UInt32(bitPattern: flags) & UInt32(bitPattern: Int32(PAM_ESTABLISH_CRED | PAM_REINITIALIZE_CRED | PAM_REFRESH_CRED)) != 0 { reportAccepted(raw) }
    return PAM_SUCCESS
}

@_cdecl("pam_sm_acct_mgmt")
public func pam_sm_acct_mgmt(_ raw: OpaquePointer?, _ flags: Int32, _ argc: Int32,
                             _ argv: UnsafeMutablePointer<UnsafePointer<CChar>?>?) -> Int32 {
    // Account policy belongs to the site's modules; this module has nothing to add.
    PAM_IGNORE
}

/// Tells the daemon which logind session the user now has, so walk-away acts on it.
@_cdecl("pam_sm_open_session")
public func pam_sm_open_session(_ raw: OpaquePointer?, _ flags: Int32, _ argc: Int32,
                                _ argv: UnsafeMutablePointer<UnsafePointer<CChar>?>?) -> Int32 {
    guard let raw else { return PAM_SYSTEM_ERR }
    reportAccepted(raw)
    let pamh = PAMHandle(raw: raw)
    let options = ModuleOptions(argc: argc, argv: argv)
    // Only what pam_systemd put in the PAM environment, never the process environment (the
    // caller's to set); the daemon still checks with logind whose session it is.
    guard let session = pamh.env("XDG_SESSION_ID"), let user = pamh.item(PAM_USER) else {
        if options.debug { pamh.log(LOG_DEBUG, "no XDG_SESSION_ID in the PAM environment (is pam_systemd before pam_boxkey in the session stack?)") }
        return PAM_SUCCESS
    }
    var data: UnsafeRawPointer?
    let ticket = pam_get_data(raw, pendingKey, &data) == PAM_SUCCESS && data != nil
        ? Unmanaged<PendingLogin>.fromOpaque(data!).takeUnretainedValue().ticket : ""
    send(.openSession(user: user, sessionID: session, service: pamh.item(PAM_SERVICE) ?? "", ticket: ticket), options: options, pamh: pamh)
    return PAM_SUCCESS
}

@_cdecl("pam_sm_close_session")
public func pam_sm_close_session(_ raw: OpaquePointer?, _ flags: Int32, _ argc: Int32,
                                 _ argv: UnsafeMutablePointer<UnsafePointer<CChar>?>?) -> Int32 {
    guard let raw else { return PAM_SYSTEM_ERR }
    let pamh = PAMHandle(raw: raw)
    let options = ModuleOptions(argc: argc, argv: argv)
    if let session = pamh.env("XDG_SESSION_ID") {
        send(.closeSession(sessionID: session), options: options, pamh: pamh)
    }
    return PAM_SUCCESS
}

/// One request and its acknowledgement; a session never fails because the daemon is away.
private func send(_ request: PAMRequest, options: ModuleOptions, pamh: PAMHandle) {
    do {
        let client = try PAMSocketClient(path: options.socket)
        try client.send(request)
        _ = try client.receive(timeoutMilliseconds: 1000)
    } catch {
        if options.debug { pamh.log(LOG_DEBUG, "boxkeyd: \(error)") }
    }
}
