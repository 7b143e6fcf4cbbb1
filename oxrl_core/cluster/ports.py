"""Ports where a process group's ranks meet."""

import random
import socket
from pathlib import Path

# Where ranks meet: a port the kernel hands out for bind(0) is free that instant, but the same ephemeral range feeds
# the local port of every outgoing connection, and Ray and vLLM open many, so one can take it before rank 0 listens
# (EADDRINUSE). Ports between Ray's worker ports (10002-19999) and the ephemeral range are taken only by binds.
MEETING_PORTS_START = 20000


def free_port() -> int:
    """A port free on this node, below the ephemeral range where the kernel allows it."""
    ports = range(MEETING_PORTS_START, ephemeral_ports_start())
    for port in random.SystemRandom().sample(ports, min(len(ports), 100)):  # not the seeded global generator
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def ephemeral_ports_start() -> int:
    """The first port of the range the kernel gives outgoing connections (and bind(0))."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):  # not Linux: the range IANA assigns to ephemeral ports
        return 49152
