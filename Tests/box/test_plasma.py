"""KDE Plasma: SDDM (its daemon, sddm-helper's PAM conversation and its Breeze greeter, driven
with xdotool as a person types) and Plasma's own lock screen (ksmserver's kscreenlocker, which
follows logind's Lock and Unlock and sets LockedHint itself), in the booted Debian 12
(SDDM 0.19, Plasma 5.27) or Debian 13 (SDDM 0.21, Plasma 6.3) root.

No graphics hardware here, and no virtual consoles of the root's own: SDDM runs its own X
server, Xorg, with the dummy video driver (Tests/box/root/sddm-xorg-dummy.conf; or Xvfb through
sddm-xvfb.conf), on a seat without VTs; Qt Quick and kwin_x11 draw with Mesa's llvmpipe.
SDDM starts a display only on a logind seat with CanGraphical=yes, which logind grants a seat
with a "master-of-seat" device; udev does not run in a container, so the `seat` fixture writes
the udev database entry udev would write for such a device (/dev/null's, tagged for seat1)
and restarts logind, which then has seat1 (CanGraphical=yes, CanTTY=no). On a seat other
than seat0 SDDM asks for no VT (0.19) or runs on none (0.21: "Using VT -1"), and logind takes
sessions there with no VT number.

What the box does at SDDM, and why:
- SDDM opens PAM only when the form is submitted, with the user and password together, and
  answers every PAM prompt at once from the form. So no prompt is open when the phone pushes,
  and an empty field is answered empty at once: there is nowhere for a push to wait. sddm is
  therefore not in boxkeyd's default `[pam] services`: the module steps aside, the phone is
  told "not at a login prompt", and the person types, as without Boxkey.
- Offered there anyway, SDDM 0.19 (Debian 12) never answered the password prompt that follows
  pam_boxkey's PAM_TEXT_INFO: the greeter stayed greyed out for good, typed passwords too (its
  helper takes any info message for the start of a password change: PamBackend.cpp
  handleInfo, QString::indexOf's -1 counts as a match; gone in SDDM 0.20). Breeze draws no
  PAM_TEXT_INFO either.
- Plasma's lock screen is the phone's: ksmserver follows logind's Lock (walk-away) and
  Unlock (`[unlock] logind_unlock`, the push checked by the box's boxkey-verify).
"""
import os
import re
import shutil
import subprocess
import time

import pytest

from conftest import (PASSWORDS, ROOT, configure_box, figure, inside, journal, journal_cursor, no_password_in_logs, read,
                      session, sessions_of, wait_for)

PASSWORD = PASSWORDS["alice"]
DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs", "img")


def suite():
    """bookworm or trixie: $BOXKEY_BOX_SUITE, else the root's own /etc/os-release."""
    if os.environ.get("BOXKEY_BOX_SUITE"):
        return os.environ["BOXKEY_BOX_SUITE"]
    m = re.search(r"^VERSION_CODENAME=(\w+)", read("/etc/os-release") if ROOT else "", re.M)
    return m.group(1) if m else "bookworm"


SUITE = suite()
BOOKWORM = SUITE == "bookworm"
# Plasma's X11 session: plasma.desktop in Plasma 5; Plasma 6 calls its X11 one plasmax11.desktop
# (plasma.desktop is its Wayland session: kwin_wayland, not installed or tried here).
PLASMA_SESSION = "/usr/share/xsessions/plasma.desktop" if BOOKWORM else "/usr/share/xsessions/plasmax11.desktop"

# The udev database entry of a master-of-seat device on seat1 (what udev's 71-seat.rules
# would give a graphics card there): /dev/null's, the one device every container has.
# Plasma's locker, drawn by llvmpipe on this 2-core machine beside the other tests, took up to
# 4.1 s to set LockedHint; past the box's default lock_confirm_s (5 s) the box would say it
# could not lock (and walk-away would end the session). A box with a GPU locks in a fraction of that.
PLASMA_TAKES_ITS_TIME = {"lock_confirm_s": "15"}
SEAT_DEVICE = "c1:3"
SEAT_DB = "I:1\nE:ID_SEAT=seat1\nG:seat\nG:master-of-seat\nQ:seat\nQ:master-of-seat\n"


def can_graphical(seat):
    r = inside("loginctl", "show-seat", seat, "--property=CanGraphical", check=False)
    return r.stdout.strip() == "CanGraphical=yes"


def jobs():
    return inside("systemctl", "list-jobs", "--no-legend", check=False).stdout.strip()


@pytest.fixture(scope="module")
def seat():
    """seat1, a graphical seat without VTs, for SDDM. It stays afterwards (no later test starts a
    display manager): restarting logind queues behind any user manager still stopping, which in
    this container can take systemd's 2-minute stop timeout (the host's cgroup v1 reports no
    empty cgroups to the root's systemd)."""
    if not can_graphical("seat1"):
        inside("sh", "-c", "mkdir -p /run/udev/data /run/udev/tags/seat /run/udev/tags/master-of-seat && "
                           f"cat >/run/udev/data/{SEAT_DEVICE} && touch /run/udev/tags/seat/{SEAT_DEVICE} "
                           f"/run/udev/tags/master-of-seat/{SEAT_DEVICE}", input=SEAT_DB)
        wait_for(lambda: not jobs(), timeout=150, interval=0.5, what=lambda: "systemd's jobs to finish:\n" + jobs())
        inside("systemctl", "restart", "systemd-logind", timeout=150)
        wait_for(lambda: can_graphical("seat1"), timeout=20, what="logind's seat1 with CanGraphical=yes")
    assert "CanTTY=no" in inside("loginctl", "show-seat", "seat1", "--property=CanTTY").stdout
    return "seat1"


class Screen:
    """SDDM's X server (Xvfb, :0 unless a stale lock file took it): the greeter's, then the
    session's display."""

    def __init__(self):
        self.env = None

    def find(self):
        """DISPLAY and XAUTHORITY of SDDM's X server, from its command line (SDDM 0.19 keeps the
        authority in /var/run/sddm/{uuid}, 0.21 in /run/sddm/xauth_*)."""
        ps = inside("ps", "-eo", "args=", check=False).stdout
        auth = re.search(r"^(?:Xvfb|\S*/Xorg) .*-auth (\S+)", ps, re.M)  # Xvfb, or Xorg with the dummy driver
        display = re.search(r"sddm-helper .*--socket /tmp/sddm-(:\d+)-", ps)  # the greeter's socket names it
        self.env = {"DISPLAY": display.group(1), "XAUTHORITY": auth.group(1)} if auth and display else None
        return self.env

    def x(self, *args, check=True):
        return inside(*args, env=self.env, check=check)

    def greeter_visible(self):
        r = self.x("xdotool", "search", "--onlyvisible", "--class", "sddm-greeter", check=False)
        return r.returncode == 0 and r.stdout.strip()

    def type(self, text):
        self.x("xdotool", "type", "--delay", "15", text)

    def key(self, key):
        self.x("xdotool", "key", key)
        return time.monotonic()

    def shot(self, name):
        """A screenshot in the root's /root (a PNG); its path here."""
        self.x("import", "-window", "root", f"/root/{name}")
        return os.path.join(ROOT, "root", name)


def sddm_state():
    return (inside("ps", "-eo", "pid,user,stat,wchan:24,args", "--forest", check=False).stdout
            + inside("journalctl", "-u", "sddm", "-n", "30", "-o", "cat", "--no-pager", check=False).stdout)


@pytest.fixture
def sddm(seat, alice):
    """SDDM started as the box starts it (its unit), alice the last user and Plasma's X11 session
    the last session (as after her last login); stopped afterwards, with every session gone."""
    gettys = [u for u in ("getty@tty1", "getty@tty7")  # sddm.service conflicts with them
              if inside("systemctl", "is-active", "--quiet", u, check=False).returncode == 0]
    inside("sh", "-c", "install -d -o sddm -g sddm /var/lib/sddm && cat >/var/lib/sddm/state.conf && "
                       "chown sddm:sddm /var/lib/sddm/state.conf",
           input=f"[Last]\nSession={PLASMA_SESSION}\nUser=alice\n")
    inside("systemctl", "reset-failed", "sddm", check=False)
    # A user manager (the greeter's, alice's) still stopping would hold the new sessions up.
    wait_for(lambda: not jobs(), timeout=150, interval=0.5, what=lambda: "systemd's jobs to finish:\n" + jobs())
    screen = Screen()
    started = time.monotonic()
    inside("systemctl", "start", "sddm")
    wait_for(screen.find, timeout=20, what=lambda: "SDDM's X server:\n" + sddm_state())
    wait_for(screen.greeter_visible, timeout=60, interval=0.05, what=lambda: "the greeter's window:\n" + sddm_state())
    screen.greeter_at = time.monotonic() - started
    yield screen
    try:
        inside("systemctl", "stop", "sddm", timeout=45)
    except subprocess.TimeoutExpired:
        raise AssertionError("SDDM did not stop within 45 s:\n" + sddm_state()) from None
    # All of alice's processes: Plasma leaves some in a session's scope after it closed
    # (ksplashqml), and Debian 13's logind has a "manager" session for her user manager.
    for user in ("alice", "sddm"):  # sddm: the greeter's, if SDDM left it
        end_user(user)
    wait_for(lambda: not sessions_of("alice") and inside("pgrep", "-u", "alice", check=False).returncode != 0, timeout=45,
             what="alice's sessions and processes to end")
    wait_for(lambda: not inside("pgrep", "-x", "Xvfb|Xorg", check=False).stdout.strip(), timeout=20, what="SDDM's X server to go")
    for u in gettys:
        inside("systemctl", "start", u, check=False)


def end_user(user):
    """logind's TerminateUser; what outlives it (startplasma-x11 once its X server is gone can)
    is killed, and sessions left closing are stopped again."""
    inside("loginctl", "terminate-user", user, check=False)
    try:
        wait_for(lambda: inside("pgrep", "-u", user, check=False).returncode != 0, timeout=10, interval=0.2)
    except AssertionError:
        inside("pkill", "-KILL", "-u", user, check=False)
    for sid in sessions_of(user):
        inside("loginctl", "terminate-session", sid, check=False)


def plasma_session(timeout=60):
    """alice's graphical session from SDDM, once Plasma's session manager runs in it."""
    def find():
        for sid in sessions_of("alice"):
            if session(sid, "Class").get("Class") == "user":
                return sid
        return None
    sid = wait_for(find, timeout=timeout, what=lambda: "alice's session:\n" + sddm_state())
    # Plasma is up for locking once ksmserver's screen locker is on alice's session bus.
    bus = {"XDG_RUNTIME_DIR": "/run/user/1000", "DBUS_SESSION_BUS_ADDRESS": "unix:path=/run/user/1000/bus"}
    wait_for(lambda: inside("busctl", "--user", "status", "org.freedesktop.ScreenSaver", user="alice", env=bus,
                            check=False).returncode == 0, timeout=timeout, interval=0.2,
             what="Plasma's screen locker (org.freedesktop.ScreenSaver) on alice's session bus")
    assert inside("pgrep", "-u", "alice", "-x", "ksmserver", check=False).returncode == 0
    return sid


def login_typed(screen):
    """alice (the greeter's preselected user) types her password and presses Enter: seconds
    from Enter to her logind session."""
    screen.type(PASSWORD)
    enter = screen.key("Return")
    def opened():
        return [s for s in sessions_of("alice") if session(s, "Class").get("Class") == "user"]
    wait_for(opened, timeout=30, interval=0.01, what=lambda: "alice's session:\n" + sddm_state())
    return time.monotonic() - enter


def test_sddm_says_nothing_of_boxkeys_and_a_typed_password_logs_in(sddm):
    """sddm is not in the default `[pam] services`: pam_boxkey steps aside at once, and SDDM is as
    without Boxkey. (Offered there, SDDM 0.19 on Debian 12 never answered the password prompt
    after the module's line and every login hung, typed passwords too.)"""
    figure(f"sddm_{SUITE}_start_to_greeter_s", round(sddm.greeter_at, 3))
    cursor = journal_cursor()
    took = login_typed(sddm)
    figure(f"sddm_{SUITE}_typed_enter_to_session_s", round(took, 3))
    sid = plasma_session()
    props = session(sid, "Type", "Seat", "Display", "Remote", "Service", "Class")
    assert props == {"Type": "x11", "Seat": "seat1", "Display": sddm.env["DISPLAY"], "Remote": "no", "Service": "sddm",
                     "Class": "user"}, props
    assert "login prompt waiting" not in journal(since=cursor)
    greeter = inside("journalctl", "--cursor", cursor, "-o", "cat", "--no-pager", check=False).stdout
    assert "Box 4821" not in greeter
    no_password_in_logs()


def test_a_push_at_sddm_is_refused_in_words_and_the_greeter_is_untouched(sddm, alice):
    """SDDM opens PAM only when its form is sent and answers every prompt from the form at once,
    so no push could wait there: the phone is told the box is not at a login prompt, and the
    person types the password as without Boxkey. The screenshot is SDDM as the person sees it."""
    phone = alice.background("login", "--no-stay")
    status = phone.wait(30)
    said = phone.said()
    assert status == 8 and "not at a login prompt" in said, (status, said)
    assert not sessions_of("alice")
    time.sleep(1)  # the greeter draws
    os.makedirs(DOCS, exist_ok=True)
    shutil.copy(sddm.shot("sddm.png"), os.path.join(DOCS, f"sddm-{SUITE}.png"))
    login_typed(sddm)
    plasma_session()


def lock_state(sid):
    return session(sid, "LockedHint").get("LockedHint")


def test_plasma_locks_itself_when_the_box_asks_logind(sddm, alice):
    """The box's lock (what walk-away does) is logind's LockSession; Plasma's ksmserver runs
    kscreenlocker_greet and sets LockedHint itself. The locker runs as alice: pam_boxkey in its
    stack (`kde`) cannot reach the box and steps aside, and her typed password unlocks."""
    configure_box(presence=PLASMA_TAKES_ITS_TIME)
    try:
        login_typed(sddm)
        sid = plasma_session()
        assert lock_state(sid) == "no"
        cursor = journal_cursor()
        start = time.monotonic()
        r = alice("lock")
        assert r.returncode == 0 and "Locked your session" in r.stdout, r.stdout + r.stderr
        wait_for(lambda: lock_state(sid) == "yes", timeout=20, interval=0.01, what="LockedHint=yes")
        figure(f"plasma_{SUITE}_box_lock_to_locked_s", round(time.monotonic() - start, 3))
        greet = inside("pgrep", "-u", "alice", "-a", "kscreenlocker", check=False).stdout
        assert "kscreenlocker_greet" in greet, greet
        said = journal(since=cursor)
        assert f"lock: session {sid} (seat1 {sddm.env['DISPLAY']}) user alice" in said, said
        time.sleep(1)  # the locker draws
        sddm.shot("plasma-locked.png")
        # Her password, typed into Plasma's locker: its own PAM conversation, without Boxkey.
        sddm.type(PASSWORD)
        sddm.key("Return")
        wait_for(lambda: lock_state(sid) == "no", timeout=20, what="the typed password to unlock")
        assert "login prompt waiting: kde" not in journal(since=cursor)
        assert sessions_of("alice")
    finally:
        configure_box()


def test_the_phone_unlocks_plasma_through_logind_and_walking_away_locks_it(sddm, alice):
    """kscreenlocker follows logind's Unlock (KDE's own advice for a broken locker is
    `loginctl unlock-session`): with `[unlock] logind_unlock = true` the phone's push, checked by
    boxkey-verify, unlocks it; the phone then stays as the presence link, and walking away
    locks Plasma again through logind."""
    configure_box(unlock={"logind_unlock": "true"}, presence=PLASMA_TAKES_ITS_TIME)
    try:
        login_typed(sddm)
        sid = plasma_session()
        assert alice("lock").returncode == 0
        wait_for(lambda: lock_state(sid) == "yes", timeout=20, what="LockedHint=yes")
        start = time.monotonic()
        phone = alice.background("login")  # stays: the presence link
        wait_for(lambda: "unlocked through logind" in phone.said() or phone.poll() is not None, timeout=30,
                 what=lambda: f"the phone's unlock; it said {phone.said()!r}")
        assert "unlocked through logind" in phone.said(), phone.said() + journal()[-800:]
        wait_for(lambda: lock_state(sid) == "no", timeout=20, interval=0.01, what="LockedHint=no")
        figure(f"plasma_{SUITE}_push_to_unlocked_s", round(time.monotonic() - start, 3))
        wait_for(lambda: inside("pgrep", "-u", "alice", "kscreenlocker", check=False).returncode != 0, timeout=10,
                 what="kscreenlocker_greet to go")
        wait_for(lambda: "Staying connected" in phone.said(), timeout=20, what="the presence link")
        # Walk-away: the phone goes; the box calls logind's Lock, and Plasma locks itself.
        left = time.monotonic()
        inside("pkill", "-KILL", "-f", "boxkey login", check=False)
        phone.wait(10)
        wait_for(lambda: lock_state(sid) == "yes", timeout=20, interval=0.01, what="LockedHint after walk-away")
        figure(f"plasma_{SUITE}_walk_away_to_locked_s", round(time.monotonic() - left, 3))
        assert "kscreenlocker_greet" in inside("pgrep", "-u", "alice", "-a", "kscreenlocker", check=False).stdout
        assert "walk-away lock: session " + sid in journal()
        assert sessions_of("alice")  # locked, not ended
        no_password_in_logs()
    finally:
        configure_box()
