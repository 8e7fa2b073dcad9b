"""The network of one bench_wan.py run: a namespace per role, joined to a bridge in a hub
namespace by veth pairs created directly inside the namespaces, and `tbf` caps on links.

Every name carries the bench's tag (its process id) and every address is in the
10.250.X.0/24 it owns, inside its own namespaces; `Network.close` deletes the namespaces
it made, which takes their veths, the bridge and the qdiscs with them. Each command is
bounded by `SETUP_TIMEOUT`.
"""

from __future__ import annotations

import os
import shutil
import subprocess

ROLES = ("orch", "trainer", "relay", "validator", "worker1", "worker2")
CAPPED = ("relay", "worker1", "worker2")
SETUP_TIMEOUT = 30


def tool(*cmd: str) -> subprocess.CompletedProcess:
    """One setup command, bounded; its exit status is the caller's to judge."""
    return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=SETUP_TIMEOUT)


def sh(*cmd: str) -> None:
    done = tool(*cmd)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")


class Network:
    """The namespaces, veths and bridge of one bench run; `close` removes all of them."""

    def __init__(self, tag: str, subnet: int) -> None:
        self.tag = tag
        self.prefix = f"10.250.{subnet}"
        self.made: list[str] = []
        self.hub = f"swan{tag}-hub"

    def ns(self, role: str) -> str:
        return f"swan{self.tag}-{role}"

    def ip(self, role: str) -> str:
        return f"{self.prefix}.{ROLES.index(role) + 2}"

    def _veth(self, role: str, end: str) -> str:
        return f"sw{self.tag}{ROLES.index(role)}{end}"  # at most 15 characters

    def build(self) -> None:
        for name in (self.hub, *(self.ns(r) for r in ROLES)):
            sh("ip", "netns", "add", name)
            self.made.append(name)
            sh("ip", "-n", name, "link", "set", "lo", "up")
        sh("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.hub, "link", "set", "br0", "up")
        for role in ROLES:
            inner, outer = self._veth(role, "r"), self._veth(role, "h")
            sh(
                "ip",
                "link",
                "add",
                inner,
                "netns",
                self.ns(role),
                "type",
                "veth",
                "peer",
                "name",
                outer,
                "netns",
                self.hub,
            )
            sh("ip", "-n", self.hub, "link", "set", outer, "master", "br0", "up")
            sh("ip", "-n", self.ns(role), "addr", "add", f"{self.ip(role)}/24", "dev", inner)
            sh("ip", "-n", self.ns(role), "link", "set", inner, "up")

    def cap(self, mbit: int | None) -> None:
        """`tbf` at `mbit` on both ends of each capped role's link (None: remove the caps)."""
        for role in CAPPED:
            for ns, dev in (
                (self.ns(role), self._veth(role, "r")),
                (self.hub, self._veth(role, "h")),
            ):
                tool("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root")
                if mbit is not None:
                    sh(
                        "ip",
                        "netns",
                        "exec",
                        ns,
                        "tc",
                        "qdisc",
                        "add",
                        "dev",
                        dev,
                        "root",
                        "tbf",
                        "rate",
                        f"{mbit}mbit",
                        "burst",
                        "64kb",
                        "latency",
                        "100ms",
                    )

    def close(self) -> None:
        for name in reversed(self.made):
            tool("ip", "netns", "del", name)
        self.made.clear()


def can_run() -> str | None:
    """Why this machine cannot run the bench, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and tc)"
    for name in ("ip", "tc", "curl"):
        if shutil.which(name) is None:
            return f"needs `{name}` on PATH"
    probe = f"swanprobe{os.getpid()}"
    made = tool("ip", "netns", "add", probe)
    if made.returncode != 0:
        return f"cannot make a network namespace: {made.stderr.strip()}"
    try:
        link = tool("ip", "-n", probe, "link", "add", "d0", "type", "veth", "peer", "name", "d1")
        if link.returncode != 0:
            return f"cannot make a veth pair in a namespace: {link.stderr.strip()}"
        tbf = tool(
            "ip",
            "netns",
            "exec",
            probe,
            "tc",
            "qdisc",
            "add",
            "dev",
            "d0",
            "root",
            "tbf",
            "rate",
            "20mbit",
            "burst",
            "64kb",
            "latency",
            "100ms",
        )
        if tbf.returncode != 0:
            return f"the tbf qdisc is not available: {tbf.stderr.strip()}"
    finally:
        tool("ip", "netns", "del", probe)
    return None
