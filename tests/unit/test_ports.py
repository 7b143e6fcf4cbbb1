"""Meeting ports for process groups: free, and out of the range the kernel hands to outgoing connections."""

import socket

from oxrl_core.cluster import ports
from oxrl_core.cluster.ports import MEETING_PORTS_START, free_port


def bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
        return True


def test_a_meeting_port_is_free_and_below_the_ephemeral_range():
    port = free_port()
    assert MEETING_PORTS_START <= port < ports.ephemeral_ports_start() and bindable(port)


def test_a_taken_port_is_passed_over(monkeypatch):
    monkeypatch.setattr(ports, "ephemeral_ports_start", lambda: MEETING_PORTS_START + 2)
    with socket.socket() as held:
        held.bind(("", MEETING_PORTS_START))
        kernel_ports = set(range(ports.ephemeral_ports_start(), 65536))  # where it falls back to should 20001 be taken
        assert {free_port() for _ in range(20)} <= {MEETING_PORTS_START + 1} | kernel_ports


def test_with_no_room_below_the_ephemeral_range_the_kernel_picks_a_free_port(monkeypatch):
    monkeypatch.setattr(ports, "ephemeral_ports_start", lambda: MEETING_PORTS_START)
    port = free_port()
    assert port > 0 and bindable(port)
