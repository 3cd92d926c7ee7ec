"""The prompts phone login must stay out of: sudo, su, sshd and pkexec (polkit). pam_boxkey is
in their stacks (common-auth, through the pam-auth-update profile); each must show its own
password prompt with no word of Boxkey's, as fast as without it, and take the password."""
import time

import pexpect
import pytest

from conftest import INIT, PASSWORDS, figure, inside, journal, journal_cursor

SSH = "ssh -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o PubkeyAuthentication=no -p 2222"
PROGRAMS = {
    # name: (user, command, its password prompt, whose password, what success prints)
    "sudo": ("alice", "sudo -k -p 'sudo-prompt: ' echo sudo-ok", "sudo-prompt: ", "alice", "sudo-ok"),
    "su": ("bob", "su alice -c 'echo su-ok'", "Password: ", "alice", "su-ok"),
    "sshd": ("bob", f"{SSH} alice@127.0.0.1 echo ssh-ok", "assword:", "alice", "ssh-ok"),
    # polkitd in this container refuses its own agent's answer ("FAILED to authenticate": the
    # helper's PAM says yes, polkitd "No session for cookie"), with Boxkey or without: what
    # pkexec finally says is compared between the two instead.
    "pkexec": ("alice", "pkexec echo pkexec-ok", "Password: ", "alice", None),
}


def run_in_terminal(user, command):
    """`command` as `user` on a terminal of the root's own (script(1) gives it a pty there)."""
    return pexpect.spawn("nsenter", ["--target", INIT, "--all", "env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8",
                                     "TERM=dumb", "runuser", "-u", user, "--", "script", "-qfec", command, "/dev/null"],
                         encoding="utf-8", timeout=20)


def time_to_prompt(name):
    user, command, prompt, whose, ok = PROGRAMS[name]
    start = time.monotonic()
    p = run_in_terminal(user, command)
    p.expect_exact(prompt)
    took = time.monotonic() - start
    before = p.before
    p.sendline(PASSWORDS[whose])
    if ok:
        p.expect_exact(ok)
    p.expect(pexpect.EOF)
    return took, before, p.before.strip().splitlines()[-3:]


@pytest.fixture(scope="module")
def admins(box):
    inside("usermod", "-aG", "sudo", "alice")


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_the_prompt_stays_silent_and_as_fast(admins, name):
    cursor = journal_cursor()
    # The same program with the profile off, then on: the module must add nothing a person sees.
    # Off and on take turns, so that a busy moment of the machine (a journal flush, a timer)
    # falls on both sides rather than on one.
    bare, runs = [], []
    try:
        for _ in range(3):
            inside("pam-auth-update", "--package", "--remove", "boxkey")
            bare.append(time_to_prompt(name))
            inside("pam-auth-update", "--package", "--enable", "boxkey")
            runs.append(time_to_prompt(name))
    finally:
        inside("pam-auth-update", "--package", "--enable", "boxkey")
    assert "pam_boxkey.so" in inside("cat", "/etc/pam.d/common-auth").stdout
    without = min(took for took, _, _ in bare)
    with_module = min(took for took, _, _ in runs)
    for _, before, outcome in runs:
        assert "Box 4821" not in before and "phone" not in before, before
        assert outcome == bare[0][2], (outcome, bare[0][2])
    figure(f"{name}_to_password_prompt_s", round(with_module, 3))
    figure(f"{name}_to_password_prompt_without_boxkey_s", round(without, 3))
    assert with_module < without + 0.1, (with_module, without)
    box = journal(since=cursor)
    assert "login prompt waiting" not in box
    if name != "sshd":  # sshd's is remote: the module says no before asking the box
        assert f"not offering phone login to {'polkit-1' if name == 'pkexec' else name}" in box, box[-2000:]
