"""The VM lab's fixtures are the end-to-end ones, switched to BlueZ (see Tests/e2e/conftest.py),
plus the lab's own controls: bluetoothd restarted (optionally with a main.conf of the test's),
controllers powered off and on, and btvirt replaced by one with more controllers. They act on
the lab's stack as ../shared/blelab/guest-init started it; the VM is thrown away afterwards."""
import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import tempfile
import time

import pytest

_spec = importlib.util.spec_from_file_location("e2e_conftest", os.path.join(os.path.dirname(__file__), "..", "e2e", "conftest.py"))
_e2e = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_e2e)
globals().update({k: v for k, v in vars(_e2e).items() if not k.startswith("__")})

BLUETOOTHD = "/usr/libexec/bluetooth/bluetoothd"
CONTROLLERS = "/sys/class/bluetooth"
LAB_LOGS = "/run/blelab"  # the lab's exchange folder: bluetoothd.log and btvirt.log are kept there
CACHE = os.environ.get("BLELAB_CACHE", "/var/cache/blelab")
FIGURES = os.environ.get("BOXKEY_LAB_FIGURES")


def record_figures(figures):
    """Prints a LAB-FIGURES line and merges `figures` into $BOXKEY_LAB_FIGURES (one file for the run)."""
    print("LAB-FIGURES " + json.dumps(figures))
    if FIGURES:
        merged = json.load(open(FIGURES)) if os.path.exists(FIGURES) else {}
        merged.update(figures)
        with open(FIGURES, "w") as f:
            json.dump(merged, f, indent=1)


def login(world, who="alice", user="alice", tty="tty1"):
    """A login prompt at the box and `boxkey login` on the phone; returns the phone's wall time."""
    greeter = world.greeter(user=user, tty=tty)
    start = time.monotonic()
    r = world.phone("login", "--no-stay", timeout=180, who=who)
    elapsed = time.monotonic() - start
    assert r.returncode == 0, r.stdout + r.stderr + world.box_output()[-3000:]
    assert f"Logged in to box 4821 as {user}" in r.stdout
    rc, out = world.finish(greeter, timeout=60)
    assert rc == 0, out
    return elapsed, r.stdout


def pids(name):
    """Live processes whose command name is `name` (the lab's btvirt or bluetoothd)."""
    found = []
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            if open(f"/proc/{d}/comm").read().strip() == name and running(int(d)):
                found.append(int(d))
        except OSError:
            pass
    return found


def stop_all(name, sig=signal.SIGTERM):
    for pid in pids(name):
        os.kill(pid, sig)
    wait_for(lambda: not pids(name), what=f"{name} to stop")


def adapters():
    """hci0, hci1, ... (not their connections' entries, hci0:42)."""
    return sorted((a for a in os.listdir(CONTROLLERS) if ":" not in a), key=lambda a: int(a.removeprefix("hci")))


def published_adapters():
    out = subprocess.run(["bluetoothctl", "list"], capture_output=True, text=True, timeout=30).stdout
    return out.count("Controller ")


def launch_bluetoothd(config=None):
    """bluetoothd as guest-init starts it (-n, $BLELAB_BTD_ARGS; -f: a main.conf of the test's)."""
    args = [BLUETOOTHD, "-n", *os.environ.get("BLELAB_BTD_ARGS", "").split(), *(["-f", config] if config else [])]
    subprocess.Popen(args, stdout=open(os.path.join(LAB_LOGS, "bluetoothd.log"), "a"), stderr=subprocess.STDOUT,
                     stdin=subprocess.DEVNULL, start_new_session=True)


def start_bluetoothd(config=None):
    """bluetoothd launched, then every adapter powered on: bluetoothd powers them off when it stops."""
    launch_bluetoothd(config)
    count = len(adapters())
    wait_for(lambda: published_adapters() >= count, timeout=20, interval=0.3, what="bluetoothd to publish the adapters")
    for adapter in adapters():
        btmgmt(adapter, "power", "on")


def bluetoothd_answers():
    """Whether bluetoothd answers a read of its objects within 5 s."""
    r = subprocess.run(["busctl", "--timeout=5", "call", "org.bluez", "/", "org.freedesktop.DBus.ObjectManager", "GetManagedObjects"],
                       capture_output=True, timeout=30)
    return r.returncode == 0


def bluetoothd_blocked_in():
    """Where bluetoothd's main thread sits in the kernel (for a failure message)."""
    found = []
    for pid in pids("bluetoothd"):
        try:
            found.append(f"{pid}: wchan {open(f'/proc/{pid}/wchan').read()}; stat {open(f'/proc/{pid}/stat').read().split()[2]}")
        except OSError as e:
            found.append(f"{pid}: {e}")
    return "; ".join(found) or "no bluetoothd"


def restart_bluetoothd(config=None, sig=signal.SIGTERM):
    stop_all("bluetoothd", sig)
    start_bluetoothd(config)


def set_controllers(n):
    """Replaces the running btvirt with `btvirt -L -lN` (with the lab's shim), and restarts
    bluetoothd over them. btvirt's controllers only hear each other inside one process, so all
    N come from one; hci0 and hci1 keep their addresses. The btvirt is $BOXKEY_LAB_BTVIRT when
    set (scripts/lab-test sets it to scripts/build-btvirt's, whose links keep their handles
    apart: stock 5.66 mixes up the links of a controller that holds two)."""
    stop_all("bluetoothd")
    remove_controllers()
    add_controllers(n)
    start_bluetoothd()


def remove_controllers():
    """btvirt stopped: its controllers leave the kernel (a dongle pulled out)."""
    stop_all("btvirt")
    wait_for(lambda: not adapters(), what="the controllers to go")


def add_controllers(n):
    """btvirt started with `n` controllers (a dongle plugged in)."""
    env = dict(os.environ)
    if os.environ.get("BLELAB_SHIM") != "0":
        env["LD_PRELOAD"] = os.path.join(CACHE, "btvirt-shim.so")
    subprocess.Popen([os.environ.get("BOXKEY_LAB_BTVIRT", "btvirt"), "-L", f"-l{n}"], env=env, stdout=open(os.path.join(LAB_LOGS, "btvirt.log"), "a"),
                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    wait_for(lambda: len(adapters()) == n, what=f"btvirt's {n} controllers")


@contextlib.contextmanager
def btmon(adapter, path):
    """btmon on `adapter` while the block runs, its trace written to `path`."""
    p = subprocess.Popen(["stdbuf", "-oL", "btmon", "-i", adapter], stdout=open(path, "w"), stderr=subprocess.STDOUT)
    try:
        yield path
    finally:
        stop_process(p, signal.SIGINT)


def debugfs(adapter, name):
    """A value from the kernel's per-controller debugfs (mounted on first use)."""
    if not os.path.isdir("/sys/kernel/debug/bluetooth"):
        subprocess.run(["mount", "-t", "debugfs", "none", "/sys/kernel/debug"], check=True)
    return open(f"/sys/kernel/debug/bluetooth/{adapter}/{name}").read().strip()


def pytest_configure(config):
    _e2e.pytest_configure(config)
    config.addinivalue_line("markers", "unsettled: fails in the lab for reasons not yet understood (see the test); "
                                       "run only when asked for (LAB_MARKERS)")
    config.addinivalue_line("markers", "spoils_lab: may leave the lab's kernel broken (an oops on a link torn down by a "
                                       "controller power-off or under load, list_del corruption in hci_chan_del): runs last")


def pytest_collection_modifyitems(items):
    """spoils_lab tests run after the rest, and those that reconfigure the controllers last."""
    items.sort(key=lambda item: ("controllers" in item.fixturenames, item.get_closest_marker("spoils_lab") is not None))


@pytest.fixture
def controllers(request):
    """The lab reconfigured to `request.param` controllers (indirect parametrisation); back to
    the lab's two afterwards. Yields the adapter names."""
    set_controllers(request.param)
    try:
        yield adapters()
    finally:
        set_controllers(2)


@pytest.fixture
def bluetoothd_config(request):
    """bluetoothd restarted with `request.param` as its main.conf (None: as the lab starts it),
    and restarted as the lab starts it afterwards."""
    if request.param is None:
        yield None
        return
    with tempfile.NamedTemporaryFile("w", prefix="main-", suffix=".conf") as conf:
        conf.write(request.param)
        conf.flush()
        restart_bluetoothd(conf.name)
        try:
            yield conf.name
        finally:
            restart_bluetoothd()


if __name__ == "__main__":
    # `python3 Tests/lab/conftest.py N`: the lab set to N controllers before the test runs
    # (scripts/lab-test swaps the lab's btvirt for the patched one this way).
    import sys
    set_controllers(int(sys.argv[1]))
