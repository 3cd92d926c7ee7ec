import Glibc

/// After Enter at a proximity offer, while the module waits for that phone's push (under a
/// second, at most `timeout=`), the program's hidden prompt is over and its terminal echoes again: a password
/// typed then would show in clear. When the conversation is a terminal — stdin is the tty that
/// PAM_TTY names, as for console `login` — echo is off for that wait. If a push arrives it logs
/// the person in, and what was typed meanwhile is discarded, never handed to the shell that
/// follows; with no push the program's next prompt takes over, as it always does.
struct QuietTerminal {
    private var saved: termios?

    init(tty: String) {
        guard !tty.isEmpty, isatty(STDIN_FILENO) == 1, let name = ttyname(STDIN_FILENO) else { return }
        let expected = tty.hasPrefix("/dev/") ? tty : "/dev/" + tty
        guard String(cString: name) == expected else { return }
        var t = termios()
        guard tcgetattr(STDIN_FILENO, &t) == 0 else { return }
        saved = t
        t.c_lflag &= ~tcflag_t(ECHO | ECHONL)
        if tcsetattr(STDIN_FILENO, TCSANOW, &t) != 0 { saved = nil }
    }

    /// Echo as it was; with `discardTyped`, the keys typed during the wait are dropped.
    func restore(discardTyped: Bool) {
        guard var t = saved else { return }
        if discardTyped { tcflush(STDIN_FILENO, TCIFLUSH) }
        _ = tcsetattr(STDIN_FILENO, TCSANOW, &t)
    }
}
