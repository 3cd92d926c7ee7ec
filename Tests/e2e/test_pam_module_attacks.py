"""Attacks on pam_boxkey.so from inside the application that loads it, found by an independent
review of the C module: an application that replaces its conversation, a password change after
a login, two logins interleaved on one thread, a signal during the wait after Enter. The daemon
here is a small scripted one (the module's side is under test, not boxkeyd's), speaking the
wire format of docs/protocol.md's last section."""
import os
import pty
import signal
import socket
import struct
import subprocess
import tempfile
import termios
import threading
import time

import pytest

HERE = os.path.dirname(__file__)


def text(s):
    b = s.encode()
    return bytes([len(b)]) + b


def frame(kind, body=b""):
    payload = bytes([3, kind]) + body
    return struct.pack(">H", len(payload)) + payload


PROMPT = frame(0x81, text("4821") + text("7F3A-91C2") + text("") + struct.pack(">I", 0))
OK = frame(0x84)


def push(user, password):
    return frame(0x82, text(user) + struct.pack(">H", len(password)) + password.encode() + text("t-" + user))


class ScriptedDaemon:
    """Answers each prompt's Enter with `pushes[expected user]` (a frame), or after `delay_s`;
    records what each connection sent: (kind, body) per request, by the prompt's user."""

    def __init__(self, path, pushes, delay_s=0):
        self.path, self.pushes, self.delay_s = path, pushes, delay_s
        self.seen = []
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(16)
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                c, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self.serve, args=(c,), daemon=True).start()

    def serve(self, c):
        user = ""
        try:
            while True:
                head = c.recv(2, socket.MSG_WAITALL)
                if len(head) < 2:
                    return
                body = c.recv(struct.unpack(">H", head)[0], socket.MSG_WAITALL)
                kind = body[1]
                if kind == 0x02:  # waitForPush: five strings, the fifth the prompt's user
                    at, fields = 2, []
                    for _ in range(5):
                        n = body[at]
                        fields.append(body[at + 1:at + 1 + n].decode())
                        at += 1 + n
                    user = fields[4]
                    c.sendall(PROMPT)
                elif kind == 0x08:  # Enter
                    time.sleep(self.delay_s)
                    c.sendall(self.pushes.get(user, frame(0x83, b"\x03")))
                elif kind in (0x04, 0x05, 0x06):
                    c.sendall(OK)
                self.seen.append((user, kind, body[2:]))
        except OSError:
            return
        finally:
            c.close()

    def verdicts(self):
        """(user, verdict) for each reportOutcome: 0 rejected, 1 accepted, 2 accepted, not the phone's."""
        return [(user, body[0]) for user, kind, body in self.seen if kind == 0x04]

    def close(self):
        self.server.close()


@pytest.fixture
def lab(world):
    """A scripted application, a verifier and a PAM service dir of their own."""
    work = tempfile.mkdtemp(prefix="pam-attacks-", dir=world.work)
    app, verifier = os.path.join(work, "pam_app"), os.path.join(work, "pam_first_pass_only.so")
    subprocess.run(["gcc", "-O2", "-o", app, os.path.join(HERE, "pam_app.c"), "-lpam"], check=True)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", verifier, os.path.join(HERE, "pam_first_pass_only.c"), "-lpam"], check=True)
    os.makedirs(os.path.join(work, "pam.d"))
    daemons = []

    class Lab:
        sock = os.path.join(work, "d.sock")

        def service(self, module_options, verifier_options):
            with open(os.path.join(work, "pam.d", "attacked"), "w") as f:
                f.write(f"auth [success=ok default=ignore] {world.bins['module']} socket={self.sock} {module_options}\n"
                        f"auth required {verifier} {verifier_options}\n"
                        f"account required pam_permit.so\n"
                        f"password required {verifier}\n")

        def daemon(self, pushes, delay_s=0):
            daemons.append(ScriptedDaemon(self.sock, pushes, delay_s))
            return daemons[-1]

        def env(self, answers="", **more):
            return dict(world.pam_env(os.path.join(work, "pam.d")), ANSWERS=answers, **more)

        def run(self, *actions, user="alice", answers="", env=None):
            return subprocess.run([app, "attacked", user, *actions], env=self.env(answers, **(env or {})),
                                  capture_output=True, text=True, timeout=60)

        def popen(self, *actions, user="alice", **kwargs):
            return subprocess.Popen([app, "attacked", user, *actions], env=self.env(), **kwargs)

    yield Lab()
    for d in daemons:
        d.close()


def test_a_retry_after_the_application_replaced_its_conversation_uses_the_new_one(lab):
    """A wrong push, then the application installs a new conversation and frees the old one's
    data before asking again: the module must not put the old one back (a use after free in
    the application)."""
    lab.service("", "password=right")
    lab.daemon({"alice": push("alice", "wrong")})
    r = lab.run("auth", "swapconv", "auth", answers="ENTER|ENTER")
    assert "FREED" not in r.stdout, r.stdout
    assert "[B] INFO: Box 4821" in r.stdout, r.stdout  # the second attempt talks to the new conversation


def test_a_typed_password_answers_no_prompt_after_authentication(lab):
    """answer_prompt hands a typed password to the verifier's prompt during authentication,
    never to a later one: a password change in the same transaction asks the person."""
    lab.service("answer_prompt", "password=typed-secret")
    lab.daemon({})
    r = lab.run("auth", "chauthtok", answers="typed-secret|new-one")
    assert "auth -> 0" in r.stdout, r.stdout
    assert "[A] HIDDEN: New password: " in r.stdout, r.stdout  # reached the application
    assert "chauthtok -> 0" in r.stdout, r.stdout


def test_two_logins_interleaved_on_one_thread_each_report_their_own_verdict(lab):
    """With a verifier that returns PAM_INCOMPLETE once, alice's right push and bob's wrong one
    interleave on one thread: each connection hears its own login's verdict."""
    lab.service("", "password=right incomplete_once")
    d = lab.daemon({"alice": push("alice", "right"), "bob": push("bob", "wrong")})
    r = lab.run("twohandles", env={"OTHER_USER": "bob"}, answers="ENTER|ENTER")
    assert "X auth -> 0" in r.stdout and "Y auth -> 7" in r.stdout, r.stdout
    assert sorted(d.verdicts()) == [("alice", 1), ("bob", 0)], d.verdicts()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_during_the_wait_after_enter_leaves_echo_on_or_ends_it_at_once(lab, sig):
    """Echo is off on the login terminal while the module waits for the push after Enter. The
    keys that end or stop a program (Ctrl-C, Ctrl-\\, Ctrl-Z) wait until echo is back; SIGTERM
    and SIGHUP (a shutdown, a hang-up) are never held by a library in someone else's program:
    it ends at once (it held them for up to timeout + 1 s, 601 s at the maximum), and the
    terminal's next owner (getty, or the closed pty) sets it again."""
    lab.service("", "password=right")
    lab.daemon({"alice": push("alice", "right")}, delay_s=2)
    master, slave = pty.openpty()
    # pam_app sets PAM_TTY to its terminal, as login does.
    p = lab.popen("auth", stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    echo = lambda: bool(termios.tcgetattr(slave)[3] & termios.ECHO)
    deadline = time.monotonic() + 5
    while echo() and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.02)
    assert not echo(), "echo was never off during the wait"
    sent = time.monotonic()
    os.killpg(p.pid, sig)
    p.wait(timeout=10)
    ended = time.monotonic() - sent
    if sig in (signal.SIGTERM, signal.SIGHUP):
        assert ended < 0.5, f"{sig.name} held for {ended:.2f} s"
    else:
        assert echo(), "echo left off after the program ended"
        assert ended > 0.5, f"{sig.name} ended the wait after {ended:.2f} s: it was not held"
    os.close(master)
    os.close(slave)


@pytest.mark.parametrize("name", [b"U" * 253 + b"\xff", b"alice\x01"], ids=["grows-past-255", "control-character"])
def test_a_program_supplied_name_the_wire_cannot_carry_as_is_gets_no_phone_login(lab, name):
    """Review: a PAM_USER set by the program (`su NAME`) was checked for length only. The
    module's writer turns a stray byte into U+FFFD (3 bytes) and a control character into a
    space, so `su $'<253 × U>\\xff'` reached the daemon as the 253-byte name of another account
    (and `alice\\x01` as `alice `). Such a name now gets no phone login: the prompt alone."""
    lab.service("", "password=right")
    d = lab.daemon({"U" * 253: push("U" * 253, "right")})
    env = lab.env("right")
    r = subprocess.run([os.path.join(os.path.dirname(lab.sock), "pam_app"), "attacked", name, "auth"], env=env,
                       capture_output=True, timeout=60)
    assert not [s for s in d.seen if s[1] == 0x02], f"the daemon was asked for a push for {d.seen[:1]}"
