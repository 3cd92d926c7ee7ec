"""Console login: getty's agetty and `login` on a real virtual console (tty1..tty3 of the
kernel's, the root's getty@ttyN), PAM through the installed pam-auth-update profile, real
logind. What a person sees on the screen and when. Debian 12's `login` is shadow's; Debian 13's
is util-linux's (the `login` package moved), which differs in what Ctrl-C does."""
import json
import os
import re
import time

import pytest

from conftest import (PASSWORDS, Console, Phone, configure_box, figure, inside, journal, journal_cursor,
                      no_password_in_logs, session, sessions_of, wait_for)

PASSWORD = PASSWORDS["alice"]
SUITE = os.environ.get("BOXKEY_BOX_SUITE", "bookworm")


def open_prompts():
    return json.loads(inside("boxkeyd", "status", "--json").stdout)["prompts"]


def at_password_prompt(tty, user="alice"):
    """`user` typed at getty's login:, and the seconds until "Password:" was on the screen."""
    tty.login_prompt()
    before = tty.count("Password:")
    tty.type(user + "\n")
    try:
        return tty.wait_for_more("Password:", before)
    except AssertionError as e:
        # What the console's programs were doing, and the last of the journal: the evidence
        # for a prompt that did not come (once seen in a run, and not since).
        ps = inside("ps", "-o", "pid,stat,wchan:24,etime,args", "-t", f"tty{tty.n}", check=False).stdout
        log = inside("journalctl", "-n", "40", "-o", "short-monotonic", "--no-pager", check=False).stdout
        raise AssertionError(f"{e}\n--- on tty{tty.n}:\n{ps}\n--- the journal:\n{log}") from None


def shell(tty, user="alice", timeout=10.0):
    return wait_for(lambda: f"{user}@boxkey-box:~$" in tty.screen(), timeout=timeout, interval=0.005,
                    what=lambda: f"{user}'s shell on tty{tty.n}; the screen:\n{tty.screen()}")


def logged_in_by_phone(tty, alice):
    """alice at `tty` by phone (push, then Enter there), the phone staying as the presence
    link: its `boxkey login`, returned."""
    at_password_prompt(tty)
    phone = alice.background("login")
    alice.waits_for_enter(phone)
    tty.type("\n")
    shell(tty)
    wait_for(lambda: "Staying connected" in phone.said(), what="the presence link")
    return phone


def log_out(tty):
    tty.type("exit\n")
    tty.login_prompt()


@pytest.fixture
def tty1(alice):
    tty = Console(1)
    tty.reset()
    yield tty
    tty.reset()


def test_the_password_prompt_is_on_screen_at_once_and_takes_the_password(tty1):
    # Without Boxkey first (the profile off): the time login itself takes.
    inside("pam-auth-update", "--package", "--remove", "boxkey")
    try:
        bare = at_password_prompt(tty1)
        tty1.type(PASSWORD + "\n")
        shell(tty1)
        log_out(tty1)
    finally:
        inside("pam-auth-update", "--package", "--enable", "boxkey")
    waits = []
    for _ in range(3):
        waits.append(at_password_prompt(tty1))
        screen = tty1.screen()
        assert "Box 4821" in screen and "push from your phone, then press Enter" in screen, screen
        typed = time.monotonic()
        tty1.type(PASSWORD + "\n")
        shell(tty1)
        figure("console_typed_password_to_shell_s", round(time.monotonic() - typed, 3))
        assert PASSWORD not in tty1.screen()
        log_out(tty1)
    figure("console_login_to_password_prompt_s", round(max(waits), 3))
    figure("console_login_to_password_prompt_without_boxkey_s", round(bare, 3))
    assert max(waits) < 0.5, waits
    no_password_in_logs()


def test_a_push_then_enter_logs_in(tty1, alice):
    at_password_prompt(tty1)
    phone = alice.background("login", "--no-stay")
    assert "login on tty1" in alice.waits_for_enter(phone)
    enter = time.monotonic()
    tty1.type("\n")
    shell(tty1)
    figure("console_enter_to_shell_s", round(time.monotonic() - enter, 3))
    assert phone.wait(30) == 0
    assert "Logged in to box 4821 as alice: login on tty1" in phone.said()
    [sid] = sessions_of("alice")
    props = session(sid, "TTY", "Type", "Remote", "Service")
    assert props == {"TTY": "tty1", "Type": "tty", "Remote": "no", "Service": "login"}, props
    assert f"session {sid} (alice, seat0 tty1) registered by login for phone" in journal()
    assert PASSWORD not in tty1.screen()
    log_out(tty1)
    no_password_in_logs()


def test_enter_before_the_phone_says_so_and_asks_again(tty1, alice):
    at_password_prompt(tty1)
    before = tty1.count("Password:")
    start = time.monotonic()
    tty1.type("\n")
    tty1.wait_for_more("Password:", before)
    assert time.monotonic() - start < 0.5
    assert "No phone has pushed to box 4821 yet" in tty1.screen()
    phone = alice.background("login", "--no-stay")
    alice.waits_for_enter(phone)
    tty1.type("\n")
    shell(tty1)
    assert phone.wait(30) == 0
    log_out(tty1)


def test_ctrl_d_at_the_prompt_is_a_failed_login_and_closes_the_prompt(tty1):
    at_password_prompt(tty1)
    assert len(open_prompts()) == 1
    before = tty1.count("Login incorrect")
    tty1.type("\x04")
    tty1.wait_for_more("Login incorrect", before)
    # One Ctrl-D, one failed attempt: no second password prompt from pam_unix.
    assert tty1.screen().split("Login incorrect")[-2].count("Password:") == 1
    wait_for(lambda: open_prompts() == [], what="the prompt to close at the box")


def test_ctrl_c_at_the_prompt_does_what_login_does_and_the_box_follows(tty1):
    at_password_prompt(tty1)
    tty1.type("\x03")
    if SUITE == "bookworm":
        # shadow's login (Debian 12) has no SIGINT handler: it ends, getty starts again.
        tty1.login_prompt()
        wait_for(lambda: open_prompts() == [], what="the prompt to close at the box")
        return
    # util-linux's login (Debian 13's `login` package) ignores SIGINT and SIGQUIT from its
    # start: Ctrl-C does nothing, the prompt stays on screen and open at the box.
    time.sleep(1)
    assert tty1.screen().splitlines()[-1].endswith("Password:"), tty1.screen()
    assert len(open_prompts()) == 1
    before = tty1.count("Login incorrect")
    tty1.type("\x04")
    tty1.wait_for_more("Login incorrect", before)
    wait_for(lambda: open_prompts() == [], what="the prompt to close at the box")


def test_a_password_typed_while_a_push_waits_is_the_persons(tty1, alice):
    at_password_prompt(tty1)
    phone = alice.background("login", "--no-stay")
    alice.waits_for_enter(phone)
    tty1.type(PASSWORD + "\n")
    shell(tty1)
    assert phone.wait(30) != 0
    assert "went on without the phone" in phone.said()
    log_out(tty1)


def test_a_push_with_prompts_on_two_consoles_for_alice_is_refused_and_both_still_work(tty1, alice):
    tty2 = Console(2)
    tty2.reset()  # logind starts a getty on tty2 only when someone switches there
    try:
        at_password_prompt(tty1)
        at_password_prompt(tty2)
        r = alice("login", "--no-stay")
        assert r.returncode != 0 and "more than one prompt" in r.stderr, r.stdout + r.stderr
        # bob on tty2 instead: alice's push now has one prompt to go to.
        tty2.type("\x04")
        at_password_prompt(tty2, user="bob")
        phone = alice.background("login", "--no-stay")
        alice.waits_for_enter(phone)
        assert "login on tty1" in phone.said()
        tty1.type("\n")
        shell(tty1)
        assert phone.wait(30) == 0
        tty2.type(PASSWORDS["bob"] + "\n")
        shell(tty2, user="bob")
        log_out(tty2)
        log_out(tty1)
    finally:
        tty2.reset()
        for sid in sessions_of("bob"):
            inside("loginctl", "terminate-session", sid, check=False)


@pytest.mark.parametrize("how", ["restart", "kill"])
def test_boxkeyd_going_away_mid_prompt_leaves_the_password_prompt(tty1, alice, how):
    at_password_prompt(tty1)
    cursor = journal_cursor()
    if how == "restart":
        inside("systemctl", "restart", "boxkeyd")
    else:
        inside("systemctl", "kill", "--signal=KILL", "boxkeyd")
    wait_for(lambda: "advertising box 4821" in journal(since=cursor), timeout=20, what="boxkeyd back")
    before = tty1.count("Password:")
    start = time.monotonic()
    tty1.type("\n")  # Enter for the phone: the daemon that opened the prompt is gone
    tty1.wait_for_more("Password:", before)
    assert time.monotonic() - start < 1.5
    tty1.type(PASSWORD + "\n")
    shell(tty1)
    log_out(tty1)


def test_a_phone_that_leaves_before_enter_takes_its_push_with_it(tty1, alice):
    at_password_prompt(tty1)
    phone = alice.background("login", "--no-stay")
    alice.waits_for_enter(phone)
    inside("pkill", "-KILL", "-f", "boxkey login", check=False)
    phone.wait(10)
    wait_for(lambda: "the phone left before Enter" in journal(), timeout=10, what="the box to drop the push")
    before = tty1.count("Password:")
    tty1.type("\n")
    tty1.wait_for_more("Password:", before)
    assert "No phone has pushed" in tty1.screen() and "alice@" not in tty1.screen()
    tty1.type(PASSWORD + "\n")
    shell(tty1)
    log_out(tty1)


def test_walk_away_ends_a_console_session_that_nothing_can_lock(tty1, alice):
    phone = logged_in_by_phone(tty1, alice)
    [sid] = sessions_of("alice")
    left = time.monotonic()
    inside("pkill", "-KILL", "-f", "boxkey login", check=False)  # the phone is gone, as out of range
    phone.wait(10)
    wait_for(lambda: not sessions_of("alice"), timeout=20, what="the console session to end")
    figure("console_walk_away_to_session_ended_s", round(time.monotonic() - left, 3))
    box = journal()
    assert f"walk-away lock: session {sid}" in box
    assert f"session {sid} (alice, seat0 tty1) cannot be locked: nothing on it follows logind's Lock" in box and "ended it ([presence] not_locked = logout)" in box
    tty1.login_prompt()


def test_boxkey_lock_on_a_console_says_it_cannot_and_ends_nothing(tty1, alice):
    """A console follows no Lock: `boxkey lock` says so (exit 19) after the box's confirm
    wait, and ends nothing: the shell stays, the presence link stays up and guarding."""
    phone = logged_in_by_phone(tty1, alice)
    [sid] = sessions_of("alice")
    asked = time.monotonic()
    r = alice("lock")
    figure("console_lock_answer_s", round(time.monotonic() - asked, 3))
    assert r.returncode == 19 and "cannot lock your session" in r.stderr, r.stdout + r.stderr
    time.sleep(8)  # past the keepalive timeout: nothing may follow
    assert sessions_of("alice") == [sid] and phone.poll() is None
    assert f"alice@boxkey-box:~$" in tty1.screen()
    status = json.loads(inside("boxkeyd", "status", "--json").stdout)
    assert [p["user"] for p in status["presence"]] == ["alice"], status
    box = journal()
    assert f"session {sid} (alice, seat0 tty1) cannot be locked" in box and "walked away" not in box
    inside("pkill", "-KILL", "-f", "boxkey login", check=False)  # walk away: the session ends
    phone.wait(10)
    wait_for(lambda: not sessions_of("alice"), timeout=20, what="the walk-away to end the session")
    tty1.login_prompt()


@pytest.mark.parametrize("how", ["restart", "upgrade", "crash"])
def test_walk_away_after_boxkeyd_restarts_still_ends_the_console(tty1, alice, how):
    """`systemctl restart`, `dpkg -i` of the packages (what an upgrade does to the unit) and a
    crash (Restart=on-failure) while the phone guards a console: the new daemon takes up the
    session (guard.json in /run/boxkey), the phone attaches again, and walking away ends it."""
    phone = logged_in_by_phone(tty1, alice)
    [sid] = sessions_of("alice")
    if how == "restart":
        inside("systemctl", "restart", "boxkeyd")
    elif how == "upgrade":
        inside("sh", "-c", "cd /root/debs && DEBIAN_FRONTEND=noninteractive dpkg -i ./boxkeyd_*.deb ./libpam-boxkey_*.deb ./boxkey_*.deb")
    else:
        inside("systemctl", "kill", "--signal=SIGKILL", "boxkeyd")  # Restart=on-failure: back in 2 s
    wait_for(lambda: "restored" in phone.said(), timeout=40, what="the phone attaching again")
    status = json.loads(inside("boxkeyd", "status", "--json").stdout)
    assert [s["id"] for s in status["sessions"]] == [sid] and [p["user"] for p in status["presence"]] == ["alice"], status
    assert f"after a restart: guarding session(s) {sid} (alice, seat0 tty1" in journal()
    inside("pkill", "-KILL", "-f", "boxkey login", check=False)  # walking away
    phone.wait(10)
    wait_for(lambda: not sessions_of("alice"), timeout=30, what="the walk-away to end the console")
    assert "ended it ([presence] not_locked = logout)" in journal()
    tty1.login_prompt()


def test_a_hung_boxkeyd_costs_a_prompt_little_and_the_watchdog_restarts_it(tty1):
    """Before: with boxkeyd stopped (SIGSTOP), `Password:` came 1.000 s after the user name, a
    password typed meanwhile was echoed in clear, and systemd never noticed. Now the module
    waits 500 ms with the echo off, and the watchdog (WatchdogSec=15s) restarts the daemon."""
    pid = inside("systemctl", "show", "-p", "MainPID", "--value", "boxkeyd").stdout.strip()
    inside("kill", "-STOP", pid)
    stopped = time.monotonic()
    try:
        waited = at_password_prompt(tty1)
        figure("console_password_prompt_with_boxkeyd_stopped_s", round(waited, 3))
        assert waited < 0.8, waited
        tty1.type(PASSWORD + "\n")
        shell(tty1)
        log_out(tty1)

        def restarted():
            show = inside("systemctl", "show", "-p", "MainPID", "-p", "ActiveState", "boxkeyd").stdout
            return f"MainPID={pid}\n" not in show and "ActiveState=active" in show and "MainPID=0" not in show
        wait_for(restarted, timeout=60, what="systemd's watchdog restarting boxkeyd")
        figure("watchdog_restart_after_sigstop_s", round(time.monotonic() - stopped, 1))
        assert "Watchdog timeout" in inside("journalctl", "-u", "boxkeyd", "--no-pager", "-o", "cat", check=False).stdout
    finally:
        inside("kill", "-CONT", pid, check=False)
    wait_for(lambda: "advertising box 4821" in journal(), timeout=30, what="the new boxkeyd advertising")


def test_walk_away_keeps_a_console_session_when_told_to(tty1, alice):
    configure_box(presence={"grace_s": "1", "not_locked": '"keep"'})
    try:
        phone = logged_in_by_phone(tty1, alice)
        inside("pkill", "-KILL", "-f", "boxkey login", check=False)
        phone.wait(10)
        wait_for(lambda: "it is still open ([presence] not_locked = keep)" in journal(), timeout=20, what="the box to say so")
        assert sessions_of("alice")
        doctor = inside("boxkeyd", "doctor", check=False).stdout
        assert "a text console: nothing on it can lock; walk-away leaves it open" in doctor, doctor
        log_out(tty1)
    finally:
        configure_box()


def test_a_new_phone_pairs_with_the_code_on_the_console_and_its_first_login_enrols_it(tty1, alice):
    """Enrolment as a user does it: the code the prompt shows, typed into the phone, then the
    phone's first login at that prompt. The box checks the pushed password itself first
    (boxkey-verify, run inside boxkeyd's sandbox): on Debian 13, PAM 1.7's pam_unix needed a
    system call the unit denied, and this enrolment failed."""
    bob = Phone("bob")
    inside("rm", "-rf", bob.home)  # a new phone: nothing paired yet
    fingerprint = json.loads(bob("status", "--json", check=True).stdout)["fingerprint"]
    try:
        at_password_prompt(tty1, user="bob")
        code = re.findall(r"Pairing code (\d{6})", tty1.screen())[-1]  # this prompt's, the last shown
        paired = bob("pair", "4821", "--code", code)
        assert paired.returncode == 0, paired.stdout + paired.stderr
        assert bob("credentials", "set", "--user", "bob", input=PASSWORDS["bob"] + "\n").returncode == 0
        phone = bob.background("login", "--no-stay")
        Phone.waits_for_enter(phone)
        tty1.type("\n")
        shell(tty1, user="bob")
        assert phone.wait(30) == 0, phone.said()
        assert re.search(f"enrolled: phone {fingerprint} .*for user bob by its first login under a pairing code", journal()), journal()
        assert "cannot retrieve authentication info" not in journal()
        log_out(tty1)
    finally:
        inside("boxkeyd", "phones", "revoke", fingerprint, "--yes", check=False)
        for sid in sessions_of("bob"):
            inside("loginctl", "terminate-session", sid, check=False)
