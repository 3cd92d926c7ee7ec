"""The enterprise path: a directory user, known to the box only through sssd (pam_sss, nss_sss)
against a throwaway slapd on this machine (TLS, Tests/e2e/slapd.py). The phone's push reaches
pam_sss, which checks it with the directory: the box stores no password and knows no shadow
entry for carol."""
import os
import sys
import tempfile
import time

import pytest

from conftest import Console, figure, inside, journal, sessions_of, wait_for
from test_console import at_password_prompt, log_out, shell

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "e2e"))
from slapd import BOX_DN, BOX_PASSWORD, SUFFIX, USER_PASSWORD, Slapd  # noqa: E402


@pytest.fixture(scope="module")
def directory(box):
    work = tempfile.mkdtemp(prefix="boxkey-sssd-")
    slapd = Slapd(work, users=(), posix={"carol": 5001}).start()
    inside("sh", "-c", "cat >/etc/boxkey-test-ca.pem", input=open(slapd.ca).read())
    conf = f"""[sssd]
services = nss, pam
domains = example

[domain/example]
id_provider = ldap
auth_provider = ldap
ldap_uri = {slapd.uri}
ldap_search_base = {SUFFIX}
ldap_id_use_start_tls = true
ldap_tls_cacert = /etc/boxkey-test-ca.pem
ldap_tls_reqcert = demand
ldap_default_bind_dn = {BOX_DN}
ldap_default_authtok = {BOX_PASSWORD}
cache_credentials = false
"""
    inside("sh", "-c", "umask 077 && cat >/etc/sssd/sssd.conf", input=conf)
    inside("systemctl", "restart", "sssd")
    wait_for(lambda: inside("id", "carol", check=False).returncode == 0, timeout=30, what="carol through sssd")
    yield slapd
    inside("systemctl", "stop", "sssd", check=False)
    slapd.stop()


def test_a_directory_user_logs_in_at_the_console_with_a_push_checked_by_pam_sss(directory, box):
    from conftest import Phone
    phone = Phone("carol")
    inside("boxkeyd", "phones", "enrol", phone.key, "--user", "carol", "--name", "carol's phone")
    box_key = inside("boxkeyd", "status", "--json").stdout.split('"publicKey"')[1].split('"')[1]
    assert phone("pair", "4821", "--box-key", box_key).returncode == 0
    assert phone("credentials", "set", "--user", "carol", input=USER_PASSWORD + "\n").returncode == 0
    assert "carol" not in inside("getent", "shadow", check=False).stdout
    tty = Console(3)
    tty.reset()
    try:
        at_password_prompt(tty, user="carol")
        pushed = phone.background("login", "--no-stay")
        phone.waits_for_enter(pushed)
        enter = time.monotonic()
        tty.type("\n")
        wait_for(lambda: "carol@boxkey-box" in tty.screen(), timeout=20, what=lambda: f"carol's shell:\n{tty.screen()}")
        figure("sssd_console_enter_to_shell_s", round(time.monotonic() - enter, 3))
        assert pushed.wait(30) == 0
        assert "login accepted" in journal()
        assert "pam_sss(login:auth): authentication success" in inside("journalctl", "-o", "cat", "--no-pager", check=False).stdout
        tty.type("exit\n")
        tty.login_prompt()
    finally:
        tty.reset()
        for sid in sessions_of("carol"):
            inside("loginctl", "terminate-session", sid, check=False)
