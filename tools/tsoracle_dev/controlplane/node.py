"""One Kubernetes node beside the dev control plane, built from upstream sources.

containerd + runc run the pods, a CNI bridge the node creates (`tsoracle0`, 10.244.0.0/24) gives
them addresses, kube-proxy's iptables rules give Services their ClusterIPs (10.0.0.0/24), CoreDNS
answers cluster names, and kube-scheduler and kube-controller-manager do what they do anywhere.
Every address lives on the bridge: the node's own address (10.244.0.1) is its gateway, where the
API server, PostgreSQL and CoreDNS listen too, so no traffic leaves the machine.

Only one node runs per machine (interfaces, iptables chains and the CNI bridge are global); its
runtime files live under /run/tsoracle-node, which also says which state folder owns it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from tsoracle_dev import hosttools
from tsoracle_dev.controlplane.process import alive, cmdline, stop

NODE_NAME = "tsoracle-node"
BRIDGE = "tsoracle0"
NODE_IP = "10.244.0.1"
POD_CIDR = "10.244.0.0/24"
SERVICE_CIDR = "10.0.0.0/24"
CLUSTER_DOMAIN = "cluster.local"
# Short and fixed: unix sockets allow ~100 bytes of path, and one node per machine anyway.
RUN = Path("/run/tsoracle-node")
CNI_BIN = Path("/usr/lib/cni")
SYSCTLS = ("net/bridge/bridge-nf-call-iptables", "net/ipv4/ip_forward")
GUARD_IN, GUARD_OUT = "TSORACLE-NODE-IN", "TSORACLE-NODE-FWD"
# Identities the control plane's bootstrap RBAC already knows (CoreDNS's: components.CoreDNS).
USERS = {
    "kubelet": (f"system:node:{NODE_NAME}", "system:nodes"),
    "kube-proxy": ("system:kube-proxy", ""),
    "kube-scheduler": ("system:kube-scheduler", ""),
    "kube-controller-manager": ("system:kube-controller-manager", ""),
    "coredns": ("tsoracle:coredns", ""),
}


class NodeError(RuntimeError):
    """The node cannot start here; the message says what to do."""


def write_secret(path: Path, text: str) -> None:
    """Replace `path` by a file only its owner can read: written under a temporary name created
    0600, then renamed, so no reader sees it half-written or readable by others."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def missing_prerequisites() -> list[str]:
    """What this machine lacks to run the node (empty when it can)."""
    problems = []
    if os.geteuid() != 0:
        problems.append("the node needs root (it creates a bridge, iptables rules and "
                        "containers); run as root, or start without it: "
                        "tsoracle-dev-cluster up --no-node")
    # Not go: the pause image's source is found in Go's module cache without it, and what
    # must be built asks for it then (images.pause_source, the cluster's build).
    problems += hosttools.missing("containerd", "containerd-shim-runc-v2", "runc", "ctr",
                                  "iptables", "ip", "conntrack", "modprobe", "openssl",
                                  *(path for path in hosttools.FILES if path.parent == CNI_BIN))
    return problems


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = hosttools.run(list(argv), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise NodeError(f"{' '.join(argv)} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


class Node:
    """The node's files and processes for one dev-cluster state folder."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.dir = state / "node"
        self.pki = state / "pki"
        self.containerd_root = self.dir / "containerd"
        self.kubelet_root = self.dir / "kubelet"
        self.address = RUN / "containerd.sock"
        self.owner_file = RUN / "owner"

    # --- ownership: one node per machine -------------------------------------------------
    @staticmethod
    @contextlib.contextmanager
    def locked() -> Iterator[None]:
        """One `up` or `down` of a node at a time on this machine."""
        RUN.mkdir(parents=True, exist_ok=True)
        with open(RUN / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def claim(self) -> None:
        """Become the machine's node, or say which one runs; call with `locked()` held."""
        owner = self.owner_file.read_text().strip() if self.owner_file.exists() else ""
        if owner and owner != str(self.state):
            other = Node(Path(owner))
            if other.running():
                raise NodeError(f"a dev cluster's node already runs on this machine (state "
                                f"{owner}); stop it first: tsoracle-dev-cluster down {owner}")
            other.teardown()  # a crashed cluster's leftovers
        self.owner_file.write_text(str(self.state))

    def owned(self) -> bool:
        return self.owner_file.exists() and self.owner_file.read_text().strip() == str(self.state)

    def running(self) -> bool:
        """Any of this node's processes alive (found by their files, not by recorded pids)."""
        return bool(self._processes(str(self.dir)))

    # --- network --------------------------------------------------------------------------
    def network_up(self) -> None:
        if _run("ip", "link", "show", BRIDGE, check=False).returncode != 0:
            _run("ip", "link", "add", BRIDGE, "type", "bridge")
        if NODE_IP not in _run("ip", "-4", "addr", "show", "dev", BRIDGE).stdout:
            _run("ip", "addr", "add", f"{NODE_IP}/24", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")
        # Service traffic between pods on one bridge must pass iptables to be DNATed, and a
        # ClusterIP answered by another pod is routed back onto the bridge. The values found
        # are put back by teardown.
        _run("modprobe", "br_netfilter", check=False)
        saved = RUN / "sysctl.json"
        if not saved.exists():
            saved.write_text(json.dumps({k: Path("/proc/sys", k).read_text().strip()
                                         for k in SYSCTLS}))
        for key in SYSCTLS:
            Path("/proc/sys", key).write_text("1\n")
        self._firewall()

    @staticmethod
    def _firewall() -> None:
        """Only the host and pods reach the node's address, and pods reach nothing beyond the
        bridge: the API server's admin may start privileged pods, and no traffic leaves."""
        guards = ((GUARD_IN, "INPUT", ["-d", f"{NODE_IP}/32"], [["-i", "lo"], ["-i", BRIDGE]]),
                  (GUARD_OUT, "FORWARD", ["-i", BRIDGE], [["-o", BRIDGE]]))
        for chain, hook, match, allowed in guards:
            if _run("iptables", "-N", chain, check=False).returncode == 0:
                for rule in allowed:
                    _run("iptables", "-A", chain, *rule, "-j", "RETURN")
                _run("iptables", "-A", chain, "-j", "DROP")
            if _run("iptables", "-C", hook, *match, "-j", chain, check=False).returncode:
                _run("iptables", "-I", hook, "1", *match, "-j", chain)

    # --- certificates and identities ------------------------------------------------------
    def prepare_pki(self) -> dict[str, str]:
        """The kubelet client CA and the API server's client certificate for kubelet calls
        (logs, exec), and a token per component; returns component -> token."""
        pki = self.pki
        if not (pki / "kubelet-client-ca.crt").exists():
            _run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650",
                 "-keyout", str(pki / "kubelet-client-ca.key"),
                 "-out", str(pki / "kubelet-client-ca.crt"),
                 "-subj", "/CN=tsoracle-dev-kubelet-client-ca")
            _run("openssl", "req", "-newkey", "rsa:2048", "-nodes",
                 "-keyout", str(pki / "apiserver-kubelet-client.key"),
                 "-out", str(pki / "apiserver-kubelet-client.csr"),
                 "-subj", "/O=system:masters/CN=kube-apiserver-kubelet-client")
            _run("openssl", "x509", "-req", "-days", "3650",
                 "-in", str(pki / "apiserver-kubelet-client.csr"),
                 "-CA", str(pki / "kubelet-client-ca.crt"),
                 "-CAkey", str(pki / "kubelet-client-ca.key"), "-CAcreateserial",
                 "-out", str(pki / "apiserver-kubelet-client.crt"))
        tokens_file = pki / "node-tokens.json"
        if not tokens_file.exists():
            write_secret(tokens_file, json.dumps({c: secrets.token_hex(16) for c in USERS}))
        return dict(json.loads(tokens_file.read_text()))

    def token_lines(self, tokens: dict[str, str]) -> list[str]:
        """Lines for the API server's --token-auth-file."""
        lines = []
        for component, (user, group) in USERS.items():
            line = f"{tokens[component]},{user},{user}"
            lines.append(f'{line},"{group}"' if group else line)
        return lines

    def apiserver_flags(self) -> list[str]:
        return [
            "--enable-admission-plugins", "NodeRestriction",
            "--kubelet-client-certificate", str(self.pki / "apiserver-kubelet-client.crt"),
            "--kubelet-client-key", str(self.pki / "apiserver-kubelet-client.key"),
            "--kubelet-preferred-address-types", "InternalIP",
        ]

    # --- teardown -------------------------------------------------------------------------
    def _ctr(self, *args: str) -> subprocess.CompletedProcess[str]:
        return _run("ctr", "--address", str(self.address), "-n", "k8s.io", *args, check=False)

    def stop_containers(self) -> list[str]:
        """Kill every container's task and return the network namespaces their sandboxes
        pinned, so that teardown can release them (and their veth pairs) afterwards."""
        if not self.address.exists():
            return []
        netns = []
        ids = self._ctr("containers", "ls", "-q").stdout.split()
        for cid in ids:
            info = self._ctr("containers", "info", cid)
            try:
                spec = json.loads(info.stdout)["Spec"]
            except (ValueError, KeyError, TypeError):
                continue
            for ns in spec.get("linux", {}).get("namespaces", []):
                if ns.get("type") == "network" and ns.get("path"):
                    netns.append(ns["path"])
        for cid in ids:
            self._ctr("tasks", "kill", "-s", "SIGKILL", cid)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            running = [line for line in self._ctr("tasks", "ls").stdout.splitlines()[1:]
                       if "RUNNING" in line]
            if not running:
                break
            time.sleep(0.2)
        for cid in ids:
            self._ctr("tasks", "delete", "-f", cid)
            for result in Path("/var/lib/cni/results").glob(f"*-{cid}-*"):
                result.unlink(missing_ok=True)  # libcni's cache of this sandbox's attachments
        return sorted(set(netns))

    def stop_runtime(self, containerd: list[int]) -> None:
        """Kill the containers, then stop containerd (`containerd`: its recorded pids, besides
        those found by this node's files), its shims and what they leave, and release the
        network namespaces the sandboxes pinned."""
        netns = self.stop_containers()
        stop([*containerd, *(p for p in self._processes(str(self.dir))
                             if self._cmd(p).startswith("containerd"))])
        stop(self._shims(), timeout=5)
        if self.owned() or not self.owner_file.exists():
            stop(self._pod_processes(), timeout=2)  # containerd could not kill them
        for path in netns:
            _run("umount", path, check=False)
            Path(path).unlink(missing_ok=True)

    def teardown(self, pids: dict[str, int] | None = None) -> None:
        """Stop the node's processes, containers and shims, release its mounts, network
        namespaces, iptables chains and bridge, and put the sysctls back. Safe to repeat, and
        works from the files alone (a crashed `up` may have recorded no pid)."""
        pids = dict(pids or {})
        mine = str(self.dir)
        front = [pid for pid in self._processes(mine)
                 if not self._cmd(pid).startswith(("containerd", "kube-proxy"))]
        stop([*(pids[c] for c in ("kubelet", "kube-controller-manager", "kube-scheduler",
                                  "coredns") if c in pids), *front])
        self.stop_runtime([pids["containerd"]] if "containerd" in pids else [])
        self._unmount_under([self.dir, RUN])
        stop([*([pids["kube-proxy"]] if "kube-proxy" in pids else []), *self._processes(mine)])
        self._remove_iptables_chains()
        for link in _run("ip", "-o", "link", "show", "master", BRIDGE, check=False).stdout \
                .splitlines():
            _run("ip", "link", "del", link.split(":")[1].strip().split("@")[0], check=False)
        _run("ip", "link", "del", BRIDGE, check=False)
        self._remove_pod_cgroups()
        for result in Path("/var/lib/cni/results").glob("tsoracle-*"):
            result.unlink(missing_ok=True)
        for log in Path("/var/log/containers").glob("*.log"):  # the kubelet's fixed folder
            if log.is_symlink() and os.readlink(log).startswith(str(self.dir)):
                log.unlink()
        saved = RUN / "sysctl.json"
        if saved.exists():
            for key, value in json.loads(saved.read_text()).items():
                Path("/proc/sys", key).write_text(f"{value}\n")
            saved.unlink()
        shutil.rmtree(RUN / "state", ignore_errors=True)
        shutil.rmtree(RUN / "runc", ignore_errors=True)
        for leftover in RUN.glob("containerd.sock*"):
            leftover.unlink(missing_ok=True)
        if self.owned():
            self.owner_file.unlink()

    @staticmethod
    def _cmd(pid: int) -> str:
        return os.path.basename(os.fsdecode(cmdline(pid).split(b"\0")[0]))

    @staticmethod
    def _processes(needle: str) -> list[int]:
        """Live processes whose command line names `needle` (a path of this node's)."""
        return [int(proc.name) for proc in Path("/proc").iterdir()
                if proc.name.isdigit() and int(proc.name) != os.getpid()
                and needle.encode() in cmdline(int(proc.name)) and alive(int(proc.name))]

    @staticmethod
    def _pod_processes() -> list[int]:
        pids: set[int] = set()
        for procs in Path("/sys/fs/cgroup/pids/kubepods").rglob("cgroup.procs"):
            try:
                pids.update(int(p) for p in procs.read_text().split())
            except OSError:
                continue
        return sorted(pids)

    def _shims(self) -> list[int]:
        """containerd-shim processes started by this node's containerd."""
        argvs = {int(p.name): cmdline(int(p.name)).split(b"\0")
                 for p in Path("/proc").iterdir() if p.name.isdigit()}
        return [pid for pid, argv in argvs.items()
                if argv[0].endswith(b"containerd-shim-runc-v2")
                and str(self.address).encode() in argv]

    @staticmethod
    def _unmount_under(roots: list[Path]) -> None:
        prefixes = tuple(f"{root}/" for root in roots)
        # Octal escapes (\040 for a space) stand for bytes; the path may be UTF-8.
        raw = [line.split()[1] for line in Path("/proc/self/mounts").read_bytes().splitlines()]
        mounts = [os.fsdecode(re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m[1], 8)]), r))
                  for r in raw]
        for mount in sorted((m for m in mounts if m.startswith(prefixes)), key=len,
                            reverse=True):
            _run("umount", "-l", mount, check=False)

    @staticmethod
    def _remove_iptables_chains() -> None:
        """kube-proxy's and the kubelet's KUBE-* chains (both families) and our guards."""
        ours = ("KUBE-", GUARD_IN, GUARD_OUT)
        for tool in ("iptables", "ip6tables"):
            if shutil.which(tool) is None:
                continue
            for table in ("nat", "filter", "mangle"):
                rules = _run(tool, "-t", table, "-S", check=False).stdout.splitlines()
                for rule in rules:
                    words = shlex.split(rule)
                    if words[:1] == ["-A"] and not words[1].startswith(ours) and \
                            "-j" in words and words[words.index("-j") + 1].startswith(ours):
                        _run(tool, "-t", table, "-D", *words[1:], check=False)
                chains = [r.split()[1] for r in rules
                          if r.startswith("-N ") and r.split()[1].startswith(ours)]
                for chain in chains:
                    _run(tool, "-t", table, "-F", chain, check=False)
                for chain in chains:
                    _run(tool, "-t", table, "-X", chain, check=False)

    @staticmethod
    def _remove_pod_cgroups() -> None:
        for hierarchy in Path("/sys/fs/cgroup").iterdir():
            top = hierarchy / "kubepods"
            if not top.is_dir():
                continue
            for cgroup in sorted((p for p in top.rglob("*") if p.is_dir()),
                                 key=lambda p: len(p.parts), reverse=True):
                try:
                    cgroup.rmdir()
                except OSError:
                    pass
            try:
                top.rmdir()
            except OSError:
                pass
