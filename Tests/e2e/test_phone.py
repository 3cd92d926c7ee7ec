"""The phone CLI (boxkey) by its contract: the vault's attempt counter under attack, one exit
code per outcome, --json, the full --help texts, and the agent (ssh-agent-like)."""
import difflib
import json
import os
import shutil
import signal
import re
import resource
import socket
import stat
import subprocess
import time

import pytest

from conftest import PASSWORD, USERS, memory_count, wait_for

PIN = "246810"
HELP = os.path.join(os.path.dirname(__file__), "help")


# --- helpers ----------------------------------------------------------------------------------

def vault_report(world):
    r = world.phone("credentials", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def with_pin(world):
    world.start_box()
    world.pair_and_store()
    r = world.phone("pin", "set", stdin=PIN + "\n" + PIN + "\n")
    assert r.returncode == 0, r.stderr


def no_file_writes():
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))


def phone_limited(world, *args, stdin):
    """`boxkey` under RLIMIT_FSIZE=0: every write that would grow a file fails (EFBIG)."""
    r = subprocess.run([world.bins["boxkey"], *args], env=world.phone_env(), input=stdin, capture_output=True,
                       text=True, timeout=60, preexec_fn=no_file_writes)
    world.outputs.append(r.stdout + r.stderr)
    return r


def alive(pid):
    """Running, and not a zombie (an agent's parent exits; who reaps it depends on the container)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            state = re.search(r"^State:\s+(\S)", f.read(), re.M).group(1)
    except OSError:  # gone before the open (ENOENT) or between open and read (ESRCH)
        return False
    return state not in ("Z", "X")


def boxkey_processes(world):
    """Live `boxkey` processes started with this world's phone folders."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            exe = os.readlink(f"/proc/{entry}/exe")
            environ = open(f"/proc/{entry}/environ", "rb").read()
        except OSError:
            continue
        if os.path.basename(exe).startswith("boxkey") and not exe.endswith("boxkeyd") \
                and world.work.encode() in environ and alive(int(entry)):
            found.append(int(entry))
    return found


class Agents:
    """Starts the world's agent and makes sure it is stopped when the test ends."""

    def __init__(self, world):
        self.world = world
        self.pids = set()
        self.socket = os.path.join(world.env["XDG_RUNTIME_DIR"], "boxkey", "agent.sock")
        self.log = os.path.join(world.env["XDG_STATE_HOME"], "boxkey", "agent.log")

    def start(self, *args, stdin=None):
        r = self.world.phone("agent", "start", *args, stdin=stdin)
        m = re.search(r"Agent running \(pid (\d+)\)", r.stdout)
        if m:
            self.pids.add(int(m.group(1)))
        return r

    def status(self):
        r = self.world.phone("agent", "status", "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        return json.loads(r.stdout)

    def log_text(self):
        return open(self.log).read() if os.path.exists(self.log) else ""

    def stop(self):
        if os.path.exists(self.socket):
            self.world.phone("agent", "stop", timeout=20)
        for pid in self.pids:
            try:
                wait_for(lambda: not alive(pid), timeout=5, what=f"agent {pid} to end")
            except AssertionError:
                os.kill(pid, 9)  # an agent this test started


@pytest.fixture
def agents(world):
    a = Agents(world)
    yield a
    a.stop()


# --- the vault: "The wrong-PIN counter can be skipped" ------------------------------------------

def test_pin_attempt_that_cannot_be_recorded_gets_no_answer(world):
    """The attack: a file-size limit of 0 makes the attempt counter's write fail. Were the PIN
    tried anyway, wrong answers (5) would come for free and the counter would never move. Every
    attempt must end 14 — no answer, right or wrong — and nothing reaches the box."""
    with_pin(world)
    greeter = world.greeter()
    before = vault_report(world)["failures"]
    for _ in range(12):
        r = phone_limited(world, "login", "--no-stay", stdin="111111\n")
        assert r.returncode == 14, r.stdout + r.stderr
        assert "could not record the PIN attempt" in r.stderr
    r = phone_limited(world, "login", "--no-stay", stdin=PIN + "\n")
    assert r.returncode == 14 and "could not record the PIN attempt" in r.stderr, r.stdout + r.stderr
    assert "login attempt" not in world.box_output()
    assert vault_report(world)["failures"] == before  # nothing recorded, because nothing was tried
    leftovers = [f for f in os.listdir(os.path.join(world.env["XDG_DATA_HOME"], "boxkey")) if f not in ("vault", "vault.lock")]
    assert leftovers == []
    # Without the limit, the right PIN logs in at the prompt that waited all along.
    r = world.phone("login", "--no-stay", stdin=PIN + "\n")
    code, _ = world.finish(greeter)
    assert r.returncode == 0 and code == 0, r.stdout + r.stderr
    assert vault_report(world)["failures"] == 0


def test_empty_pin_is_no_attempt_and_wrong_pin_counts_one(world):
    with_pin(world)
    assert vault_report(world)["failures"] == 0
    r = world.phone("login", "--no-stay", stdin="\n")
    assert r.returncode == 16 and "no PIN entered" in r.stderr, r.stderr
    r = world.phone("login", "--no-stay", stdin="")  # EOF: the same
    assert r.returncode == 16, r.stderr
    assert vault_report(world)["failures"] == 0
    r = world.phone("login", "--no-stay", stdin="111111\n")
    assert r.returncode == 5 and "9 attempts left" in r.stderr, r.stderr
    assert vault_report(world)["failures"] == 1


def test_parallel_wrong_pins_are_each_counted(world):
    """The attack: start several guesses at once, so each reads the same count before any
    writes it. Each attempt holds the vault's lock from count to result, so each is counted,
    and the ones after the 4th meet the delay."""
    with_pin(world)
    guesses = [subprocess.Popen([world.bins["boxkey"], "login", "--no-stay"], env=world.phone_env(), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(6)]
    results = []
    for i, p in enumerate(guesses):
        out, err = p.communicate(f"11111{i}\n", timeout=60)
        results.append((p.returncode, err))
    world.outputs.extend(err for _, err in results)
    codes = sorted(code for code, _ in results)
    # Five wrong PINs counted one by one; the sixth meets the delay after the fifth.
    assert codes == [5, 5, 5, 5, 5, 12], results
    assert vault_report(world)["failures"] == 5


def test_a_wrong_pin_lockout_is_shown_and_agent_start_says_it_before_asking(world):
    """Five wrong PINs lock the vault for a minute. Before: no command showed it, and `agent
    start` asked for the PIN, then refused. Now status (words and JSON) and doctor say until
    when, and `agent start` refuses before it reads anything."""
    with_pin(world)
    for _ in range(5):
        assert world.phone("login", "--no-stay", "--no-agent", stdin="111111\n").returncode == 5
    report = vault_report(world)
    assert report["failures"] == 5 and report["lockedUntil"], report
    said = world.phone("status").stdout
    assert "5 wrong PINs: no PIN is tried until" in said, said
    doctor = world.phone("doctor").stdout
    assert "locked after 5 wrong PINs" in doctor, doctor
    r = world.phone("agent", "start", stdin="")  # nothing to read: it must not ask
    assert r.returncode == 12 and "PIN:" not in r.stderr, r.stdout + r.stderr
    assert vault_report(world)["failures"] == 5


def test_agent_start_killed_before_ready_is_a_failure(world):
    """An agent that dies before it serves (OOM during Argon2id, a crash) must not read as
    started: the command fails, whatever the signal's exit status would look like."""
    with_pin(world)
    p = subprocess.Popen([world.bins["boxkey"], "agent", "start"], env=world.phone_env(), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p.stdin.write(PIN + "\n")
    p.stdin.flush()
    p.stdin.close()
    child = None
    def find_child():
        nonlocal child
        for pid in (int(d) for d in os.listdir("/proc") if d.isdigit()):
            try:
                cmd = open(f"/proc/{pid}/cmdline", "rb").read()
                env = open(f"/proc/{pid}/environ", "rb").read()
            except OSError:
                continue
            if b"--detached-child" in cmd and world.work.encode() in env:
                child = pid
                return True
        return False
    wait_for(find_child, timeout=10, what="the agent's process")
    os.kill(child, 9)
    p.wait(30)
    assert p.returncode != 0, p.stdout.read() + p.stderr.read()
    assert world.phone("agent", "status").returncode == 18


def test_pin_is_at_least_six_digits(world):
    assert world.phone("credentials", "set", "--user", "alice", stdin=PASSWORD + "\n").returncode == 0
    for weak in ("2468", "abcdef", "12345a"):
        r = world.phone("pin", "set", stdin=weak + "\n")
        assert r.returncode == 1 and "at least 6 digits" in r.stderr, (weak, r.stderr)
        assert vault_report(world)["pin"] is False
    r = world.phone("pin", "set", stdin=PIN + "\n" + PIN + "\n")
    assert r.returncode == 0 and "PIN set" in r.stdout, r.stderr
    assert vault_report(world)["pin"] is True


def test_on_a_terminal_a_bad_pin_or_password_is_asked_again(world):
    """Before: `pin set` with a 5-digit PIN exited 1, and `credentials set` asked for the
    password once (a typo showed up only as a rejected login). On a terminal both ask again."""
    import pexpect
    env = world.phone_env()
    child = pexpect.spawn(world.bins["boxkey"], ["credentials", "set", "--user", "alice"], env=env, encoding="utf-8", timeout=10)
    child.expect("Password: ")
    child.sendline(PASSWORD)
    child.expect("Password again: ")
    child.sendline(PASSWORD + "x")
    child.expect("differ")
    child.expect("Password: ")
    child.sendline(PASSWORD)
    child.expect("Password again: ")
    child.sendline(PASSWORD)
    child.expect("Credentials for alice stored")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    child = pexpect.spawn(world.bins["boxkey"], ["pin", "set"], env=env, encoding="utf-8", timeout=10)
    child.expect("New PIN: ")
    child.sendline("24680")
    child.expect("at least 6 digits")
    child.expect("New PIN: ")
    child.sendline(PIN)
    child.expect("New PIN again: ")
    child.sendline(PIN)
    child.expect("PIN set")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0 and vault_report(world)["pin"] is True
    assert world.phone("credentials", "show", stdin=PIN + "\n").returncode == 0


def test_pin_set_and_change_ask_twice(world):
    """A typo in a new PIN would set one nobody knows, and ten tries later wipe the vault."""
    assert world.phone("credentials", "set", "--user", "alice", stdin=PASSWORD + "\n").returncode == 0
    for second in ("", "135790"):
        r = world.phone("pin", "set", stdin=PIN + "\n" + second + "\n")
        assert r.returncode == 16 and "differ" in r.stderr, (second, r.stderr)
        assert vault_report(world)["pin"] is False
    r = world.phone("pin", "set", stdin=PIN + "\n" + PIN + "\n")
    assert r.returncode == 0 and "PIN set" in r.stdout, r.stderr
    r = world.phone("pin", "change", stdin=PIN + "\n" + "135790\n" + "135791\n")
    assert r.returncode == 16 and "differ" in r.stderr, r.stderr
    r = world.phone("pin", "change", stdin=PIN + "\n" + "135790\n" + "135790\n")
    assert r.returncode == 0 and "PIN changed" in r.stdout, r.stderr
    assert world.phone("credentials", "show", stdin="135790\n").returncode == 0
    assert vault_report(world)["failures"] == 0


def test_what_cannot_be_a_pin_is_not_an_attempt(world):
    """`abc`, a `y` meant for "Search again?", the next line of a script: refused before the
    vault counts anything, so they never bring the wipe closer."""
    with_pin(world)
    world.greeter()
    for typed in ("abc", "y", "12345", "wrong horse", "1234567x"):
        r = world.phone("login", "--no-stay", stdin=typed + "\n")
        assert r.returncode == 16 and "not a PIN" in r.stderr, (typed, r.stdout + r.stderr)
    assert vault_report(world)["failures"] == 0
    # The password stays what it was: the bad PIN line stores nothing.
    r = world.phone("credentials", "set", "--user", "alice", stdin="123456\nwrong horse\n")
    assert r.returncode == 16 and "not a PIN" in r.stderr, r.stdout + r.stderr
    assert vault_report(world)["failures"] == 0
    r = world.phone("login", "--no-stay", stdin=PIN + "\n")
    assert r.returncode == 0, r.stdout + r.stderr


def test_piped_credentials_set_reads_one_line_per_question(world):
    """Documented in `credentials set --help`: the user (without --user), the password, the
    current PIN (when one is set); no answer shifts into another's place."""
    world.start_box()
    assert world.pair(world.pairing_code("alice")).returncode == 0
    r = world.phone("credentials", "set", stdin="alice\n" + PASSWORD + "\n")
    assert r.returncode == 0 and "Credentials for alice stored" in r.stdout, r.stdout + r.stderr
    assert world.phone("pin", "set", stdin=PIN + "\n" + PIN + "\n").returncode == 0
    r = world.phone("credentials", "set", stdin="alice\n" + PASSWORD + "\n" + PIN + "\n")
    assert r.returncode == 0 and "stored behind your PIN" in r.stdout, r.stdout + r.stderr
    assert vault_report(world)["failures"] == 0
    greeter = world.greeter()
    r = world.phone("login", "--no-stay", stdin=PIN + "\n")
    assert r.returncode == 0 and world.finish(greeter)[0] == 0, r.stdout + r.stderr


def test_sim_move_is_seen_by_every_later_command(world):
    """The simulated radio: where `boxkey sim move` put the phone, a later scan and login start."""
    world.start_box()
    world.pair_and_store()
    world.greeter()
    assert world.phone("sim", "move", "45").returncode == 0
    r = world.phone("scan", "--json", "--seconds", "2")
    assert r.returncode == 0 and not [json.loads(line) for line in r.stdout.splitlines()], r.stdout
    r = world.phone("login", "--no-stay")  # looks for 10 s
    assert r.returncode == 3 and "not found" in r.stderr, r.stdout + r.stderr
    assert world.phone("sim", "move", "1").returncode == 0
    r = world.phone("scan", "--json", "--seconds", "2")
    assert {row["id"] for row in map(json.loads, r.stdout.splitlines())} == {"4821"}, r.stdout
    # --sim-position still wins.
    r = world.phone("scan", "--json", "--seconds", "2", "--sim-position", "45")
    assert r.stdout.strip() == "", r.stdout


def test_scan_watch_keeps_the_list_of_nearby_boxes_up_to_date(world):
    """As a phone app's list of nearby boxes: a box appears, its prompt stops waiting, it leaves
    when the phone walks off; one JSON line per change, until Ctrl-C (exit 0)."""
    world.start_box()
    world.pair_and_store()
    greeter = world.greeter()
    watch = world.phone_background("scan", "--watch", "--json")

    def changes():
        return [json.loads(line) for line in open(watch.log).read().splitlines() if line.startswith("{")]

    wait_for(lambda: any(c["change"] == "new" for c in changes()), timeout=10, what="the box in the list")
    first = changes()[0]
    assert first["id"] == "4821" and first["paired"] is True and first["loginPrompt"] is True, first
    world.finish(greeter)
    wait_for(lambda: any(c["change"] == "changed" and c["loginPrompt"] is False for c in changes()), timeout=10,
             what="the prompt no longer waiting")
    world.phone("sim", "move", "45")
    wait_for(lambda: changes()[-1]["change"] == "gone", timeout=15, what="the box gone from the list")
    quiet = len(changes())
    time.sleep(1.5)
    assert len(changes()) == quiet, "lines without a change"
    watch.send_signal(signal.SIGINT)
    assert watch.wait(10) == 0


def test_every_running_process_of_the_phone_follows_a_sim_move(world):
    """Before: one `sim move` was taken by whichever process read it first, so with `scan
    --watch` open either the scan or the presence link followed, and a login could be left at
    40 m after the phone moved back. Now both follow each walk, once."""
    world.settings["presence"]["grace_s"] = 30  # back within it: no walk-away
    world.start_box()
    world.pair_and_store()
    greeter = world.greeter("authenticate", "open_session")
    holder = world.staying_login()
    assert world.finish(greeter)[0] == 0
    watch = world.phone_background("scan", "--watch", "--json")

    def changes():
        return [json.loads(line) for line in open(watch.log).read().splitlines() if line.startswith("{")]

    wait_for(lambda: any(c["change"] == "new" for c in changes()), timeout=10, what="the box in the list")
    assert world.phone("sim", "move", "45").returncode == 0
    wait_for(lambda: changes()[-1]["change"] == "gone", timeout=15, what="the scan following the walk")
    wait_for(lambda: "lost at" in open(holder.log).read(), timeout=15, what="the presence link following the walk")
    assert world.phone("sim", "move", "1").returncode == 0
    wait_for(lambda: changes()[-1]["change"] == "new", timeout=15, what="the scan following the walk back")
    wait_for(lambda: "restored" in open(holder.log).read(), timeout=15, what="the presence link following the walk back")
    assert "LockSession" not in world.logind.calls()
    watch.send_signal(signal.SIGINT)
    assert watch.wait(10) == 0


def test_a_sim_move_that_cannot_be_written_says_so(world):
    """Before: "Moving to 5.0 m" and exit 0 with a folder it could not write."""
    folder = os.path.join(world.work, "not-writable")
    os.makedirs(folder)
    os.chmod(folder, 0o500)
    env = {"BOXKEY_SIM_DIR": folder}
    r = world.phone("sim", "move", "5", extra_env=env) if os.geteuid() != 0 else world.phone("sim", "move", "5", "--sim-directory", "/proc/self")
    assert r.returncode == 1 and "the phone did not move: cannot write" in r.stderr and "Moving" not in r.stdout, r.stdout + r.stderr


STATUS_KEYS = {"phoneKey", "fingerprint", "vault", "agent", "presence", "loggedIn", "boxes"}
VAULT_KEYS = {"credentials", "pin", "failures", "lockedUntil", "problem", "user", "kind"}
AGENT_KEYS = {"running", "pid", "credentialsHeld", "user", "mode", "expiresInSeconds", "presence", "proximity", "proximityOpen"}


def test_status_json_has_every_key_in_every_state(world, agents):
    """docs/phone-json.md: every key in every state, null when it has no value."""
    def check():
        s = json.loads(world.phone("status", "--json").stdout)
        assert set(s) == STATUS_KEYS and set(s["vault"]) == VAULT_KEYS, s
        if s["agent"] is not None:
            assert set(s["agent"]) == AGENT_KEYS - {"running"}, s["agent"]
        if s["presence"] is not None:
            assert set(s["presence"]) == {"box", "holder", "pid", "connected"}, s["presence"]
        for b in s["boxes"]:
            assert set(b) == {"id", "fingerprint", "key", "isDefault", "address"}, b
        return s

    def agent_status():
        r = world.phone("agent", "status", "--json")
        a = json.loads(r.stdout)
        assert (r.returncode == 0) == a["running"], r
        assert a == {"running": False} or set(a) == AGENT_KEYS, a
        return a

    s = check()
    assert s["vault"]["credentials"] == "none" and s["agent"] is None and s["presence"] is None and s["loggedIn"] is None
    assert agent_status() == {"running": False}
    with_pin(world)
    s = check()
    assert s["vault"] == {"credentials": "stored", "pin": True, "failures": 0, "lockedUntil": None, "problem": None, "user": None, "kind": None}
    # Without the PIN, whose credentials they are is readable.
    assert world.phone("pin", "clear", stdin=PIN + "\n").returncode == 0
    s = check()
    assert s["vault"]["user"] == "alice" and s["vault"]["kind"] == "password"
    # A foreground login holds the presence link.
    greeter = world.greeter("authenticate", "open_session")
    holder = world.staying_login()
    world.finish(greeter)
    s = check()
    assert s["presence"] == {"box": "4821", "holder": "login", "pid": holder.pid, "connected": True} and s["loggedIn"] is True, s
    text = world.phone("status").stdout
    assert f"logged in on box 4821 (presence link held by boxkey login, pid {holder.pid})" in text, text
    holder.terminate()
    holder.wait(10)
    # The agent holds it.
    assert agents.start().returncode == 0
    a = agent_status()
    assert a["running"] is True and a["credentialsHeld"] is True and a["user"] == "alice" and a["presence"] is None
    greeter = world.greeter("authenticate", "open_session")
    assert world.phone("login").returncode == 0
    world.finish(greeter)
    wait_for(lambda: (check()["presence"] or {}).get("connected"), what="the agent's presence link")
    s = check()
    assert s["presence"]["holder"] == "agent" and s["loggedIn"] is True and s["agent"]["presence"] == {"box": "4821", "connected": True}


def test_tampered_vault_can_be_seen_and_cleared_with_force(world):
    assert world.phone("credentials", "set", "--user", "alice", stdin=PASSWORD + "\n").returncode == 0
    path = os.path.join(world.env["XDG_DATA_HOME"], "boxkey", "vault")
    text = open(path).read()
    assert '"failures" : 0' in text
    open(path, "w").write(text.replace('"failures" : 0', '"failures" : 3', 1))
    r = world.phone("status")
    assert r.returncode == 0, r.stderr
    assert re.search(r"^credentials: unusable", r.stdout, re.M), r.stdout
    r = world.phone("status", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["vault"]["credentials"] == "unusable", r.stdout
    r = world.phone("credentials", "set", "--user", "alice", stdin=PASSWORD + "\n")
    assert r.returncode == 14 and "--force" in r.stderr, r.stderr
    r = world.phone("credentials", "clear")
    assert r.returncode == 14 and "--force" in r.stderr, r.stderr
    assert os.path.exists(path)
    r = world.phone("credentials", "clear", "--force")
    assert r.returncode == 0 and path in r.stdout, r.stdout + r.stderr
    assert not os.path.exists(path)
    assert vault_report(world)["credentials"] == "none"
    r = world.phone("credentials", "set", "--user", "alice", stdin=PASSWORD + "\n")
    assert r.returncode == 0 and "Credentials for alice stored" in r.stdout, r.stderr
    assert vault_report(world)["credentials"] == "stored"


# --- CLI habits ---------------------------------------------------------------------------------

def packaged_version():
    """The version debian/changelog releases and the protocol version the sources speak: what
    `--version` must say."""
    top = os.path.join(os.path.dirname(__file__), "..", "..")
    with open(os.path.join(top, "debian", "changelog")) as f:
        release = re.match(r"boxkey \(([^)]+)\)", f.readline()).group(1)
    with open(os.path.join(top, "Sources", "BoxkeyCore", "Protocol", "BoxkeyProtocol.swift")) as f:
        protocol = re.search(r"static let version: UInt8 = (\d+)", f.read()).group(1)
    return f"{release} (protocol {protocol})"


def test_version_and_usage_errors(world):
    r = world.phone("--version")
    assert r.returncode == 0 and r.stdout == f"boxkey {packaged_version()}\n", r.stdout
    r = world.phone("pair", "12a4", "--code", "123456")
    assert r.returncode == 64 and "'12a4'" in r.stderr and "Usage: boxkey pair" in r.stderr, r.stderr
    r = world.phone("login", "99999")
    assert r.returncode == 64 and "'99999'" in r.stderr and "Usage: boxkey login" in r.stderr, r.stderr
    r = world.phone("pair", "4821", "--code", "12")
    assert r.returncode == 64 and "a pairing code is 6 digits" in r.stderr, r.stderr
    # Nothing was created by refused arguments.
    assert not os.path.exists(os.path.join(world.env["XDG_CONFIG_HOME"], "boxkey"))


def test_not_paired_and_no_credentials_have_their_own_codes(world):
    r = world.phone("login", "--no-stay")
    assert r.returncode == 4 and "no default box" in r.stderr, r.stderr
    world.start_box()
    r = world.pair(world.pairing_code("alice"))
    assert r.returncode == 0, r.stdout + r.stderr
    r = world.phone("login", "--no-stay")
    assert r.returncode == 11 and "no credentials stored" in r.stderr, r.stderr
    r = world.phone("login", "1234", "--no-stay")
    assert r.returncode == 4 and "box 1234 is not paired" in r.stderr, r.stderr


def test_json_outputs_parse(world, agents):
    world.start_box()
    world.pair_and_store()
    status = json.loads(world.phone("status", "--json").stdout)
    stored = {"credentials": "stored", "pin": False, "failures": 0, "lockedUntil": None, "problem": None, "user": "alice", "kind": "password"}
    assert status["vault"] == stored
    assert [b["id"] for b in status["boxes"]] == ["4821"] and status["boxes"][0]["isDefault"] is True
    assert re.fullmatch(r"[0-9a-f]{64}", status["phoneKey"])
    assert vault_report(world) == stored
    assert json.loads(world.phone("credentials", "show", "--json").stdout) == vault_report(world)
    world.greeter()
    r = world.phone("scan", "--json", "--seconds", "2")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert rows, r.stdout
    for row in rows:
        assert set(row) == {"id", "address", "rssi", "paired", "loginPrompt"}, row
        assert row["id"] == "4821" and row["paired"] is True and isinstance(row["rssi"], int)
    assert any(row["loginPrompt"] for row in rows)
    r = agents.start()
    assert r.returncode == 0 and "Agent running" in r.stdout, r.stdout + r.stderr
    a = agents.status()
    assert a["credentialsHeld"] is True and a["user"] == "alice" and a["pid"] in agents.pids
    assert 0 < a["expiresInSeconds"] <= 4 * 3600
    assert json.loads(world.phone("status", "--json").stdout)["agent"]["pid"] == a["pid"]


@pytest.mark.both_radios
def test_logout_asks_first(world):
    world.start_box()
    world.pair_and_store()
    greeter = world.greeter("authenticate", "open_session")
    assert world.phone("login", "--no-stay").returncode == 0
    world.finish(greeter)
    r = world.phone("logout", stdin="n\n")
    assert r.returncode == 16 and "not logged out" in r.stderr, r.stdout + r.stderr
    assert "Log out of your session? Unsaved work will be lost. [y/N]" in r.stderr
    r = world.phone("logout", stdin="")  # no answer is no
    assert r.returncode == 16
    time.sleep(0.5)
    assert "TerminateSession" not in world.logind.calls()
    r = world.phone("logout", stdin="y\n")
    assert r.returncode == 0 and "Logged out of box 4821" in r.stdout, r.stderr
    wait_for(lambda: 'TerminateSession "42"' in world.logind.calls(), what="TerminateSession")


def test_doctor_says_what_is_wrong_and_what_to_do(world):
    world.start_box()
    r = world.phone("doctor")
    assert r.returncode == 0 and "warning phone key: none yet" in r.stdout, r.stdout + r.stderr
    world.pair_and_store()
    r = world.phone("doctor", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    found = {f["check"]: f for f in json.loads(r.stdout)["findings"]}
    assert found["boxes"]["level"] == "ok" and "4821 (default)" in found["boxes"]["detail"]
    assert found["credentials"]["level"] == "ok" and found["phone key"]["level"] == "ok"
    config = os.path.join(world.env["XDG_CONFIG_HOME"], "boxkey")
    os.chmod(config, 0o755)
    r = world.phone("doctor")
    assert r.returncode == 1, r.stdout
    assert f"FAILED  configuration folder: {config} is mode 755" in r.stdout and f"chmod 700 {config}" in r.stdout


# --- every --help text, against Tests/e2e/help/ --------------------------------------------------

COMMANDS = [(), ("scan",), ("pair",), ("forget",), ("credentials",), ("credentials", "set"), ("credentials", "clear"),
            ("credentials", "show"), ("pin",), ("pin", "set"), ("pin", "change"), ("pin", "clear"), ("login",), ("lock",),
            ("logout",), ("status",), ("doctor",), ("agent",), ("agent", "start"), ("agent", "status"), ("agent", "forget"),
            ("agent", "stop"), ("fleet",), ("fleet", "trust"), ("fleet", "forget"), ("sim",), ("sim", "move")]


@pytest.mark.parametrize("words", COMMANDS, ids=lambda w: " ".join(("boxkey",) + w))
def test_help_text_matches_golden_file(bins, words):
    """BOXKEY_REGENERATE_HELP=1 rewrites the golden files from the binary under test."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BOXKEY_", "XDG_"))}
    env["COLUMNS"] = "100"  # the parser wraps to the terminal's width, else to $COLUMNS
    r = subprocess.run([bins["boxkey"], *words, "--help"], env=env, capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    golden = os.path.join(HELP, "_".join(("boxkey",) + words) + ".txt")
    if os.environ.get("BOXKEY_REGENERATE_HELP") == "1":
        os.makedirs(HELP, exist_ok=True)
        open(golden, "w").write(r.stdout)
    expected = open(golden).read()
    if r.stdout != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), r.stdout.splitlines(True),
                                            fromfile=golden, tofile="boxkey " + " ".join(words) + " --help"))
        pytest.fail("help text changed (BOXKEY_REGENERATE_HELP=1 rewrites the golden file):\n" + diff, pytrace=False)


# --- the agent ----------------------------------------------------------------------------------

def test_agent_logs_in_without_asking_the_pin(world, agents):
    with_pin(world)
    greeter = world.greeter()
    start = time.monotonic()
    r = world.phone("login", "--no-stay", stdin=PIN + "\n")
    without_agent = time.monotonic() - start
    assert r.returncode == 0 and world.finish(greeter)[0] == 0, r.stderr
    r = agents.start(stdin=PIN + "\n")
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^Agent running \(pid \d+\), credentials held for 4h\.$", r.stdout, re.M), r.stdout
    greeter = world.greeter()
    start = time.monotonic()
    r = world.phone("login", "--no-stay", stdin="")  # no PIN to give: none is asked
    with_agent = time.monotonic() - start
    code, _ = world.finish(greeter)
    assert r.returncode == 0 and code == 0, r.stdout + r.stderr
    assert "Logged in to box 4821 as alice" in r.stdout and "PIN" not in r.stderr
    print(f"login --no-stay: {without_agent:.2f} s without the agent (PIN, Argon2id), {with_agent:.2f} s through it")
    s = agents.status()
    assert s["credentialsHeld"] is True and s["user"] == "alice"
    assert vault_report(world)["failures"] == 0


def test_agent_forget_makes_the_next_login_ask_the_pin(world, agents):
    with_pin(world)
    assert agents.start(stdin=PIN + "\n").returncode == 0
    r = world.phone("agent", "forget")
    assert r.returncode == 0 and "dropped the credentials" in r.stdout, r.stderr
    assert agents.status()["credentialsHeld"] is False
    assert "credentials dropped (asked to)" in agents.log_text()
    r = world.phone("login", "--no-stay", stdin="")
    assert r.returncode == 16 and "no PIN entered" in r.stderr, r.stdout + r.stderr
    # A wrong PIN handed to the agent is an attempt like any other.
    r = world.phone("login", "--no-stay", stdin="111111\n")
    assert r.returncode == 5 and "9 attempts left" in r.stderr, r.stdout + r.stderr
    assert vault_report(world)["failures"] == 1
    assert agents.status()["credentialsHeld"] is False
    greeter = world.greeter()
    r = world.phone("login", "--no-stay", stdin=PIN + "\n")
    code, _ = world.finish(greeter)
    assert r.returncode == 0 and code == 0, r.stdout + r.stderr
    assert agents.status()["credentialsHeld"] is True
    assert vault_report(world)["failures"] == 0


@pytest.mark.parametrize("how", ["ctrl-c", "forget", "lock"])
def test_the_agents_push_is_taken_back_at_once(world, agents, how):
    """The agent's push waits for Enter: Ctrl-C in `boxkey login` (the client goes away),
    `agent forget` or `boxkey lock` takes it back at once; Enter right after logs in no one."""
    with_pin(world)
    assert agents.start(stdin=PIN + "\n").returncode == 0
    prompt = world.greeter(stdin=None)
    client = world.phone_background("login")
    wait_for(lambda: "Press Enter" in open(client.log).read(), timeout=20, what="the push waiting for Enter")
    if how == "ctrl-c":
        client.send_signal(signal.SIGINT)
        assert client.wait(10) == 16, open(client.log).read()
        assert "Withdrawn: box 4821 dropped the push" in open(client.log).read()
    elif how == "forget":
        assert world.phone("agent", "forget").returncode == 0
    else:
        world.phone("lock")
    wait_for(lambda: "the phone withdrew it before Enter was pressed at the box" in world.box_output(), timeout=5, what="the withdrawal")
    prompt.type("\n")
    wait_for(lambda: "No phone has pushed" in prompt.text(), what="the answer to Enter")
    prompt.kill()
    assert "login accepted" not in world.box_output()
    if how != "ctrl-c":
        assert client.wait(10) == 16 and "Withdrawn" in open(client.log).read(), open(client.log).read()


def test_a_second_login_while_the_agent_holds_the_presence_link_is_refused(world, agents):
    """Before: the second login went through the agent, which connected again and knocked its
    own presence link down twice, then failed "(remoteUser)". Now it is refused before any
    radio work, and the agent's link keeps guarding."""
    with_pin(world)
    assert agents.start(stdin=PIN + "\n").returncode == 0
    greeter = world.greeter("authenticate", "open_session")
    assert world.phone("login").returncode == 0
    assert world.finish(greeter)[0] == 0
    wait_for(lambda: (agents.status().get("presence") or {}).get("connected"), what="the agent's presence link")
    links = world.box_output().count("presence link up")
    for args in (("login",), ("login", "--no-stay"), ("login", "--no-agent")):
        r = world.phone(*args)
        assert r.returncode == 1 and "the agent (pid" in r.stderr and "holds its presence link" in r.stderr, r.stdout + r.stderr
    assert (agents.status().get("presence") or {}).get("connected")
    assert world.box_output().count("presence link up") == links and "presence link lost" not in world.box_output()


def test_lock_through_the_agent_drops_the_credentials(world, agents):
    with_pin(world)
    assert agents.start(stdin=PIN + "\n").returncode == 0
    greeter = world.greeter("authenticate", "open_session")
    assert world.phone("login", "--no-stay").returncode == 0
    assert world.finish(greeter)[0] == 0
    r = world.phone("lock")
    assert r.returncode == 0 and "Locked your session on box 4821" in r.stdout, r.stdout + r.stderr
    wait_for(lambda: 'LockSession "42"' in world.logind.calls(), what="LockSession")
    assert agents.status()["credentialsHeld"] is False
    assert "credentials dropped (boxkey lock)" in agents.log_text()
    r = world.phone("login", "--no-stay", stdin="")
    assert r.returncode == 16  # the PIN is asked again


# Lock on both radios; logout takes the same path, on the simulated radio only (the lab's time).
@pytest.mark.parametrize("action", [pytest.param("lock", marks=pytest.mark.both_radios), "logout"])
def test_lock_and_logout_through_the_agent_holding_the_presence_link(world, agents, action):
    """`boxkey login` with an agent: the agent keeps the presence link, and a lock or logout
    goes over that link. The command says what the box did, and exits 0."""
    with_pin(world)
    assert agents.start(stdin=PIN + "\n").returncode == 0
    greeter = world.greeter("authenticate", "open_session")
    r = world.phone("login")
    assert r.returncode == 0 and "presence link" in r.stdout, r.stdout + r.stderr
    assert world.finish(greeter)[0] == 0
    wait_for(lambda: (agents.status().get("presence") or {}).get("connected"), what="the agent's presence link")
    r = world.phone(action, *(["--yes"] if action == "logout" else []))
    said, call = ("Locked your session on box 4821", 'LockSession "42"') if action == "lock" \
        else ("Logged out of box 4821", 'TerminateSession "42"')
    assert r.returncode == 0 and said in r.stdout, r.stdout + r.stderr
    wait_for(lambda: call in world.logind.calls(), what=call)
    wait_for(lambda: not agents.status().get("presence"), what="the agent's presence link to end")


def test_lock_through_the_agent_of_a_session_nothing_can_lock_says_so_and_keeps_the_link(world, agents):
    """The agent holds the presence link of a text console: `boxkey lock` is told the session
    cannot be locked (exit 19), the box ends nothing, and the agent's link stays up and says
    so truly (the box still lists it)."""
    world.settings["presence"]["lock_confirm_s"] = 8   # longer than the keepalive timeout
    with_pin(world)
    assert agents.start(stdin=PIN + "\n").returncode == 0
    world.logind.without_locker("42")
    greeter = world.greeter("authenticate", "open_session")
    assert world.phone("login").returncode == 0
    assert world.finish(greeter)[0] == 0
    wait_for(lambda: (agents.status().get("presence") or {}).get("connected"), what="the agent's presence link")
    r = world.phone("lock")
    assert r.returncode == 19 and "cannot lock your session" in r.stderr, r.stdout + r.stderr
    time.sleep(8)
    assert "TerminateSession" not in world.logind.calls()
    assert (agents.status().get("presence") or {}).get("connected")
    box = json.loads(world.admin("status", "--json").stdout)
    assert [p["user"] for p in box["presence"]] == ["alice"], box
    assert "walked away" not in world.box_output()


def test_lock_through_a_foreground_login_makes_the_agent_drop_the_credentials(world, agents):
    """`boxkey lock` means the person is leaving: when the presence link is a foreground
    login's, an agent running beside it still drops what it holds."""
    with_pin(world)
    assert agents.start(stdin=PIN + "\n").returncode == 0
    # The foreground login below reads no PIN from its standard input.
    assert world.phone("pin", "clear", stdin=PIN + "\n").returncode == 0
    greeter = world.greeter("authenticate", "open_session")
    holder = world.phone_background("login", "--no-agent")
    wait_for(lambda: "Staying connected" in open(holder.log).read() or holder.poll() is not None, what="presence link")
    assert holder.poll() is None, open(holder.log).read()
    assert world.finish(greeter)[0] == 0
    r = world.phone("lock")
    assert r.returncode == 0 and "Locked your session on box 4821" in r.stdout, r.stdout + r.stderr
    wait_for(lambda: 'LockSession "42"' in world.logind.calls(), what="LockSession")
    assert agents.status()["credentialsHeld"] is False
    assert holder.wait(15) == 0


def test_suspend_drops_the_credentials(world, agents):
    """logind's PrepareForSleep(true), sent by the mock from the bus name org.freedesktop.login1,
    right after `agent start` returns: the watch is in place before the agent says it runs."""
    with_pin(world)
    assert agents.start(stdin=PIN + "\n").returncode == 0

    def prepare_for_sleep(going):
        world.logind.manager.EmitSignal("org.freedesktop.login1.Manager", "PrepareForSleep", "b", [going],
                                        dbus_interface=world.logind.MOCK)

    def sleep_inhibitors():
        return [(str(i[0]), str(i[1]), str(i[3])) for i in
                world.logind.manager.ListInhibitors(dbus_interface="org.freedesktop.login1.Manager")]

    # While it holds credentials the agent delays suspends (logind waits for it), so a suspend
    # cannot overtake the drop; the inhibitor goes with the credentials.
    wait_for(lambda: sleep_inhibitors() == [("sleep", "boxkey agent", "delay")], timeout=5, what="the agent's delay inhibitor")
    prepare_for_sleep(True)
    wait_for(lambda: agents.status()["credentialsHeld"] is False, timeout=5, what="the agent dropping the credentials")
    assert "credentials dropped (the machine is going to sleep)" in agents.log_text()
    wait_for(lambda: sleep_inhibitors() == [], timeout=5, what="the inhibitor released")
    # Unlocked again by the next login; waking up (false) drops nothing, the next suspend does.
    greeter = world.greeter()
    assert world.phone("login", "--no-stay", stdin=PIN + "\n").returncode == 0
    assert world.finish(greeter)[0] == 0
    assert agents.status()["credentialsHeld"] is True
    wait_for(lambda: len(sleep_inhibitors()) == 1, timeout=5, what="the inhibitor taken again")
    prepare_for_sleep(False)
    time.sleep(1)
    assert agents.status()["credentialsHeld"] is True
    prepare_for_sleep(True)
    wait_for(lambda: agents.status()["credentialsHeld"] is False, timeout=5, what="the agent dropping the credentials")


def test_agent_socket_is_private_and_refuses_other_users(world, agents):
    world.start_box()
    world.pair_and_store()
    assert agents.start().returncode == 0
    directory = os.path.dirname(agents.socket)
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert stat.S_ISSOCK(os.stat(agents.socket).st_mode) and stat.S_IMODE(os.stat(agents.socket).st_mode) == 0o600
    # Open the way for uid 1001 (mallory) on purpose: only the agent's SO_PEERCRED check is left.
    opened = [world.work, os.path.join(world.work, "phone"), os.path.dirname(directory), directory]
    modes = {p: stat.S_IMODE(os.stat(p).st_mode) for p in opened + [agents.socket]}
    try:
        for p in opened:
            os.chmod(p, 0o755)
        os.chmod(agents.socket, 0o666)
        probe = ("import socket\n"
                 "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
                 "s.settimeout(10)\n"
                 f"s.connect({agents.socket!r})\n"
                 "try:\n"
                 "    s.sendall(b'\\x00\\x01\\x01')\n"  # a status request
                 "except OSError:\n"
                 "    pass\n"
                 "try:\n"
                 "    print(repr(s.recv(4096)))\n"
                 "except ConnectionResetError:\n"
                 "    print('reset')\n")
        r = subprocess.run(["/usr/bin/python3", "-c", probe], preexec_fn=lambda: os.setuid(USERS["mallory"]),
                           capture_output=True, text=True, timeout=20)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() in ("b''", "reset"), r.stdout  # no answer: closed
    finally:
        for p, mode in modes.items():
            os.chmod(p, mode)
    wait_for(lambda: "refused a connection from another user" in agents.log_text(), timeout=5, what="the refusal logged")
    assert agents.status()["credentialsHeld"] is True  # the agent serves its own user as before


def test_agent_log_and_outputs_never_contain_the_password(world, agents):
    with_pin(world)
    assert agents.start(stdin=PIN + "\n").returncode == 0
    for password in (PASSWORD, "wrong horse"):
        assert world.phone("agent", "forget").returncode == 0
        assert world.phone("credentials", "set", "--user", "alice", stdin=f"{password}\n{PIN}\n").returncode == 0
        g = world.greeter()
        r = world.phone("login", "--no-stay", stdin=PIN + "\n")
        assert r.returncode == (0 if password == PASSWORD else 2), r.stderr
        world.finish(g)
    world.phone("agent", "status")
    world.phone("status", "--json")
    agents.stop()
    world.stop_box()
    log = agents.log_text()
    assert "login accepted" in world.box_output() and "login rejected" in world.box_output()
    assert "Logged in to box 4821" in log
    everything = log + world.box_output() + "\n".join(world.outputs)
    for secret in (PASSWORD, "wrong horse", "battery", PIN):
        assert secret not in everything, secret


def test_agent_stop_ends_the_process(world, agents):
    world.start_box()
    world.pair_and_store()
    assert agents.start().returncode == 0
    pid = agents.status()["pid"]
    assert alive(pid)
    r = world.phone("agent", "stop")
    assert r.returncode == 0 and "Agent stopped" in r.stdout, r.stderr
    wait_for(lambda: not alive(pid), timeout=5, what="the agent process to end")
    assert not os.path.exists(agents.socket)
    assert "agent stopped" in agents.log_text()
    r = world.phone("agent", "status")
    assert r.returncode == 18, r.stdout + r.stderr
    assert boxkey_processes(world) == []


def test_two_agents_started_at_once_leave_one_that_stop_reaches(world, agents):
    """The check for a running agent and the start are half a second apart (the PIN's
    Argon2id). Two `agent start` in that window: one agent runs (the other never opens the
    vault), and `forget` and `stop` reach the one that holds the password."""
    with_pin(world)
    starts = [subprocess.Popen([world.bins["boxkey"], "agent", "start"], env=world.phone_env(), stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.communicate(PIN + "\n", timeout=60), p.returncode) for p in starts]
    for (out, err), _ in results:
        world.outputs.append(out + err)
        m = re.search(r"Agent running \(pid (\d+)\)", out)
        if m:
            agents.pids.add(int(m.group(1)))
    assert any(rc == 0 and "Agent running" in out for (out, _), rc in results), results
    assert len(agents.pids) == 1, results
    pid = next(iter(agents.pids))
    assert boxkey_processes(world) == [pid]
    assert vault_report(world)["failures"] == 0  # the second start tried no PIN
    assert world.phone("agent", "forget").returncode == 0
    assert memory_count(pid, PASSWORD.encode()) == 0
    r = world.phone("agent", "stop")
    assert r.returncode == 0 and "Agent stopped" in r.stdout, r.stdout + r.stderr
    wait_for(lambda: boxkey_processes(world) == [], timeout=5, what="no agent left")


def test_agent_memory_holds_no_pin_or_password_once_dropped(world, agents):
    """The agent holds the credentials, never the PIN: neither the PIN it was started with nor
    one sent over its socket stays in its memory, and after `forget` neither does the password."""
    with_pin(world)
    assert agents.start(stdin=PIN + "\n").returncode == 0
    pid = agents.status()["pid"]
    assert memory_count(pid, PIN.encode()) == 0
    assert world.phone("agent", "forget").returncode == 0
    greeter = world.greeter()
    r = world.phone("login", "--no-stay", stdin=PIN + "\n")  # the PIN goes to the agent over its socket
    assert r.returncode == 0 and world.finish(greeter)[0] == 0, r.stdout + r.stderr
    assert agents.status()["credentialsHeld"] is True
    assert memory_count(pid, PIN.encode()) == 0
    assert world.phone("agent", "forget").returncode == 0
    assert memory_count(pid, PASSWORD.encode()) == 0
    assert memory_count(pid, PIN.encode()) == 0


def test_phone_key_linked_to_a_missing_file_is_an_error_not_a_new_identity(world):
    """A phone.key that is a link to a disk not mounted now is not "no key"."""
    world.start_box()
    world.pair_and_store()
    key = os.path.join(world.env["XDG_CONFIG_HOME"], "boxkey", "phone.key")
    moved = os.path.join(world.work, "unmounted-phone.key")
    os.rename(key, os.path.join(world.work, "kept.key"))
    os.symlink(moved, key)
    r = world.phone("credentials")
    assert r.returncode != 0 and "link to a missing file" in r.stderr, r.stdout + r.stderr
    assert os.path.islink(key) and not os.path.exists(moved)


def test_a_pin_sent_in_pieces_is_not_left_in_the_agents_memory(world, agents):
    """A client may send the unlock request in several writes; the agent reassembles it in
    one buffer it zeroes, not in NIO's fragments, which would be freed unzeroed."""
    with_pin(world)
    assert agents.start(stdin=PIN + "\n").returncode == 0
    pid = agents.status()["pid"]
    assert world.phone("agent", "forget").returncode == 0
    body = b"\x02\x00\x06" + PIN.encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(20)
        s.connect(agents.socket)
        s.sendall(len(body).to_bytes(2, "big"))
        time.sleep(0.3)
        s.sendall(body[:4])
        time.sleep(0.3)
        s.sendall(body[4:])
        assert s.recv(4096)  # the answer: unlocked
    wait_for(lambda: agents.status()["credentialsHeld"] is True, timeout=10, what="the agent to unlock")
    assert world.phone("agent", "forget").returncode == 0
    assert memory_count(pid, PIN.encode()) == 0
    assert memory_count(pid, PASSWORD.encode()) == 0


def test_unreadable_phone_key_is_an_error_not_a_new_identity(world):
    """A phone.key that exists but cannot be read now (permissions here; too many open files or
    an I/O error elsewhere) must not be replaced by a new key: the boxes know this one, and the
    vault is bound to it."""
    world.start_box()
    world.pair_and_store()
    key = os.path.join(world.env["XDG_CONFIG_HOME"], "boxkey", "phone.key")
    before = open(key, "rb").read()
    mallory = USERS["mallory"]
    phone_home = os.path.join(world.work, "phone")
    modes = {world.work: stat.S_IMODE(os.stat(world.work).st_mode)}
    # The phone's files belong to another account, whose key file it may not read.
    try:
        os.chmod(world.work, 0o755)
        for root, dirs, files in os.walk(phone_home):
            for name in [root] + [os.path.join(root, f) for f in files]:
                os.chown(name, mallory, -1)
        os.chmod(key, 0o000)
        r = subprocess.run([world.bins["boxkey"], "status"], env=dict(world.phone_env(), HOME=phone_home),
                           preexec_fn=lambda: os.setuid(mallory), capture_output=True, text=True, timeout=30)
        world.outputs.append(r.stdout + r.stderr)
    finally:
        for root, dirs, files in os.walk(phone_home):
            for name in [root] + [os.path.join(root, f) for f in files]:
                os.chown(name, 0, -1)
        os.chmod(key, 0o600)
        for p, mode in modes.items():
            os.chmod(p, mode)
    assert r.returncode != 0 and "cannot read" in r.stderr and "phone.key" in r.stderr, r.stdout + r.stderr
    assert open(key, "rb").read() == before
    assert world.phone("status").returncode == 0


def test_an_agent_nothing_can_reach_stops_and_a_second_one_is_refused(world, agents):
    """logind removes the runtime directory when the user's last session ends, and a shell
    without XDG_RUNTIME_DIR looks for the agent elsewhere. A second agent must not start beside
    the first (one per phone, whatever the environment), and an agent whose socket is gone
    stops instead of holding the password where nothing can reach it."""
    with_pin(world)
    assert agents.start(stdin=PIN + "\n").returncode == 0
    pid = agents.status()["pid"]
    r = world.phone("agent", "start", "--foreground", stdin=PIN + "\n", extra_env={"XDG_RUNTIME_DIR": ""})
    assert r.returncode != 0 and "an agent is already running" in r.stdout + r.stderr, r.stdout + r.stderr
    assert vault_report(world)["failures"] == 0
    runtime = os.path.dirname(agents.socket)
    shutil.rmtree(runtime)
    os.makedirs(runtime, mode=0o700)
    wait_for(lambda: not alive(pid), timeout=10, what="the unreachable agent to stop")
    assert "was removed or replaced; stopping" in agents.log_text()
    assert agents.start(stdin=PIN + "\n").returncode == 0  # a new one may start now


def test_agent_answers_while_another_process_holds_the_vault(world, agents):
    """A stopped or hung `boxkey` holding the vault's lock must not wedge the agent: forget and
    stop answer at once, and the unlock it was asked for fails after a bounded wait."""
    with_pin(world)
    assert agents.start(stdin=PIN + "\n").returncode == 0
    assert world.phone("agent", "forget").returncode == 0
    vault_dir = os.path.join(world.env["XDG_DATA_HOME"], "boxkey")
    holder = subprocess.Popen(["flock", vault_dir, "sleep", "60"])
    try:
        time.sleep(0.3)
        login = subprocess.Popen([world.bins["boxkey"], "login", "--no-stay"], env=world.phone_env(), stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        login.stdin.write(PIN + "\n")
        login.stdin.flush()
        time.sleep(1)  # the agent is waiting for the vault now
        start = time.monotonic()
        r = world.phone("agent", "status", "--json", timeout=10)
        assert r.returncode == 0 and json.loads(r.stdout)["credentialsHeld"] is False, r.stdout + r.stderr
        r = world.phone("agent", "stop", timeout=10)
        assert r.returncode == 0 and "Agent stopped" in r.stdout, r.stdout + r.stderr
        assert time.monotonic() - start < 5
        login.kill()
        login.communicate()
    finally:
        holder.kill()
        holder.wait()


def test_lock_reaches_the_agent_when_the_phone_files_do_not_load(world, agents):
    """`boxkey lock` is how a person leaving drops the agent's credentials: it reaches the agent
    by its socket alone, even with a damaged boxes.json."""
    with_pin(world)
    assert agents.start(stdin=PIN + "\n").returncode == 0
    greeter = world.greeter("authenticate", "open_session")
    assert world.phone("login", "--no-stay").returncode == 0
    assert world.finish(greeter)[0] == 0
    open(os.path.join(world.env["XDG_CONFIG_HOME"], "boxkey", "boxes.json"), "w").write("{ damaged")
    r = world.phone("lock")
    assert r.returncode == 0 and "Locked your session on box 4821" in r.stdout, r.stdout + r.stderr
    assert agents.status()["credentialsHeld"] is False


def test_lock_waits_for_the_agents_login_in_hand(world, agents):
    """`boxkey lock` while the agent is busy with a login (here the stack takes 3 s to give its
    verdict): the credentials go at once, and the lock is done once the login is over instead
    of being refused as busy."""
    world.start_box()
    world.pair_and_store()
    assert agents.start().returncode == 0
    slow = [world.module_line(), "auth optional pam_exec.so quiet /bin/sleep 3", world.matrix_line()]
    greeter = world.greeter("authenticate", "open_session", auth=slow)
    connected = world.box_output().count("connected ")
    login = subprocess.Popen([world.bins["boxkey"], "login", "--no-stay"], env=world.phone_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    wait_for(lambda: world.box_output().count("connected ") > connected, timeout=20, what="the agent's link to the box")
    time.sleep(0.5)  # the push is in the stack now, which takes 3 s to answer
    r = world.phone("lock", timeout=60)
    out, err = login.communicate(timeout=60)
    world.outputs.append(out + err)
    assert world.finish(greeter)[0] == 0
    assert login.returncode == 0 and "Logged in to box 4821" in out, out + err
    assert r.returncode == 0 and "Locked your session on box 4821" in r.stdout, r.stdout + r.stderr
    assert "credentials dropped (boxkey lock)" in agents.log_text()
    wait_for(lambda: 'LockSession "42"' in world.logind.calls(), what="LockSession")
    assert agents.status()["credentialsHeld"] is False


def test_search_shows_progress_and_offers_to_search_again_on_a_terminal(world):
    """On a terminal the search says how long it has looked, and a box not found is offered
    a second search; declining ends with exit 3 (not found)."""
    import pty
    world.start_box()
    world.pair_and_store()
    world.stop_box()  # the box is gone: nothing answers
    pid, fd = pty.fork()
    if pid == 0:
        env = world.phone_env()
        os.execve(world.bins["boxkey"], [world.bins["boxkey"], "login", "--no-stay"], env)
    seen = b""
    deadline = time.monotonic() + 40
    answered = False
    while time.monotonic() < deadline:
        try:
            chunk = os.read(fd, 1024)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
        if not answered and b"Search again? [Y/n]" in seen:
            os.write(fd, b"n\n")
            answered = True
    _, status = os.waitpid(pid, 0)
    text = seen.decode(errors="replace")
    world.outputs.append(text)
    assert re.search(r"looking for box 4821… [1-9] s", text), text
    assert answered, text
    assert os.waitstatus_to_exitcode(status) == 3, text
