"""One type per component of the dev cluster: its flags, the files it reads and how `up` knows
it serves. The control plane (cluster.py) starts them in order; the node (node.py) owns the
machine-wide parts (network, certificates, teardown)."""

from __future__ import annotations

import datetime as dt
import json
import ssl
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tsoracle_dev import hosttools
from tsoracle_dev.controlplane.node import (
    BRIDGE,
    CLUSTER_DOMAIN,
    CNI_BIN,
    NODE_IP,
    NODE_NAME,
    POD_CIDR,
    RUN,
    SERVICE_CIDR,
    Node,
    write_secret,
)
from tsoracle_dev.controlplane.process import Process
from tsoracle_dev.localpg import free_port

Api = Callable[[str], Any]  # GET a path as the cluster's admin


class Etcd(Process):
    name = what = "etcd"

    def __init__(self, binary: Path, data: Path, logs: Path) -> None:
        self.port, peer = free_port(), free_port()
        super().__init__([
            str(binary), "--name", "dev", "--data-dir", str(data),
            "--listen-client-urls", f"http://127.0.0.1:{self.port}",
            "--advertise-client-urls", f"http://127.0.0.1:{self.port}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"dev=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync", "--log-level", "warn",
        ], logs)

    def ready(self) -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
            return bool(json.loads(r.read()).get("health") == "true")


class APIServer(Process):
    name = what = "kube-apiserver"
    timeout = 120.0
    stop_timeout = 5.0  # it drains for long on SIGTERM; nothing here needs the drain

    def __init__(self, argv: list[str], logs: Path, host: str, port: int, token: str,
                 pid: int | None = None) -> None:
        """`argv` as `flags` made it (a restart reuses the recorded one)."""
        super().__init__(argv, logs, pid)
        self.host, self.port, self.token = host, port, token

    @staticmethod
    def flags(binary: Path, etcd_port: int, port: int, host: str, pki: Path,
              node_flags: list[str]) -> list[str]:
        """`node_flags`: the node's (Node.apiserver_flags), empty without a node."""
        return [
            str(binary), "--etcd-servers", f"http://127.0.0.1:{etcd_port}",
            "--cert-dir", str(pki), "--secure-port", str(port),
            "--bind-address", host, "--advertise-address", host,
            "--service-cluster-ip-range", SERVICE_CIDR,
            "--authorization-mode", "Node,RBAC" if node_flags else "RBAC",
            "--token-auth-file", str(pki / "tokens.csv"),
            "--service-account-issuer", "https://kubernetes.default.svc",
            "--service-account-key-file", str(pki / "sa.pub"),
            "--service-account-signing-key-file", str(pki / "sa.key"),
            "--api-audiences", "https://kubernetes.default.svc",
            "--allow-privileged=true", "--enable-priority-and-fairness=false",
            *node_flags,
        ]

    def ready(self) -> bool:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # only a readiness poll; clients verify the CA
        req = urllib.request.Request(f"https://{self.host}:{self.port}/readyz",
                                     headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(req, context=ctx, timeout=2) as resp:
            return bool(resp.status == 200)


class Containerd(Process):
    """Debian's containerd, with the node's CNI bridge and no registry."""

    name = what = "containerd"
    timeout = 30.0

    def __init__(self, node: Node, sandbox_image: str, logs: Path) -> None:
        self.node = node
        self.sandbox_image = sandbox_image
        self.config = node.dir / "containerd.toml"
        super().__init__(["containerd", "--config", str(self.config)], logs)

    def prepare(self) -> None:
        node = self.node
        node.containerd_root.mkdir(parents=True, exist_ok=True)
        cni_conf = node.dir / "cni"
        cni_conf.mkdir(parents=True, exist_ok=True)
        (cni_conf / "10-tsoracle.conflist").write_text(json.dumps({
            "cniVersion": "0.4.0", "name": "tsoracle", "plugins": [
                {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False,
                 "hairpinMode": True,
                 "ipam": {"type": "host-local", "dataDir": str(node.dir / "ipam"),
                          "ranges": [[{"subnet": POD_CIDR, "gateway": NODE_IP}]],
                          "routes": [{"dst": "0.0.0.0/0"}]}},
                {"type": "loopback"}]}, indent=2))
        # No registry: a pull of anything not imported fails at once on a closed local port,
        # rather than reaching out to the Internet.
        hosts = node.dir / "registry-hosts"
        (hosts / "_default").mkdir(parents=True, exist_ok=True)
        (hosts / "_default" / "hosts.toml").write_text('server = "http://127.0.0.1:9"\n')
        self.config.write_text(f"""version = 2
root = "{node.containerd_root}"
state = "{RUN / 'state'}"
[grpc]
  address = "{node.address}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{node.dir / 'opt'}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{self.sandbox_image}"
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
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{hosts}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{cni_conf}"
""")

    def ready(self) -> bool:
        return hosttools.run(["ctr", "--address", str(self.node.address), "version"],
                             capture_output=True).returncode == 0

    def stop(self) -> None:
        # Its containers first: only a running containerd can say which network namespaces
        # they pinned.
        self.node.stop_runtime([self.pid] if self.pid is not None else [])


class NodeComponent(Process):
    """A component that calls the API server as its own user (node.USERS), with a kubeconfig
    written for it. `binary`: kube-node (the component is its subcommand) or CoreDNS's;
    `api` GETs a path as the admin, for the readiness of those that need it."""

    built_from = "kube-node"  # the Go module (cluster.VERSIONS) of its binary

    def __init__(self, binary: Path, node: Node, server: str, token: str, logs: Path,
                 api: Api) -> None:
        self.node, self.server, self.token, self.api = node, server, token, api
        super().__init__(self.flags(str(binary), str(self.kubeconfig)), logs)

    @property
    def kubeconfig(self) -> Path:
        return self.node.dir / f"{self.name}.kubeconfig"

    def flags(self, binary: str, kubeconfig: str) -> list[str]:
        raise NotImplementedError

    def prepare(self) -> None:
        write_secret(self.kubeconfig, json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "node",
            "clusters": [{"name": "dev", "cluster": {
                "server": self.server,
                "certificate-authority": str(self.node.pki / "apiserver.crt")}}],
            "users": [{"name": self.name, "user": {"token": self.token}}],
            "contexts": [{"name": "node", "context": {"cluster": "dev", "user": self.name}}],
        }))


class ControllerManager(NodeComponent):
    name = "kube-controller-manager"
    what = "kube-controller-manager (the default ServiceAccount)"
    timeout = 180.0

    def flags(self, binary: str, kubeconfig: str) -> list[str]:
        pki = self.node.pki
        return [
            binary, self.name, "--kubeconfig", kubeconfig,
            "--bind-address", "127.0.0.1", "--secure-port", str(free_port()),
            "--leader-elect=false", "--use-service-account-credentials=true",
            "--service-account-private-key-file", str(pki / "sa.key"),
            "--root-ca-file", str(pki / "apiserver.crt"),
            "--service-cluster-ip-range", SERVICE_CIDR,
            # Ask the API server who may do what, as every controller runs under its own
            # ServiceAccount (kubeadm does the same).
            "--authentication-kubeconfig", kubeconfig, "--authorization-kubeconfig", kubeconfig,
        ]

    def ready(self) -> bool:
        self.api("/api/v1/namespaces/default/serviceaccounts/default")  # NotFound until then
        return True


class Scheduler(NodeComponent):
    name = "kube-scheduler"

    def flags(self, binary: str, kubeconfig: str) -> list[str]:
        return [
            binary, self.name, "--kubeconfig", kubeconfig,
            "--bind-address", "127.0.0.1", "--secure-port", str(free_port()),
            "--leader-elect=false",
            "--authentication-kubeconfig", kubeconfig, "--authorization-kubeconfig", kubeconfig,
        ]


class Kubelet(NodeComponent):
    name = "kubelet"
    what = "the node's kubelet (node Ready)"
    timeout = 180.0
    since = 0.0  # when it started; the API server stamps with this machine's clock

    def flags(self, binary: str, kubeconfig: str) -> list[str]:
        return [
            binary, self.name, "--config", str(self.node.dir / "kubelet.yaml"),
            "--kubeconfig", kubeconfig, "--root-dir", str(self.node.kubelet_root),
            "--cert-dir", str(self.node.dir / "kubelet-pki"), "--node-ip", NODE_IP,
            "--hostname-override", NODE_NAME,
        ]

    def prepare(self) -> None:
        super().prepare()
        self.since = time.time() - 2
        node = self.node
        node.kubelet_root.mkdir(parents=True, exist_ok=True)
        resolv = node.dir / "resolv.conf"  # dnsPolicy Default: cluster names, nothing upstream
        resolv.write_text(f"nameserver {NODE_IP}\n")
        (node.dir / "kubelet.yaml").write_text(json.dumps({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            # The host runs cgroup v1 without systemd as PID 1.
            "failCgroupV1": False, "cgroupDriver": "cgroupfs", "failSwapOn": False,
            "address": NODE_IP, "port": free_port(), "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": free_port(),
            "authentication": {"anonymous": {"enabled": False},
                               "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(node.pki / "kubelet-client-ca.crt")}},
            "authorization": {"mode": "Webhook"},
            "clusterDNS": [NODE_IP], "clusterDomain": CLUSTER_DOMAIN,
            "resolvConf": str(resolv),
            # No registry: an image garbage-collected here could never be pulled again.
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            # A shared dev machine's disk and memory are not this node's to defend.
            "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "containerRuntimeEndpoint": f"unix://{node.address}",
            "rotateCertificates": False, "serializeImagePulls": False,
            "maxPods": 60,
            "podLogsDir": str(node.dir / "pod-logs"),
        }, indent=2))

    def ready(self) -> bool:
        """This kubelet reported the node Ready (a Ready condition from before a `down` does
        not count)."""
        node = self.api(f"/api/v1/nodes/{NODE_NAME}")
        return any(c["type"] == "Ready" and c["status"] == "True" and dt.datetime.fromisoformat(
                       c["lastHeartbeatTime"].replace("Z", "+00:00")).timestamp()
                   >= self.since for c in node["status"].get("conditions", []))


class KubeProxy(NodeComponent):
    name = "kube-proxy"

    def flags(self, binary: str, kubeconfig: str) -> list[str]:
        return [binary, self.name, "--config", str(self.node.dir / "kube-proxy.yaml")]

    def prepare(self) -> None:
        super().prepare()
        (self.node.dir / "kube-proxy.yaml").write_text(json.dumps({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "mode": "iptables", "clusterCIDR": POD_CIDR, "hostnameOverride": NODE_NAME,
            "clientConnection": {"kubeconfig": str(self.kubeconfig)},
            "bindAddress": NODE_IP,
            "healthzBindAddress": f"127.0.0.1:{free_port()}",
            "metricsBindAddress": f"127.0.0.1:{free_port()}",
            # Leave the host's conntrack sysctls alone (this sandbox may not write them).
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                          "tcpCloseWaitTimeout": "0s"},
            # Only this node's bridge: never rewrite traffic of the host's real interfaces.
            "nodePortAddresses": [f"{NODE_IP}/32"],
        }, indent=2))


class CoreDNS(NodeComponent):
    """Cluster names on the node's address; nothing upstream."""

    name = what = built_from = "coredns"
    timeout = 180.0
    # Its user is none the bootstrap RBAC knows: `up` applies these first.
    RBAC = [
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
    ]
    ready_port = 0  # its /ready, chosen when it starts

    def flags(self, binary: str, kubeconfig: str) -> list[str]:
        return [binary, "-conf", str(self.node.dir / "Corefile")]

    def prepare(self) -> None:
        super().prepare()
        self.ready_port = free_port()
        (self.node.dir / "Corefile").write_text(f"""{CLUSTER_DOMAIN}:53 in-addr.arpa:53 {{
    bind {NODE_IP}
    errors
    health 127.0.0.1:{free_port()}
    ready 127.0.0.1:{self.ready_port}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa {{
        kubeconfig {self.kubeconfig} node
        pods insecure
    }}
    cache 5
}}
.:53 {{
    bind {NODE_IP}
    errors
}}
""")

    def ready(self) -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ready_port}/ready", timeout=2) as r:
            return bool(r.status == 200)
