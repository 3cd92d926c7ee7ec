"""End-to-end fixtures: real boxkeyd and boxkey processes on the simulated radio, a real PAM
stack (pam_wrapper + pamtester + pam_matrix), and python-dbusmock's logind on a private bus.

In the VM lab (Tests/lab, BOXKEY_E2E_RADIO=bluez) the same fixtures put the box on hci0 and the
phone on hci1 through the real bluetoothd, and logind's mock on the lab's system bus (BlueZ
lives there too); binaries come prebuilt from the host (BOXKEY_E2E_PREBUILT)."""
import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PAM_MATRIX = "/usr/lib/x86_64-linux-gnu/pam_wrapper/pam_matrix.so"
PASSWORD = "correct horse battery"
RADIO = os.environ.get("BOXKEY_E2E_RADIO", "simulated")


def wait_for(predicate, timeout=10.0, interval=0.05, what="condition"):
    if os.environ.get("BLELAB_GUEST") == "1":
        timeout *= 4  # the lab emulates its CPU: everything is 10-15x slower there
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


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


class Logind:
    """A private dbus-daemon with dbusmock's logind template; `calls()` reads its call log."""

    def __init__(self, work):
        self.log = os.path.join(work, "logind.log")
        self.bus = None
        if RADIO == "bluez":
            # The lab's own system bus, which BlueZ is on; the VM is thrown away afterwards.
            self.address = os.environ.get("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/run/dbus/system_bus_socket")
            self.mock = subprocess.Popen(["/usr/bin/python3", "-m", "dbusmock", "--system", "--template", "logind", "-l", self.log],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_for(lambda: subprocess.run(["dbus-send", "--system", "--print-reply", "--dest=org.freedesktop.login1",
                                             "/org/freedesktop/login1", "org.freedesktop.DBus.Peer.Ping"],
                                            capture_output=True).returncode == 0, timeout=30, what="logind mock")
            return
        address_file = os.path.join(work, "bus-address")
        with open(address_file, "w") as out:
            self.bus = subprocess.Popen(["dbus-daemon", "--session", "--nofork", "--print-address=1"],
                                        stdout=out, stderr=subprocess.DEVNULL)
        wait_for(lambda: os.path.getsize(address_file) > 0, what="dbus-daemon")
        self.address = open(address_file).readline().strip()
        env = dict(os.environ, DBUS_SYSTEM_BUS_ADDRESS=self.address)
        self.mock = subprocess.Popen(["/usr/bin/python3", "-m", "dbusmock", "--system", "--template", "logind",
                                      "-l", self.log], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: subprocess.run(["dbus-send", "--system", "--print-reply", "--dest=org.freedesktop.login1",
                                         "/org/freedesktop/login1", "org.freedesktop.DBus.Peer.Ping"],
                                        env=env, capture_output=True).returncode == 0, what="logind mock")

    def calls(self):
        return open(self.log).read() if os.path.exists(self.log) else ""

    def stop(self):
        for p in (self.mock, self.bus):
            if p is None:
                continue
            p.terminate()
            p.wait(5)


class World:
    """One box, one phone, one PAM service, in a temporary folder."""

    def __init__(self, bins, work, logind):
        self.bins, self.work, self.logind = bins, work, logind
        self.sim = os.path.join(work, "air")
        self.socket = os.path.join(work, "run", "pam.sock")
        self.box_log = os.path.join(work, "boxkeyd.log")
        self.box_process = None
        self.outputs = []  # everything every process printed, for the no-password check
        self.env = dict(os.environ, BOXKEY_SIM_DIR=self.sim, BOXKEY_RADIO=RADIO, DBUS_SYSTEM_BUS_ADDRESS=logind.address,
                        XDG_CONFIG_HOME=os.path.join(work, "phone", "config"),
                        XDG_DATA_HOME=os.path.join(work, "phone", "data"))
        self.env.pop("XDG_SESSION_ID", None)
        if RADIO == "bluez":
            self.env["BOXKEY_ADAPTER"] = "hci1"
        self.config_extra = ""
        self.module_options = "timeout=20 answer_prompt"
        os.makedirs(os.path.join(work, "pam.d"))
        with open(os.path.join(work, "passdb"), "w") as f:
            f.write(f"alice:{PASSWORD}:boxkey-test\n")

    # --- box -------------------------------------------------------------------------------
    def config(self):
        path = os.path.join(self.work, "boxkeyd.conf")
        with open(path, "w") as f:
            f.write(f"""[box]
id = "4821"
state_directory = "{self.work}/box"
[radio]
backend = "{RADIO}"
adapter = "{'hci0' if RADIO == 'bluez' else ''}"
[presence]
grace_s = 1
[pam]
socket = "{self.socket}"
{self.config_extra}""")
        return path

    def start_box(self, expect_ready=True):
        self.box_process = subprocess.Popen([self.bins["boxkeyd"], "--config", self.config(), "--log-level", "debug"],
                                            env=self.env, stdout=open(self.box_log, "a"), stderr=subprocess.STDOUT)
        if expect_ready:
            slow = 60 if RADIO == "bluez" else 10  # the lab emulates its CPU
            wait_for(lambda: os.path.exists(self.socket), timeout=slow, what="boxkeyd's socket")
            wait_for(lambda: "advertising box" in self.box_output(), timeout=slow, what="boxkeyd advertising")
        return self.box_process

    def stop_box(self):
        if self.box_process and self.box_process.poll() is None:
            self.box_process.send_signal(signal.SIGTERM)
            self.box_process.wait(10)

    def box_output(self):
        return open(self.box_log).read() if os.path.exists(self.box_log) else ""

    def admin(self, *args):
        r = subprocess.run([self.bins["boxkeyd"], *args, "--config", self.config()], env=self.env, capture_output=True, text=True, timeout=20)
        self.outputs.append(r.stdout + r.stderr)
        return r

    # --- phone -----------------------------------------------------------------------------
    def phone(self, *args, stdin=None, timeout=60, extra_env=None):
        env = dict(self.env, **(extra_env or {}))
        r = subprocess.run([self.bins["boxkey"], *args], env=env, input=stdin, capture_output=True, text=True, timeout=timeout)
        self.outputs.append(r.stdout + r.stderr)
        return r

    def phone_background(self, *args):
        log = os.path.join(self.work, f"phone-{len(self.outputs)}.log")
        p = subprocess.Popen([self.bins["boxkey"], *args], env=self.env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
        p.log = log
        return p

    def pair_and_store(self, password=PASSWORD):
        r = self.phone("pair", "4821", "--yes")
        assert r.returncode == 0, r.stderr
        r = self.phone("credentials", "set", "--user", "alice", stdin=password + "\n")
        assert r.returncode == 0, r.stderr

    # --- the box's login prompt -------------------------------------------------------------
    def pam_service(self, module_options=None):
        path = os.path.join(self.work, "pam.d", "boxkey-test")
        with open(path, "w") as f:
            f.write(f"auth [success=ok default=ignore] {self.bins['module']} socket={self.socket} "
                    f"{module_options if module_options is not None else self.module_options}\n"
                    f"auth required {PAM_MATRIX} passdb={self.work}/passdb\n"
                    f"account required {PAM_MATRIX} passdb={self.work}/passdb\n"
                    f"session optional {self.bins['module']} socket={self.socket}\n")
        return path

    def pam_env(self):
        return dict(self.env, LD_PRELOAD="libpam_wrapper.so", PAM_WRAPPER="1",
                    PAM_WRAPPER_SERVICE_DIR=os.path.join(self.work, "pam.d"))

    def greeter(self, *operations, stdin="", session_id="42"):
        """A login prompt: pamtester in the test PAM stack. Returns once the daemon sees it waiting."""
        self.pam_service()
        before = self.box_output().count("login prompt waiting")
        env = dict(self.pam_env(), XDG_SESSION_ID=session_id)
        p = subprocess.Popen(["pamtester", "-v", "boxkey-test", "alice", *(operations or ("authenticate",))],
                             env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        p.stdin.write(stdin)
        p.stdin.close()
        wait_for(lambda: self.box_output().count("login prompt waiting") > before, what="the login prompt")
        return p

    def finish(self, greeter, timeout=30):
        out = greeter.stdout.read()
        greeter.wait(timeout)
        self.outputs.append(out)
        return greeter.returncode, out


@pytest.fixture
def world(bins):
    work = tempfile.mkdtemp(prefix="boxkey-e2e-")
    logind = Logind(work)
    w = World(bins, work, logind)
    yield w
    w.stop_box()
    logind.stop()
    shutil.rmtree(work, ignore_errors=True)
