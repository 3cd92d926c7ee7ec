"""The real programs of a box, driven as people drive them (scripts/box-test): a Debian 12 root
booted with systemd-nspawn, the packages installed with apt, and getty's login on a real
virtual console, LightDM on Xvfb with a scripted greeter, greetd, sudo, su, sshd, pkexec,
xss-lock with i3lock, sssd against a throwaway slapd, gnome-keyring.

scripts/box-test boots the root and runs these tests from this machine, reaching in with
nsenter: $BOXKEY_BOX_INIT is the root's PID 1 here, $BOXKEY_BOX_ROOT its folder. Times are
CLOCK_MONOTONIC, which the root shares. The box runs on the simulated radio (this machine has no
Bluetooth); the phone is the installed `boxkey`, run as root inside the box."""
import errno
import fcntl
import json
import os
import re
import subprocess
import termios
import time

import pytest

INIT = os.environ.get("BOXKEY_BOX_INIT")
ROOT = os.environ.get("BOXKEY_BOX_ROOT")
PASSWORDS = {"alice": "correct horse battery", "bob": "bob's own password"}
FIGURES = os.environ.get("BOXKEY_BOX_FIGURES")
SUITE = os.environ.get("BOXKEY_BOX_SUITE", "bookworm")


def pytest_collection_modifyitems(config, items):
    if not INIT:
        skip = pytest.mark.skip(reason="needs the booted box of scripts/box-test ($BOXKEY_BOX_INIT)")
        for item in items:
            item.add_marker(skip)


def wait_for(predicate, timeout=10.0, interval=0.02, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what() if callable(what) else what}")


def figure(name, value):
    """A measured figure for docs/performance.md (scripts/box-test prints them at the end)."""
    print(f"BOX-FIGURE {name} = {value}")
    if FIGURES:
        with open(FIGURES, "a") as f:
            f.write(json.dumps({name: value}) + "\n")


def inside(*args, input=None, check=True, timeout=60, user=None, env=None):
    """Runs a command in the booted root (as root, or `user` through runuser), clean environment."""
    prefix = ["runuser", "-u", user, "--"] if user else []
    extra = [f"{k}={v}" for k, v in (env or {}).items()]
    r = subprocess.run(["nsenter", "--target", INIT, "--all", "env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root",
                        "LANG=C.UTF-8", *extra, *prefix, *args], input=input, capture_output=True, text=True, timeout=timeout)
    if check:
        assert r.returncode == 0, f"{' '.join(args)}: {r.returncode}\n{r.stdout}{r.stderr}"
    return r


_logs = [0]


def inside_background(*args):
    """A long-running command in the root. Its output goes to a file of its own in the root:
    `p.said()` reads it."""
    _logs[0] += 1
    log = f"/root/background-{os.getpid()}-{_logs[0]}.log"
    p = subprocess.Popen(["nsenter", "--target", INIT, "--all", "env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root",
                          "LANG=C.UTF-8", "sh", "-c", 'exec "$@" >"$0" 2>&1', log, *args],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    p.said = lambda: read(log)
    return p


def read(path):
    """A file of the root, or "" when it is not there."""
    try:
        with open(os.path.join(ROOT, path.lstrip("/")), errors="replace") as f:
            return f.read()
    except OSError:
        r = inside("cat", path, check=False)
        return r.stdout if r.returncode == 0 else ""


_test_start = [None]


@pytest.fixture(autouse=True)
def _journal_from_here():
    """journal() reads from the test's start: what an earlier test logged never satisfies a
    later one's wait."""
    _test_start[0] = journal_cursor() if INIT else None
    yield


def journal(unit="boxkeyd", since=None):
    """The unit's journal since `since` (a cursor), by default since the test began."""
    args = ["journalctl", "-u", unit, "-o", "cat", "--no-pager"]
    cursor = since or _test_start[0]
    if cursor:
        args += ["--cursor", cursor]
    return inside(*args, check=False).stdout


def journal_cursor():
    r = inside("journalctl", "-n", "0", "--show-cursor", "--no-pager", check=False)
    m = re.search(r"-- cursor: (\S+)", r.stdout)
    return m.group(1) if m else None


def session(session_id, *props):
    """logind's properties of a session, as a dict (loginctl show-session)."""
    r = inside("loginctl", "show-session", session_id, *[f"--property={p}" for p in props], check=False)
    return dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)


def sessions_of(user):
    """The user's logind sessions that a person logged in to. Debian 13's systemd (256 and
    later) also lists the user's service manager (user@UID.service) as a session of class
    "manager", on no seat; it is no login of anyone's: left out, as boxkeyd leaves it out (a
    session on no seat is not at the box)."""
    r = inside("loginctl", "list-sessions", "--no-legend", check=False)
    ids = [line.split()[0] for line in r.stdout.splitlines() if len(line.split()) > 2 and line.split()[2] == user]
    return [sid for sid in ids if session(sid, "Class").get("Class") != "manager"]


class Console:
    """A virtual console of the kernel's (ttyN, a real VT the root's getty@ttyN runs on): its
    screen is /dev/vcsaN, and keys go in as if typed (TIOCSTI). Both are opened through the
    root's /dev: here a VT's vcsN nodes come and go as it is allocated and freed (systemd frees
    it when getty restarts), while the root's bind mounts keep them."""

    def __init__(self, n):
        self.n = n
        self.dev = f"/proc/{INIT}/root/dev"

    def screen(self):
        try:
            with open(f"{self.dev}/vcsa{self.n}", "rb") as f:
                data = f.read()
        except OSError as e:
            if e.errno == errno.ENXIO:  # the VT is freed for a moment while its getty restarts
                return ""
            raise
        rows, cols = data[0], data[1]
        chars = data[4::2]
        lines = [chars[r * cols:(r + 1) * cols].decode("cp437").rstrip() for r in range(rows)]
        while lines and not lines[-1]:
            lines.pop()
        return "\n".join(lines)

    def type(self, text):
        fd = os.open(f"{self.dev}/tty{self.n}", os.O_RDWR | os.O_NOCTTY)
        try:
            for byte in text.encode():
                fcntl.ioctl(fd, termios.TIOCSTI, bytes([byte]))
        finally:
            os.close(fd)

    def count(self, text):
        return self.screen().count(text)

    def wait_for_more(self, text, before, timeout=10.0):
        """Waits until `text` is on the screen more than `before` times; seconds it took."""
        start = time.monotonic()
        wait_for(lambda: self.count(text) > before, timeout=timeout, interval=0.005,
                 what=lambda: f"{text!r} on tty{self.n}; the screen:\n{self.screen()}")
        return time.monotonic() - start

    def at_login_prompt(self):
        lines = self.screen().splitlines()
        return bool(lines) and lines[-1].endswith("login:")

    def login_prompt(self, timeout=20.0):
        """Waits for getty's "login:" as the last line (a fresh getty after a logout or Ctrl-C).
        A screen left blank (systemd clears a VT when getty restarts) gets Enter, as a person
        would press it to see the prompt again."""
        start = time.monotonic()
        nudged = False
        while not self.at_login_prompt():
            if not nudged and time.monotonic() - start > 2 and not self.screen().strip():
                self.type("\n")
                nudged = True
            assert time.monotonic() - start < timeout, f"getty's login: on tty{self.n}; the screen:\n{self.screen()}"
            time.sleep(0.02)

    def reset(self):
        """Back to getty's login prompt, whatever was left on this console."""
        if not self.at_login_prompt():
            inside("systemctl", "restart", f"getty@tty{self.n}", check=False)
            self.login_prompt()


class Phone:
    """The installed `boxkey`, run as root inside the box with its own home, on the box's
    simulated radio."""

    def __init__(self, name):
        self.home = f"/root/phone-{name}"
        self.env = {"BOXKEY_RADIO": "simulated", "BOXKEY_SIM_DIR": "/run/boxkey-sim", "XDG_CONFIG_HOME": f"{self.home}/config",
                    "XDG_DATA_HOME": f"{self.home}/data", "XDG_STATE_HOME": f"{self.home}/state", "XDG_RUNTIME_DIR": f"{self.home}/run"}

    def __call__(self, *args, input=None, check=False, timeout=90):
        return inside("boxkey", *args, input=input, check=check, timeout=timeout, env=self.env)

    def background(self, *args):
        """`boxkey ARGS` running on (a push, a presence link); `p.said()` is what it printed."""
        return inside_background("env", *[f"{k}={v}" for k, v in self.env.items()], "boxkey", *args)

    @staticmethod
    def waits_for_enter(p, timeout=20.0):
        """Until the phone `p` says its push waits at the box for Enter; what it said."""
        return wait_for(lambda: "Press Enter at box 4821" in p.said() and p.said(), timeout=timeout,
                        what=lambda: f"the push to wait for Enter; the phone said: {p.said()!r}")

    @property
    def key(self):
        return json.loads(self("status", "--json", check=True).stdout)["phoneKey"]


def configure_box(**sections):
    """Writes /etc/boxkey/boxkeyd.conf (the simulated radio, and `sections`) and restarts boxkeyd."""
    settings = {"box": {"id": '"4821"'}, "radio": {"backend": '"simulated"', "sim_directory": '"/run/boxkey-sim"'},
                "presence": {"grace_s": "1"}}
    for name, values in sections.items():
        settings.setdefault(name, {}).update(values)
    text = "".join(f"[{name}]\n" + "".join(f"{k} = {v}\n" for k, v in values.items()) for name, values in settings.items())
    inside("sh", "-c", "cat >/etc/boxkey/boxkeyd.conf", input=text)
    # The unit makes no folder for the simulated radio unless asked (boxkeyd(8)).
    inside("mkdir", "-p", "/etc/systemd/system/boxkeyd.service.d")
    inside("sh", "-c", "cat >/etc/systemd/system/boxkeyd.service.d/simulated-radio.conf",
           input="[Service]\nRuntimeDirectory=boxkey-sim\n")
    inside("systemctl", "daemon-reload")
    cursor = journal_cursor()
    inside("systemctl", "restart", "boxkeyd")
    wait_for(lambda: "advertising box 4821" in journal(since=cursor), timeout=20, what="boxkeyd advertising")


@pytest.fixture(scope="session")
def box():
    """The booted root, set up once: users alice and bob with passwords, the box on the simulated
    radio, and alice's phone enrolled, paired and holding her password."""
    for user, password in PASSWORDS.items():
        if inside("id", user, check=False).returncode != 0:
            inside("useradd", "--create-home", "--shell", "/bin/bash", user)
        inside("chpasswd", input=f"{user}:{password}\n")
        if SUITE != "bookworm":
            # The test users' service managers run from the start and stay (lingering): on
            # Debian 13 in this machine's containers, systemd 257 now and then never hears that a
            # stopped user manager's cgroup is gone (user@UID.service "deactivating
            # (final-sigkill)" with no cgroup left), and every later login of that user waits for
            # it before its shell. That is the harness, not the box: with the manager kept
            # running, logins, locks and walk-aways are the same as on a box.
            inside("loginctl", "enable-linger", user)
    configure_box()
    phone = Phone("alice")
    inside("boxkeyd", "phones", "enrol", phone.key, "--user", "alice", "--name", "alice's phone")
    box_key = json.loads(inside("boxkeyd", "status", "--json").stdout)["publicKey"]
    assert phone("pair", "4821", "--box-key", box_key).returncode == 0
    assert phone("credentials", "set", "--user", "alice", input=PASSWORDS["alice"] + "\n").returncode == 0
    return phone


@pytest.fixture
def alice(box):
    """alice's phone, with a box in its default settings and no session of alice's left."""
    yield box
    for sid in sessions_of("alice"):
        inside("loginctl", "terminate-session", sid, check=False)
    wait_for(lambda: not sessions_of("alice"), timeout=15, what="alice's sessions to end")


def no_password_in_logs():
    """Nothing the box logged, nor anything in the journal, holds a password. Read as bytes:
    GNOME's and Plasma's programs log fields that are not UTF-8."""
    everything = subprocess.run(["nsenter", "--target", INIT, "--all", "journalctl", "-o", "export", "--no-pager"],
                                capture_output=True, timeout=120).stdout
    for password in PASSWORDS.values():
        assert password.encode() not in everything, "a password is in the journal"
