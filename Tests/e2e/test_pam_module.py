"""The PAM module itself: exports, speed when the daemon is absent, remote sessions, and
1000 transactions in one process. The "boxkey-only" service is in the World's [pam] services,
and pam_cycles gives the prompts the local tty1 unless a test says otherwise."""
import json
import os
import re
import socket
import subprocess
import time

from conftest import PASSWORD


def stack(world, options, then=""):
    path = os.path.join(world.work, "pam.d", "boxkey-only")
    with open(path, "w") as f:
        f.write(f"auth required {world.bins['module']} {options}\n{then}")


def cycles(world, count, *extra):
    r = subprocess.run([world.bins["harness"], "boxkey-only", "alice", str(count), *extra], env=world.pam_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return {k: float(v) for k, v in re.findall(r"(\w+)=([\d.]+)", r.stdout)}


def test_only_pam_entry_points_are_exported(bins):
    out = subprocess.run(["nm", "-D", "--defined-only", bins["module"]], capture_output=True, text=True, check=True).stdout
    exported = sorted(line.split()[-1] for line in out.splitlines() if line.split()[1] in "TDBRWV")
    assert exported == ["pam_sm_acct_mgmt", "pam_sm_authenticate", "pam_sm_close_session", "pam_sm_open_session", "pam_sm_setcred"]
    dynamic = subprocess.run(["readelf", "-d", bins["module"]], capture_output=True, text=True, check=True).stdout
    assert "NODELETE" in dynamic and "BIND_NOW" in dynamic
    needed = sorted(re.findall(r"\(NEEDED\).*\[(.*)\]", dynamic))
    assert needed == ["ld-linux-x86-64.so.2", "libc.so.6", "libpam.so.0"] or needed == ["libc.so.6", "libpam.so.0"], needed
    program_headers = subprocess.run(["readelf", "-lW", bins["module"]], capture_output=True, text=True, check=True).stdout
    assert "GNU_RELRO" in program_headers and not re.search(r"GNU_STACK.*RWE", program_headers)
    # Loaded into every PAM program, setuid su and sudo included: small (issue 30: <= 256 KB).
    assert os.path.getsize(bins["module"]) <= 256 * 1024


def test_daemon_down_is_unavailable_fast_and_1000_cycles_are_stable(world):
    stack(world, f"socket={world.work}/nobody-listens.sock")
    r = cycles(world, 1000)
    assert r["rc"] == 9  # PAM_AUTHINFO_UNAVAIL
    assert r["max_ms"] < 50, r
    assert r["rss_end_kib"] - r["rss_start_kib"] < 1024, r
    # With ignore_unavailable the module steps aside (PAM_IGNORE), so a required module after
    # it alone decides: a required PAM_AUTHINFO_UNAVAIL would have failed the stack.
    stack(world, f"socket={world.work}/nobody-listens.sock ignore_unavailable", "auth required pam_permit.so\n")
    assert cycles(world, 10)["rc"] == 0


def test_remote_sessions_are_not_offered_phone_login(world):
    world.start_box()
    stack(world, f"socket={world.socket} timeout=5")
    r = cycles(world, 3, "203.0.113.9", "tty1")  # a local tty, but a remote host
    assert r["rc"] == 9 and r["max_ms"] < 50
    assert "login prompt waiting" not in world.box_output()


def test_a_conversation_that_gives_no_answer_is_never_waited_on(world):
    """pam_cycles' conversation answers every prompt with nothing (no response string): the
    module's prompt ends there, as a cancelled one (PAM_CONV_ERR), and the prompt is closed at
    the box. Nothing waits for a phone."""
    world.start_box()
    stack(world, f"socket={world.socket} timeout=5")
    r = cycles(world, 3, "", "tty1")
    assert r["rc"] == 19 and r["max_ms"] < 500, r  # PAM_CONV_ERR
    assert world.box_output().count("login prompt waiting") == 3
    assert json.loads(world.admin("status", "--json").stdout)["prompts"] == []


def test_pam_socket_refuses_other_users(world):
    world.start_box()
    # Get past the file modes: SO_PEERCRED must still refuse.
    for path in (world.work, os.path.dirname(world.socket)):
        os.chmod(path, 0o711)
    os.chmod(world.socket, 0o666)
    # The daemon may close before the request is even written: a broken pipe or a reset is the
    # same refusal as an empty read.
    probe = ("import socket,sys\ns=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.settimeout(5)\n"
             "try:\n    s.sendall(bytes([0,2,1,1])); print(len(s.recv(100)))\n"
             "except (BrokenPipeError, ConnectionResetError):\n    print(0)")
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", probe, world.socket],
                       capture_output=True, text=True, timeout=20)
    assert r.stdout.strip() == "0", r.stdout + r.stderr
    assert "not root" in world.box_output()


def test_processes_holding_secrets_are_not_dumpable(world):
    """PR_SET_DUMPABLE 0: the kernel then hands /proc/PID of an unprivileged process to root,
    so no core file and no same-user ptrace can read its memory."""
    import pathlib
    import tempfile
    import time
    base = pathlib.Path(tempfile.mkdtemp(prefix="boxkey-nobody-"))  # pytest's tmp_path is root-only
    os.chmod(base, 0o755)
    home = base / "home"
    home.mkdir()
    os.chmod(home, 0o777)
    env = dict(world.env, HOME=str(home), XDG_CONFIG_HOME=str(home / "c"), XDG_DATA_HOME=str(home / "d"),
               BOXKEY_SIM_DIR=str(home / "air"), BOXKEY_RADIO="simulated")
    p = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", world.bins["boxkey"], "scan", "--seconds", "3"],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    control = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sleep", "3"])
    try:
        time.sleep(1.5)
        assert p.poll() is None
        real_uid = re.search(r"^Uid:\s+(\d+)", open(f"/proc/{p.pid}/status").read(), re.M).group(1)
        assert real_uid == "65534"                                # boxkey runs as nobody...
        assert os.stat(f"/proc/{p.pid}/mem").st_uid == 0          # ...but its memory belongs to root: not dumpable
        assert os.stat(f"/proc/{control.pid}/mem").st_uid == 65534  # an ordinary process of nobody's
    finally:
        p.wait(10)
        control.wait(10)


def first_pass_only(world):
    """A verifier that only reads PAM_AUTHTOK (as pam_sss use_first_pass does)."""
    path = os.path.join(world.work, "pam_first_pass_only.so")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", path, os.path.join(os.path.dirname(__file__), "pam_first_pass_only.c"), "-lpam"], check=True)
    return path


def pamtester(world, stdin):
    return subprocess.run(["pamtester", "-v", "boxkey-only", "alice", "authenticate"], env=world.pam_env(), input=stdin,
                          capture_output=True, text=True, timeout=60)


def test_ask_password_keeps_use_first_pass_verifiers_working(world):
    """pam-auth-update puts pam_boxkey first and gives pam_sss use_first_pass: with no push
    (daemon down; sudo, which is never offered), nothing would ask for the password."""
    verifier = first_pass_only(world)
    then = f"auth required {verifier} [password={PASSWORD}]\n"  # [ ]: one argument, spaces and all
    stack(world, f"socket={world.work}/nobody-listens.sock ignore_unavailable", then)
    assert pamtester(world, PASSWORD + "\n").returncode != 0  # the lockout: nobody asked
    stack(world, f"socket={world.work}/nobody-listens.sock ignore_unavailable ask_password", then)
    r = pamtester(world, PASSWORD + "\n")
    assert r.returncode == 0 and "successfully authenticated" in r.stdout + r.stderr, r.stdout + r.stderr
    assert pamtester(world, "wrong horse\n").returncode != 0
    # A service the daemon does not offer phone login to (sudo here): asked at once as well.
    world.start_box()
    with open(os.path.join(world.work, "pam.d", "sudo"), "w") as f:
        f.write(f"auth [success=ok default=ignore] {world.bins['module']} socket={world.socket} ask_password\n{then}")
    start = time.monotonic()
    r = subprocess.run(["pamtester", "sudo", "alice", "authenticate"], env=world.pam_env(), input=PASSWORD + "\n",
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert time.monotonic() - start < 5


def test_a_daemon_that_stops_accepting_never_hangs_the_login_stack(world):
    """A daemon alive but not accepting (stopped, wedged): once its listen queue is full, a
    blocking connect would wait for ever in every sudo and login."""
    path = os.path.join(world.work, "wedged.sock")
    wedged = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    wedged.bind(path)
    wedged.listen(1)  # never accepts
    try:
        stack(world, f"socket={path} timeout=5 ignore_unavailable", "auth required pam_permit.so\n")
        for attempt in range(5):  # the queue fills after the first one or two
            start = time.monotonic()
            r = subprocess.run(["pamtester", "boxkey-only", "alice", "authenticate"], env=world.pam_env(),
                               capture_output=True, text=True, timeout=30)
            assert r.returncode == 0, r.stdout + r.stderr
            assert time.monotonic() - start < 4, f"attempt {attempt} took {time.monotonic() - start:.1f} s"
    finally:
        wedged.close()
