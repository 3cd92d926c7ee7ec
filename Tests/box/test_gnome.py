"""GDM and GNOME Shell: GDM's real daemon, its login screen (gnome-shell in GDM mode) and its
gdm-password conversation, and gnome-shell's lock screen in alice's GNOME session, driven as a
person drives them: keys with xdotool, what the screen shows read as a screen reader reads it
(AT-SPI, Tests/box/root/gnome-a11y) and in screenshots. Debian 12 (GDM 43, GNOME Shell 43) and
Debian 13 (GDM 48, GNOME Shell 48): $BOXKEY_BOX_SUITE says which.

The test box has no virtual console of its own (the machine's are not shared with it) and no
DRM device: GNOME runs on X (Xorg's dummy driver or Xvfb, Mesa's llvmpipe behind GLX), never
Wayland (mutter's native backend needs a DRM device).
  - Debian 13: GDM 48 opens its login screen on seat0 without a VT (GDM 45, "Allow seat0 seats
    to work when seat0 has no VTs"), on Xorg with the dummy driver: the login screen and the
    GNOME session it opens are GDM's own, on seat0, as on any box.
  - Debian 12: GDM 43 opens every seat0 display on a VT (gdm-session-worker.c
    set_up_for_new_vt opens /dev/tty1: "couldn't open console of initial fd") and cannot. Its
    login screen runs on an X terminal instead (Xvfb on the box's loopback asking GDM over XDMCP,
    on both suites): GDM's own greeter, worker and gdm-password stack, where boxkeyd rightly
    offers no phone (a display that could be anywhere). alice's GNOME session is opened by
    greetd (vt = "none") with GDM's daemon beside it: gnome-shell's unlock dialog authenticates
    through GDM (Gdm.Client.open_reauthentication_channel; for a session GDM did not start, a
    temporary reauthentication channel, gdm-manager.c), i.e. GDM's gdm-password worker, as
    root, where pam_boxkey reaches boxkeyd.
gnome-shell follows logind itself (js/ui/screenShield.js: the session's Lock signal locks,
Unlock deactivates, and _setLocked calls SetLockedHint): the tests check that the
SetLockedHint call comes from gnome-shell (busctl monitor)."""
import json
import os
import shutil
import time

import pytest

from conftest import (PASSWORDS, ROOT, configure_box, figure, inside, inside_background, journal,
                      no_password_in_logs, read, session, sessions_of, wait_for)
from test_greetd import Greetd

PASSWORD = PASSWORDS["alice"]
SUITE = os.environ.get("BOXKEY_BOX_SUITE", "bookworm")
GDM_USER = "Debian-gdm"
XDMCP_X = "127.0.0.1:20"  # the X terminal's display, as GDM names it
X_UNIT = "boxkey-test-gdm-x"  # and a number: a stopped transient unit lingers a moment
# Transient units stop when their program does: on this machine's cgroup v1 hierarchy the box's
# systemd is not told when a unit's cgroup empties, and a stop that waits for it takes the
# whole TimeoutStopSec.
QUICK_STOP = ["-p", "KillMode=process", "-p", "TimeoutStopSec=15"]
BOX_LINE = "Box 4821: push from your phone, then press Enter"
DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs", "img")
RUN = "/run/boxkey-test"

# GNOME runs in a root of its own, without this machine's VTs and on a network of its own
# (scripts/gnome-test); box-test's root has neither GDM nor GNOME.
pytestmark = pytest.mark.skipif(os.environ.get("BOXKEY_BOX_GNOME") != "1", reason="needs scripts/gnome-test's root")


def shell_env(user, display=None):
    """DISPLAY, XAUTHORITY and the session bus of `user`'s gnome-shell (on `display`), None while
    it is not up."""
    r = inside("pgrep", "-u", user, "-x", "gnome-shell", check=False)
    for pid in r.stdout.split():
        environ = read(f"/proc/{pid}/environ")
        env = dict(kv.split("=", 1) for kv in environ.split("\0") if "=" in kv)
        if "DISPLAY" in env and "DBUS_SESSION_BUS_ADDRESS" in env and display in (None, env["DISPLAY"]):
            return {k: env[k] for k in ("DISPLAY", "XAUTHORITY", "DBUS_SESSION_BUS_ADDRESS", "XDG_RUNTIME_DIR") if k in env}
    return None


def x_env(env):
    return {"DISPLAY": env["DISPLAY"], "XAUTHORITY": env["XAUTHORITY"]}


def a11y(user, env):
    """What `user`'s gnome-shell shows (AT-SPI): a list of {role, name, text, focused}."""
    r = inside("/usr/local/bin/gnome-a11y", "snapshot", user=user, env=env, check=False, timeout=30)
    try:
        return json.loads(r.stdout)
    except ValueError:
        return []


def texts(nodes):
    return [n["name"] or n["text"] for n in nodes if n["name"] or n["text"]]


def focused(nodes, role):
    return any(n["role"] == role and n["focused"] for n in nodes)


class Watch:
    """gnome-a11y watch: what gnome-shell announces, with CLOCK_MONOTONIC times."""

    def __init__(self, user, env):
        self.p = inside_background("runuser", "-u", user, "--", "env", *[f"{k}={v}" for k, v in env.items()],
                                   "/usr/local/bin/gnome-a11y", "watch")
        wait_for(lambda: self.events(), timeout=30, what="gnome-a11y watching")

    def events(self):
        out = []
        for line in self.p.said().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    def first(self, after, predicate, timeout=20.0, what="an announcement"):
        return wait_for(lambda: next((e for e in self.events() if e["t"] >= after and predicate(e)), None), timeout=timeout,
                        what=lambda: f"{what}; gnome-shell announced:\n" + "\n".join(json.dumps(e) for e in self.events()[-30:]))

    def stop(self):
        inside("pkill", "-f", "gnome-a11y watch", check=False)
        self.p.wait(10)


def gdm_state():
    return (inside("ps", "-eo", "pid,user,stat,etime,args", "--forest", check=False).stdout
            + inside("journalctl", "-u", "gdm", "-n", "60", "--no-pager", check=False).stdout
            + inside("loginctl", "list-sessions", "--no-legend", check=False).stdout)


def stop_gdm():
    inside("systemctl", "stop", "gdm", check=False, timeout=60)
    # (GDM's user manager, systemd --user, ends logind's UserStopDelaySec later.)
    wait_for(lambda: inside("pgrep", "-u", GDM_USER, "-x", "gnome-shell|gnome-session-b|gdm-x-session", check=False).returncode != 0
             and inside("pgrep", "-x", "gdm3|gdm-session-wor", check=False).returncode != 0, timeout=30,
             what=lambda: "GDM's processes to end:\n" + gdm_state())


def no_user_manager(user="alice"):
    """Waits until `user`'s service manager (user@UID.service, with her session bus) is not on
    its way out: gone, or running (lingering: conftest keeps it on Debian 13). A GNOME session
    opened while it stops gets a session bus that goes with it, and gnome-session gives up
    ("Lost name on bus: org.gnome.SessionManager"). (On this machine's cgroup v1 hierarchy the
    box's systemd is not told when a cgroup empties: without a TimeoutStopSec=5s drop-in for
    user@.service the stop takes its full 2 min.)"""
    uid = inside("id", "-u", user).stdout.strip()
    wait_for(lambda: inside("loginctl", "show-user", user, check=False).returncode != 0
             or inside("systemctl", "is-active", f"user@{uid}.service", check=False).stdout.strip() == "active", timeout=150,
             what=lambda: f"{user}'s service manager to stop:\n" + inside("loginctl", "user-status", user, "--no-pager", check=False).stdout)


@pytest.fixture
def gdm_daemon(alice):
    """GDM's daemon, started (it stops getty@tty1, which its unit conflicts with: started again
    afterwards when it ran before)."""
    getty = inside("systemctl", "is-active", "getty@tty1", check=False).stdout.strip() == "active"
    no_user_manager()
    inside("systemctl", "reset-failed", "gdm", check=False)
    inside("systemctl", "start", "gdm")
    yield
    stop_gdm()
    if getty:
        inside("systemctl", "start", "getty@tty1", check=False)


@pytest.fixture
def login_screen(gdm_daemon, alice):
    """GDM's login screen on the X terminal (Xvfb asking GDM over XDMCP), up and asking for a
    user name: its gnome-shell's environment."""
    unit = f"{X_UNIT}-{time.monotonic_ns()}"
    inside("systemd-run", f"--unit={unit}", "--collect", *QUICK_STOP, "Xvfb", ":20", "-query", "127.0.0.1", "-listen", "tcp",
           "-screen", "0", "1024x768x24")
    env = wait_for(lambda: shell_env(GDM_USER, XDMCP_X), timeout=90, what=lambda: "GDM's login screen:\n" + gdm_state())
    wait_for(lambda: focused(a11y(GDM_USER, env), "text"), timeout=60,
             what=lambda: f"the user name entry; the login screen shows {texts(a11y(GDM_USER, env))}")
    yield env
    for sid in sessions_of("alice"):
        inside("loginctl", "terminate-session", sid, check=False)
    inside("systemctl", "stop", unit, check=False)


def screenshot(env, name):
    inside("import", "-window", "root", f"/root/{name}", env=x_env(env))
    return os.path.join(ROOT, "root", name)


def to_password_prompt(env):
    """alice typed into the login screen's user name entry, then Enter: seconds until the
    password entry was up (focused) in the login screen."""
    watch = Watch(GDM_USER, env)
    try:
        inside("xdotool", "type", "--delay", "30", "alice", env=x_env(env))
        entered = time.monotonic()
        inside("xdotool", "key", "Return", env=x_env(env))
        shown = watch.first(entered, lambda e: e["role"] == "password text" and e.get("focused")
                            and e["type"].startswith("object:state-changed"), what="the password entry")
    finally:
        watch.stop()
    return shown["t"] - entered


GDM_SEAT0 = SUITE != "bookworm"  # GDM >= 45: "Allow seat0 seats to work when seat0 has no VTs"
NO_SEAT0 = ("GDM 43 opens every seat0 display on a VT (gdm-session-worker: \"couldn't open console of initial fd: No such "
            "file or directory\" for /dev/tty1); the test box has none")


@pytest.fixture
def seat0_login_screen(gdm_daemon, alice):
    """GDM's own login screen on seat0 (GDM 48: no VT; its X server is Xorg with the dummy video
    driver, rootless, as Debian-gdm), up and asking for a user name: its gnome-shell's
    environment."""
    if not GDM_SEAT0:
        pytest.skip(NO_SEAT0)
    env = wait_for(lambda: shell_env(GDM_USER, ":0"), timeout=120, what=lambda: "GDM's login screen on seat0:\n" + gdm_state())
    greeter = [s for s in inside("loginctl", "list-sessions", "--no-legend", check=False).stdout.splitlines() if GDM_USER in s]
    assert any(" seat0 " in s and " greeter " in s for s in greeter), greeter
    wait_for(lambda: focused(a11y(GDM_USER, env), "text"), timeout=60,
             what=lambda: f"the user name entry; the login screen shows {texts(a11y(GDM_USER, env))}")
    yield env
    for sid in sessions_of("alice"):
        inside("loginctl", "terminate-session", sid, check=False)


def test_gdm_on_seat0_asks_at_once_and_a_push_then_enter_logs_in(seat0_login_screen, alice):
    env = seat0_login_screen
    waited = to_password_prompt(env)
    figure(f"gdm_{SUITE}_user_name_to_password_prompt_s", round(waited, 3))
    assert waited < 1.0, waited
    assert "login prompt waiting: gdm-password on seat0 for alice" in journal(), journal()
    wait_for(lambda: [t for t in texts(a11y(GDM_USER, env)) if t.startswith(BOX_LINE)], timeout=10,
             what=lambda: f"Boxkey's line; the login screen shows {texts(a11y(GDM_USER, env))}")
    time.sleep(1)  # the line fades in
    png = screenshot(env, f"gdm-{SUITE}.png")
    os.makedirs(DOCS, exist_ok=True)
    shutil.copy(png, os.path.join(DOCS, f"gdm-{SUITE}.png"))
    pushed = time.monotonic()
    phone = alice.background("login", "--no-stay")
    said = alice.waits_for_enter(phone)
    held = time.monotonic()
    assert "gdm-password on seat0" in said, said
    enter = time.monotonic()
    inside("xdotool", "key", "Return", env=x_env(env))  # Enter in the empty password field
    assert phone.wait(60) == 0, phone.said()
    assert "Logged in to box 4821 as alice" in phone.said(), phone.said()
    accepted = wait_for(lambda: logged_at("login accepted: .* via gdm-password", after=enter), what="boxkeyd's login accepted")
    [sid] = wait_for(lambda: sessions_of("alice"), timeout=60, what=lambda: "alice's session:\n" + gdm_state())
    opened = time.monotonic()
    figure(f"gdm_{SUITE}_push_to_waiting_for_enter_s", round(held - pushed, 3))
    figure(f"gdm_{SUITE}_enter_to_authenticated_s", round(accepted - enter, 3))
    figure(f"gdm_{SUITE}_enter_to_session_s", round(opened - enter, 3))
    props = session(sid, "Service", "Type", "Seat", "Remote", "Class")
    assert props == {"Service": "gdm-password", "Type": "x11", "Seat": "seat0", "Remote": "no", "Class": "user"}, props
    wait_for(lambda: f"session {sid} (alice, seat0" in journal() and "registered by gdm-password for phone" in journal(),
             what=lambda: "the session on record:\n" + journal())
    no_password_in_logs()


def test_gdm_login_screen_over_xdmcp_asks_at_once_and_offers_no_phone(login_screen, alice):
    """GDM's login screen on an X terminal: the password prompt comes at once; boxkeyd does not
    offer phone login there (PAM_RHOST is the X terminal's address and the asking worker is in
    no local session: a display that could be anywhere); a typed password logs alice in."""
    env = login_screen
    waited = to_password_prompt(env)
    figure(f"gdm_xdmcp_{SUITE}_user_name_to_password_prompt_s", round(waited, 3))
    assert waited < 1.0, waited
    wait_for(lambda: "not offering phone login to gdm-password" in journal(), what="boxkeyd's word on the prompt")
    assert "remote login from 127.0.0.1 with no local session" in journal(), journal()
    time.sleep(1)  # what the login screen draws after the prompt
    shown = texts(a11y(GDM_USER, env))
    assert not any(t.startswith("Box 4821") for t in shown), shown
    png = screenshot(env, f"gdm-{SUITE}.png")
    os.makedirs(DOCS, exist_ok=True)
    shutil.copy(png, os.path.join(DOCS, f"gdm-{SUITE}-xdmcp.png"))
    r = alice("login", "--no-stay")  # the phone's push finds no prompt that takes it
    assert r.returncode != 0, r.stdout + r.stderr
    inside("xdotool", "type", "--delay", "20", PASSWORD, env=x_env(env))
    typed = time.monotonic()
    inside("xdotool", "key", "Return", env=x_env(env))
    [sid] = wait_for(lambda: sessions_of("alice"), timeout=60, what=lambda: "alice's session:\n" + gdm_state())
    figure(f"gdm_xdmcp_{SUITE}_typed_password_to_session_s", round(time.monotonic() - typed, 3))
    props = session(sid, "Service", "Type", "Seat", "Remote")
    assert props == {"Service": "gdm-password", "Type": "x11", "Seat": "", "Remote": "yes"}, props  # logind: a remote X display
    wait_for(lambda: f"not registering session {sid} for alice by gdm-password: not a local session" in journal(),
             what="boxkeyd's word on the session")
    no_password_in_logs()


# alice's GNOME session on seat0 (greetd, startx with Xvfb), and gnome-shell's lock screen in it.



def screensaver_active(env):
    r = inside("gdbus", "call", "--session", "--dest", "org.gnome.Shell.ScreenShield", "--object-path", "/org/gnome/ScreenSaver",
               "--method", "org.gnome.ScreenSaver.GetActive", user="alice", env=env, check=False)
    return r.stdout.strip() if r.returncode == 0 else None


class LockedHintSetters:
    """Who calls logind's SetLockedHint (busctl monitor on the system bus): the command name of
    each caller."""

    def __init__(self):
        self.p = inside_background("busctl", "monitor", "--system", "--json=short",
                                   "--match", "type='method_call',interface='org.freedesktop.login1.Session',member='SetLockedHint'")
        time.sleep(0.5)

    def callers(self):
        found = []
        for line in self.p.said().splitlines():
            try:
                m = json.loads(line)
            except ValueError:
                continue
            if m.get("member") != "SetLockedHint":
                continue
            r = inside("busctl", "call", "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus",
                       "GetConnectionUnixProcessID", "s", m["sender"], check=False)
            pid = r.stdout.split()[-1] if r.returncode == 0 else None
            found.append((read(f"/proc/{pid}/comm").strip() if pid else m["sender"], m.get("payload", {}).get("data")))
        return found

    def stop(self):
        self.p.terminate()
        inside("pkill", "-f", "busctl monitor --system", check=False)


GREETD_UNIT = "boxkey-test-greetd-gnome"  # and a number: a stopped transient unit lingers a moment


@pytest.fixture
def gnome(gdm_daemon, alice):
    """alice's GNOME session on seat0, GNOME's own way where the box allows it (Debian 13: GDM's
    login screen on seat0, push and Enter), else opened by greetd with GDM's daemon beside it
    (Debian 12: GDM 43 cannot open a display without a VT). The phone does not stay (see
    gnome_by_greetd). Yields (session, alice's gnome-shell's environment)."""
    yield from (gnome_by_gdm if GDM_SEAT0 else gnome_by_greetd)(alice)


def end_gnome_sessions():
    """Ends alice's sessions, unlocked first: gnome-shell ended while locked leaves
    screenShield.locked in its runtime state (/run/user/UID, which stays while her service
    manager lingers), and the next gnome-shell locks at once (screenShield.js lockIfWasLocked,
    for a shell that crashed while locked)."""
    for s in sessions_of("alice"):
        if session(s, "LockedHint").get("LockedHint") == "yes":
            inside("loginctl", "unlock-session", s, check=False)
            try:
                wait_for(lambda: session(s, "LockedHint").get("LockedHint") != "yes", timeout=10, what="the unlock")
            except AssertionError:
                pass
        inside("loginctl", "terminate-session", s, check=False)


def gnome_by_gdm(alice):
    env = wait_for(lambda: shell_env(GDM_USER, ":0"), timeout=120, what=lambda: "GDM's login screen on seat0:\n" + gdm_state())
    wait_for(lambda: focused(a11y(GDM_USER, env), "text"), timeout=60,
             what=lambda: f"the user name entry; the login screen shows {texts(a11y(GDM_USER, env))}")
    try:
        inside("xdotool", "type", "--delay", "30", "alice", env=x_env(env))
        inside("xdotool", "key", "Return", env=x_env(env))
        wait_for(lambda: "login prompt waiting: gdm-password on seat0 for alice" in journal(), what="the prompt at the box")
        phone = alice.background("login", "--no-stay")
        alice.waits_for_enter(phone)
        inside("xdotool", "key", "Return", env=x_env(env))
        assert phone.wait(60) == 0, phone.said()
        [sid] = wait_for(lambda: sessions_of("alice"), timeout=60, what=lambda: "alice's session:\n" + gdm_state())
        env = wait_for(lambda: shell_env("alice"), timeout=120, what=lambda: "alice's gnome-shell:\n" + gdm_state())
        wait_for(lambda: screensaver_active(env) == "(false,)", timeout=60, what="gnome-shell's screen shield")
        wait_for(lambda: f"session {sid} (alice, seat0" in journal() and "registered by gdm-password for phone" in journal(),
                 what=lambda: "the session on record:\n" + journal())
        time.sleep(3)  # GNOME settles (see gnome_by_greetd)
        assert session(sid, "LockedHint")["LockedHint"] == "no"
        yield sid, env
    finally:
        inside("pkill", "-KILL", "-f", "boxkey login", check=False)
        end_gnome_sessions()
        wait_for(lambda: not sessions_of("alice"), timeout=60, what=lambda: "alice's session to end:\n" + gdm_state())


def gnome_by_greetd(alice):
    """alice's GNOME session (GNOME on Xorg: gnome-session and gnome-shell) on seat0, opened by
    greetd (no VT: vt = "none") with a push and Enter at its scripted greeter; GDM's daemon runs
    beside it for gnome-shell's unlock dialog (a temporary reauthentication channel).

    The phone does not stay as the presence link: while GNOME starts (llvmpipe on both cores)
    the simulated radio's link missed its supervision timeout, and walk-away locked the session
    before the test began. The presence link comes from the phone's push at the unlock dialog,
    once GNOME has started."""
    inside("sh", "-c", f"mkdir -p -m 1777 {RUN} && rm -f {RUN}/greetd.commands {RUN}/greetd.events && "
                       f"mkfifo -m 666 {RUN}/greetd.commands && install -m 666 /dev/null {RUN}/greetd.events && cat >{RUN}/greetd-gnome.toml",
           input='[terminal]\nvt = "none"\n\n[default_session]\ncommand = "/usr/local/bin/gnome-greetd-greeter"\nuser = "_greetd"\n')
    unit = f"{GREETD_UNIT}-{time.monotonic_ns()}"
    inside("systemd-run", f"--unit={unit}", "--collect", *QUICK_STOP, "/usr/sbin/greetd", "--config", f"{RUN}/greetd-gnome.toml")
    try:
        g = Greetd()
        g.next("ready", timeout=30)
        g.do("create", user="alice")
        g.next("reply", auth_message_type="secret")
        phone = alice.background("login", "--no-stay")
        assert "greetd on seat0" in alice.waits_for_enter(phone)
        g.do("respond", text="")
        g.next("reply", type="success")
        g.do("start", cmd=["/usr/local/bin/gnome-x-session"], env=["XDG_SESSION_TYPE=x11", "XDG_SESSION_DESKTOP=gnome-xorg"])
        g.next("started")
        assert phone.wait(30) == 0, phone.said()
        [sid] = wait_for(lambda: sessions_of("alice"), timeout=30, what="alice's session")
        env = wait_for(lambda: shell_env("alice"), timeout=120, what=lambda: "alice's gnome-shell:\n" + gdm_state())
        wait_for(lambda: screensaver_active(env) == "(false,)", timeout=60,
                 what=lambda: "gnome-shell's screen shield: " + inside("gdbus", "call", "--session", "--dest", "org.gnome.Shell.ScreenShield",
                                                                        "--object-path", "/org/gnome/ScreenSaver", "--method",
                                                                        "org.gnome.ScreenSaver.GetActive", user="alice", env=env,
                                                                        check=False).stderr + f"\n{env}\n" + journal("user@1000.service")[-3000:])
        wait_for(lambda: f"session {sid} (alice, seat0" in journal() and "registered by greetd for phone" in journal(),
                 what="the session on record")
        time.sleep(3)  # GNOME settles
        assert session(sid, "LockedHint")["LockedHint"] == "no"
        yield sid, env
    finally:
        inside("pkill", "-KILL", "-f", "boxkey login", check=False)  # the phone, staying or not
        end_gnome_sessions()
        wait_for(lambda: not sessions_of("alice"), timeout=60, what=lambda: "alice's session to end:\n" + gdm_state())
        inside("systemctl", "stop", unit, check=False)


def walk_away(sid, phone):
    """The phone goes (out of range): seconds until logind's LockedHint, and who set it."""
    setters = LockedHintSetters()
    try:
        assert session(sid, "LockedHint")["LockedHint"] == "no" and "presence link lost" not in journal(), journal()
        left = time.monotonic()
        inside("pkill", "-KILL", "-f", "boxkey login", check=False)
        phone.wait(10)
        wait_for(lambda: session(sid, "LockedHint")["LockedHint"] == "yes", timeout=20,
                 what=lambda: "LockedHint; boxkeyd said:\n" + journal())
        took = time.monotonic() - left
        who = wait_for(lambda: setters.callers(), timeout=5, what="the SetLockedHint call")
    finally:
        setters.stop()
    return took, who


def logged_at(pattern, after):
    """CLOCK_MONOTONIC time of boxkeyd's last journal line matching `pattern`, if after `after`."""
    r = inside("journalctl", "-u", "boxkeyd", "-o", "short-monotonic", "--no-pager", "-g", pattern, check=False)
    lines = [line for line in r.stdout.splitlines() if line.startswith("[")]
    if not lines:
        return None
    t = float(lines[-1][1:lines[-1].index("]")])
    return t if t >= after else None


def lock_from_logind(sid):
    """logind's Lock for the session (loginctl lock-session, as boxkeyd's walk-away does through
    LockSession): seconds until LockedHint, and who set it."""
    setters = LockedHintSetters()
    try:
        start = time.monotonic()
        inside("loginctl", "lock-session", sid)
        wait_for(lambda: session(sid, "LockedHint")["LockedHint"] == "yes", timeout=20, what="LockedHint")
        took = time.monotonic() - start
        who = wait_for(lambda: setters.callers(), timeout=5, what="the SetLockedHint call")
    finally:
        setters.stop()
    return took, who


def unlock_with_push_and_enter(sid, env, alice, shot=None):
    """A person at the locked box: a key lifts gnome-shell's curtain and its unlock dialog asks
    GDM (gdm-password); the phone pushes and stays; Enter in the empty password field. The
    phone (the presence link now)."""
    watch = Watch("alice", env)
    try:
        pressed = time.monotonic()
        inside("xdotool", "key", "Return", env=x_env(env))
        shown = watch.first(pressed, lambda e: e["role"] == "password text" and e.get("focused"), timeout=30,
                            what="the unlock dialog's password entry")
    finally:
        watch.stop()
    figure(f"gnome_{SUITE}_key_to_unlock_prompt_s", round(shown["t"] - pressed, 3))
    wait_for(lambda: "login prompt waiting: gdm-password" in journal(), timeout=10,
             what=lambda: f"the prompt at the box; boxkeyd said:\n{journal()}")
    wait_for(lambda: [t for t in texts(a11y("alice", env)) if t.startswith(BOX_LINE)], timeout=10,
             what=lambda: f"Boxkey's line; the unlock dialog shows {texts(a11y('alice', env))}")
    if shot:
        time.sleep(1)  # the line fades in
        inside("import", "-window", "root", f"/root/{shot}", env=x_env(env))
        os.makedirs(DOCS, exist_ok=True)
        shutil.copy(os.path.join(ROOT, "root", shot), os.path.join(DOCS, shot))
    pushed = time.monotonic()
    phone = alice.background("login")
    said = alice.waits_for_enter(phone)
    assert "gdm-password" in said, said
    enter = time.monotonic()
    inside("xdotool", "key", "Return", env=x_env(env))
    wait_for(lambda: session(sid, "LockedHint")["LockedHint"] == "no", timeout=20, what=lambda: "the unlock; the phone said " + phone.said())
    unlocked = time.monotonic()
    accepted = wait_for(lambda: logged_at("login accepted: .* via gdm-password", after=enter), what="boxkeyd's login accepted")
    figure(f"gnome_{SUITE}_enter_to_authenticated_s", round(accepted - enter, 3))
    figure(f"gnome_{SUITE}_push_to_waiting_for_enter_s", round(enter - pushed, 3))
    figure(f"gnome_{SUITE}_enter_to_unlocked_s", round(unlocked - enter, 3))
    assert screensaver_active(env) == "(false,)"
    wait_for(lambda: "Staying connected" in phone.said(), what=lambda: f"the presence link; the phone said {phone.said()!r}")
    return phone


def test_gnome_shell_locks_on_logind_and_a_push_then_enter_in_its_unlock_dialog_unlocks(gnome, alice):
    sid, env = gnome
    took, who = lock_from_logind(sid)
    figure(f"gnome_{SUITE}_logind_lock_to_locked_hint_s", round(took, 3))
    assert who == [("gnome-shell", [True])], who  # gnome-shell itself, on logind's Lock
    assert screensaver_active(env) == "(true,)"
    phone = unlock_with_push_and_enter(sid, env, alice, shot=f"gnome-unlock-{SUITE}.png")
    # Walk-away: the phone that unlocked is the presence link; it goes, boxkeyd asks logind to
    # lock, gnome-shell locks and says so.
    time.sleep(2)
    took, who = walk_away(sid, phone)
    figure(f"gnome_{SUITE}_walk_away_to_locked_s", round(took, 3))
    assert who == [("gnome-shell", [True])], who
    assert screensaver_active(env) == "(true,)"
    assert sessions_of("alice") == [sid]  # locked, not ended
    assert f"walk-away lock: session {sid}" in journal(), journal()
    # And back: push and Enter again.
    unlock_with_push_and_enter(sid, env, alice)
    inside("pkill", "-KILL", "-f", "boxkey login", check=False)
    no_password_in_logs()


def test_the_phone_unlocks_gnome_shell_through_logind_when_the_box_allows_it(gnome, alice):
    sid, env = gnome
    configure_box(unlock={"logind_unlock": "true"})
    try:
        lock_from_logind(sid)
        # No prompt is open at the box (the curtain is down, no unlock dialog): the push is
        # checked by the box's boxkey-verify and unlocks through logind's UnlockSession, which
        # gnome-shell follows (screenShield.js: 'Unlock' -> deactivate).
        start = time.monotonic()
        r = alice("login", "--no-stay")
        assert r.returncode == 0 and "unlocked through logind" in r.stdout, r.stdout + r.stderr
        wait_for(lambda: session(sid, "LockedHint")["LockedHint"] == "no", timeout=20, what="the unlock")
        figure(f"gnome_{SUITE}_push_to_unlocked_through_logind_s", round(time.monotonic() - start, 3))
        wait_for(lambda: screensaver_active(env) == "(false,)", timeout=10, what="gnome-shell's shield to go")
    finally:
        configure_box()
