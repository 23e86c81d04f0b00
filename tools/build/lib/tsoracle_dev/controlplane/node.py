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
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from tsoracle_dev import hosttools

NODE_NAME = "tsoracle-node"
BRIDGE = "tsoracle0"
NODE_IP = "10.244.0.1"
POD_CIDR = "10.244.0.0/24"
SERVICE_CIDR = "10.0.0.0/24"
CLUSTER_DOMAIN = "cluster.local"
COREDNS_VERSION = "v1.14.7"
# Short and fixed: unix sockets allow ~100 bytes of path, and one node per machine anyway.
RUN = Path("/run/tsoracle-node")
CNI_BIN = Path("/usr/lib/cni")
SYSCTLS = ("net/bridge/bridge-nf-call-iptables", "net/ipv4/ip_forward")
GUARD_IN, GUARD_OUT = "TSORACLE-NODE-IN", "TSORACLE-NODE-FWD"
# Identities the control plane's bootstrap RBAC already knows (except CoreDNS: see RBAC below).
USERS = {
    "kubelet": (f"system:node:{NODE_NAME}", "system:nodes"),
    "kube-proxy": ("system:kube-proxy", ""),
    "kube-scheduler": ("system:kube-scheduler", ""),
    "kube-controller-manager": ("system:kube-controller-manager", ""),
    "coredns": ("tsoracle:coredns", ""),
}
COREDNS_RBAC = {
    "apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "tsoracle:coredns"},
         "rules": [{"apiGroups": [""], "resources": ["services", "namespaces", "pods"],
                    "verbs": ["list", "watch"]},
                   {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                    "verbs": ["list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "tsoracle:coredns"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "tsoracle:coredns"},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                       "name": "tsoracle:coredns"}]},
    ]}


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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    except OSError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _stop(pids: list[int], timeout: float = 10.0) -> None:
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for pid in pids:
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


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
        self.coredns_ready_port = 0  # set when CoreDNS starts

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

    # --- processes ------------------------------------------------------------------------
    def start_containerd(self, spawn: Callable[[str, list[str]], int],
                         sandbox_image: str) -> int:
        self.containerd_root.mkdir(parents=True, exist_ok=True)
        cni_conf = self.dir / "cni"
        cni_conf.mkdir(parents=True, exist_ok=True)
        (cni_conf / "10-tsoracle.conflist").write_text(json.dumps({
            "cniVersion": "0.4.0", "name": "tsoracle", "plugins": [
                {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False,
                 "hairpinMode": True,
                 "ipam": {"type": "host-local", "dataDir": str(self.dir / "ipam"),
                          "ranges": [[{"subnet": POD_CIDR, "gateway": NODE_IP}]],
                          "routes": [{"dst": "0.0.0.0/0"}]}},
                {"type": "loopback"}]}, indent=2))
        config = self.dir / "containerd.toml"
        config.write_text(f"""version = 2
root = "{self.containerd_root}"
state = "{RUN / 'state'}"
[grpc]
  address = "{self.address}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{self.dir / 'opt'}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox_image}"
  # This sandbox may not lower OOM scores (no CAP_SYS_RESOURCE); without this runc fails
  # with "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "{RUN / 'runc'}"
  # No registry: a pull of anything not imported fails at once on a closed local port,
  # rather than reaching out to the Internet.
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{self._no_registry()}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{cni_conf}"
""")
        pid = spawn("containerd", ["containerd", "--config", str(config)])
        deadline = time.monotonic() + 30
        while _run("ctr", "--address", str(self.address), "version", check=False).returncode:
            if time.monotonic() > deadline or not _alive(pid):
                raise NodeError(f"containerd did not start; see {self.state}/logs/containerd.log")
            time.sleep(0.2)
        return pid

    def _no_registry(self) -> Path:
        hosts = self.dir / "registry-hosts"
        (hosts / "_default").mkdir(parents=True, exist_ok=True)
        (hosts / "_default" / "hosts.toml").write_text('server = "http://127.0.0.1:9"\n')
        return hosts

    def _kubeconfig(self, component: str, server: str, token: str) -> Path:
        path = self.dir / f"{component}.kubeconfig"
        write_secret(path, json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "node",
            "clusters": [{"name": "dev", "cluster": {
                "server": server, "certificate-authority": str(self.pki / "apiserver.crt")}}],
            "users": [{"name": component, "user": {"token": token}}],
            "contexts": [{"name": "node", "context": {"cluster": "dev", "user": component}}],
        }))
        return path

    def start_components(self, spawn: Callable[[str, list[str]], int], binary: Path,
                         coredns: Path, server: str, tokens: dict[str, str],
                         free_port: Callable[[], int]) -> dict[str, int]:
        kc = {c: self._kubeconfig(c, server, tokens[c]) for c in USERS}
        pids = {}
        manager = str(kc["kube-controller-manager"])
        pids["kube-controller-manager"] = spawn("kube-controller-manager", [
            str(binary), "kube-controller-manager", "--kubeconfig", manager,
            "--bind-address", "127.0.0.1", "--secure-port", str(free_port()),
            "--leader-elect=false", "--use-service-account-credentials=true",
            "--service-account-private-key-file", str(self.pki / "sa.key"),
            "--root-ca-file", str(self.pki / "apiserver.crt"),
            "--service-cluster-ip-range", SERVICE_CIDR,
            # Ask the API server who may do what, as every controller runs under its own
            # ServiceAccount (kubeadm does the same).
            "--authentication-kubeconfig", manager, "--authorization-kubeconfig", manager,
        ])
        pids["kube-scheduler"] = spawn("kube-scheduler", [
            str(binary), "kube-scheduler", "--kubeconfig", str(kc["kube-scheduler"]),
            "--bind-address", "127.0.0.1", "--secure-port", str(free_port()),
            "--leader-elect=false",
            "--authentication-kubeconfig", str(kc["kube-scheduler"]),
            "--authorization-kubeconfig", str(kc["kube-scheduler"]),
        ])
        self.kubelet_root.mkdir(parents=True, exist_ok=True)
        kubelet_config = self.dir / "kubelet.yaml"
        kubelet_config.write_text(json.dumps({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            # The host runs cgroup v1 without systemd as PID 1.
            "failCgroupV1": False, "cgroupDriver": "cgroupfs", "failSwapOn": False,
            "address": NODE_IP, "port": free_port(), "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": free_port(),
            "authentication": {"anonymous": {"enabled": False},
                               "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(self.pki / "kubelet-client-ca.crt")}},
            "authorization": {"mode": "Webhook"},
            "clusterDNS": [NODE_IP], "clusterDomain": CLUSTER_DOMAIN,
            "resolvConf": str(self._resolv_conf()),
            # No registry: an image garbage-collected here could never be pulled again.
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            # A shared dev machine's disk and memory are not this node's to defend.
            "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "containerRuntimeEndpoint": f"unix://{self.address}",
            "rotateCertificates": False, "serializeImagePulls": False,
            "maxPods": 60,
            "podLogsDir": str(self.dir / "pod-logs"),
        }, indent=2))
        pids["kubelet"] = spawn("kubelet", [
            str(binary), "kubelet", "--config", str(kubelet_config),
            "--kubeconfig", str(kc["kubelet"]), "--root-dir", str(self.kubelet_root),
            "--cert-dir", str(self.dir / "kubelet-pki"), "--node-ip", NODE_IP,
            "--hostname-override", NODE_NAME,
        ])
        proxy_config = self.dir / "kube-proxy.yaml"
        proxy_config.write_text(json.dumps({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "mode": "iptables", "clusterCIDR": POD_CIDR, "hostnameOverride": NODE_NAME,
            "clientConnection": {"kubeconfig": str(kc["kube-proxy"])},
            "bindAddress": NODE_IP,
            "healthzBindAddress": f"127.0.0.1:{free_port()}",
            "metricsBindAddress": f"127.0.0.1:{free_port()}",
            # Leave the host's conntrack sysctls alone (this sandbox may not write them).
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                          "tcpCloseWaitTimeout": "0s"},
            # Only this node's bridge: never rewrite traffic of the host's real interfaces.
            "nodePortAddresses": [f"{NODE_IP}/32"],
        }, indent=2))
        pids["kube-proxy"] = spawn("kube-proxy", [
            str(binary), "kube-proxy", "--config", str(proxy_config)])
        corefile = self.dir / "Corefile"
        self.coredns_ready_port = free_port()  # `up` waits for its /ready
        corefile.write_text(f"""{CLUSTER_DOMAIN}:53 in-addr.arpa:53 {{
    bind {NODE_IP}
    errors
    health 127.0.0.1:{free_port()}
    ready 127.0.0.1:{self.coredns_ready_port}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa {{
        kubeconfig {kc['coredns']} node
        pods insecure
    }}
    cache 5
}}
.:53 {{
    bind {NODE_IP}
    errors
}}
""")
        pids["coredns"] = spawn("coredns", [str(coredns), "-conf", str(corefile)])
        return pids

    def _resolv_conf(self) -> Path:
        """Pods with dnsPolicy Default get this: cluster names only, nothing upstream."""
        path = self.dir / "resolv.conf"
        path.write_text(f"nameserver {NODE_IP}\n")
        return path

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

    def teardown(self, pids: dict[str, int] | None = None) -> None:
        """Stop the node's processes, containers and shims, release its mounts, network
        namespaces, iptables chains and bridge, and put the sysctls back. Safe to repeat, and
        works from the files alone (a crashed `up` may have recorded no pid)."""
        pids = dict(pids or {})
        mine = str(self.dir)
        front = [pid for pid in self._processes(mine)
                 if not self._cmd(pid).startswith(("containerd", "kube-proxy"))]
        _stop([*(pids[c] for c in ("kubelet", "kube-controller-manager", "kube-scheduler",
                                   "coredns") if c in pids), *front])
        netns = self.stop_containers()
        _stop([*([pids["containerd"]] if "containerd" in pids else []),
               *(p for p in self._processes(mine) if self._cmd(p).startswith("containerd"))])
        _stop(self._shims(), timeout=5)
        if self.owned() or not self.owner_file.exists():
            _stop(self._pod_processes(), timeout=2)  # containerd could not kill them
        for path in netns:
            _run("umount", path, check=False)
            Path(path).unlink(missing_ok=True)
        self._unmount_under([self.dir, RUN])
        _stop([*([pids["kube-proxy"]] if "kube-proxy" in pids else []),
               *self._processes(mine)])
        self._remove_iptables_chains()
        for link in _run("ip", "-o", "link", "show", "master", BRIDGE, check=False).stdout \
                .splitlines():
            _run("ip", "link", "del", link.split(":")[1].strip().split("@")[0], check=False)
        _run("ip", "link", "del", BRIDGE, check=False)
        self._remove_pod_cgroups()
        for result in Path("/var/lib/cni/results").glob("tsoracle-*"):
            result.unlink(missing_ok=True)
        for link in Path("/var/log/containers").glob("*.log"):  # the kubelet's fixed folder
            if link.is_symlink() and os.readlink(link).startswith(str(self.dir)):
                link.unlink()
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
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            return ""
        return os.path.basename(argv0.decode(errors="replace"))

    @staticmethod
    def _processes(needle: str) -> list[int]:
        """Live processes whose command line names `needle` (a path of this node's)."""
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            try:
                argv = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if needle.encode() in argv and _alive(int(proc.name)):
                found.append(int(proc.name))
        return found

    @staticmethod
    def _pod_processes() -> list[int]:
        pids = set()
        for procs in Path("/sys/fs/cgroup/pids/kubepods").rglob("cgroup.procs"):
            try:
                pids.update(int(p) for p in procs.read_text().split())
            except OSError:
                continue
        return sorted(pids)

    def _shims(self) -> list[int]:
        """containerd-shim processes started by this node's containerd."""
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"containerd-shim-runc-v2") and \
                    str(self.address).encode() in argv:
                found.append(int(proc.name))
        return found

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
