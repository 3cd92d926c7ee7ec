"""greetd 0.9 with a scripted greeter on its IPC (greetd-ipc(7)). greetd authenticates in a
worker process with no terminal and no logind session; the box takes it as local because its
parent, greetd, runs the greeter in a local greeter session."""
import json
import time

import pytest

from conftest import PASSWORDS, figure, inside, journal, read, session, sessions_of, wait_for

RUN = "/run/boxkey-test"


class Greetd:
    def __init__(self):
        self.seen = 0

    def events(self):
        return [json.loads(line) for line in read(f"{RUN}/greetd.events").splitlines() if line.strip()]

    def do(self, what, **fields):
        inside("sh", "-c", f"cat >>{RUN}/greetd.commands", input=json.dumps({"do": what, **fields}) + "\n")
        return time.monotonic()

    def next(self, kind, timeout=10.0, **match):
        def find():
            for i, e in enumerate(self.events()[self.seen:], self.seen):
                if e["event"] == kind and all(e.get(k) == v for k, v in match.items()):
                    self.seen = i + 1
                    return e
            return None
        return wait_for(find, timeout=timeout, what=lambda: f"greetd event {kind} {match}; events:\n"
                        + "\n".join(json.dumps(e) for e in self.events()[self.seen:]))


@pytest.fixture
def greetd(alice):
    inside("sh", "-c", f"mkdir -p -m 1777 {RUN} && rm -f {RUN}/greetd.commands {RUN}/greetd.events && "
                       f"mkfifo -m 666 {RUN}/greetd.commands && install -m 666 /dev/null {RUN}/greetd.events")
    inside("systemctl", "reset-failed", "greetd", check=False)
    inside("systemctl", "restart", "greetd")
    g = Greetd()
    g.next("ready", timeout=30)
    yield g
    inside("systemctl", "stop", "greetd", check=False)


def test_greetd_asks_at_once_and_takes_a_push_with_enter(greetd, alice):
    asked = greetd.do("create", user="alice")
    secret = greetd.next("reply", auth_message_type="secret")
    figure("greetd_create_session_to_password_prompt_s", round(secret["t"] - asked, 3))
    assert secret["t"] - asked < 0.5
    infos = [e["auth_message"] for e in greetd.events() if e.get("auth_message_type") == "info"]
    assert any(i.startswith("Box 4821: push from your phone, then press Enter") for i in infos), infos
    assert "not offering phone login to greetd" not in journal()
    phone = alice.background("login")  # stays: the presence link
    assert "greetd on seat0 tty7" in alice.waits_for_enter(phone)
    enter = greetd.do("respond", text="")
    done = greetd.next("reply", type="success")
    figure("greetd_enter_to_authenticated_s", round(done["t"] - enter, 3))
    greetd.do("start", cmd=["/usr/local/bin/boxkey-test-console-session"])
    greetd.next("started")
    [sid] = wait_for(lambda: sessions_of("alice"), timeout=20, what="alice's session")
    props = session(sid, "Class", "Remote", "Service", "Type")
    assert props["Class"] == "user" and props["Remote"] == "no" and props["Service"] == "greetd", props
    wait_for(lambda: f"session {sid} (alice, seat0" in journal() and "registered by greetd for phone" in journal(), what="the session on record")
    # A text session: walk-away cannot lock it, so it ends (not_locked = logout).
    wait_for(lambda: "Staying connected" in phone.said(), what="the presence link")
    inside("pkill", "-KILL", "-f", "boxkey login", check=False)
    phone.wait(10)
    wait_for(lambda: not sessions_of("alice"), timeout=20, what="the session to end")


def test_greetd_takes_a_typed_password(greetd):
    greetd.do("create", user="alice")
    greetd.next("reply", auth_message_type="secret")
    greetd.do("respond", text=PASSWORDS["alice"])
    greetd.next("reply", type="success")
