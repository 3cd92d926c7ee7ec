"""Attacks on "the module asks at once, a push waits at the prompt for Enter" (PAM wire 3,
protocol 4), on the locality of a display manager's worker and on walk-away's "end what did
not lock", from an independent review (2026-11-26). Each was a finding or a check that held;
each now passes."""
import json
import os
import socket
import struct
import subprocess
import tempfile
import time

import dbus
import pytest

from conftest import PASSWORD, PASSWORDS, ROOT, USERS, wait_for


# --- tools of the attacker -------------------------------------------------------------------

class RawCentral:
    """A bare central on the simulated radio (SocketAir's frames, JSON with a 4-byte length): it
    connects to the box and sends nothing else, as any BLE device in range can."""

    def __init__(self, world, address):
        files = [f for f in os.listdir(world.sim) if f.endswith(".json")]
        assert len(files) == 1, files
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(os.path.join(world.sim, files[0][:-5] + ".sock"))
        still = {"from": 1.0, "to": 1.0, "start": [0, 0], "duration": [0, 0]}
        self.send({"hello": {"central": address, "trajectory": still}})
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        self.send({"event": {"_0": {"connected": {"mtu": 23}}, "time": now, "waitsForClock": False}})

    def send(self, frame):
        data = json.dumps(frame).encode()
        self.sock.sendall(struct.pack(">I", len(data)) + data)

    def close(self):
        self.sock.close()


def greeter_session_beside(world, session="g1"):
    """A display manager's greeter in a local logind greeter session, run as a sibling of the
    prompts this test starts (both are children of this pytest process, as greetd's greeter and
    its workers are children of greetd)."""
    world.logind.add_session(session, 113, "greeter", tty="tty7", display=":0")
    obj = world.logind.connection.get_object(world.logind.BUS_NAME, f"{world.logind.PATH}/session/{session}")
    obj.Set("org.freedesktop.login1.Session", "Class", "greeter", dbus_interface=dbus.PROPERTIES_IFACE)
    sibling = subprocess.Popen(["sleep", "300"], env=dict(os.environ, MOCK_LOGIND_SESSION=session))
    world.processes.append(sibling)
    return sibling


# --- 4. locality borrowed from a sibling ------------------------------------------------------

@pytest.mark.parametrize("where", [
    {"tty": "xterminal.example.org:0"},         # LightDM's XDMCP seat: PAM_TTY is the remote display, no PAM_RHOST
    {"tty": "pts/7", "rhost": "localhost"},     # a loopback "remote" login (telnet/rlogin/xrdp-like) with no session
])
def test_a_sibling_greeter_does_not_make_a_remote_prompt_local(world, where):
    """The new rule takes a session-less worker as local when any process with the same parent is
    in a local greeter session. It does not look at the worker's own terminal, display or host:
    a display manager that also serves a remote display (LightDM with XDMCP: PAM_TTY is
    "host:0", no PAM_RHOST) or a localhost login whose parent also runs a greeter borrows the
    local greeter's locality, and alice's push goes to it."""
    world.settings["pam"]["enter_wait_s"] = 5  # the held push comes back to the phone sooner
    world.start_box()
    world.pair_and_store()
    greeter_session_beside(world)
    prompt = world.greeter(stdin=None, wait=False, **where)
    wait_for(lambda: "Password:" in prompt.text(), what="the remote prompt's password prompt")
    time.sleep(0.5)
    r = world.phone("login", "--no-stay", timeout=60)
    offered = "login prompt waiting" in world.box_output()
    prompt.kill()
    assert not offered, "a remote prompt was offered phone login:\n" + world.box_output()[-1500:]
    assert r.returncode != 0 and "Sent. Press Enter" not in r.stdout, r.stdout + r.stderr


# --- 1/3. routing: whose push does Enter deliver? ---------------------------------------------

def two_phones(world):
    """alice's phone enrolled for alice; mallory's (a colleague's, in radio range) for mallory."""
    world.start_box()
    world.pair_and_store()
    world.pair_and_store(user="mallory", who="mallory")


def test_a_prompt_that_names_nobody_takes_no_push_until_the_name_is_typed(world):
    """A prompt that names nobody yet (gdm's "Not listed?", lightdm's "Other..."). Before: mallory,
    in radio range, parked her own push there, alice's push was refused, and alice's Enter logged
    her in as mallory (nothing on the screen says whose push waits). Now the module asks who
    first, and only a prompt for that user takes a push."""
    two_phones(world)
    prompt = world.greeter(user="", stdin=None, wait=False)
    wait_for(lambda: "login:" in prompt.text(), what="the module's user prompt")
    r = world.phone("login", "--no-stay", who="mallory")
    assert r.returncode != 0 and "not at a login prompt" in r.stderr, r.stdout + r.stderr
    prompt.type("alice\n")
    wait_for(lambda: "login prompt waiting: boxkey-test on tty1 for alice" in world.box_output(), what="alice's prompt")
    r = world.phone("login", "--no-stay", who="mallory")
    assert r.returncode != 0 and "prompt is for another user" in r.stderr, r.stdout + r.stderr
    alice = world.phone_background("login", "--no-stay")
    wait_for(lambda: f"(pid {prompt.pid}): waiting" in world.box_output(), what="alice's push at her prompt")
    prompt.type("\n")
    code, out = world.finish(prompt)
    assert alice.wait(30) == 0 and code == 0, out
    accepted = [l for l in world.box_output().splitlines() if "login accepted" in l]
    assert len(accepted) == 1 and "user alice" in accepted[0], accepted


def test_enter_waits_for_no_connection_and_takes_no_one_elses_push(world):
    """Before: Enter while any device was connected (alice's phone mid-handshake, say) waited for
    "a phone on its way" and then delivered the first push that fitted, from anyone. Now Enter
    waits only for the phone whose offer is at the prompt; a connection alone is nothing."""
    two_phones(world)
    prompt = world.greeter(stdin=None)
    raw = RawCentral(world, "C0:FF:EE:00:00:01")
    wait_for(lambda: "C0:FF:EE:00:00:01" in world.box_output(), what="the connection")
    start = time.monotonic()
    prompt.type("\n")
    wait_for(lambda: "No phone has pushed" in prompt.text(), what="the answer to Enter")
    assert time.monotonic() - start < 2
    r = world.phone("login", "--no-stay", who="mallory")
    raw.close()
    assert r.returncode != 0 and "prompt is for another user" in r.stderr, r.stdout + r.stderr
    code, out = world.finish(prompt)
    assert "login accepted" not in world.box_output()


# --- 2. denial of service at the password prompt ----------------------------------------------

def test_a_stranger_connecting_does_not_make_enter_wait(world):
    """Any device in range that connects (no key, no handshake) counts for 3 s as "a phone on its
    way": Enter at every open prompt then waits min(timeout=, commandTimeout) = 10 s, and keeps
    waiting after that device has gone."""
    world.start_box()
    world.pair_and_store()
    prompt = world.greeter(stdin=None)
    wait_for(lambda: "Password:" in prompt.text(), what="the password prompt")
    raw = RawCentral(world, "C0:FF:EE:00:00:02")
    wait_for(lambda: "C0:FF:EE:00:00:02" in world.box_output(), what="the stranger's connection")
    raw.close()  # gone again at once
    start = time.monotonic()
    prompt.type("\n")
    wait_for(lambda: "No phone has pushed" in prompt.text(), timeout=30, what="the answer to Enter")
    waited = time.monotonic() - start
    prompt.kill()
    assert waited < 2, f"Enter waited {waited:.1f} s for a stranger's connection that had already ended"


# --- 1. retries on the same PAM handle ---------------------------------------------------------

def test_a_second_attempt_on_the_same_handle_gets_nothing_of_the_first_push(world):
    """pamtester authenticates twice on one handle (as login retries): the push taken by the first
    Enter is not delivered again at the second. Held up."""
    world.start_box()
    world.pair_and_store()
    prompt = world.greeter("authenticate", "authenticate", stdin=None)
    phone = world.phone_background("login", "--no-stay")
    wait_for(lambda: "push held at" in world.box_output(), what="the held push")
    prompt.type("\n")
    wait_for(lambda: "login accepted" in world.box_output(), what="the first attempt")
    assert phone.wait(20) == 0
    wait_for(lambda: prompt.text().count("Password:") >= 2, what="the second attempt's prompt")
    prompt.type("\n")  # Enter with nothing typed: no push waits now
    wait_for(lambda: "No phone has pushed" in prompt.text(), what="the answer to Enter")
    prompt.type("")
    prompt.close_input()
    code, out = world.finish(prompt)
    assert world.box_output().count("login accepted") == 1
    assert out.count("successfully authenticated") == 1, out


# --- 6. walk-away: "terminate if not locked" ---------------------------------------------------

def test_walk_away_does_not_end_a_text_session_the_phone_never_opened(world):
    """alice's phone logged her in at a prompt (no session on record: authenticate only, or boxkeyd
    restarted since). She also has a text console on tty2 she logged into by typing, with work
    running in it. Her phone walks away: the box locks every local session of hers (fail closed),
    and then *terminates* tty2 because a text console cannot report LockedHint."""
    world.settings["presence"]["lock_confirm_s"] = 1
    world.logind.add_session("43", USERS["alice"], "alice", tty="tty2", locker=False)
    world.start_box()
    world.pair_and_store()
    prompt = world.greeter()
    phone = world.staying_login()
    assert world.finish(prompt)[0] == 0
    world.phone("sim", "move", "45", "--over", "1")
    wait_for(lambda: 'LockSession "43"' in world.logind.calls(), timeout=15, what="the walk-away lock")
    time.sleep(3)
    phone.terminate()
    phone.wait(10)
    assert 'TerminateSession "43"' not in world.logind.calls(), \
        "walk-away ended tty2, a session no push opened:\n" + "\n".join(l for l in world.box_output().splitlines() if "session 43" in l)


def test_someone_using_the_phones_radio_address_cannot_walk_it_away(world):
    """The phone's radio address is on the air for anyone to hear. A device that connects with it
    is taken as the phone's new connection, so the box ends the phone's live presence link as
    lost: grace, then walk-away (lock; now also TerminateSession where the lock is not confirmed).
    Held up on the simulated radio: the phone re-attaches within the grace period."""
    world.settings["presence"]["lock_confirm_s"] = 1
    world.start_box()
    world.pair_and_store()
    prompt = world.greeter("authenticate", "open_session")
    phone = world.staying_login()
    assert world.finish(prompt)[0] == 0
    import re
    address = re.search(r"connected (00:50:48:[0-9A-F:]{8})#", world.box_output()).group(1)
    raw = RawCentral(world, address)  # the attacker, in range, with the phone's address
    time.sleep(4)  # grace_s is 1
    raw.close()
    calls = world.logind.calls()
    phone.terminate()
    phone.wait(10)
    assert 'LockSession "42"' not in calls and "TerminateSession" not in calls, \
        "a device using alice's phone's address walked her away:\n" + calls


def test_enter_after_boxkeyd_restarted_mid_prompt_is_answered_at_once(world):
    world.start_box()
    world.pair_and_store()
    prompt = world.greeter(stdin=None)
    wait_for(lambda: "Password:" in prompt.text(), what="the password prompt")
    world.stop_box()
    world.start_box()
    start = time.monotonic()
    prompt.type("\n")
    wait_for(lambda: prompt.text().count("Password:") >= 2, what="a password prompt after Enter")
    assert time.monotonic() - start < 3
    prompt.type(PASSWORD + "\n")
    code, out = world.finish(prompt)
    assert code == 0, out


def test_a_held_push_of_a_phone_revoked_meanwhile_is_not_delivered(world):
    world.start_box()
    world.pair_and_store()
    prompt = world.greeter(stdin=None)
    phone = world.phone_background("login", "--no-stay")
    wait_for(lambda: "push held at" in world.box_output(), what="the held push")
    import re
    fingerprint = re.search(r"([0-9A-F]{4}-[0-9A-F]{4}-[0-9A-F]{4}-[0-9A-F]{4})", world.admin("phones", "list").stdout).group(1)
    assert world.admin("phones", "revoke", "--yes", fingerprint).returncode == 0
    prompt.type("\n")
    time.sleep(2)
    prompt.kill()
    phone.wait(30)
    assert "login accepted" not in world.box_output() and "credentials received" not in prompt.text()
    assert "(vm) user alice via" not in world.box_output(), world.box_output()[-1500:]


def test_someone_at_the_keyboard_cannot_spend_alices_rejection_budget(world):
    """The pairing code is on every login screen. Whoever sits there pairs two phones of their own
    (pending: a pending phone may push for any user), pushes wrong passwords for alice and presses
    Enter: ten rejections for alice in 15 min, and alice's own phone is refused."""
    world.start_box()
    world.pair_and_store()
    for who in ("m1", "m2"):
        world.pair_and_store(password="a guess", user="alice", who=who, enrol=False)
        for _ in range(5):
            g = world.greeter()
            world.phone("login", "--no-stay", who=who)
            world.finish(g)
    g = world.greeter()
    r = world.phone("login", "--no-stay")
    world.finish(g)
    assert r.returncode == 0, "alice's own phone is locked out by someone else's pushes: " + r.stderr


# --- 3. hostage prompts (issue 39) -------------------------------------------------------------

def test_a_pending_phone_cannot_hold_alices_prompt_against_her_own_phone(world):
    """A phone that read the pairing code off the screen (pending: paired with a code that
    names no user) pushes a guess for alice; it waits for Enter at her prompt. Before: alice's
    own phone was told "box is not at a login prompt" for the whole enter_wait_s, and the
    pending phone could do it again and again, charged nothing. Now alice's push takes the
    prompt back from it, and the pending phone is refused after 3 pushes left unused."""
    world.start_box()
    world.pair_and_store()                                       # alice's phone, enrolled
    world.pair_and_store(who="mallory", enrol=False, password="a guess")  # pending, pushes for alice
    # Held and left unused three times, the pending phone is refused before its push waits.
    for round in range(3):
        prompt = world.greeter(stdin=None)
        mallory = world.phone_background("login", "--no-stay", who="mallory")
        wait_for(lambda: "Press Enter" in open(mallory.log).read(), timeout=20, what="mallory's push held at alice's prompt")
        alice = world.phone_background("login", "--no-stay")
        wait_for(lambda: "Press Enter" in open(alice.log).read(), timeout=20, what="alice's push held instead")
        assert mallory.wait(10) == 8, open(mallory.log).read()
        if round == 0:
            assert "a phone enrolled for alice came to the same prompt" in world.box_output()
        prompt.type("\n")
        code, out = world.finish(prompt)
        assert code == 0 and alice.wait(20) == 0, out + open(alice.log).read()
    p = world.greeter(stdin=None)
    r = world.phone("login", "--no-stay", who="mallory")
    assert r.returncode == 2 and "waited with nobody pressing Enter" in r.stderr, r.stdout + r.stderr
    p.kill()


def test_alices_phone_hears_that_another_phones_push_waits_at_her_prompt(world):
    """Two phones enrolled for alice (her phone and her tablet): the second push while the
    first waits for Enter is told the truth, not "box is not at a login prompt"."""
    world.start_box()
    world.pair_and_store()
    world.pair_and_store(who="tablet")
    prompt = world.greeter(stdin=None)
    first = world.phone_background("login", "--no-stay")
    wait_for(lambda: "Press Enter" in open(first.log).read(), timeout=20, what="the first push held")
    r = world.phone("login", "--no-stay", who="tablet")
    assert r.returncode == 8 and "another phone's push is waiting for Enter" in r.stderr, r.stdout + r.stderr
    prompt.type("\n")
    code, out = world.finish(prompt)
    assert code == 0 and first.wait(20) == 0
