"""Login end to end: phone CLI <-> simulated radio <-> boxkeyd <-> PAM stack <-> logind."""
import json
import os
import re
import signal
import subprocess
import time

import pytest

from conftest import FINGERPRINT, PASSWORD, SLOW, process_cpu_seconds, wait_for

# The tests marked both_radios also run over real BlueZ in the VM lab (scripts/lab-test); the
# radio-specific steps are World methods (walk_away, come_back). A phone's process left running
# is stopped by the World at the end of the test.


@pytest.mark.both_radios
def test_login_accepted_and_phone_recorded(world):
    world.start_box()
    world.pair_and_store(enrol=False)  # an admin's code without --user: enrolled by its first login
    assert not re.search(FINGERPRINT + "  alice", world.admin("phones", "list").stdout)
    greeter = world.greeter("authenticate", "acct_mgmt", "open_session")
    r = world.phone("login", "--no-stay")
    code, out = world.finish(greeter)
    assert r.returncode == 0, r.stderr
    assert "Logged in to box 4821 as alice: boxkey-test on tty1" in r.stdout
    assert code == 0 and "successfully authenticated" in out
    assert "Box 4821: push from your phone, then press Enter" in out
    listing = world.admin("phones", "list")
    assert re.search(FINGERPRINT + "  alice", listing.stdout), listing.stdout
    assert "login accepted" in world.box_output()


def test_status_and_phones_as_json_and_for_people(world):
    """`boxkeyd status` and `boxkeyd phones` as JSON (an encoder's, for scripts), and for people
    with no empty fields."""
    world.start_box()
    world.pair_and_store()
    r = world.admin("status", "--json")
    assert r.returncode == 0, r.stderr
    status = json.loads(r.stdout)
    assert status["boxID"] == "4821" and len(status["publicKey"]) == 64 and status["enrolledPhones"] == 1
    assert status["pairing"]["live"] is False and status["sessions"] == [] and status["prompts"] == []
    assert re.match(r"^\d+\.\d+\.\d+ \(protocol \d+\)$", status["version"])
    text = world.admin("status").stdout
    assert all(re.match(r"^[a-zA-Z ]+:\s+\S", line) for line in text.splitlines()), text  # no empty field
    assert "sessions:    none" in text and "public key:  " + status["publicKey"] in text
    for command in (("phones", "--json"), ("phones", "list", "--json")):
        r = world.admin(*command)
        assert r.returncode == 0, r.stderr
        phones = json.loads(r.stdout)
        assert [p["users"] for p in phones] == [["alice"]] and re.fullmatch(FINGERPRINT, phones[0]["fingerprint"])
        assert phones[0]["enrolledBy"].startswith("pairing code") and "revokedAt" not in phones[0]


@pytest.mark.both_radios
def test_wrong_password_rejected_then_reentered(world):
    world.start_box()
    world.pair_and_store(password="wrong horse")
    greeter = world.greeter()
    r = world.phone("login", "--no-stay")
    code, out = world.finish(greeter)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "rejected the login for alice" in r.stderr and "If the password changed" in r.stderr and "Authentication failure" in r.stderr
    assert code != 0 and "Authentication failure" in out
    # The user re-enters the password; nothing was retried in between.
    assert world.phone("credentials", "set", "--user", "alice", stdin=PASSWORD + "\n").returncode == 0
    greeter = world.greeter()
    r = world.phone("login", "--no-stay")
    code, _ = world.finish(greeter)
    assert r.returncode == 0 and code == 0


@pytest.mark.both_radios
def test_ctrl_c_in_boxkey_login_takes_the_push_back_at_once(world):
    """Ctrl-C while the push waits for Enter: the phone sends `withdraw`, the box drops the push
    and answers "withdrawn" (exit 16), and Enter at once afterwards logs in no one."""
    world.start_box()
    world.pair_and_store()
    prompt = world.greeter(stdin=None)
    phone = world.phone_background("login", "--no-agent")
    wait_for(lambda: "Press Enter" in open(phone.log).read(), timeout=20, what="the push waiting for Enter")
    phone.send_signal(signal.SIGINT)
    assert phone.wait(10) == 16, open(phone.log).read()
    assert "Withdrawn: box 4821 dropped the push" in open(phone.log).read()
    assert "the phone withdrew it before Enter was pressed at the box" in world.box_output()
    prompt.type("\n")  # at once: the push is gone, not merely on its way out
    wait_for(lambda: "No phone has pushed" in prompt.text(), what="the answer to Enter")
    prompt.kill()
    assert "login accepted" not in world.box_output()


def test_push_without_prompt_is_not_replayed(world):
    world.start_box()
    world.pair_and_store()
    r = world.phone("login", "--no-stay")
    assert r.returncode == 8, r.stdout + r.stderr
    assert "not at a login prompt" in r.stderr
    # A prompt that appears later gets nothing from that push: Enter there finds no push, says
    # so, and asks again at once.
    greeter = world.greeter(stdin=None)
    start = time.monotonic()
    greeter.type("\n")
    wait_for(lambda: "No phone has pushed to box 4821 yet" in greeter.text(), what="the answer to Enter")
    assert time.monotonic() - start < 2
    code, out = world.finish(greeter)
    assert code != 0 and out.count("Password:") >= 2, out


def test_the_password_prompt_comes_at_once_and_takes_what_is_typed(world):
    world.start_box()
    start = time.monotonic()
    greeter = world.greeter(stdin=PASSWORD + "\n")
    code, out = world.finish(greeter)
    elapsed = time.monotonic() - start
    assert code == 0, out
    assert "Box 4821: push from your phone, then press Enter" in out
    assert elapsed < 2, elapsed
    assert out.count("Password:") == 1, out  # typed once: answer_prompt hands it to pam_matrix


def test_box_key_changed_is_refused_loudly(world):
    world.start_box()
    world.pair_and_store()
    world.stop_box()
    # Another box takes ID 4821 with a new key.
    subprocess.run(["rm", "-rf", os.path.join(world.work, "box")], check=True)
    world.start_box()
    world.greeter()
    r = world.phone("login", "--no-stay")
    assert r.returncode == 7, r.stdout + r.stderr
    assert "PRESENTS A DIFFERENT KEY" in r.stderr
    assert "login attempt" not in world.box_output()


def test_vault_wiped_after_ten_wrong_pins(world):
    world.start_box()
    world.pair_and_store()
    assert world.phone("pin", "set", stdin="246810\n246810\n").returncode == 0
    now = 1_800_000_000
    for attempt in range(1, 11):
        r = world.phone("login", "--no-stay", stdin="111111\n", extra_env={"BOXKEY_TEST_NOW": str(now)})
        assert r.returncode == (5 if attempt < 10 else 13), r.stderr
        if attempt < 10:
            assert f"{10 - attempt} attempt" in r.stderr, r.stderr
            if attempt >= 5:
                # Locked out until the delay has passed: even the right PIN is not tried.
                early = world.phone("login", "--no-stay", stdin="246810\n", extra_env={"BOXKEY_TEST_NOW": str(now + 1)})
                assert early.returncode == 12 and re.search(r"try again in \d+ (min|h|s).* \(at \d\d:\d\d:\d\d\); \d tries left", early.stderr), early.stderr
        else:
            assert "wiped" in r.stderr
        now += 3601
    assert "wiped" in world.phone("credentials").stdout
    r = world.phone("login", "--no-stay", stdin="246810\n", extra_env={"BOXKEY_TEST_NOW": str(now)})
    assert r.returncode == 13 and "wiped" in r.stderr


def test_tampered_vault_is_reported(world):
    world.start_box()
    world.pair_and_store()
    assert world.phone("pin", "set", stdin="246810\n246810\n").returncode == 0
    path = os.path.join(world.env["XDG_DATA_HOME"], "boxkey", "vault")
    text = open(path).read()
    open(path, "w").write(text.replace('"failures" : 0', '"failures" : 0 ', 1).replace('"failures" : 0 ', '"failures" : 0'))
    assert world.phone("credentials").returncode == 0  # unchanged content still verifies
    open(path, "w").write(re.sub(r'"operations" : \d+', '"operations" : 1', text))
    r = world.phone("login", "--no-stay", stdin="246810\n")
    assert r.returncode == 14 and "modified outside boxkey" in r.stderr


@pytest.mark.both_radios
def test_walk_away_locks_through_logind(world):
    world.start_box()
    world.pair_and_store()
    greeter = world.greeter("authenticate", "open_session")
    phone = world.staying_login()
    assert world.finish(greeter)[0] == 0
    world.walk_away(phone)
    wait_for(lambda: 'LockSession "42"' in world.logind.calls(), timeout=15, what="LockSession")
    wait_for(lambda: "walk-away lock" in world.box_output(), what="the box logging its walk-away lock")


@pytest.mark.both_radios
def test_phone_back_within_grace_is_not_locked(world):
    # A longer grace: the phone steps out of range and comes back before it ends (in the lab
    # finding the box again takes longer).
    world.settings["presence"]["grace_s"] = 6 * SLOW
    world.start_box()
    world.pair_and_store()
    greeter = world.greeter("authenticate", "open_session")
    phone = world.staying_login()
    world.finish(greeter)
    world.walk_away(phone)
    # The box's view: the phone's own log says nothing while it is frozen (the lab's walk-away).
    wait_for(lambda: "presence link lost" in world.box_output(), timeout=10, what="link loss")
    world.come_back(phone)
    wait_for(lambda: "restored" in open(phone.log).read(), timeout=10, what="re-attach")
    time.sleep(world.settings["presence"]["grace_s"] + 1)
    assert "LockSession" not in world.logind.calls()
    assert "presence link back" in world.box_output()
    phone.terminate()
    phone.wait(10)


@pytest.mark.both_radios
def test_explicit_lock_and_logout(world):
    world.start_box()
    world.pair_and_store()
    greeter = world.greeter("authenticate", "open_session")
    assert world.phone("login", "--no-stay").returncode == 0
    world.finish(greeter)
    r = world.phone("lock")
    assert r.returncode == 0 and "Locked" in r.stdout, r.stderr
    wait_for(lambda: 'LockSession "42"' in world.logind.calls(), what="LockSession")
    r = world.phone("logout", "--yes")
    assert r.returncode == 0 and "Logged out" in r.stdout, r.stderr
    wait_for(lambda: 'TerminateSession "42"' in world.logind.calls(), what="TerminateSession")
    # Nothing on record any more: logout ends no session by guess. (A lock now would lock all
    # of alice's local sessions, which is harmless.)
    r = world.phone("logout", "--yes")
    assert r.returncode == 15 and "no session" in r.stderr


@pytest.mark.parametrize("action", [pytest.param("lock", marks=pytest.mark.both_radios), "logout"])
def test_lock_and_logout_while_the_login_holds_the_presence_link(world, action):
    """The state right after every login: `boxkey login` in the foreground holds the presence
    link. A second link from the same phone would push that one aside; the command goes through
    the process that holds it, and its answer is the box's."""
    world.start_box()
    world.pair_and_store()
    greeter = world.greeter("authenticate", "open_session")
    holder = world.staying_login()
    assert world.finish(greeter)[0] == 0
    r = world.phone(action, *(["--yes"] if action == "logout" else []))
    said, call = ("Locked your session on box 4821", 'LockSession "42"') if action == "lock" \
        else ("Logged out of box 4821", 'TerminateSession "42"')
    assert r.returncode == 0 and said in r.stdout, r.stdout + r.stderr
    wait_for(lambda: call in world.logind.calls(), what=call)
    # The link's holder is done: it ends, saying what ended it.
    assert holder.wait(15) == 0
    assert said in open(holder.log).read()
    assert "presence link lost" not in world.box_output()


def test_lock_of_a_session_nothing_can_lock_says_so_and_never_ends_it(world):
    """`boxkey lock` on a text console: the box waits `lock_confirm_s` for LockedHint, then
    says the session cannot be locked. Here that wait (8 s, as for a slow desktop locker) is
    longer than the keepalive timeout (6 s), which the phone cannot keep while it waits for the
    answer. The lock must end nothing: no TerminateSession, the holder's link stays up and
    guarding (walking away still ends the session), and the holder does not spin."""
    world.settings["presence"]["lock_confirm_s"] = 8
    holder = world.console_guarded_by_phone()
    cpu_before = process_cpu_seconds(holder.pid)
    started = time.monotonic()
    r = world.phone("lock")
    took = time.monotonic() - started
    assert r.returncode == 19, r.stdout + r.stderr
    assert "box 4821 cannot lock your session" in r.stderr and "text console" in r.stderr, r.stderr
    assert "remoteUser" not in r.stderr and took < 14, (took, r.stderr)
    # The explicit lock ended nothing, now or a little later.
    time.sleep(8)
    assert "TerminateSession" not in world.logind.calls()
    assert holder.poll() is None, open(holder.log).read()
    assert process_cpu_seconds(holder.pid) - cpu_before < 2, "the holder spins"
    presence = json.loads(world.phone("status", "--json").stdout)["presence"] or {}
    assert presence.get("connected"), presence
    assert "walked away" not in world.box_output()
    assert "cannot be locked: nothing on it follows logind's Lock" in world.box_output()
    # Still guarded: walking away ends it (`not_locked = logout`, the default).
    world.walk_away(holder)
    wait_for(lambda: 'TerminateSession "42"' in world.logind.calls(), timeout=20, what="the walk-away ending the session")
    holder.terminate()
    holder.wait(10)


@pytest.mark.parametrize("how", ["restart", "crash"])
def test_walk_away_after_a_box_restart_ends_the_console_the_phone_opened(world, how):
    """The daemon restarts (an upgrade, `systemctl restart`) or crashes while alice's phone
    guards her console: the new daemon takes up the session and its phone (guard.json), the
    phone attaches again, and walking away then ends the console as it would have before."""
    holder = world.console_guarded_by_phone()
    if how == "crash":
        world.box_process.kill()
        world.box_process.wait(10)
    else:
        world.stop_box()
    world.start_box()
    wait_for(lambda: "restored" in open(holder.log).read(), timeout=20, what="the phone attaching again")
    status = json.loads(world.admin("status", "--json").stdout)
    assert [s["id"] for s in status["sessions"]] == ["42"] and [p["user"] for p in status["presence"]] == ["alice"], status
    assert "after a restart: guarding session(s) 42 (alice" in world.box_run_output()
    world.walk_away(holder)
    wait_for(lambda: 'TerminateSession "42"' in world.logind.calls(), timeout=25, what="the walk-away ending the console")
    holder.terminate()
    holder.wait(10)


def test_a_phone_that_left_while_the_box_was_down_is_a_walk_away(world):
    """The phone goes while no daemon runs: the new daemon gives it its grace time to come
    back, then walks it away (here: ends the console it opened)."""
    holder = world.console_guarded_by_phone()
    world.stop_box()
    holder.kill()
    holder.wait(10)
    world.start_box()
    wait_for(lambda: 'TerminateSession "42"' in world.logind.calls(), timeout=30, what="the walk-away ending the console")
    assert "did not come back after the box restarted" in world.box_run_output()


def test_a_second_login_leaves_a_live_presence_link_alone(world):
    """While a login holds a live presence link the session is open: a second `boxkey login`
    to the box is refused before it asks anything, and the first keeps guarding the session
    (were it to hand the link over first, a failed second login would leave walk-away off)."""
    world.settings["presence"]["grace_s"] = 1
    world.start_box()
    world.pair_and_store()
    greeter = world.greeter("authenticate", "open_session")
    first = world.staying_login()
    assert world.finish(greeter)[0] == 0
    for args in (("login",), ("login", "--no-stay"), ("login", "--no-agent")):
        r = world.phone(*args)
        assert r.returncode == 1 and f"holds its presence link" in r.stderr and str(first.pid) in r.stderr, r.stdout + r.stderr
    assert first.poll() is None
    r = json.loads(world.phone("status", "--json").stdout)
    assert r["presence"] == {"box": "4821", "holder": "login", "pid": first.pid, "connected": True}, r
    # Still guarding: walking away locks.
    world.walk_away(first)
    wait_for(lambda: 'LockSession "42"' in world.logind.calls(), timeout=15, what="LockSession")
    first.terminate()
    first.wait(10)


@pytest.mark.both_radios
def test_revoked_phone_is_refused(world):
    world.start_box()
    world.pair_and_store()
    greeter = world.greeter()
    assert world.phone("login", "--no-stay").returncode == 0
    world.finish(greeter)
    fingerprint = re.search(r"([0-9A-F]{4}-[0-9A-F]{4}-[0-9A-F]{4}-[0-9A-F]{4})", world.admin("phones", "list").stdout).group(1)
    r = world.admin("phones", "revoke", "--yes", fingerprint[:9])
    assert r.returncode == 0 and "revoked" in r.stdout
    world.greeter()
    r = world.phone("login", "--no-stay")
    assert r.returncode == 9 and "revoked" in r.stderr
    assert "REVOKED" in world.admin("phones", "list").stdout


@pytest.mark.both_radios
def test_a_phone_revoked_while_its_presence_link_is_up_is_told_once_and_stops(world):
    """Before: it said "looking for the box…" and knocked 4.6 times a second until Ctrl-C, and
    the box logged each refusal. Now the phone says it was removed and exits 9 (refused); the
    box says the refusal once."""
    world.start_box()
    world.pair_and_store()
    greeter = world.greeter("authenticate", "open_session")
    holder = world.staying_login()
    assert world.finish(greeter)[0] == 0
    fingerprint = re.search(r"([0-9A-F]{4}-[0-9A-F]{4}-[0-9A-F]{4}-[0-9A-F]{4})", world.admin("phones", "list").stdout).group(1)
    assert world.admin("phones", "revoke", "--yes", fingerprint[:9]).returncode == 0
    assert holder.wait(30) == 9, open(holder.log).read()
    said = open(holder.log).read()
    assert "Box 4821 no longer takes this phone" in said and "revoked" in said, said
    time.sleep(2)
    refused = [l for l in world.box_output().splitlines() if "refused" in l and "a revoked phone" in l and " notice " in l]
    assert len(refused) == 1, refused


def test_rejections_are_rate_limited(world):
    world.config_extra = "[limits]\nrejected_pushes_per_phone = 2\n"
    world.start_box()
    world.pair_and_store(password="wrong")
    for _ in range(2):
        g = world.greeter()
        assert world.phone("login", "--no-stay").returncode == 2
        world.finish(g)
    g = world.greeter()
    r = world.phone("login", "--no-stay")
    assert r.returncode == 9 and "too many failed attempts" in r.stderr
    g.kill()


@pytest.mark.both_radios
def test_restart_keeps_identity_and_corrupt_state_is_refused(world):
    world.start_box()
    before = world.admin("status").stdout
    world.pair_and_store()
    world.stop_box()
    world.start_box()
    after = world.admin("status").stdout
    assert before.splitlines()[:2] == after.splitlines()[:2]
    g = world.greeter()
    assert world.phone("login", "--no-stay").returncode == 0
    world.finish(g)
    world.stop_box()
    identity = os.path.join(world.work, "box", "identity")
    text = open(identity).read()
    open(identity, "w").write(text.replace("box-id 4821", "box-id 4822"))
    p = world.start_box(expect_ready=False)
    assert p.wait(20 * SLOW) != 0
    assert "corrupt" in world.box_output() and "checksum" in world.box_output()
    assert open(identity).read().startswith("boxkey-identity 1")  # not regenerated


def test_check_config_reports_errors(world):
    path = os.path.join(world.work, "bad.conf")
    open(path, "w").write('[presence]\npolicy = "explode"\n')
    r = subprocess.run([world.bins["boxkeyd"], "--check-config", "--config", path], capture_output=True, text=True)
    assert r.returncode == 78 and "policy must be lock, logout or none" in r.stderr
    open(path, "w").write('[radio]\nbackend = "simulated"\ntypo = 1\n')
    r = subprocess.run([world.bins["boxkeyd"], "--check-config", "--config", path], capture_output=True, text=True)
    assert r.returncode == 78 and "line 3: unknown key typo in [radio]" in r.stderr, r.stderr
    # The admin commands read the same file, but a bad one does not stop them (the running
    # daemon keeps its settings): they say the error and ask the daemon anyway; none runs here.
    for command in (["status"], ["phones"], ["phones", "list"], ["pair-code"]):
        r = subprocess.run([world.bins["boxkeyd"], *command, "--config", path], capture_output=True, text=True)
        assert r.returncode == 69 and "warning:" in r.stderr and "unknown key typo" in r.stderr, (command, r.returncode, r.stderr)
    # A missing file is every default, said so; a bad log level is a usage error.
    missing = os.path.join(world.work, "missing.conf")
    r = subprocess.run([world.bins["boxkeyd"], "--check-config", "--config", missing], capture_output=True, text=True)
    assert r.returncode == 0 and "no such file; every setting has its default" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([world.bins["boxkeyd"], "--log-level", "loud", "--config", missing], capture_output=True, text=True)
    assert r.returncode == 64 and "--log-level must be one of" in r.stderr, r.stderr
    r = subprocess.run([world.bins["boxkeyd"], "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and re.match(r"^boxkeyd \d+\.\d+\.\d+ \(protocol \d+\)$", r.stdout.strip()), r.stdout


def test_logs_never_contain_the_password(world):
    world.start_box()
    world.pair_and_store()
    for password in (PASSWORD, "wrong horse"):
        world.phone("credentials", "set", "--user", "alice", stdin=password + "\n")
        g = world.greeter()
        world.phone("login", "--no-stay")
        world.finish(g)
    world.stop_box()
    everything = world.box_output() + "\n".join(world.outputs)
    assert "login accepted" in everything and "login rejected" in everything
    for secret in (PASSWORD, "wrong horse", "battery"):
        assert secret not in everything


def test_background_presence_link(world):
    """--background starts an agent and logs in through it; the agent holds the presence link."""
    world.start_box()
    world.pair_and_store()
    greeter = world.greeter("authenticate", "open_session")
    r = world.phone("login", "--background", timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Agent running" in r.stdout and "Logged in to box 4821" in r.stdout and "holds the presence link" in r.stdout
    world.finish(greeter)
    status = world.phone("status").stdout
    assert re.search(r"agent:\s+pid \d+, holding credentials for alice \(a password\), presence link to box 4821", status), status
    # Stopping the agent ends its presence link as walking away: the box locks by its policy.
    assert world.phone("agent", "stop").returncode == 0
    wait_for(lambda: 'LockSession "42"' in world.logind.calls(), timeout=15, what="walk-away lock")
    wait_for(lambda: "agent:       not running" in world.phone("status").stdout, what="the agent gone")


def test_truncated_vault_is_reported(world):
    world.start_box()
    world.pair_and_store()
    path = os.path.join(world.env["XDG_DATA_HOME"], "boxkey", "vault")
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])
    r = world.phone("login", "--no-stay")
    assert r.returncode == 14 and "modified outside boxkey" in r.stderr


def test_rolled_back_vault_still_costs_argon2id_per_guess(world):
    """Restoring an old copy of the vault resets the wrong-PIN counter: a Linux device has no
    tamper-proof storage to prevent that (docs/threat-model.md). What the attacker still pays is
    one Argon2id derivation per guess, at least 0.25 s and 64 MiB."""
    world.start_box()
    world.pair_and_store()
    assert world.phone("pin", "set", stdin="246810\n246810\n").returncode == 0
    path = os.path.join(world.env["XDG_DATA_HOME"], "boxkey", "vault")
    snapshot = open(path, "rb").read()
    now = 1_800_000_000
    for _ in range(5):
        assert world.phone("login", "--no-stay", stdin="111111\n", extra_env={"BOXKEY_TEST_NOW": str(now)}).returncode == 5
    locked = world.phone("login", "--no-stay", stdin="111111\n", extra_env={"BOXKEY_TEST_NOW": str(now)})
    assert "try again in" in locked.stderr
    open(path, "wb").write(snapshot)  # the attacker rolls the file back
    start = time.monotonic()
    r = world.phone("login", "--no-stay", stdin="111111\n", extra_env={"BOXKEY_TEST_NOW": str(now)})
    assert r.returncode == 5 and "9 attempts left" in r.stderr
    assert time.monotonic() - start >= 0.25


def test_sighup_reloads_what_it_can_and_keeps_the_rest(world):
    world.start_box()
    world.pair_and_store()
    pid = world.box_process.pid
    waiting = world.greeter(stdin=None)  # offered: its password prompt is open for a push
    # The phone-login services change at once: without boxkey-test in the list, the open prompt
    # takes no push any more (Enter there brings the password prompt back) and the next is not
    # offered.
    world.settings["pam"]["services"] = ["login"]
    world.settings["box"]["id"] = "4822"  # the box ID needs a restart: said, not applied
    world.config()
    start = time.monotonic()
    os.kill(pid, signal.SIGHUP)
    wait_for(lambda: "reloaded the configuration" in world.box_output(), what="the reload")
    waiting.type("\n")
    wait_for(lambda: waiting.text().count("Password:") == 2, what="the password prompt after Enter")
    waiting.type(PASSWORD + "\n")
    code, out = world.finish(waiting)
    assert code == 0 and "Box 4821" in out and time.monotonic() - start < 10, out
    assert "not applied until boxkeyd restarts: [box] id" in world.box_output()
    assert "reloaded the configuration: changed phoneLoginServices" in world.box_output()
    prompt = world.greeter(stdin=PASSWORD + "\n", wait=False)
    wait_for(lambda: "not offering phone login to boxkey-test" in world.box_output(), what="the refusal")
    code, out = world.finish(prompt)
    assert code == 0 and "Box 4821" not in out, out
    assert json.loads(world.admin("status", "--json").stdout)["boxID"] == "4821"
    # A file that no longer parses, or that is gone, changes nothing: the last good settings stay.
    with open(world.config(), "a") as f:
        f.write("[pam\n")
    os.kill(pid, signal.SIGHUP)
    wait_for(lambda: "reload failed, the running settings stay" in world.box_output(), what="the failed reload")
    os.rename(os.path.join(world.work, "boxkeyd.conf"), os.path.join(world.work, "moved.conf"))
    os.kill(pid, signal.SIGHUP)
    wait_for(lambda: "boxkeyd.conf: no such file" in world.box_output(), what="the reload of a missing file")
    open(os.path.join(world.work, "boxkeyd.conf"), "w").close()  # empty, as if caught half-written
    os.kill(pid, signal.SIGHUP)
    wait_for(lambda: "boxkeyd.conf: no settings in the file" in world.box_output(), what="the reload of an empty file")
    assert world.box_process.poll() is None
    world.settings["pam"]["services"] = ["boxkey-test"]
    world.config()
    os.kill(pid, signal.SIGHUP)
    wait_for(lambda: world.box_output().count("reloaded the configuration: changed") == 2,
             what=lambda: "the second reload; the box said:\n" + world.box_output()[-2500:])
    prompt = world.greeter()
    assert world.phone("login", "--no-stay").returncode == 0
    assert world.finish(prompt)[0] == 0


def test_boxkeyd_doctor_checks_the_daemon_and_the_configuration(world):
    world.start_box()
    r = world.admin("doctor")
    out = r.stdout
    admin_socket = os.path.join(os.path.dirname(world.socket), os.path.basename(world.socket).replace("pam", "admin", 1))
    assert "ok      boxkeyd: answering on " + admin_socket + ": box 4821" in out, out + r.stderr
    assert "ok      configuration: " in out
    # Tests run the simulated radio: said, with what to do.
    assert 'warning radio: [radio] backend = "simulated"' in out
    # A bad file is one finding among the others, not the end of the checks.
    bad = os.path.join(world.work, "bad.conf")
    with open(bad, "w") as f:
        f.write("[presence]\npolicy = \"explode\"\n")
    # With the file unreadable, the defaults stand, and --socket names the daemon's.
    r = subprocess.run([world.bins["boxkeyd"], "doctor", "--config", bad, "--socket", world.socket], env=world.box_env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAILED  configuration: " + bad + " line 2: [presence] policy must be lock, logout or none" in r.stdout
    assert "ok      boxkeyd: answering" in r.stdout


def test_root_refuses_a_simulated_radio_folder_another_user_owns(world):
    """Root writes and chmods files in the simulated radio's folder: in a folder of another
    user's, that user could swap a name for a link to one of root's files."""
    foreign = os.path.join(world.work, "foreign-air")
    os.makedirs(foreign)
    os.chown(foreign, 65534, 65534)
    world.settings["radio"]["sim_directory"] = foreign
    box = world.start_box(expect_ready=False)
    assert box.wait(timeout=20) == 1
    assert "belongs to uid 65534" in world.box_output() and "/run/boxkey-sim" in world.box_output()
    assert os.listdir(foreign) == []
