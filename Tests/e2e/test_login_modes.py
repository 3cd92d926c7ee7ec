"""Login modes (docs/login-modes.md): key mode, where an enrolled phone's intended login is
enough and no password is stored anywhere, and the refusals that keep it to the boxes, users,
services and PAM lines an admin chose. Every refusal leaves the password prompt working."""
import json
import os
import re
import signal
import subprocess
import time

import pytest

from conftest import PASSWORD, wait_for


def key_stack(world, options="timeout=20 key answer_prompt"):
    """The key-mode PAM line (`sufficient`: the module's success ends auth), then the password
    (pam_matrix always asks: answer_prompt hands it what was typed, as try_first_pass would)."""
    return [f"auth sufficient {world.bins['module']} socket={world.socket} {options}", world.matrix_line()]


def enrol_key_only(world, enrol=True):
    """A phone paired under an admin's code for alice, holding her user name and no password."""
    r = world.pair(world.pairing_code("alice" if enrol else None))
    assert r.returncode == 0, r.stdout + r.stderr
    r = world.phone("credentials", "set", "--user", "alice", "--key-only")
    assert r.returncode == 0 and "no password" in r.stdout, r.stdout + r.stderr


def refused_login(world, phone_says, stack=None, typed=PASSWORD):
    """A phone login the box refuses: the phone says `phone_says`, and the prompt (the World's
    stack unless `stack`) still takes the password typed at the keyboard."""
    greeter = world.greeter(auth=stack, stdin=None)
    r = world.phone("login", "--no-stay")
    greeter.type(typed + "\n")
    code, out = world.finish(greeter)
    assert r.returncode != 0 and phone_says in r.stderr, r.stdout + r.stderr
    assert code == 0 and "successfully authenticated" in out, out


@pytest.mark.both_radios
def test_key_mode_logs_in_with_no_password_anywhere(world):
    world.settings["login"] = {"mode": "key", "key_services": ["boxkey-test"]}
    world.start_box()
    enrol_key_only(world)
    greeter = world.greeter("authenticate", "acct_mgmt", "open_session", auth=key_stack(world))
    r = world.phone("login", "--no-stay")
    code, out = world.finish(greeter)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Logged in to box 4821 as alice" in r.stdout
    assert code == 0 and "successfully authenticated" in out, out
    assert out.count("Password:") == 1, out  # the module's own, answered with Enter; pam_matrix never ran
    box = world.box_output()
    assert "key login attempt: phone" in box and "login accepted" in box
    # The session opened is bound to the phone, as after a password push.
    assert "registered by boxkey-test for phone" in box
    # The box stores no password: nothing under its state directory holds alice's.
    for root, _, files in os.walk(world.settings["box"]["state_directory"]):
        for name in files:
            assert PASSWORD.encode() not in open(os.path.join(root, name), "rb").read()
    status = json.loads(world.admin("status", "--json").stdout)
    assert status["login"] == {"mode": "key", "keyUsers": [], "escrowUsers": [], "keyServices": ["boxkey-test"], "sealedPasswords": 0,
                               "proximity": False}
    assert "login mode:  key" in world.admin("status").stdout


def test_key_login_is_refused_in_password_mode_and_the_prompt_still_works(world):
    world.start_box()  # [login] mode defaults to password
    enrol_key_only(world)
    refused_login(world, "does not take key logins for alice")
    assert "refused key login" in world.box_output() and "key login attempt" not in world.box_output()


def test_key_users_put_one_user_in_key_mode(world):
    world.settings["login"] = {"key_users": ["alice"], "key_services": ["boxkey-test"]}
    world.start_box()
    enrol_key_only(world)
    greeter = world.greeter(auth=key_stack(world))
    r = world.phone("login", "--no-stay")
    code, out = world.finish(greeter)
    assert r.returncode == 0 and code == 0, r.stderr + out
    assert "key mode for alice" in world.admin("status").stdout


def test_a_pam_line_without_the_key_option_refuses_a_key_login(world):
    """The box says yes, the stack's line does not: the module never returns success for a key
    login unless its line says `key`, and the person gets the password prompt at once."""
    world.settings["login"] = {"mode": "key", "key_services": ["boxkey-test"]}
    world.start_box()
    enrol_key_only(world)
    greeter = world.greeter(stdin=None, auth=key_stack(world, options="timeout=20 answer_prompt"))
    phone = world.phone_background("login", "--no-stay")
    wait_for(lambda: "push held at" in world.box_output(), what="the key login at the prompt")
    greeter.type_at_prompt(1, "\n")  # Enter takes the key login, which this line refuses
    greeter.type_at_prompt(2, PASSWORD + "\n")
    code, out = world.finish(greeter)
    phone.wait(20)
    r = subprocess.CompletedProcess(phone.args, phone.returncode, "", open(phone.log).read())
    assert r.returncode != 0 and "does not take key logins" in r.stderr, r.stdout + r.stderr
    assert code == 0 and "successfully authenticated" in out, out  # the typed password, after the refusal
    assert "login rejected" in world.box_output()


def refused_key_login(world, phone_says):
    refused_login(world, phone_says, stack=key_stack(world, options="timeout=5 key answer_prompt"))


def test_a_service_outside_key_services_refuses_a_key_login(world):
    world.settings["login"] = {"mode": "key", "key_services": ["login"]}
    world.start_box()
    enrol_key_only(world)
    refused_key_login(world, "prompt does not take key logins")
    assert "does not take key logins ([login] key_services)" in world.box_output()


def test_a_phone_not_yet_enrolled_cannot_key_login(world):
    """A pending phone (paired under a code that names no user) is enrolled by its first accepted
    password; with no password it has nothing to prove, so key mode refuses it."""
    world.settings["login"] = {"mode": "key", "key_services": ["boxkey-test"]}
    world.start_box()
    enrol_key_only(world, enrol=False)
    refused_key_login(world, "not enrolled for alice")
    assert "a key login needs a phone enrolled for that user" in world.box_output()


def test_a_revoked_phone_cannot_key_login(world):
    world.settings["login"] = {"mode": "key", "key_services": ["boxkey-test"]}
    world.start_box()
    enrol_key_only(world)
    fingerprint = json.loads(world.admin("phones", "--json").stdout)[0]["fingerprint"]
    assert world.admin("phones", "revoke", "--yes", fingerprint).returncode == 0
    refused_key_login(world, "revoked this phone")
    assert "key login attempt" not in world.box_output()


# --- escrow mode --------------------------------------------------------------------------

def enrol_escrow(world):
    r = world.pair(world.pairing_code("alice"))
    assert r.returncode == 0, r.stdout + r.stderr
    r = world.phone("credentials", "set", "--user", "alice", "--escrow")
    assert r.returncode == 0 and "escrow secret" in r.stdout, r.stdout + r.stderr


def escrow_file(world):
    return os.path.join(world.settings["box"]["state_directory"], "escrow.json")


def sealed_records(world):
    path = escrow_file(world)
    return json.load(open(path)) if os.path.exists(path) else []


def capture(world, password=PASSWORD):
    """The first escrow login: the phone pushes, the person presses Enter at the box and types
    the password there."""
    greeter = world.greeter("authenticate", "acct_mgmt", "open_session", stdin=None)
    held = f"(pid {greeter.pid}): waiting"
    phone = world.phone_background("login", "--no-stay")
    wait_for(lambda: held in world.box_output(), what="the push at the prompt")
    greeter.type("\n")
    greeter.type_at_prompt(2, password + "\n")
    code, out = world.finish(greeter)
    phone.wait(30)
    said = open(phone.log).read()
    return subprocess.CompletedProcess(phone.args, phone.returncode, said, said), code, out


def set_password(world, user, password):
    """The user's password changes (passwd): both the site's stack and the box's own service."""
    for name, service in (("passdb", "boxkey-test"), ("verify.passdb", "boxkey-verify")):
        path = os.path.join(world.work, name)
        lines = [line for line in open(path) if not line.startswith(user + ":")]
        open(path, "w").writelines(lines + [f"{user}:{password}:{service}\n"])


def slow_verify(world, seconds):
    """The box's own password service (boxkey-verify) takes `seconds` before it answers."""
    path = os.path.join(world.box_pam, "boxkey-verify")
    with open(path) as f:
        verify = f.read()
    with open(path, "w") as f:
        f.write(f"auth required pam_exec.so quiet /bin/sleep {seconds}\n" + verify)


def sealed_then_changed(world):
    """An escrow box where alice's phone holds a sealed copy of a password changed since."""
    world.settings["login"] = {"mode": "escrow"}
    world.start_box()
    enrol_escrow(world)
    r, code, _ = capture(world)
    assert r.returncode == 0 and code == 0, r.stderr
    set_password(world, "alice", "a new horse")


@pytest.mark.both_radios
def test_escrow_mode_seals_the_typed_password_then_logs_in_with_the_phone(world):
    world.settings["login"] = {"mode": "escrow"}
    world.start_box()
    enrol_escrow(world)
    assert sealed_records(world) == []
    # First: the phone is near, the person types the password at the box once.
    r, code, out = capture(world)
    assert r.returncode == 0 and "password sealed for this phone" in r.stdout, r.stdout + r.stderr
    assert code == 0 and "successfully authenticated" in out, out
    assert "phone is here: type the password once" in out
    records = sealed_records(world)
    assert [(x["user"], len(x["sealed"]["nonce"])) for x in records] == [("alice", 24)]
    assert os.stat(escrow_file(world)).st_mode & 0o777 == 0o600
    assert PASSWORD.encode() not in open(escrow_file(world), "rb").read()
    # Then: the phone alone logs in; nobody types anything.
    greeter = world.greeter("authenticate", "acct_mgmt", "open_session")
    r = world.phone("login", "--no-stay")
    code, out = world.finish(greeter)
    assert r.returncode == 0 and "Logged in to box 4821 as alice" in r.stdout, r.stdout + r.stderr
    assert code == 0 and "successfully authenticated" in out, out
    box = world.box_output()
    assert "escrow capture attempt" in box and "escrow login attempt" in box and "login accepted" in box
    assert PASSWORD not in box and PASSWORD not in r.stdout + r.stderr
    status = json.loads(world.admin("status", "--json").stdout)["login"]
    assert status["mode"] == "escrow" and status["sealedPasswords"] == 1


def test_a_changed_password_destroys_the_sealed_copy_and_is_picked_up_at_the_next_typed_login(world):
    sealed_then_changed(world)
    greeter = world.greeter()
    r = world.phone("login", "--no-stay")
    code, out = world.finish(greeter)
    assert r.returncode != 0 and "sealed password was not accepted" in r.stderr, r.stdout + r.stderr
    assert sealed_records(world) == []
    assert "refuses the sealed password too" in world.box_output()
    # The next login with the phone near asks for the new password and seals it.
    r, code, out = capture(world, "a new horse")
    assert r.returncode == 0 and code == 0, r.stdout + r.stderr + out
    assert len(sealed_records(world)) == 1


def test_the_verdict_is_acknowledged_at_once_while_the_box_checks_the_sealed_password(world):
    """The stack refuses a sealed password (changed since); the box then checks it with its own
    service (pam_unix delays a failure ~2 s) before destroying it. The daemon answered the
    module's report only after that check, and the module waits 1 s for the answer: the login
    stalled 1 s and logged a false "could not report the outcome"."""
    sealed_then_changed(world)
    slow_verify(world, 2)
    greeter = world.greeter()
    r = world.phone("login", "--no-stay")
    code, out = world.finish(greeter)
    assert r.returncode != 0 and "sealed password was not accepted" in r.stderr, r.stdout + r.stderr
    assert code != 0
    assert "could not report the outcome" not in out, out


def test_revoking_the_phone_destroys_its_sealed_password(world):
    world.settings["login"] = {"mode": "escrow"}
    world.start_box()
    enrol_escrow(world)
    r, code, _ = capture(world)
    assert r.returncode == 0 and code == 0, r.stderr
    fingerprint = json.loads(world.admin("phones", "--json").stdout)[0]["fingerprint"]
    r = world.admin("phones", "revoke", "--yes", fingerprint)
    assert r.returncode == 0 and "destroyed 1 sealed password" in r.stdout, r.stdout + r.stderr
    assert sealed_records(world) == []


def test_a_new_escrow_secret_cannot_open_the_old_copy(world):
    """The phone's secret alone opens its copy: a new one (or another phone's) fails, and the
    useless copy is destroyed."""
    world.settings["login"] = {"mode": "escrow"}
    world.start_box()
    enrol_escrow(world)
    r, code, _ = capture(world)
    assert r.returncode == 0 and code == 0, r.stderr
    assert world.phone("credentials", "set", "--user", "alice", "--escrow").returncode == 0
    refused_login(world, "does not open with this phone's secret")
    assert sealed_records(world) == []


def test_a_wrong_typed_password_seals_nothing(world):
    world.settings["login"] = {"mode": "escrow"}
    world.start_box()
    enrol_escrow(world)
    r, code, out = capture(world, "not her password")
    assert code != 0 and r.returncode != 0, r.stdout + r.stderr + out
    assert sealed_records(world) == []
    assert "not sealing" in world.box_output()


def test_an_escrow_login_is_refused_in_password_mode(world):
    world.start_box()
    enrol_escrow(world)
    refused_login(world, "does not take escrow logins")
    assert sealed_records(world) == []


# --- proximity login with intent --------------------------------------------------------------

@pytest.fixture
def proximity_agent(world):
    """Starts alice's agent with proximity on, 5 m from the box (too far to offer), and stops it."""
    started = []

    def start(*args):
        r = world.phone("agent", "start", "--proximity", *args)
        assert r.returncode == 0 and "proximity login on" in r.stdout, r.stdout + r.stderr
        started.append(r)
        return r
    yield start
    if started:
        world.phone("agent", "stop", timeout=20)


def offer_shown(world):
    """A prompt with its input open, once the near phone's offer waits there for Enter."""
    greeter = world.greeter(stdin=None)
    wait_for(lambda: f"(pid {greeter.pid}); waiting for Enter there" in world.box_output(), timeout=20, what="the offer at the prompt")
    return greeter


def offer_on_screen(world, proximity_agent):
    """A box with proximity on, alice's phone paired and its agent 1 m away: a prompt showing
    the phone's offer."""
    world.settings["login"] = {"proximity": True}
    world.start_box()
    world.pair_and_store()
    proximity_agent("--sim-position", "1")
    return offer_shown(world)


def agent_log(world):
    path = os.path.join(world.env["XDG_STATE_HOME"], "boxkey", "agent.log")
    return open(path).read() if os.path.exists(path) else ""


def test_proximity_login_waits_for_enter_at_the_box(world, proximity_agent):
    """Near is not enough: the phone offers, the prompt asks the person, and only Enter there
    logs in. Far away, nothing is offered at all."""
    world.settings["login"] = {"proximity": True}
    world.start_box()
    world.pair_and_store()
    proximity_agent("--sim-position", "5")
    assert "proximity login on" in world.phone("status").stdout
    greeter = world.greeter("authenticate", "acct_mgmt", "open_session", stdin=None)
    time.sleep(4)
    assert "proximity offer" not in world.box_output(), "offered from 5 m"
    world.phone("sim", "move", "1")
    moved = time.monotonic()
    wait_for(lambda: "proximity offer: phone" in world.box_output(), timeout=20, what="the offer at the prompt", interval=0.05)
    offered = time.monotonic() - moved
    assert "proximity offer: phone" in world.box_output()
    # Near and offered, but nobody pressed Enter: no login, however long the phone waits.
    time.sleep(3)
    assert greeter.poll() is None and "login accepted" not in world.box_output()
    near = time.monotonic()
    greeter.type("\n")
    code, out = world.finish(greeter)
    elapsed = time.monotonic() - near
    assert code == 0 and "successfully authenticated" in out, out
    box = world.box_output()
    assert "proximity intent: Enter pressed" in box and "login accepted" in box
    wait_for(lambda: "(proximity, Enter at the box)" in agent_log(world), timeout=10, what="the agent's report")
    assert "proximity:   on" in world.admin("status").stdout
    assert "holding credentials for alice (a password)" in world.phone("status").stdout
    print(f"PROXIMITY-FIGURES {{\"near_to_offer_shown_s\": {offered:.2f}, \"enter_to_accepted_s\": {elapsed:.2f}}}")


def test_a_phone_walking_away_is_not_offered_on_the_readings_it_took_while_near(world, proximity_agent):
    """An attack on the mean: alice's phone lay beside the box (near readings), she walks away,
    and someone at the box opens a prompt. One far reading with the prompt waiting must not be
    carried over the threshold by the near ones before it: nothing is offered until the phone
    is near again."""
    world.settings["login"] = {"proximity": True}
    world.start_box()
    world.pair_and_store()
    proximity_agent("--sim-position", "0.3")
    time.sleep(2)  # near readings (−46 dBm), no prompt yet; 10 m is −84: (−46 −46 −84) / 3 > −65
    world.phone("sim", "move", "10")
    time.sleep(0.6)
    greeter = world.greeter("authenticate", stdin=None)
    time.sleep(4)
    assert "proximity offer" not in world.box_output(), "offered to a phone 10 m away"
    world.phone("sim", "move", "1")
    wait_for(lambda: "proximity offer: phone" in world.box_output(), timeout=20, what="the offer once near again")
    greeter.type(PASSWORD + "\n")
    code, out = world.finish(greeter)
    assert code == 0, out


def test_proximity_is_off_unless_the_box_allows_it(world, proximity_agent):
    world.start_box()  # [login] proximity defaults to false
    world.pair_and_store()
    proximity_agent("--sim-position", "1")
    greeter = world.greeter(stdin=None)
    wait_for(lambda: "refused proximity offer" in world.box_output(), timeout=20, what="the refused offer")
    greeter.type(PASSWORD + "\n")
    code, out = world.finish(greeter)
    assert code == 0 and "phone is near" not in out, out  # the typed password, never the offer
    assert "proximity login is off" in world.box_output()


def test_a_password_typed_at_an_offer_is_the_persons(world, proximity_agent):
    """The offer's prompt is also a password prompt: what the person types goes to the stack as
    typed, and the phone pushes nothing."""
    world.settings["login"] = {"proximity": True}
    world.start_box()
    world.pair_and_store(password="the phone's stale password")
    proximity_agent("--sim-position", "1")
    # The verifier takes PAM_AUTHTOK as pam_unix with try_first_pass (or pam_sss) does.
    verifier = os.path.join(world.work, "pam_first_pass_only.so")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", verifier, os.path.join(os.path.dirname(__file__), "pam_first_pass_only.c"), "-lpam"], check=True)
    greeter = world.greeter(stdin=None, auth=[world.module_line(), f"auth required {verifier} [password={PASSWORD}]"])
    wait_for(lambda: "proximity offer: phone" in world.box_output(), timeout=20, what="the offer at the prompt")
    greeter.type(PASSWORD + "\n")
    code, out = world.finish(greeter)
    assert code == 0, out
    assert "proximity intent" not in world.box_output()


def test_another_phone_cannot_take_a_prompt_showing_an_offer(world, proximity_agent):
    """While the offer of alice's phone is on the screen, her second phone cannot push into
    that prompt: Enter there is for the phone the prompt named."""
    world.settings["login"] = {"proximity": True}
    world.start_box()
    world.pair_and_store()
    r = world.pair(world.pairing_code("alice"), who="spare")
    assert r.returncode == 0, r.stdout + r.stderr
    assert world.phone("credentials", "set", "--user", "alice", stdin=PASSWORD + "\n", who="spare").returncode == 0
    proximity_agent("--sim-position", "1")
    greeter = offer_shown(world)
    r = world.phone("login", "--no-stay", who="spare")
    assert r.returncode != 0 and "showing another phone's offer" in r.stderr, r.stdout + r.stderr
    greeter.type("\n")
    code, out = world.finish(greeter)
    assert code == 0 and "successfully authenticated" in out, out
    spare = json.loads(world.admin("phones", "--json").stdout)
    assert len(spare) == 2
    accepted = re.findall(r"login accepted: phone (\S+)", world.box_output())
    assert len(accepted) == 1


def test_enter_after_the_offering_phone_left_brings_the_password_prompt_at_once(world, proximity_agent):
    greeter = offer_on_screen(world, proximity_agent)
    assert world.phone("agent", "stop", timeout=20).returncode == 0
    wait_for(lambda: "left while its proximity offer was on the screen" in world.box_output(), timeout=10, what="the box to see the phone go")
    start = time.monotonic()
    greeter.type("\n")  # Enter at the offer: no phone now, and the prompt asks again at once
    greeter.type_at_prompt(2, PASSWORD + "\n")
    code, out = world.finish(greeter)
    assert code == 0 and "successfully authenticated" in out, out
    assert time.monotonic() - start < 5, "waited for a push that could not come"
    assert "login accepted" not in world.box_output()


def test_a_refused_login_keeps_a_copy_the_box_can_still_confirm(world):
    """The stack's "no" is not proof the password changed (a locked account, a directory outage,
    a cancelled prompt): someone without the phone must not be able to destroy the copy. It
    goes only when the box's own password-only service refuses the sealed password too."""
    world.settings["login"] = {"mode": "escrow"}
    world.start_box()
    enrol_escrow(world)
    r, code, _ = capture(world)
    assert r.returncode == 0 and code == 0, r.stderr
    # A stack that refuses whatever the password (as pam_faillock does for a locked account).
    greeter = world.greeter(auth=[world.module_line(), world.matrix_line(), "auth required pam_deny.so"])
    r = world.phone("login", "--no-stay")
    code, out = world.finish(greeter)
    assert r.returncode != 0 and code != 0, r.stdout + r.stderr + out
    assert len(sealed_records(world)) == 1
    assert "the sealed password still checks out, kept" in world.box_output()


def test_a_password_push_is_refused_for_a_user_in_escrow_mode(world):
    """Escrow and key mode exist so that the phone holds no password: a phone that pushes one
    anyway is refused, and the password is not used."""
    world.settings["login"] = {"mode": "escrow"}
    world.start_box()
    world.pair_and_store()  # a phone holding alice's password
    refused_login(world, "is in escrow mode for alice")
    assert "login attempt" not in world.box_output()


def test_revoking_while_the_typed_password_is_checked_seals_nothing(world):
    """Revocation answers a stolen phone: a capture whose check is still running when the phone
    is revoked must not leave a sealed copy behind (the stolen phone's secret would open it)."""
    world.settings["login"] = {"mode": "escrow"}
    slow_verify(world, 3)
    world.start_box()
    enrol_escrow(world)
    greeter = world.greeter("authenticate", stdin=None)
    phone = world.phone_background("login", "--no-stay")
    wait_for(lambda: "escrow capture attempt" in world.box_output(), timeout=20, what="the capture")
    greeter.type_at_prompt(1, "\n")
    greeter.type_at_prompt(2, PASSWORD + "\n")
    time.sleep(1.5)  # the stack has accepted; the box's own check sleeps
    fingerprint = json.loads(world.admin("phones", "--json").stdout)[0]["fingerprint"]
    assert world.admin("phones", "revoke", "--yes", fingerprint).returncode == 0
    phone.wait(30)
    world.finish(greeter)
    wait_for(lambda: "not sealing" in world.box_output() or "sealed for this phone" in world.box_output(), timeout=15, what="the check to end")
    box = world.box_output()
    assert sealed_records(world) == [], box[-2000:]
    assert "was revoked while the password was checked" in box, "\n".join(l for l in box.splitlines() if " debug " not in l)[-3000:]


def test_turning_proximity_off_withdraws_an_offer_on_the_screen(world, proximity_agent):
    """An admin turns proximity off (SIGHUP) while an offer is up: Enter there no longer logs the
    phone in; it brings the password prompt."""
    greeter = offer_on_screen(world, proximity_agent)
    world.settings["login"] = {"proximity": False}
    world.config()
    os.kill(world.box_process.pid, signal.SIGHUP)
    wait_for(lambda: re.search(r"reloaded the configuration: changed .*proximity", world.box_output()), what="the reload")
    greeter.type("\n")
    greeter.type_at_prompt(2, PASSWORD + "\n")
    code, out = world.finish(greeter)
    assert code == 0 and "successfully authenticated" in out, out
    assert "proximity intent" not in world.box_output() and "login accepted" not in world.box_output()
