"""Trust at the box: which prompt a push may reach, which phone may push, which session a login
may claim, and what the phone gets credit for. Each test is an attack that Boxkey let through
before the trust model."""
import re
import time

import pytest

from conftest import FINGERPRINT, PASSWORD, PASSWORDS, USERS, wait_for


# --- which prompt receives a push ------------------------------------------------------------

def test_sudo_prompt_does_not_take_the_lockers_push(world):
    world.start_box()
    world.pair_and_store()
    locker = world.greeter()  # alice's login prompt on tty1 waits for her phone
    # Later, something runs sudo: its stack has the module too, but sudo is not a phone-login service.
    sudo = world.greeter(service="sudo", tty="/dev/pts/3", stdin=None, wait=False)
    wait_for(lambda: "Password:" in sudo.text(), what="sudo's own password prompt")
    r = world.phone("login", "--no-stay")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Logged in to box 4821 as alice: boxkey-test on tty1" in r.stdout
    assert world.finish(locker)[0] == 0
    code, out = world.finish(sudo)  # nothing typed: sudo fails, and it never saw the push
    assert code != 0
    assert "Box 4821" not in out and "Pairing code" not in out


def test_two_waiting_prompts_refuse_the_push(world):
    world.module_options = "timeout=15 answer_prompt"
    world.start_box()
    world.pair_and_store()
    first, second = world.greeter(tty="tty1"), world.greeter(tty="tty2")
    r = world.phone("login", "--no-stay")
    assert r.returncode == 8 and "more than one" in r.stderr, r.stdout + r.stderr
    assert world.finish(first)[0] != 0 and world.finish(second)[0] != 0


def test_localhost_prompt_needs_a_local_logind_session(world):
    world.start_box()
    world.pair_and_store()
    # PAM_RHOST=localhost and no logind session for the prompt's process: remote, not offered.
    prompt = world.greeter(rhost="localhost", stdin=None, wait=False)
    wait_for(lambda: "Password:" in prompt.text(), what="the password prompt")
    r = world.phone("login", "--no-stay")
    assert r.returncode == 8 and "not at a login prompt" in r.stderr, r.stdout + r.stderr
    prompt.type(PASSWORD + "\n")
    code, out = world.finish(prompt)
    assert code == 0 and "Box 4821" not in out
    # The same prompt inside alice's local session (Remote=false, seat0) is offered.
    prompt = world.greeter(rhost="localhost", logind_session="42")
    assert world.phone("login", "--no-stay").returncode == 0
    assert world.finish(prompt)[0] == 0


# --- which phone may push --------------------------------------------------------------------

def test_unenrolled_phones_are_refused_and_do_not_lock_out_alice(world):
    world.module_options = "timeout=120 answer_prompt"
    world.start_box()
    world.pair_and_store()
    strangers = [f"stranger{i}" for i in range(20)]
    for who in strangers:
        world.pair_by_key(who)
    prompt = world.greeter()
    r = world.phone("login", "--no-stay", who=strangers[0])
    assert r.returncode == 9 and "not enrolled" in r.stderr, r.stdout + r.stderr
    # All of them at once, ten at a time (some may find the box busy): none gets through.
    for wave in (strangers[:10], strangers[10:]):
        phones = [world.phone_background("login", "--no-stay", who=who) for who in wave]
        for p in phones:
            assert p.wait(60) not in (0, 2), open(p.log).read()
    assert "not enrolled" in "".join(open(p.log).read() for p in world.processes if hasattr(p, "log"))
    assert prompt.poll() is None, prompt.text()  # nothing reached the prompt
    r = world.phone("login", "--no-stay")
    assert r.returncode == 0, r.stdout + r.stderr
    assert world.finish(prompt)[0] == 0


def test_wrong_pairing_code_fails_and_uses_one_of_three_tries_the_last_one_still_pairs(world):
    world.start_box()
    code = world.pairing_code()
    wrong = f"{(int(code) + 1) % 1_000_000:06d}"
    r = world.pair(wrong)
    assert r.returncode == 10 and "pairing failed" in r.stderr, r.stdout + r.stderr
    assert world.pair(code).returncode == 0  # two tries were left
    r = world.pair(code, who="mallory")  # single use
    assert r.returncode == 9 and "no pairing code" in r.stderr, r.stdout + r.stderr
    code = world.pairing_code()
    wrong = f"{(int(code) + 1) % 1_000_000:06d}"
    for _ in range(2):
        r = world.pair(wrong, who="bob")
        assert r.returncode == 10 and "3 tries" in r.stderr, r.stdout + r.stderr
    r = world.pair(code, who="bob")  # the right code on the last try pairs
    assert r.returncode == 0, r.stdout + r.stderr
    code = world.pairing_code()
    wrong = f"{(int(code) + 1) % 1_000_000:06d}"
    for _ in range(3):
        assert world.pair(wrong, who="carol").returncode == 10
    r = world.pair(code, who="carol")  # the three tries are spent: the code is gone
    assert r.returncode == 9 and "no pairing code" in r.stderr, r.stdout + r.stderr


def test_enter_at_a_prompt_whose_code_is_used_up_shows_a_new_one(world):
    """Before: a code that had used its three tries stayed on the prompt as "valid 2 min",
    Enter did not renew it, and the phone's error promised a new one that came only at the next
    prompt. Now Enter there answers with a new code, which pairs."""
    world.start_box()
    prompt = world.greeter(stdin=None)
    shown = world.prompt_pairing_code(prompt)
    wrong = f"{(int(shown) + 1) % 1_000_000:06d}"
    for _ in range(3):
        assert world.pair(wrong).returncode == 10
    assert world.pair(shown).returncode == 9  # used up
    prompt.type("\n")
    wait_for(lambda: "New pairing code" in prompt.text(), what="a new code after Enter")
    new = re.search(r"New pairing code (\d{6})", prompt.text()).group(1)
    assert new != shown and "the one above is used up" in prompt.text()
    r = world.pair(new)
    assert r.returncode == 0 and "Paired with box 4821" in r.stdout, r.stdout + r.stderr
    prompt.kill()


def test_phone_enrolled_for_alice_cannot_push_for_bob(world):
    world.module_options = "timeout=5 answer_prompt"
    world.start_box()
    world.pair_and_store()
    # The phone even holds bob's right password; the prompt is bob's.
    assert world.phone("credentials", "set", "--user", "bob", stdin=PASSWORDS["bob"] + "\n").returncode == 0
    prompt = world.greeter(user="bob")
    r = world.phone("login", "--no-stay")
    code, out = world.finish(prompt)
    assert r.returncode in (8, 9), r.stdout + r.stderr
    assert code != 0 and "successfully authenticated" not in out
    assert "refused" in world.box_output()


def test_pairing_code_at_the_prompt_enrols_on_first_login(world):
    world.module_options = "timeout=60 answer_prompt"
    world.start_box()
    prompt = world.greeter()
    r = world.pair(world.prompt_pairing_code(prompt))
    assert r.returncode == 0 and "Paired with box 4821" in r.stdout, r.stdout + r.stderr
    assert world.phone("credentials", "set", "--user", "alice", stdin=PASSWORD + "\n").returncode == 0
    r = world.phone("login", "--no-stay")
    assert r.returncode == 0, r.stdout + r.stderr
    code, out = world.finish(prompt)
    assert code == 0 and "New phone? Pairing code" in out
    assert re.search(FINGERPRINT + "  alice", world.admin("phones", "list").stdout)


# --- which session a login may claim ---------------------------------------------------------

def test_foreign_session_id_is_not_taken(world):
    world.start_box()
    world.pair_and_store(user="mallory", who="mallory")
    # Mallory logs in on tty2 with alice's session ID: first in her process environment (what
    # pam_boxkey used to read), then in the PAM environment (logind says session 42 is alice's).
    for pam_session, env in ((None, {"XDG_SESSION_ID": "42"}), ("42", {})):
        prompt = world.greeter("authenticate", "open_session", user="mallory", tty="tty2", session=pam_session, env=env)
        r = world.phone("login", "--no-stay", who="mallory")
        assert r.returncode == 0, r.stdout + r.stderr
        assert world.finish(prompt)[0] == 0
        world.phone("logout", "--yes", who="mallory")
        world.phone("lock", who="mallory")
        time.sleep(1)
        calls = world.logind.calls()
        assert 'TerminateSession "42"' not in calls and 'LockSession "42"' not in calls
    assert "refused" in world.box_output()


def test_ssh_session_does_not_replace_the_console_session(world):
    world.logind.add_session("s1", USERS["alice"], "alice", remote=True, service="sshd")
    world.start_box()
    world.pair_and_store()
    prompt = world.greeter("authenticate", "open_session")  # console session 42
    phone = world.staying_login()
    assert world.finish(prompt)[0] == 0
    # alice also logs in over ssh with her password, and logs out again.
    ssh = world.greeter("authenticate", "open_session", "close_session", service="sshd", tty="ssh",
                        rhost="203.0.113.9", session="s1", stdin=PASSWORD + "\n", wait=False)
    code, out = world.finish(ssh)
    assert code == 0 and "Box 4821" not in out, out
    world.phone("sim", "move", "45", "--over", "1")
    wait_for(lambda: 'LockSession "42"' in world.logind.calls(), timeout=15, what="LockSession of the console session")
    assert 'LockSession "s1"' not in world.logind.calls()
    phone.terminate()
    phone.wait(10)


def test_walk_away_without_a_session_locks_all_local_sessions(world):
    world.logind.add_session("43", USERS["alice"], "alice", tty="tty2")
    world.logind.add_session("s1", USERS["alice"], "alice", remote=True)
    world.logind.add_session("m1", USERS["mallory"], "mallory", tty="tty3")
    world.start_box()
    world.pair_and_store()
    prompt = world.greeter()  # authenticate only: no session on record
    phone = world.staying_login()
    assert world.finish(prompt)[0] == 0
    world.phone("sim", "move", "45", "--over", "1")
    wait_for(lambda: all(f'LockSession "{s}"' in world.logind.calls() for s in ("42", "43")), timeout=15,
             what="alice's local sessions locked")
    calls = world.logind.calls()
    assert 'LockSession "s1"' not in calls and 'LockSession "m1"' not in calls
    wait_for(lambda: "walk-away lock" in world.box_output(), what="the box logging its walk-away lock")
    phone.terminate()
    phone.wait(10)


# --- credit only for what the phone did ------------------------------------------------------

def test_keyboard_password_gives_the_phone_no_credit(world):
    world.start_box()
    world.pair_and_store(password="wrong horse", enrol=False)
    # The pushed (wrong) password goes to the first pam_matrix; the second asks the keyboard.
    prompt = world.greeter(stdin=None, auth=[world.module_line(), world.matrix_line("sufficient"), world.matrix_line()])
    phone = world.phone_background("login")  # staying: a credited phone would keep a presence link
    wait_for(lambda: "push held at" in world.box_output(), what="the push at the prompt")
    prompt.type("\n")
    wait_for(lambda: prompt.text().count("Password:") == 2, what="the second verifier's prompt")
    prompt.type(PASSWORD + "\n")
    code, out = world.finish(prompt)
    phone.wait(40)
    said = open(phone.log).read()
    assert code == 0, out  # the human at the keyboard logged in
    assert phone.returncode == 2 and "not the one this phone pushed" in said, said
    assert "login completed without the phone's password" in world.box_output()
    assert not re.search(FINGERPRINT + "  alice", world.admin("phones", "list").stdout)


# --- presence --------------------------------------------------------------------------------

def test_missed_keepalives_walk_away(world):
    world.settings["presence"]["keepalive_timeout_s"] = 3
    world.start_box()
    world.pair_and_store()
    prompt = world.greeter("authenticate", "open_session")
    phone = world.staying_login("--keepalive", "100")  # in range, but silent
    assert world.finish(prompt)[0] == 0
    wait_for(lambda: 'LockSession "42"' in world.logind.calls(), timeout=15, what="walk-away lock")
    wait_for(lambda: "walk-away lock" in world.box_output(), what="the box logging its walk-away lock")
    phone.terminate()
    phone.wait(10)


# --- smaller ---------------------------------------------------------------------------------

def test_huge_module_timeout_is_clamped(world):
    world.module_options = "timeout=999999999 answer_prompt"
    world.start_box()
    world.pair_and_store()
    prompt = world.greeter()
    assert world.phone("login", "--no-stay").returncode == 0
    code, out = world.finish(prompt)
    assert code == 0, out


def test_phone_text_is_escaped_in_the_box_log(world):
    world.module_options = "timeout=5 answer_prompt"
    world.start_box()
    world.pair_and_store()
    assert world.phone("credentials", "set", "--user", "ali\u2028ce\u202egpj.exe", stdin=PASSWORD + "\n").returncode == 0
    prompt = world.greeter()
    world.phone("login", "--no-stay")
    world.finish(prompt)
    log = world.box_output()
    assert "\u2028" not in log and "\u202e" not in log
    assert "\\u{2028}" in log and re.search(r"\\u\{202e\}", log, re.I)


def random_password():
    """A password no program text contains, so any 8-byte piece of it found is a copy of it."""
    import secrets
    return "pw-" + secrets.token_urlsafe(18)


def test_box_memory_holds_no_password_after_login(world):
    password = random_password()
    world.add_user("carol", 1003, password)
    world.start_box()
    world.pair_and_store(password=password, user="carol")
    prompt = world.greeter(user="carol")
    assert world.phone("login", "--no-stay").returncode == 0
    assert world.finish(prompt)[0] == 0
    time.sleep(2)
    assert world.box_memory_count(password.encode(), run=8) == 0


def test_box_memory_holds_no_piece_of_any_password_after_concurrent_logins(world):
    """Three phones log in at once, four times over (the push frames leave while other links'
    traffic runs: NIO may still hold a write's buffer when it completes); then no 8-byte piece
    of any of their passwords is left in the daemon's memory."""
    users = {f"user{k}": (2000 + k, random_password()) for k in range(3)}
    for user, (uid, password) in users.items():
        world.add_user(user, uid, password)
    world.start_box()
    for user, (_, password) in users.items():
        world.pair_and_store(password=password, user=user, who=user)
    for _ in range(4):
        prompts = [world.greeter(user=user, tty=f"tty{k + 1}") for k, user in enumerate(users)]
        phones = [world.phone_background("login", "--no-stay", who=user) for user in users]
        for p in phones:
            assert p.wait(60) == 0, open(p.log).read()
        for prompt in prompts:
            assert world.finish(prompt)[0] == 0
    time.sleep(2)
    for user, (_, password) in users.items():
        assert world.box_memory_count(password.encode(), run=8) == 0, user


@pytest.mark.parametrize("how", ["typed", "timeout", "phone gone"])
def test_a_held_push_that_is_let_go_leaves_no_password_in_the_box(world, how):
    """A push waits at the prompt in secure memory; whichever way it is let go (the person types
    a password instead, nobody presses Enter, the phone leaves), the box holds no copy after."""
    world.settings["pam"]["enter_wait_s"] = 5
    password = random_password()
    world.add_user("carol", 1003, password)
    world.start_box()
    world.pair_and_store(password=password, user="carol")
    prompt = world.greeter(user="carol", stdin=None)
    phone = world.phone_background("login", "--no-stay")
    wait_for(lambda: f"(pid {prompt.pid}): waiting" in world.box_output(), what="the push held at the prompt")
    assert world.box_memory_count(password.encode()) >= 1  # held (in libsodium's guarded pages)
    if how == "typed":
        prompt.type("what the person typed\n")
    elif how == "phone gone":
        phone.kill()
    phone.wait(30)
    wait_for(lambda: "push not used" in world.box_output(), timeout=15, what="the push to be let go")
    world.finish(prompt)
    time.sleep(1)
    assert world.box_memory_count(password.encode(), run=8) == 0


# --- screen lockers that run as the user -------------------------------------------------------

def test_user_run_locker_unlocks_through_logind(world):
    """swaylock, i3lock, xscreensaver run as the user and cannot reach the root-only socket: with
    [unlock] logind_unlock, the box verifies the push through its own PAM service (boxkey-verify:
    pam_matrix through pam_wrapper) and unlocks the one locked local session through logind."""
    world.logind.add_session("43", USERS["alice"], "alice", tty="tty2", locked=True)
    world.settings["unlock"] = {"logind_unlock": True}
    world.start_box()
    world.pair_and_store()
    r = world.phone("login", "--no-stay")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "session 43 (seat0 tty2) unlocked through logind" in r.stdout
    assert 'UnlockSession "43"' in world.logind.calls()
    # A wrong password unlocks nothing, and the phone is told.
    assert world.phone("credentials", "set", "--user", "alice", stdin="wrong horse\n").returncode == 0
    r = world.phone("login", "--no-stay")
    assert r.returncode == 2, r.stdout + r.stderr
    assert world.logind.calls().count("UnlockSession") == 1


def test_pending_phone_is_not_enrolled_by_a_factor_that_ignores_its_password(world):
    """A pending phone pushes alice's name with a wrong password; a later module that needs no
    password (pam_fprintd, U2F; here pam_permit) completes the stack. The box confirms the pushed
    password through its own service before enrolling: the phone gets nothing."""
    world.start_box()
    world.pair_and_store(password="wrong horse", enrol=False)
    prompt = world.greeter("authenticate", "open_session", auth=[world.module_line(), "auth sufficient pam_permit.so"])
    r = world.phone("login", timeout=40)
    assert world.finish(prompt)[0] == 0  # the stack succeeded (the fingerprint, say)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "did not confirm the pushed password" in world.box_output()
    assert not re.search(FINGERPRINT + "  alice", world.admin("phones", "list").stdout)


def test_a_push_never_counts_as_success_even_where_the_verifiers_failure_is_ignored(world):
    """The module's result is PAM_IGNORE after a push: in a stack whose verifier can fail
    without failing the stack (sufficient as the last line, or a jump with no pam_deny after
    it), a wrong pushed password must still not log in."""
    world.start_box()
    world.pair_and_store(password="a wrong guess")
    prompt = world.greeter(auth=[world.module_line(), world.matrix_line("sufficient")])
    r = world.phone("login", "--no-stay")
    code, out = world.finish(prompt)
    assert code != 0 and "successfully authenticated" not in out, out
    assert r.returncode == 2, r.stdout + r.stderr
