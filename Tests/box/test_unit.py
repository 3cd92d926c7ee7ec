"""boxkeyd.service as systemd runs it on a booted box: a start says nothing at notice or above
that an admin would have to look into, a configuration error stops the unit instead of
restarting it every 2 s, and the simulated radio's folder is made only when asked for."""
import time

from conftest import configure_box, inside, journal, journal_cursor, wait_for


def test_a_start_logs_nothing_at_notice_or_above():
    """Before: every start logged libdispatch's "Failed to set thread priority for worker
    thread ... errno=13" at notice (the unit allowed no renice)."""
    configure_box()
    cursor = journal_cursor()
    inside("systemctl", "restart", "boxkeyd")
    wait_for(lambda: "advertising box 4821" in journal(since=cursor), timeout=20, what="boxkeyd advertising")
    time.sleep(1)
    loud = inside("journalctl", "-u", "boxkeyd", "-p", "notice", "-o", "cat", "--no-pager", "--cursor", cursor, check=False).stdout
    # systemd's own start and stop lines are info; the simulated radio's warning is expected here.
    loud = [line for line in loud.splitlines() if line.strip() and "simulated" not in line]
    assert not loud, loud
    assert inside("systemctl", "show", "-p", "LimitNICE", "boxkeyd").stdout.strip() == "LimitNICE=20"


def test_a_configuration_error_stops_the_unit_instead_of_restarting_it():
    """Before: a config error restarted the daemon every 2 s forever."""
    inside("cp", "/etc/boxkey/boxkeyd.conf", "/root/boxkeyd.conf.good")
    try:
        inside("sh", "-c", "printf '[box]\\nid = \"not a box id\"\\n' >>/etc/boxkey/boxkeyd.conf")
        inside("systemctl", "restart", "boxkeyd", check=False)
        time.sleep(5)  # two RestartSec= periods
        show = inside("systemctl", "show", "-p", "NRestarts", "-p", "ActiveState", "-p", "ExecMainStatus", "boxkeyd").stdout
        assert "NRestarts=0" in show and "ActiveState=failed" in show and "ExecMainStatus=78" in show, show
    finally:
        inside("cp", "/root/boxkeyd.conf.good", "/etc/boxkey/boxkeyd.conf")
        inside("systemctl", "reset-failed", "boxkeyd", check=False)
        configure_box()


def test_the_simulated_radios_folder_is_made_only_when_asked_for():
    """Before: /run/boxkey-sim was made by the unit on every box, BlueZ or not."""
    inside("mv", "/etc/systemd/system/boxkeyd.service.d/simulated-radio.conf", "/root/simulated-radio.conf")
    try:
        inside("systemctl", "daemon-reload")
        assert inside("systemctl", "show", "-p", "RuntimeDirectory", "boxkeyd").stdout.strip() == "RuntimeDirectory=boxkey"
    finally:
        inside("mv", "/root/simulated-radio.conf", "/etc/systemd/system/boxkeyd.service.d/simulated-radio.conf")
        inside("systemctl", "daemon-reload")
    assert "boxkey-sim" in inside("systemctl", "show", "-p", "RuntimeDirectory", "boxkeyd").stdout
