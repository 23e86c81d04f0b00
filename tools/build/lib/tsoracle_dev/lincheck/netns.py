"""A network partition between one worker and PostgreSQL: a namespace, a veth pair, iptables.

The worker runs inside its own network namespace (`ip netns exec`), joined to the host by a
veth pair on a /30 of its own; PostgreSQL also listens on the host end. `cut()` adds DROP rules
inside the namespace for both directions, so packets vanish without an answer and TCP keeps
waiting (a real partition, not a refused connection); `heal()` removes them. Needs root, `ip`
(iproute2) and `iptables`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid


class NamespaceUnavailable(RuntimeError):
    pass


def _run(*args: str) -> None:
    proc = subprocess.run(list(args), capture_output=True, text=True)
    if proc.returncode != 0:
        raise NamespaceUnavailable(f"{' '.join(args)}: {proc.stderr.strip()}")


class NetNamespace:
    def __init__(self) -> None:
        if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("iptables"):
            raise NamespaceUnavailable(
                "the partition nemesis needs root, `ip` (iproute2) and `iptables`")
        tag = uuid.uuid4().hex[:6]
        self.name = f"tso-{tag}"
        self.host_if, self.ns_if = f"tso{tag}h", f"tso{tag}n"  # at most 15 characters
        third = self._free_subnet()
        self.host_ip, self.ns_ip = f"10.213.{third}.1", f"10.213.{third}.2"
        self.subnet = f"10.213.{third}.0/30"
        self.cut_now = False

    @staticmethod
    def _free_subnet() -> int:
        used = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
        for third in range(1, 255):
            if f" 10.213.{third}." not in used:
                return third
        raise NamespaceUnavailable("no free 10.213.x.0/30 subnet for the partition namespace")

    def up(self) -> NetNamespace:
        try:
            _run("ip", "netns", "add", self.name)
            _run("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
            _run("ip", "link", "set", self.ns_if, "netns", self.name)
            _run("ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
            _run("ip", "link", "set", self.host_if, "up")
            self._in("ip", "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if)
            self._in("ip", "link", "set", self.ns_if, "up")
            self._in("ip", "link", "set", "lo", "up")
        except NamespaceUnavailable:
            self.down()
            raise
        return self

    def _in(self, *args: str) -> None:
        _run("ip", "netns", "exec", self.name, *args)

    def prefix(self) -> list[str]:
        """Put before a command line to run it inside the namespace."""
        return ["ip", "netns", "exec", self.name]

    def cut(self) -> None:
        self._in("iptables", "-A", "OUTPUT", "-d", self.host_ip, "-j", "DROP")
        self._in("iptables", "-A", "INPUT", "-s", self.host_ip, "-j", "DROP")
        self.cut_now = True

    def heal(self) -> None:
        self._in("iptables", "-F")
        self.cut_now = False

    def down(self) -> None:
        # The namespace takes its end of the pair along; the host end may linger briefly.
        for args in (("ip", "netns", "del", self.name), ("ip", "link", "del", self.host_if)):
            subprocess.run(list(args), capture_output=True)
