"""End-to-end fixtures: real boxkeyd and boxkey processes on the simulated radio, a real PAM
stack (pam_wrapper + pamtester + pam_matrix), and python-dbusmock's logind on a private bus.
The box knows its users (alice 1000, mallory 1001, bob 1002) through nss_wrapper; several
phones, each its own boxkey home, share the air.

In the VM lab (Tests/lab, BOXKEY_E2E_RADIO=bluez) the same fixtures put the box on hci0 and the
phone on hci1 through the real bluetoothd, and logind's mock on the lab's system bus (BlueZ
lives there too); binaries come prebuilt from the host (BOXKEY_E2E_PREBUILT)."""
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time

import dbus
import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PAM_MATRIX = "/usr/lib/x86_64-linux-gnu/pam_wrapper/pam_matrix.so"
PASSWORD = "correct horse battery"
PASSWORDS = {"alice": PASSWORD, "mallory": "mallory's own password", "bob": "bob's own password"}
USERS = {"alice": 1000, "mallory": 1001, "bob": 1002}
# The PAM services the World's box offers phone login in: pamtester's, pam_cycles' and two real ones.
SERVICES = ["login", "gdm-password", "boxkey-test", "boxkey-only"]
FINGERPRINT = r"[0-9A-F]{4}-[0-9A-F]{4}-[0-9A-F]{4}-[0-9A-F]{4}"
RADIO = os.environ.get("BOXKEY_E2E_RADIO", "simulated")
# The lab emulates its CPU (everything is 10-15x slower there): waits are this much longer.
SLOW = 4 if os.environ.get("BLELAB_GUEST") == "1" else 1


def pytest_configure(config):
    config.addinivalue_line("markers", "both_radios: runs on the simulated radio and, in the VM lab, over real BlueZ "
                                       "(scripts/lab-test runs `pytest Tests/e2e -m both_radios` there)")


def wait_for(predicate, timeout=10.0, interval=0.05, what="condition"):
    timeout *= SLOW
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what() if callable(what) else what}")


def process_cpu_seconds(pid):
    """CPU time (user and system) process `pid` has used so far."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stop_process(p, sig=signal.SIGTERM, grace=5.0):
    """Sends `sig` to a Popen'd process and waits for it; SIGKILL after `grace` seconds. Never
    raises. Returns False if it took the SIGKILL."""
    if p is None or p.poll() is not None:
        return True
    try:
        p.send_signal(sig)
        p.wait(grace)
        return True
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        return False
    except ProcessLookupError:
        p.wait()
        return True


def memory_count(pid, secret, run=None):
    """How many times `secret` (bytes) is in process `pid`'s readable, writable memory (root
    reads /proc/PID/mem even of a non-dumpable process). With `run`, any `run`-byte piece of
    it counts: a freed heap block keeps a copy minus its first 16 bytes (malloc's own pointers),
    which a search for the whole secret misses."""
    pieces = [secret] if run is None else {secret[i:i + run] for i in range(len(secret) - run + 1)}
    hits, chunk = 0, 1 << 24
    overlap = max(len(p) for p in pieces) - 1
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            fields = line.split()
            if not fields[1].startswith("rw"):
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            for at in range(start, end, chunk):
                try:
                    mem.seek(at)
                    data = mem.read(min(chunk + overlap, end - at))
                except (OSError, ValueError, OverflowError):
                    break
                hits += sum(data.count(p) for p in pieces)
    return hits


def btmgmt(adapter, *args):
    """btmgmt on adapter hciN (the lab only: `btmgmt --index N ...`)."""
    r = subprocess.run(["btmgmt", "--index", adapter.removeprefix("hci"), *args], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, f"btmgmt {adapter} {' '.join(args)}: {r.stdout}{r.stderr}"


def drop_le_links(adapter):
    """Ends every LE link of adapter hciN with an HCI Disconnect (the lab only); returns how many."""
    out = subprocess.run(["hcitool", "-i", adapter, "con"], capture_output=True, text=True, timeout=30).stdout
    handles = re.findall(r"LE [0-9A-F:]{17} handle (\d+)", out)
    for handle in handles:
        subprocess.run(["hcitool", "-i", adapter, "ledc", handle], capture_output=True, timeout=30)
    return len(handles)


def running(pid):
    """Whether `pid` is alive (a zombie is not)."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def kernel_bugs():
    out = subprocess.run(["dmesg"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if re.search(r"kernel BUG|Oops|list_del corruption", line)]


@pytest.fixture(autouse=True)
def kernel_stays_sound():
    """In the lab: fails a test during which the VM's kernel oopsed (its Bluetooth stack is
    unusable afterwards, so every later failure in this VM is suspect)."""
    before = len(kernel_bugs()) if RADIO == "bluez" else 0
    yield
    new = kernel_bugs()[before:] if RADIO == "bluez" else []
    assert not new, "the lab's kernel oopsed during this test (console.log has the trace):\n" + "\n".join(new)


@pytest.fixture(scope="session")
def bins():
    prebuilt = os.environ.get("BOXKEY_E2E_PREBUILT")
    if prebuilt:
        return {"boxkeyd": os.path.join(prebuilt, "boxkeyd"), "boxkey": os.path.join(prebuilt, "boxkey"),
                "module": os.path.join(prebuilt, "pam_boxkey.so"), "harness": os.path.join(prebuilt, "pam_cycles")}
    bin_dir = subprocess.run(["swift", "build", "--show-bin-path"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout.strip()
    subprocess.run(["swift", "build"], cwd=ROOT, check=True, capture_output=True)
    module = subprocess.run([os.path.join(ROOT, "scripts/build-pam-module")], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout.strip()
    harness = os.path.join(tempfile.mkdtemp(prefix="boxkey-harness-"), "pam_cycles")
    subprocess.run(["gcc", "-O2", "-o", harness, os.path.join(ROOT, "Tests/e2e/pam_cycles.c"), "-lpam"], check=True)
    return {"boxkeyd": os.path.join(bin_dir, "boxkeyd"), "boxkey": os.path.join(bin_dir, "boxkey"),
            "module": module, "harness": harness}


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, str):
        return f'"{v}"'
    return str(v)


# logind's GetSessionByPID finds the session from the process's cgroup; the mock reads the
# MOCK_LOGIND_SESSION variable the test gave the process instead. dbusmock runs this with exec()
# and separate locals: no comprehensions that would need `args`.
GET_SESSION_BY_PID = """\
session = ''
try:
    with open('/proc/%d/environ' % args[0], 'rb') as f:
        for entry in f.read().split(b'\\0'):
            if entry.startswith(b'MOCK_LOGIND_SESSION='):
                session = entry.split(b'=', 1)[1].decode()
except OSError:
    pass
if not session:
    raise dbus.exceptions.DBusException('PID %d does not belong to any known session' % args[0],
                                        name='org.freedesktop.login1.NoSessionForPID')
ret = dbus.ObjectPath('/org/freedesktop/login1/session/' + session)
"""


# LockSession as logind with the session's locker: a session whose Type is not tty (a desktop
# whose locker follows logind's Lock signal) says it is locked (LockedHint); a text console does not.
LOCK_SESSION = """\
session = objects.get('/org/freedesktop/login1/session/' + args[0])
if session is not None and session.Get('org.freedesktop.login1.Session', 'Type') != 'tty':
    session.Set('org.freedesktop.login1.Session', 'LockedHint', dbus.Boolean(True))
"""


class Logind:
    """A private dbus-daemon with dbusmock's logind template, plus GetSessionByPID; `calls()`
    reads its call log ('LockSession "42"', 'TerminateSession "42"', ...)."""
    BUS_NAME, PATH, MOCK = "org.freedesktop.login1", "/org/freedesktop/login1", "org.freedesktop.DBus.Mock"

    def __init__(self, work):
        self.log = os.path.join(work, "logind.log")
        self.bus = self.mock = self.connection = None
        try:
            self._start(work)
        except BaseException:
            self.stop()  # what did start
            raise

    def _start(self, work):
        if RADIO == "bluez":
            # The lab's own system bus, which BlueZ is on; the VM is thrown away afterwards.
            self.address = os.environ.get("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/run/dbus/system_bus_socket")
            env = dict(os.environ)
        else:
            address_file = os.path.join(work, "bus-address")
            with open(address_file, "w") as out:
                self.bus = subprocess.Popen(["dbus-daemon", "--session", "--nofork", "--print-address=1"],
                                            stdout=out, stderr=subprocess.DEVNULL)
            wait_for(lambda: os.path.getsize(address_file) > 0, what="dbus-daemon")
            self.address = open(address_file).readline().strip()
            env = dict(os.environ, DBUS_SYSTEM_BUS_ADDRESS=self.address)
        env.pop("DISPLAY", None)  # the template copies it into every session
        self.mock = subprocess.Popen(["/usr/bin/python3", "-m", "dbusmock", "--system", "--template", "logind", "-l", self.log],
                                     env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: subprocess.run(["dbus-send", "--system", "--print-reply", f"--dest={self.BUS_NAME}", self.PATH,
                                         "org.freedesktop.DBus.Peer.Ping"], env=env, capture_output=True).returncode == 0,
                 timeout=30 if RADIO == "bluez" else 10, what="logind mock")
        self.connection = dbus.bus.BusConnection(self.address)
        self.manager = self.connection.get_object(self.BUS_NAME, self.PATH)
        self.manager.AddMethod("org.freedesktop.login1.Manager", "GetSessionByPID", "u", "o", GET_SESSION_BY_PID,
                               dbus_interface=self.MOCK)
        self.manager.AddMethod("org.freedesktop.login1.Manager", "LockSession", "s", "", LOCK_SESSION, dbus_interface=self.MOCK)

    def add_session(self, id, uid, user, seat="seat0", remote=False, locked=False, tty="", display="", service="", locker=True):
        """A logind session. A remote one (sshd's) has Remote=true, no seat and a remote host.
        With a locker (a desktop whose locker follows logind) LockSession sets its LockedHint;
        without one (Type tty: a text console) nothing does."""
        self.manager.AddSession(id, seat, dbus.UInt32(uid), user, True, dbus_interface=self.MOCK)
        props = {"TTY": tty, "Display": display, "LockedHint": dbus.Boolean(locked), "Service": service,
                 "Type": "x11" if locker else "tty"}
        if remote:
            props.update(Remote=dbus.Boolean(True), RemoteHost="203.0.113.9", TTY=tty or "pts/0",
                         Seat=dbus.Struct(("", dbus.ObjectPath("/")), signature="so"))
        session = self.connection.get_object(self.BUS_NAME, f"{self.PATH}/session/{id}")
        for name, value in props.items():
            # Properties.Set, not the Mock's UpdateProperties: that cannot signal a struct (Seat).
            session.Set("org.freedesktop.login1.Session", name, value, dbus_interface=dbus.PROPERTIES_IFACE)

    def without_locker(self, id):
        """Session `id` becomes a text console's (Type tty): LockSession no longer sets its
        LockedHint."""
        session = self.connection.get_object(self.BUS_NAME, f"{self.PATH}/session/{id}")
        session.Set("org.freedesktop.login1.Session", "Type", "tty", dbus_interface=dbus.PROPERTIES_IFACE)

    def calls(self):
        return open(self.log).read() if os.path.exists(self.log) else ""

    def call_time(self, call):
        """The wall-clock time (time.time()) of the first logged call containing `call`, or None."""
        return next((float(line.split(" ", 1)[0]) for line in self.calls().splitlines() if call in line), None)

    def stop(self):
        """Stops the mock, then its bus, and waits for both (SIGKILL if they do not end)."""
        try:
            if self.connection is not None:
                self.connection.close()
        finally:
            stop_process(self.mock)
            stop_process(self.bus)


# greeter(stdin=PERSON): a person sits at the prompt and presses Enter once a phone's push waits
# there (the box says so in its log), as someone who pushed from the phone at the box would.
PERSON = object()


class Prompt:
    """A running pamtester: its output is collected as it comes (stdbuf makes pamtester's stdout
    line-buffered; prompts go to unbuffered stderr), its input can be typed later."""

    def __init__(self, process, stdin, box_output=None):
        self.process = process
        self.pid = process.pid
        self._out = bytearray()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.enters = 0
        if stdin is PERSON:
            threading.Thread(target=self._press_enter_on_hold, args=(box_output,), daemon=True).start()
        elif stdin is not None:
            try:
                self.type(stdin)
            except BrokenPipeError:
                pass
            self.close_input()

    def _press_enter_on_hold(self, box_output):
        held = f"(pid {self.pid}): waiting"
        while self.process.poll() is None and not self.process.stdin.closed:
            if box_output().count(held) > self.enters:
                self.enters += 1
                try:
                    self.type("\n")
                except (BrokenPipeError, ValueError):
                    return
            time.sleep(0.02)

    def _read(self):
        while chunk := os.read(self.process.stdout.fileno(), 4096):
            self._out += chunk

    def text(self):
        return bytes(self._out).decode("utf-8", "replace")

    def type(self, text):
        self.process.stdin.write(text.encode())
        self.process.stdin.flush()

    def type_at_prompt(self, n, text, prompt="Password:"):
        """Types `text` once the `n`th `prompt` is on the screen (a terminal program flushes what
        was typed before its prompt)."""
        wait_for(lambda: self.text().count(prompt) >= n, what=f"prompt {n} ({prompt})")
        self.type(text)

    def close_input(self):
        if not self.process.stdin.closed:
            try:
                self.process.stdin.close()
            except BrokenPipeError:
                pass

    def poll(self):
        return self.process.poll()

    def kill(self):
        self.process.kill()


class World:
    """One box and its users, one or more phones, PAM prompts, in a temporary folder."""

    def __init__(self, bins, work, logind):
        self.bins, self.work, self.logind = bins, work, logind
        self.sim = os.path.join(work, "air")
        self.socket = os.path.join(work, "run", "pam.sock")
        self.box_log = os.path.join(work, "boxkeyd.log")
        self.box_process = None
        self.boxes = []  # every boxkeyd started, stopped when the test ends
        self.outputs = []  # everything every process printed, for the no-password check
        # XDG_STATE_HOME and XDG_RUNTIME_DIR too: the agent's log and socket stay in the test's
        # folder (not the real $HOME).
        self.env = dict(os.environ, BOXKEY_SIM_DIR=self.sim, BOXKEY_RADIO=RADIO, DBUS_SYSTEM_BUS_ADDRESS=logind.address,
                        XDG_CONFIG_HOME=os.path.join(work, "phone", "config"),
                        XDG_DATA_HOME=os.path.join(work, "phone", "data"),
                        XDG_STATE_HOME=os.path.join(work, "phone", "state"),
                        XDG_RUNTIME_DIR=os.path.join(work, "phone", "run"))
        for name in ("XDG_SESSION_ID", "MOCK_LOGIND_SESSION", "LD_PRELOAD"):
            self.env.pop(name, None)
        self.phone_adapter = "hci1" if RADIO == "bluez" else None
        self.phone_adapters = {}  # who -> "hciN": phones on other adapters than the World's (the lab)
        if RADIO == "bluez":
            self.env["BOXKEY_ADAPTER"] = self.phone_adapter
        # boxkeyd.conf, section by section; tests change values here before start_box().
        self.settings = {
            "box": {"id": "4821", "state_directory": f"{work}/box"},
            "radio": {"backend": RADIO, "adapter": "hci0" if RADIO == "bluez" else ""},
            "presence": {"grace_s": 1},
            "pam": {"socket": self.socket, "services": list(SERVICES)},
        }
        if RADIO == "bluez":
            # The lab's btvirt answers HCI Read RSSI with "Unknown HCI Command": the connected-link
            # RSSI is never readable there, and an unreadable signal is walking away after
            # away_after_s (5 s). Off in the lab, so that link loss and keepalives decide;
            # Tests/lab/test_walk_away.py checks that fail-closed lock on its own.
            self.settings["presence"]["away_after_s"] = 3600
        self.config_extra = ""  # appended verbatim: sections not in settings
        # The lab's CPU is emulated (10-15 times slower): a fresh box's first answer may take
        # longer there than the module's 500 ms on hardware.
        self.module_options = "timeout=20 answer_prompt" + (" first_answer_ms=3000" if RADIO == "bluez" else "")
        self.prompts = 0
        self.processes = []  # prompts and background phones, stopped when the test ends
        os.makedirs(os.path.join(work, "pam.d"))
        with open(os.path.join(work, "passdb"), "w") as f:
            f.writelines(f"{user}:{password}:boxkey-test\n" for user, password in PASSWORDS.items())
        with open(os.path.join(work, "passwd"), "w") as f:
            f.write("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
            f.writelines(f"{user}:x:{uid}:{uid}:{user}:/home/{user}:/bin/sh\n" for user, uid in USERS.items())
        with open(os.path.join(work, "group"), "w") as f:
            f.write("root:x:0:\nnogroup:x:65534:\n")
            f.writelines(f"{user}:x:{uid}:\n" for user, uid in USERS.items())
        open(os.path.join(work, "pam_env.conf"), "w").close()
        # The box's users, for boxkeyd and for the PAM stacks.
        self.nss = {"LD_PRELOAD": "libnss_wrapper.so", "NSS_WRAPPER_PASSWD": os.path.join(work, "passwd"),
                    "NSS_WRAPPER_GROUP": os.path.join(work, "group")}
        # The box's own password-only PAM service (boxkey-verify): it confirms a pending phone's
        # first push and serves [unlock]. pam_matrix stands in for pam_unix, through pam_wrapper.
        self.box_pam = os.path.join(work, "box.pam.d")
        os.makedirs(self.box_pam)
        with open(os.path.join(work, "verify.passdb"), "w") as f:
            f.writelines(f"{user}:{password}:boxkey-verify\n" for user, password in PASSWORDS.items())
        with open(os.path.join(self.box_pam, "boxkey-verify"), "w") as f:
            f.write(f"auth required {PAM_MATRIX} passdb={work}/verify.passdb\n"
                    f"account required {PAM_MATRIX} passdb={work}/verify.passdb\n")
        self.box_env = dict(self.env, **dict(self.nss, LD_PRELOAD="libpam_wrapper.so:libnss_wrapper.so"),
                            PAM_WRAPPER="1", PAM_WRAPPER_SERVICE_DIR=self.box_pam)

    def add_user(self, user, uid, password):
        """Another user the box knows, with a password its PAM stacks accept (before start_box)."""
        for name, line in (("passwd", f"{user}:x:{uid}:{uid}:{user}:/home/{user}:/bin/sh"), ("group", f"{user}:x:{uid}:"),
                           ("passdb", f"{user}:{password}:boxkey-test"), ("verify.passdb", f"{user}:{password}:boxkey-verify")):
            with open(os.path.join(self.work, name), "a") as f:
                f.write(line + "\n")

    # --- box -------------------------------------------------------------------------------
    def config(self):
        """The settings as boxkeyd.conf, written whole (a new file renamed over the old, as
        editors and config management do): the running box may read it at any moment (its
        start-up check, a reload), and must never see half a file."""
        path = os.path.join(self.work, "boxkeyd.conf")
        text = "".join(f"[{section}]\n" + "".join(f"{key} = {toml_value(value)}\n" for key, value in values.items())
                       for section, values in self.settings.items()) + self.config_extra
        try:
            with open(path) as f:
                if f.read() == text:
                    return path
        except OSError:
            pass
        with open(path + ".new", "w") as f:
            f.write(text)
        os.rename(path + ".new", path)
        return path

    def start_box(self, expect_ready=True):
        # The log is appended to across restarts: readiness is read from this run's part.
        self.box_run_start = os.path.getsize(self.box_log) if os.path.exists(self.box_log) else 0
        self.box_process = subprocess.Popen([self.bins["boxkeyd"], "--config", self.config(), "--log-level", "debug"],
                                            env=self.box_env, stdout=open(self.box_log, "a"), stderr=subprocess.STDOUT)
        self.boxes.append(self.box_process)
        if expect_ready:
            slow = 60 if RADIO == "bluez" else 10  # the lab emulates its CPU
            wait_for(lambda: os.path.exists(self.socket), timeout=slow, what="boxkeyd's socket")
            wait_for(lambda: "advertising box" in self.box_run_output(), timeout=slow, what="boxkeyd advertising")
        return self.box_process

    def stop_box(self):
        assert stop_process(self.box_process, grace=10), "boxkeyd did not stop within 10 s of SIGTERM"

    def background_links(self):
        """The pids of running agents (`boxkey agent start`, `boxkey login --background`) of
        this World's phones: each runs in its own session, so no process list of ours holds
        them. Found by their command line and the phone home in their environment."""
        pids = []
        for pid in (int(d) for d in os.listdir("/proc") if d.isdigit()):
            try:
                cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
                environ = open(f"/proc/{pid}/environ", "rb").read()
            except OSError:
                continue
            if cmdline.startswith(self.bins["boxkey"].encode() + b"\0") and b"--detached-child" in cmdline \
                    and self.work.encode() in environ:
                pids.append(pid)
        return pids

    # --- a phone leaving and coming back: the one radio-specific step of the shared tests ------
    def walk_away(self, phone):
        """`phone` (a phone_background holding the presence link) leaves. Simulated radio: it
        walks out of range (45 m, over 1 s). BlueZ (the lab): it freezes (SIGSTOP) and its
        controller drops the link, as a supervision timeout would. btvirt has no range to leave,
        and powering the phone's controller off with a live link makes the lab's kernel oops."""
        if RADIO == "bluez":
            phone.send_signal(signal.SIGSTOP)
            assert drop_le_links(self.phone_adapter), f"no LE link on {self.phone_adapter}"
        else:
            self.phone("sim", "move", "45", "--over", "1")

    def come_back(self, phone):
        """`phone` is back in range (thawed, in the lab: it finds its link gone and re-attaches)."""
        if RADIO == "bluez":
            phone.send_signal(signal.SIGCONT)
        else:
            self.phone("sim", "move", "1")

    def close(self):
        """Stops and waits for everything the test started: prompts and phones, background
        links, then the box (SIGTERM, as systemd would). Every step runs even when the test or
        an earlier step failed; a box that needed SIGKILL fails the test after that."""
        for p in self.processes:
            stop_process(p, signal.SIGKILL)
        for pid in self.background_links():
            # Not our child: Ctrl-C for it (how its user stops it), and wait for it to go.
            for sig in (signal.SIGINT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                    wait_for(lambda: not running(pid), timeout=5, what=f"background link {pid} to end")
                    break
                except ProcessLookupError:
                    break
                except AssertionError:
                    continue
        stubborn = [p.pid for p in self.boxes if not stop_process(p, grace=10)]
        if RADIO == "bluez":
            # bluetoothd keeps a killed phone's link up; the next test's first connect to a new
            # box over such a link fails ("disconnected while resolving services"), so none is
            # left behind.
            for adapter in {self.phone_adapter, *self.phone_adapters.values()}:
                drop_le_links(adapter)
        assert not stubborn, f"boxkeyd {stubborn} did not stop within 10 s of SIGTERM"
        # With the ASan-built module: any report it wrote fails the test.
        reports = [f for f in os.listdir(self.work) if f.startswith("asan.")]
        assert not reports, "AddressSanitizer in the module:\n" + "\n".join(open(os.path.join(self.work, f)).read()[:4000] for f in reports)

    def box_output(self):
        """Everything every boxkeyd of this World logged."""
        return open(self.box_log).read() if os.path.exists(self.box_log) else ""

    def box_run_output(self):
        """What the boxkeyd started last logged: a wait after a restart must not be met by
        the run before it."""
        with open(self.box_log, "rb") as f:
            f.seek(getattr(self, "box_run_start", 0))
            return f.read().decode(errors="replace")

    def admin(self, *args):
        r = subprocess.run([self.bins["boxkeyd"], *args, "--config", self.config()], env=self.box_env, capture_output=True, text=True, timeout=20)
        self.outputs.append(r.stdout + r.stderr)
        return r

    def box_key(self):
        """The box's public key, 64 hex digits (for `boxkey pair --box-key`), from `boxkeyd status`."""
        status = self.admin("status").stdout
        m = re.search(r"^public key:\s+([0-9a-f]{64})$", status, re.M)
        assert m, status
        return m.group(1)

    def box_memory_count(self, secret, run=None):
        """How many times `secret` (bytes), or with `run` any piece of it that long, is in
        boxkeyd's readable, writable memory."""
        return memory_count(self.box_process.pid, secret, run)

    # --- phones ----------------------------------------------------------------------------
    def phone_env(self, who="alice"):
        """Each phone is its own boxkey home; alice's is the World's default phone."""
        env = dict(self.env)
        if who != "alice":
            home = os.path.join(self.work, f"phone-{who}")
            env.update(XDG_CONFIG_HOME=os.path.join(home, "config"), XDG_DATA_HOME=os.path.join(home, "data"),
                       XDG_STATE_HOME=os.path.join(home, "state"), XDG_RUNTIME_DIR=os.path.join(home, "run"))
        if who in self.phone_adapters:
            env["BOXKEY_ADAPTER"] = self.phone_adapters[who]
        return env

    def phone(self, *args, stdin=None, timeout=60, extra_env=None, who="alice"):
        env = dict(self.phone_env(who), **(extra_env or {}))
        r = subprocess.run([self.bins["boxkey"], *args], env=env, input=stdin, capture_output=True, text=True, timeout=timeout)
        self.outputs.append(r.stdout + r.stderr)
        return r

    def phone_background(self, *args, who="alice"):
        log = os.path.join(self.work, f"phone-{len(self.outputs)}-{time.monotonic_ns()}.log")
        p = subprocess.Popen([self.bins["boxkey"], *args], env=self.phone_env(who), stdout=open(log, "w"), stderr=subprocess.STDOUT)
        p.log = log
        self.processes.append(p)
        return p

    def staying_login(self, *args, who="alice"):
        """`boxkey login ARGS` in the background, returned once it holds the presence link."""
        p = self.phone_background("login", *args, who=who)
        wait_for(lambda: "Staying connected" in open(p.log).read(), what="presence link")
        return p

    def console_guarded_by_phone(self):
        """A box with alice's phone; she logs in at a text console (session 42, nothing on it
        follows Lock) by phone, which stays as the presence link: returned."""
        self.start_box()
        self.pair_and_store()
        self.logind.without_locker("42")
        greeter = self.greeter("authenticate", "open_session")
        holder = self.staying_login()
        assert self.finish(greeter)[0] == 0
        return holder

    def pairing_code(self, user=None):
        """A code minted by the box's admin: `boxkeyd pair-code [--user USER]`."""
        r = self.admin("pair-code", *(["--user", user] if user else []))
        m = re.search(r"Pairing code for box 4821: (\d{6})", r.stdout)
        assert r.returncode == 0 and m, r.stdout + r.stderr
        return m.group(1)

    def prompt_pairing_code(self, prompt, timeout=10):
        """The code a waiting login prompt shows ("New phone? Pairing code 123456: boxkey pair 4821 ...")."""
        wait_for(lambda: re.search(r"Pairing code (\d{6})", prompt.text()), timeout=timeout, what="the prompt's pairing code")
        return re.search(r"Pairing code (\d{6})", prompt.text()).group(1)

    def pair(self, code, who="alice"):
        return self.phone("pair", "4821", "--code", code, who=who)

    def pair_and_store(self, password=None, user="alice", who="alice", enrol=True):
        """Pairs a phone with an admin's code and stores its credentials. enrol: the code names the
        user, so the phone is enrolled at pairing; otherwise it is pending until its first login."""
        r = self.pair(self.pairing_code(user if enrol else None), who)
        assert r.returncode == 0 and "Paired with box 4821" in r.stdout, r.stdout + r.stderr + "\n--- box:\n" + self.box_output()[-3000:]
        r = self.phone("credentials", "set", "--user", user, stdin=(password or PASSWORDS[user]) + "\n", who=who)
        assert r.returncode == 0, r.stderr

    def pair_by_key(self, who, user="alice", password="a guess"):
        """A phone that pinned the box's key but was never enrolled (a stranger)."""
        r = self.phone("pair", "4821", "--box-key", self.box_key(), who=who)
        assert r.returncode == 0, r.stdout + r.stderr
        assert self.phone("credentials", "set", "--user", user, stdin=password + "\n", who=who).returncode == 0

    # --- the box's login prompts ------------------------------------------------------------
    def module_line(self, options=None):
        return f"auth [success=ok default=ignore] {self.bins['module']} socket={self.socket} {options if options is not None else self.module_options}"

    def matrix_line(self, control="required"):
        return f"auth {control} {PAM_MATRIX} passdb={self.work}/passdb"

    def pam_service(self, name="boxkey-test", directory=None, auth=None, envfile=None):
        """A PAM stack: the module, then pam_matrix asking for the password. In the session stack
        pam_env stands in for pam_systemd: it puts XDG_SESSION_ID from `envfile` into the PAM
        environment (readenv=1 is what makes pam_env read envfile)."""
        directory = directory or os.path.join(self.work, "pam.d")
        envfile = envfile or os.devnull
        with open(os.path.join(directory, name), "w") as f:
            f.write("\n".join(auth or [self.module_line(), self.matrix_line()]) + "\n"
                    f"account required {PAM_MATRIX} passdb={self.work}/passdb\n"
                    f"session required pam_env.so readenv=1 user_readenv=0 conffile={self.work}/pam_env.conf envfile={envfile}\n"
                    f"session optional {self.bins['module']} socket={self.socket}\n")
        return directory

    def pam_env(self, service_dir=None):
        # BOXKEY_E2E_MODULE_ASAN: the module is built with AddressSanitizer (scripts/asan-module-test),
        # whose runtime must be the first library the PAM program loads.
        asan = os.environ.get("BOXKEY_E2E_MODULE_ASAN")
        preload = (asan + ":" if asan else "") + "libpam_wrapper.so:libnss_wrapper.so"
        extra = {"ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1:log_path=" + os.path.join(self.work, "asan")} if asan else {}
        return dict(self.env, PAM_WRAPPER="1", PAM_WRAPPER_SERVICE_DIR=service_dir or os.path.join(self.work, "pam.d"),
                    **dict(self.nss, LD_PRELOAD=preload), **extra)

    def greeter(self, *operations, stdin=PERSON, user="alice", service="boxkey-test", tty="tty1", rhost=None,
                session="42", logind_session=None, env=None, auth=None, wait=True):
        """A login prompt: pamtester in its own copy of the test PAM stack. tty and rhost are its
        PAM items; session is the XDG_SESSION_ID its session stack puts in the PAM environment;
        logind_session is what logind's GetSessionByPID says about it (None: no session, as a
        display manager or getty); env is added to its process environment. stdin is written and
        closed at once (what the person types, "" for Ctrl-D); None keeps it open for
        Prompt.type(); PERSON presses Enter whenever a push waits at this prompt. Unless
        wait=False, returns once the daemon sees the prompt waiting."""
        self.prompts += 1
        directory = os.path.join(self.work, f"pam-{self.prompts}")
        os.makedirs(directory)
        envfile = os.path.join(directory, "session.env")
        with open(envfile, "w") as f:
            f.write(f"XDG_SESSION_ID={session}\n" if session else "")
        self.pam_service(service, directory, auth, envfile)
        items = [*(["-I", f"tty={tty}"] if tty else []), *(["-I", f"rhost={rhost}"] if rhost else [])]
        process_env = dict(self.pam_env(directory), **(env or {}))
        if logind_session:
            process_env["MOCK_LOGIND_SESSION"] = logind_session
        before = self.box_output().count("login prompt waiting")
        p = subprocess.Popen(["stdbuf", "-oL", "pamtester", "-v", *items, service, user, *(operations or ("authenticate",))],
                             env=process_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        prompt = Prompt(p, stdin, self.box_output)
        self.processes.append(p)
        if wait:
            wait_for(lambda: self.box_output().count("login prompt waiting") > before, what="the login prompt")
        return prompt

    def finish(self, greeter, timeout=30):
        greeter.close_input()
        greeter.process.wait(timeout)
        greeter._reader.join(5)
        out = greeter.text()
        self.outputs.append(out)
        return greeter.process.returncode, out


@pytest.fixture
def world(bins):
    """A World in a fresh folder. At teardown — after a failed test or a failed setup too —
    everything it started is stopped and waited for, and the folder removed."""
    work = tempfile.mkdtemp(prefix="boxkey-e2e-")
    logind = w = None
    try:
        logind = Logind(work)
        logind.add_session("42", USERS["alice"], "alice", tty="tty1")  # alice's console session
        w = World(bins, work, logind)
        yield w
    finally:
        try:
            if w is not None:
                w.close()
        finally:
            try:
                if logind is not None:
                    logind.stop()
            finally:
                shutil.rmtree(work, ignore_errors=True)
