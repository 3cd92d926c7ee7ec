"""LightDM: its real daemon and PAM conversation on Xvfb, driven through a scripted greeter that
uses LightDM's own greeter library (liblightdm-gobject), and once through lightdm-gtk-greeter,
Debian's default, with xdotool. The session it opens runs xss-lock with i3lock, a locker that
follows logind; pam_gnome_keyring unlocks the login keyring."""
import json
import os
import shutil
import subprocess
import time

import pytest

from conftest import (PASSWORDS, ROOT, configure_box, figure, inside, journal, journal_cursor, no_password_in_logs, read,
                      session, sessions_of, wait_for)

PASSWORD = PASSWORDS["alice"]
RUN = "/run/boxkey-test"
X = {"DISPLAY": ":0", "XAUTHORITY": "/var/run/lightdm/root/:0"}
DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs", "img")


class Greeter:
    """The scripted greeter (Tests/box/root/boxkey-test-lightdm-greeter): commands in, events out."""

    def __init__(self):
        self.seen = 0

    def events(self):
        return [json.loads(line) for line in read(f"{RUN}/greeter.events").splitlines() if line.strip()]

    def do(self, what, **fields):
        inside("sh", "-c", f"cat >>{RUN}/greeter.commands", input=json.dumps({"do": what, **fields}) + "\n")
        return time.monotonic()

    def next(self, kind, timeout=10.0, **match):
        """The next event of `kind` after the last one returned (matching `match`)."""
        def find():
            for i, e in enumerate(self.events()[self.seen:], self.seen):
                if e["event"] == kind and all(e.get(k) == v for k, v in match.items()):
                    self.seen = i + 1
                    return e
            return None
        return wait_for(find, timeout=timeout, what=lambda: f"greeter event {kind} {match}; events:\n"
                        + "\n".join(json.dumps(e) for e in self.events()[self.seen:]))

    def texts(self):
        return [e.get("text", "") for e in self.events() if e["event"] in ("prompt", "message")]


def lightdm_state():
    """What LightDM and its children are doing, and its log: for a LightDM that does not stop."""
    return (inside("ps", "-eo", "pid,ppid,stat,wchan:32,args", "--forest", check=False).stdout
            + inside("sh", "-c", "tail -n 40 /var/log/lightdm/*.log", check=False).stdout)


def forks_not_yet_run():
    """Session children of LightDM's that have forked their session's process, which has not
    yet exec'd it (it still runs as `lightdm --session-child`)."""
    ps = inside("ps", "-eo", "pid=,ppid=,args=", check=False).stdout
    procs = {p[0]: (p[1], p[2]) for p in (line.split(None, 2) for line in ps.splitlines()) if len(p) == 3}
    return [pid for pid, (ppid, args) in procs.items()
            if args.startswith("lightdm --session-child") and procs.get(ppid, ("", ""))[1].startswith("lightdm --session-child")]


def start_lightdm(greeter_session):
    inside("sh", "-c", f"mkdir -p -m 1777 {RUN} && rm -f {RUN}/greeter.commands {RUN}/greeter.events && "
                       f"mkfifo -m 666 {RUN}/greeter.commands && install -m 666 /dev/null {RUN}/greeter.events")
    inside("sed", "-i", f"s/^greeter-session=.*/greeter-session={greeter_session}/", "/etc/lightdm/lightdm.conf.d/50-boxkey-test.conf")
    inside("systemctl", "reset-failed", "lightdm", check=False)
    inside("systemctl", "restart", "lightdm")


def stop_lightdm():
    """Stops LightDM once every session it started runs its own program.

    LightDM 1.26's session child sets a SIGTERM handler, then forks the session's process; until
    that process execs, it has the handler too, which calls exit() (src/session-child.c
    signal_cb), not safe in a signal handler. Stopped within those milliseconds (here, right
    after a test saw the session appear), the fork hung on a lock (futex_do_wait) and
    `systemctl stop lightdm` waited past 60 s; on a box, systemd would kill it after 90 s. A
    person does not stop the display manager within milliseconds of logging in."""
    wait_for(lambda: not forks_not_yet_run(), timeout=10, what=lambda: "the session's program to run:\n" + lightdm_state())
    try:
        inside("systemctl", "stop", "lightdm", check=False, timeout=30)
    except subprocess.TimeoutExpired:
        raise AssertionError("LightDM did not stop within 30 s:\n" + lightdm_state()) from None


@pytest.fixture
def greeter(alice):
    start_lightdm("boxkey-test-lightdm-greeter")
    g = Greeter()
    g.next("ready", timeout=30)
    yield g
    stop_lightdm()


def keyring_unlocks():
    """How often pam_gnome_keyring said it unlocked a login keyring (with the password PAM
    handed it; a wrong one is "the password for the login keyring was invalid")."""
    everything = inside("journalctl", "-o", "cat", "--no-pager", check=False).stdout
    assert "login keyring was invalid" not in everything
    return everything.count("gkr-pam: unlocked login keyring")


def test_the_password_prompt_comes_at_once_and_a_typed_password_logs_in(greeter):
    cursor = journal_cursor()
    asked = greeter.do("authenticate", user="alice")
    prompt = greeter.next("prompt", secret=True)
    figure("lightdm_authenticate_to_password_prompt_s", round(prompt["t"] - asked, 3))
    assert prompt["t"] - asked < 0.5
    texts = greeter.texts()
    assert any(t.startswith("Box 4821: push from your phone, then press Enter") for t in texts), texts
    greeter.do("respond", text=PASSWORD)
    assert greeter.next("complete")["authenticated"] is True
    greeter.do("start", session="boxkey-test")
    wait_for(lambda: sessions_of("alice"), timeout=20, what="alice's session")
    assert "login accepted" not in journal(since=cursor)


def test_a_push_then_enter_opens_a_real_session_and_unlocks_the_keyring(greeter, alice):
    # A first login typed at the keyboard makes alice's login keyring (with her password).
    greeter.do("authenticate", user="alice")
    greeter.next("prompt", secret=True)
    greeter.do("respond", text=PASSWORD)
    assert greeter.next("complete")["authenticated"] is True
    greeter.do("start", session="boxkey-test")
    [first] = wait_for(lambda: sessions_of("alice"), timeout=20, what="alice's first session")
    wait_for(lambda: read("/home/alice/.local/share/keyrings/login.keyring"), timeout=20, what="alice's login keyring")
    unlocks = keyring_unlocks()
    mark = len(greeter.events())
    inside("loginctl", "terminate-session", first)
    wait_for(lambda: not sessions_of("alice"), timeout=20, what="the first session to end")
    greeter.seen = mark
    greeter.next("ready", timeout=30)  # LightDM starts a new greeter after the session
    # Now from the phone: push, then Enter in the empty password field.
    greeter.do("authenticate", user="alice")
    greeter.next("prompt", secret=True)
    pushed = time.monotonic()
    phone = alice.background("login")  # stays: the presence link
    alice.waits_for_enter(phone)
    assert "lightdm on :0" in phone.said()
    held = time.monotonic()
    enter = greeter.do("respond", text="")
    done = greeter.next("complete")
    assert done["authenticated"] is True and done["user"] == "alice"
    figure("lightdm_push_to_waiting_for_enter_s", round(held - pushed, 3))
    figure("lightdm_enter_to_authenticated_s", round(done["t"] - enter, 3))
    greeter.do("start", session="boxkey-test")
    [sid] = wait_for(lambda: sessions_of("alice"), timeout=20, what="alice's session")
    figure("lightdm_enter_to_session_open_s", round(time.monotonic() - enter, 3))
    props = session(sid, "Type", "Class", "Display", "Remote", "Service", "Active")
    assert props == {"Type": "x11", "Class": "user", "Display": ":0", "Remote": "no", "Service": "lightdm", "Active": "yes"}, props
    wait_for(lambda: f"session {sid} (alice, seat0 :0) registered by lightdm for phone" in journal(), what="the session on record")
    # The real password reached the stack: pam_gnome_keyring unlocked the login keyring with it.
    wait_for(lambda: keyring_unlocks() > unlocks, timeout=20, what="pam_gnome_keyring to unlock the login keyring")
    wait_for(lambda: "Staying connected" in phone.said(), what="the presence link")
    # boxkeyd restarts, is upgraded (dpkg -i: what an upgrade does to the unit) and crashes
    # (SIGKILL; Restart=on-failure), one after the other: each new daemon takes up the session
    # from guard.json, and the phone attaches again each time (Plasma's test walks away with no
    # restart).
    for how in ["restart", "upgrade", "crash"]:
        restored = phone.said().count("restored")
        started = journal().count("after a restart: guarding session(s)")
        if how == "restart":
            inside("systemctl", "restart", "boxkeyd")
        elif how == "upgrade":
            inside("sh", "-c", "cd /root/debs && DEBIAN_FRONTEND=noninteractive dpkg -i ./boxkeyd_*.deb ./libpam-boxkey_*.deb ./boxkey_*.deb")
        else:
            inside("systemctl", "kill", "--signal=SIGKILL", "boxkeyd")
        wait_for(lambda: phone.said().count("restored") > restored, timeout=40, what=f"the phone attaching again after the {how}")
        wait_for(lambda: journal().count("after a restart: guarding session(s)") > started, what=f"the daemon after the {how} taking up the session")
        assert f"after a restart: guarding session(s) {sid} (alice, seat0 :0" in journal()

    # Walk-away: the phone goes; logind's Lock reaches xss-lock, which runs i3lock and says so.
    left = time.monotonic()
    inside("pkill", "-KILL", "-f", "boxkey login", check=False)
    phone.wait(10)
    wait_for(lambda: session(sid, "LockedHint")["LockedHint"] == "yes", timeout=20, what="LockedHint")
    figure("lightdm_walk_away_to_locked_s", round(time.monotonic() - left, 3))
    assert inside("pgrep", "-u", "alice", "-x", "i3lock", check=False).returncode == 0
    assert sessions_of("alice") == [sid]  # locked, not ended
    inside("import", "-window", "root", "/root/locked.png", env=X)
    no_password_in_logs()


def test_the_phone_unlocks_the_locker_through_logind_when_the_box_allows_it(greeter, alice):
    configure_box(unlock={"logind_unlock": "true"})
    try:
        greeter.do("authenticate", user="alice")
        greeter.next("prompt", secret=True)
        phone = alice.background("login", "--no-stay")
        alice.waits_for_enter(phone)
        greeter.do("respond", text="")
        assert greeter.next("complete")["authenticated"] is True
        greeter.do("start", session="boxkey-test")
        [sid] = wait_for(lambda: sessions_of("alice"), timeout=20, what="alice's session")
        phone.wait(20)
        wait_for(lambda: inside("pgrep", "-u", "alice", "-x", "xss-lock", check=False).returncode == 0, what="xss-lock")
        assert alice("lock").returncode == 0
        wait_for(lambda: session(sid, "LockedHint")["LockedHint"] == "yes", timeout=20, what="the lock")
        # i3lock runs as alice and cannot reach the box's socket: the phone's push unlocks
        # through the box's own check (boxkey-verify) and logind's UnlockSession.
        start = time.monotonic()
        r = alice("login", "--no-stay")
        assert r.returncode == 0 and "unlocked through logind" in r.stdout, r.stdout + r.stderr
        wait_for(lambda: session(sid, "LockedHint")["LockedHint"] == "no", timeout=20, what="the unlock")
        wait_for(lambda: inside("pgrep", "-u", "alice", "-x", "i3lock", check=False).returncode != 0, what="i3lock to go")
        figure("lightdm_push_to_unlocked_s", round(time.monotonic() - start, 3))
    finally:
        configure_box()


def test_the_greeter_cancelling_while_a_push_waits_lets_the_push_go(greeter, alice):
    greeter.do("authenticate", user="alice")
    greeter.next("prompt", secret=True)
    phone = alice.background("login", "--no-stay")
    alice.waits_for_enter(phone)
    greeter.do("cancel")
    assert phone.wait(20) != 0
    assert "went on without the phone" in phone.said()
    wait_for(lambda: json.loads(inside("boxkeyd", "status", "--json").stdout)["prompts"] == [], what="no prompt left at the box")
    # The greeter goes on: a typed password still logs in.
    greeter.do("authenticate", user="alice")
    greeter.next("prompt", secret=True)
    greeter.do("respond", text=PASSWORD)
    assert greeter.next("complete")["authenticated"] is True


def test_another_user_chosen_at_the_greeter_takes_the_prompt(greeter, alice):
    greeter.do("authenticate", user="alice")
    greeter.next("prompt", secret=True)
    greeter.do("authenticate", user="bob")  # the person picks bob: LightDM ends alice's conversation
    greeter.next("prompt", secret=True)
    wait_for(lambda: len(json.loads(inside("boxkeyd", "status", "--json").stdout)["prompts"]) == 1, what="one prompt at the box")
    r = alice("login", "--no-stay")
    assert r.returncode != 0 and "prompt is for another user" in r.stderr, r.stdout + r.stderr
    greeter.do("respond", text=PASSWORDS["bob"])
    assert greeter.next("complete")["authenticated"] is True


def test_lightdm_gtk_greeter_shows_the_box_and_takes_enter(alice):
    """Debian's default LightDM greeter, as a person uses it: a screenshot of its screen with
    Boxkey's lines (docs/img), then Enter in its password field after the phone's push."""
    start_lightdm("lightdm-gtk-greeter")
    try:
        # Up in 2-3 s; if not, what LightDM is doing says why.
        wait_for(lambda: inside("xdotool", "search", "--class", "lightdm-gtk-greeter", env=X, check=False).stdout.strip(),
                 timeout=30, what=lambda: "lightdm-gtk-greeter's window:\n" + lightdm_state())
        time.sleep(1)
        inside("xdotool", "type", "--delay", "20", "alice", env=X)
        inside("xdotool", "key", "Return", env=X)
        wait_for(lambda: "login prompt waiting: lightdm" in journal(), timeout=10, what="the prompt at the box")
        time.sleep(1)  # the greeter draws the lines
        inside("import", "-window", "root", "/root/lightdm-gtk-greeter.png", env=X)
        os.makedirs(DOCS, exist_ok=True)
        shutil.copy(os.path.join(ROOT, "root/lightdm-gtk-greeter.png"), os.path.join(DOCS, "lightdm-gtk-greeter.png"))
        phone = alice.background("login", "--no-stay")
        alice.waits_for_enter(phone)
        inside("xdotool", "key", "Return", env=X)
        assert phone.wait(30) == 0
        wait_for(lambda: sessions_of("alice"), timeout=20, what="alice's session")
    finally:
        stop_lightdm()
