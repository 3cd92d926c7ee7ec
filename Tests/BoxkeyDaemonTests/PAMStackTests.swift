@testable import BoxkeyDaemon
import Testing

/// `boxkeyd doctor` reads each phone-login service's auth stack the way libpam does and says
/// whether pam_boxkey sits where it works.
@Suite struct PAMStackTests {
    /// Debian 12 after `pam-auth-update` with the boxkey profile: /etc/pam.d/login includes common-auth.
    let debian: [String: String] = [
        "login": """
            auth       optional   pam_faildelay.so  delay=3000000
            auth       requisite  pam_nologin.so
            @include common-auth
            account    required   pam_access.so
            """,
        "common-auth": """
            # here are the per-package modules (the "Primary" block)
            auth\t[success=ok default=ignore]\tpam_boxkey.so timeout=30
            auth\t[success=1 default=ignore]\tpam_unix.so nullok try_first_pass
            auth\trequisite\t\t\tpam_deny.so
            auth\trequired\t\t\tpam_permit.so
            """,
    ]

    func verdict(_ files: [String: String], _ service: String = "login") -> PAMStack.Verdict? {
        PAMStack.authLines(service) { files[$0] }.map(PAMStack.judge)
    }

    @Test func debiansStackWithTheProfileIsGood() {
        let lines = PAMStack.authLines("login") { debian[$0] }!
        #expect(lines.map(\.name) == ["pam_faildelay", "pam_nologin", "pam_boxkey", "pam_unix", "pam_deny", "pam_permit"])
        #expect(verdict(debian) == .good(verifier: "pam_unix"))
    }

    @Test func aMissingFileIsNil() {
        #expect(verdict(debian, "gdm-password") == nil)
    }

    @Test func withoutTheProfileTheModuleIsAbsent() {
        var files = debian
        files["common-auth"] = "auth [success=1 default=ignore] pam_unix.so nullok\nauth requisite pam_deny.so\n"
        #expect(verdict(files) == .absent)
    }

    @Test func aPasswordModuleThatAsksAgainIgnoresThePush() {
        var files = debian
        files["common-auth"] = "auth [success=ok default=ignore] pam_boxkey.so\nauth [success=1 default=ignore] pam_unix.so nullok\n"
        #expect(verdict(files) == .verifierIgnoresPush("pam_unix"))
        // answer_prompt: the module answers that question itself with the pushed password.
        files["common-auth"] = "auth [success=ok default=ignore] pam_boxkey.so answer_prompt\nauth required pam_unix.so nullok\n"
        #expect(verdict(files) == .good(verifier: "pam_unix"))
    }

    /// The dangerous ones: a stack where the module's own success logs in, or nothing after it
    /// checks the password.
    @Test func aStackNothingVerifiesIsFlagged() {
        #expect(verdict(["login": "auth sufficient /lib/security/pam_boxkey.so\nauth required pam_unix.so try_first_pass\n"]) == .endsStack(control: "sufficient"))
        #expect(verdict(["login": "auth [success=done default=ignore] pam_boxkey.so\n"]) == .endsStack(control: "[success=done default=ignore]"))
        #expect(verdict(["login": "auth [success=ok default=ignore] pam_boxkey.so\nauth required pam_permit.so\n"]) == .noVerifierAfter)
    }

    @Test func includeSubstackAndDashAuthAreFollowed() {
        let files = [
            "gdm-password": "-auth optional pam_gnome_keyring.so\nauth substack common-auth\n",
            "common-auth": "auth [success=ok  default=ignore] pam_boxkey.so \\\n  timeout=30 ask_password\nauth required pam_sss.so use_first_pass\n",
        ]
        #expect(verdict(files, "gdm-password") == .good(verifier: "pam_sss"))
        #expect(PAMStack.authLines("gdm-password") { files[$0] }![1].arguments == ["timeout=30", "ask_password"])
    }

    /// What an attacker's review found doctor called "ok".
    @Test func jumpsCaseAndLockoutsAreFlagged() {
        let unix = "auth [success=1 default=ignore] pam_unix.so try_first_pass\nauth requisite pam_deny.so\nauth required pam_permit.so\n"
        #expect(verdict(["login": "auth [success=2 default=ignore] pam_boxkey.so\n" + unix]) == .endsStack(control: "[success=2 default=ignore]"))
        #expect(verdict(["login": "AUTH SUFFICIENT pam_boxkey.so\n" + unix]) == .endsStack(control: "sufficient"))
        #expect(verdict(["login": "auth requisite pam_boxkey.so\n" + unix]) == .failsWithoutPush(control: "requisite"))
        #expect(verdict(["login": "auth optional pam_boxkey.so\nauth optional pam_unix.so try_first_pass\nauth required pam_permit.so\n"]) == .verifierOptional("pam_unix"))
        #expect(verdict(["login": "auth optional pam_boxkey.so\nauth optional pam_boxkey.so\n" + unix]) == .twice)
        // pam-auth-update gives pam_sss use_first_pass after pam_boxkey: without ask_password,
        // nothing asks for the password when no push comes.
        let sss = "auth [success=1 new_authtok_reqd=done default=ignore] pam_sss.so use_first_pass\nauth requisite pam_deny.so\n"
        #expect(verdict(["login": "auth [success=ok default=ignore] pam_boxkey.so timeout=30\n" + sss]) == .lockout("pam_sss"))
        #expect(verdict(["login": "auth [success=ok default=ignore] pam_boxkey.so timeout=30 ask_password\n" + sss]) == .good(verifier: "pam_sss"))
        // The second review: spaces around "=", case inside [...], no default, a trailing "\ ".
        #expect(verdict(["login": "auth [success = done default = ignore] pam_boxkey.so\n" + unix]) == .endsStack(control: "[success=done default=ignore]"))
        #expect(verdict(["login": "auth [Success=ok Default=ignore] pam_boxkey.so\n" + unix]) == .failsWithoutPush(control: "[Success=ok Default=ignore]"))
        #expect(verdict(["login": "auth [success=ok] pam_boxkey.so\n" + unix]) == .failsWithoutPush(control: "[success=ok]"))
        // The packaged profile: conv_err=die stops the stack only when the person ended the
        // conversation (Ctrl-D), never for want of a push.
        #expect(verdict(["login": "auth [success=ok conv_err=die default=ignore] pam_boxkey.so ask_password\n" + unix]) == .good(verifier: "pam_unix"))
        let continued = PAMStack.authLines("login") { ["login": "auth [success=ok default=ignore] pam_boxkey.so \\  \n  ask_password\n" + unix][$0] }!
        #expect(continued[0].arguments == ["ask_password"])
    }

    @Test func aModuleAfterThePasswordPromptIsLate() {
        #expect(verdict(["login": "auth required pam_unix.so\nauth optional pam_boxkey.so\n"]) == .afterVerifier("pam_unix"))
    }

    @Test func includeLoopsEnd() {
        #expect(verdict(["login": "@include login\nauth required pam_unix.so\n"]) == .absent)
    }
}
