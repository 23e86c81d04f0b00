"""A real local one-node Kubernetes cluster with PostgreSQL beside it, built from sources.

    tsoracle-dev-cluster up [--no-node] [STATE_DIR]   # ends: export KUBECONFIG=…
    tsoracle-dev-cluster down [STATE_DIR]          # stop; etcd and PostgreSQL data stay
    tsoracle-dev-cluster down --purge [STATE_DIR]  # stop and delete all state
    tsoracle-dev-cluster build                     # only build (and cache) the binaries

(`python -m tsoracle_dev.controlplane.cluster` is the same command.)

etcd, kube-apiserver, the node's components (kube-node: kubelet, kube-proxy, kube-scheduler,
kube-controller-manager) and CoreDNS are built from Go modules (the go.mod files beside this
module), once per version, and cached under ~/.cache/tsoracle. The node (node.py) needs root and
Debian's containerd, runc and CNI plugins (a missing program ends in one line naming its
package: tsoracle_dev.hosttools). `up` is idempotent: it reuses running processes, and says on
stderr what it waits for; the PostgreSQL role's password is random per state folder, kept until
`down --purge`. Every file holding a secret is its owner's alone (0600).

With --no-node (and for the tests' API-server fixture) only etcd and kube-apiserver run, on
loopback: objects are stored and validated, no pod runs, namespaces never finish deleting, and
no default ServiceAccount appears.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

from tsoracle_dev import CHECKOUT, hosttools
from tsoracle_dev.controlplane.node import (
    COREDNS_RBAC,
    COREDNS_VERSION,
    NODE_IP,
    NODE_NAME,
    POD_CIDR,
    SERVICE_CIDR,
    Node,
    NodeError,
    missing_prerequisites,
    write_secret,
)
from tsoracle_dev.kubetools import tools_dir
from tsoracle_dev.localpg import PASSWORD as FIXED_PASSWORD
from tsoracle_dev.localpg import LocalPostgres, free_port, run_when_this_process_exits

HERE = Path(__file__).resolve().parent  # the Go wrapper modules are folders beside this file

# Every version the cluster is built from, in one place.
K8S_VERSION = "v1.35.4"
ETCD_VERSION = "v3.6.16"
VERSIONS = {"etcd": ETCD_VERSION, "kube-apiserver": K8S_VERSION, "kube-node": K8S_VERSION,
            "coredns": COREDNS_VERSION}
CACHE = Path(os.environ.get("TSORACLE_CACHE", Path.home() / ".cache" / "tsoracle"))
# `make dev-cluster` keeps its state here; the docs tests point it elsewhere.
DEFAULT_STATE = Path(os.environ.get("TSORACLE_DEV_CLUSTER_STATE", CHECKOUT / ".dev-cluster"))


def version_ldflags(name: str, version: str) -> list[str]:
    """The -X settings upstream's release build stamps in, so binaries report their version.

    Without them kube-apiserver reports `v0.0.0-master+$Format:%H$` and `kubectl version`
    refuses to parse it.
    """
    if name == "etcd":
        return [f"-X go.etcd.io/etcd/api/v3/version.GitSHA=module-{version}"]
    if name == "coredns":
        return []  # its version is a constant in the module
    major, minor, _ = version.lstrip("v").split(".", 2)
    fields = {"gitVersion": version, "gitMajor": major, "gitMinor": minor,
              "gitCommit": f"module-{version}", "gitTreeState": "clean",
              "buildDate": "1970-01-01T00:00:00Z"}
    return [f"-X {pkg}.{key}={value}"
            for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
            for key, value in fields.items()]


def _recipe(name: str, version: str) -> str:
    """A digest of everything that decides the binary, so a changed recipe rebuilds it."""
    digest = hashlib.sha256(" ".join([hosttools.go_version(),
                                      *version_ldflags(name, version)]).encode())
    for source in sorted((HERE / name).iterdir()):
        digest.update(source.name.encode() + source.read_bytes())
    return digest.hexdigest()[:10]


def build(name: str, version: str) -> Path:
    """Build a control-plane binary from its wrapper module once per version and recipe."""
    out = CACHE / f"{name}-{version}-{_recipe(name, version)}"
    if out.exists():
        return out
    hosttools.need_go(HERE / name)
    CACHE.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}
    print(f"building {name} {version} from Go modules (minutes, once)...", file=sys.stderr)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")  # concurrent builds must not collide
    ldflags = " ".join(["-s", "-w", *version_ldflags(name, version)])
    proc = hosttools.run(["go", "build", "-p", "2", "-trimpath", f"-ldflags={ldflags}", "-o",
                          str(tmp), "."], cwd=HERE / name, env=env)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"go build of {name} {version} failed (exit {proc.returncode}); "
                           "its output is above")
    os.replace(tmp, out)  # atomic: a concurrent build of the same recipe wins or loses whole
    # Earlier recipes of this version are dead weight (a process running one keeps its inode).
    for stale in CACHE.glob(f"{name}-{version}-*"):
        if stale != out and not stale.name.endswith(".tmp"):
            stale.unlink(missing_ok=True)
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a killed child of ours stays a zombie until reaped: that is not alive
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass  # not our child; /proc tells
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _after(stamp: str, since: float) -> bool:
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() >= since


class Progress:
    """What `up` is waiting for, one line per phase (`waiting for etcd... ok`, with the seconds
    when it took a while), so a long start never looks hung. Silent without a stream."""

    SLOW = 3.0  # seconds: a phase this long says how long it took

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out

    def _write(self, text: str) -> None:
        if self.out is not None:
            self.out.write(text)
            self.out.flush()

    def note(self, line: str) -> None:
        self._write(line + "\n")

    @contextlib.contextmanager
    def phase(self, what: str) -> Iterator[None]:
        started = time.monotonic()
        self._write(f"waiting for {what}...")
        try:
            yield
        except BaseException:
            self._write(f" failed after {time.monotonic() - started:.0f} s\n")
            raise
        took = time.monotonic() - started
        self._write(f" ok ({took:.0f} s)\n" if took >= self.SLOW else " ok\n")


class ControlPlane:
    def __init__(self, state: str | os.PathLike[str] = DEFAULT_STATE, *,
                 postgres: bool = True, node: bool = False,
                 progress: TextIO | None = None) -> None:
        """`progress`: where `up` says what it waits for (the command passes stderr)."""
        self.with_postgres = postgres
        self.with_node = node
        self.progress = Progress(progress)
        self.state = Path(state).resolve()
        self.info_file = self.state / "cluster.json"
        self.kubeconfig = self.state / "kubeconfig"
        self.node = Node(self.state)
        # With a node, pods reach PostgreSQL and the API server at the node's address.
        self.host = NODE_IP if node else "127.0.0.1"
        self.pg = LocalPostgres(self.state / "pg", host=self.host,
                                extra_listen=((NODE_IP, POD_CIDR),) if node else ())

    def _secret(self, name: str, make: Callable[[], str]) -> str:
        """The secret `name` of this state folder (pki/, 0700), made once by `make`."""
        path = self.state / "pki" / name
        if not path.exists():
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_secret(path, make())
        return path.read_text().strip()

    def admin_token(self) -> str:
        """The admin's bearer token, random per state folder (it may start privileged pods)."""
        return self._secret("admin-token", lambda: secrets.token_hex(16))

    def postgres_password(self) -> str:
        """The PostgreSQL role's password: random per state folder, made with the folder's
        database and kept until `down --purge` (the database and Secrets made from its URL
        keep working across `down` and `up`)."""
        def make() -> str:
            if (self.pg.data / "PG_VERSION").exists():
                # A database made before passwords were random: its role has the fixed one.
                self.progress.note("note: this dev cluster's PostgreSQL keeps the fixed "
                                   "password it was made with; `make dev-cluster-reset` (which "
                                   "deletes its data) gives it a random one")
                return FIXED_PASSWORD
            return secrets.token_hex(16)

        return self._secret("postgres-password", make)

    def _save_info(self, info: dict[str, Any]) -> None:
        write_secret(self.info_file, json.dumps(info))  # it holds PostgreSQL's URL

    def info(self) -> dict[str, object]:
        return json.loads(self.info_file.read_text()) if self.info_file.exists() else {}

    def healthy(self) -> bool:
        info = self.info()
        if not info or not all(_alive(int(p)) for p in info.get("pids", {}).values()):
            return False
        if bool(info.get("node")) != self.with_node:
            return False
        return self._ready(int(info["apiserver_port"]), timeout=2)

    def _node_lock(self) -> contextlib.AbstractContextManager[None]:
        uses_node = self.with_node or self.info().get("node") or self.node.owned()
        return Node.locked() if uses_node and os.geteuid() == 0 else contextlib.nullcontext()

    def up(self) -> Path:
        if self.with_node and (problems := missing_prerequisites()):
            raise NodeError("cannot start the node: " + "; ".join(problems))
        binaries = {name: build(name, version) for name, version in VERSIONS.items()
                    if self.with_node or name in ("etcd", "kube-apiserver")}
        if self.with_postgres:
            self.pg.password = self.postgres_password()
        with self._node_lock():
            if self.healthy() and self.kubeconfig.exists():
                self.progress.note(f"the dev cluster of {self.state} already runs")
                if self.with_postgres:
                    with self.progress.phase("PostgreSQL"):
                        self.pg.start()
                return self.kubeconfig
            self._down()  # tears a node down only if this folder owns it
            if self.with_node:
                self.node.claim()
            return self._up(binaries)

    def _up(self, binaries: dict[str, Path]) -> Path:
        self.state.mkdir(parents=True, exist_ok=True)
        if self.with_node:
            self.node.network_up()
        pg_url = None
        if self.with_postgres:
            with self.progress.phase("PostgreSQL"):
                pg_url = self.pg.start()
        pki = self.state / "pki"
        pki.mkdir(exist_ok=True)
        pki.chmod(0o700)  # keys and tokens
        # The API server signs its own serving certificate for its address, once.
        advertised = pki / "advertised-address"
        if advertised.exists() and advertised.read_text() != self.host:
            for name in ("apiserver.crt", "apiserver.key"):
                (pki / name).unlink(missing_ok=True)
        advertised.write_text(self.host)
        if not (pki / "sa.key").exists():
            hosttools.need("openssl")
            hosttools.run(["openssl", "genrsa", "-out", str(pki / "sa.key"), "2048"],
                          check=True, capture_output=True)
            hosttools.run(["openssl", "rsa", "-in", str(pki / "sa.key"), "-pubout", "-out",
                           str(pki / "sa.pub")], check=True, capture_output=True)
        tokens = self.node.prepare_pki() if self.with_node else {}
        users = [f'{self.admin_token()},admin,admin,"system:masters"']
        if tokens:
            users += self.node.token_lines(tokens)
        write_secret(pki / "tokens.csv", "\n".join(users) + "\n")
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        logs = self.state / "logs"
        logs.mkdir(exist_ok=True)
        etcd = self._spawn("etcd", [
            str(binaries["etcd"]), "--name", "dev", "--data-dir", str(self.state / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-cluster", f"dev=http://127.0.0.1:{peer_port}",
            "--unsafe-no-fsync", "--log-level", "warn",
        ], logs)
        with self.progress.phase("etcd"):
            self._wait_etcd(etcd_port, etcd, logs)
        self._apiserver_argv = [
            str(binaries["kube-apiserver"]), "--etcd-servers", f"http://127.0.0.1:{etcd_port}",
            "--cert-dir", str(pki), "--secure-port", str(api_port),
            "--bind-address", self.host, "--advertise-address", self.host,
            "--service-cluster-ip-range", SERVICE_CIDR,
            "--authorization-mode", "Node,RBAC" if self.with_node else "RBAC",
            "--token-auth-file", str(pki / "tokens.csv"),
            "--service-account-issuer", "https://kubernetes.default.svc",
            "--service-account-key-file", str(pki / "sa.pub"),
            "--service-account-signing-key-file", str(pki / "sa.key"),
            "--api-audiences", "https://kubernetes.default.svc",
            "--allow-privileged=true", "--enable-priority-and-fairness=false",
        ]
        if self.with_node:
            self._apiserver_argv += self.node.apiserver_flags()
        apiserver = self._spawn("kube-apiserver", self._apiserver_argv, logs)
        info: dict[str, Any] = {
            "pids": {"etcd": etcd, "kube-apiserver": apiserver}, "node": self.with_node,
            "host": self.host, "apiserver_port": api_port, "etcd_port": etcd_port,
            "postgres_url": pg_url, "apiserver_argv": self._apiserver_argv,
        }
        self._save_info(info)
        with self.progress.phase("kube-apiserver"):
            ready = self._ready(api_port, timeout=120, pid=apiserver)
            if not ready:
                tail = (logs / "kube-apiserver.log").read_text()[-3000:]
                self._down()
                raise RuntimeError(f"kube-apiserver did not become ready:\n{tail}")
        self._write_kubeconfig(api_port, pki / "apiserver.crt")
        if self.with_node:
            try:
                self._start_node(info, binaries, tokens, logs)
            except BaseException:
                self._down()
                raise
        return self.kubeconfig

    def _start_node(self, info: dict[str, Any], binaries: dict[str, Path],
                    tokens: dict[str, str], logs: Path) -> None:
        # Here, not at the top: only a node needs the images, and they import this module.
        from tsoracle_dev import images

        def spawn(name: str, argv: list[str]) -> int:
            pid = self._spawn(name, argv, logs)
            info["pids"][name] = pid  # recorded at once: a failed start still cleans up
            self._save_info(info)
            return pid

        for item in COREDNS_RBAC["items"]:
            self._apply(item)
        with self.progress.phase("containerd"):
            self.node.start_containerd(spawn, images.PAUSE_IMAGE)
        info["containerd_address"] = str(self.node.address)  # where `make images` imports
        with self.progress.phase("the pause image (build and import)"):
            images.import_archive(images.build_pause(), str(self.node.address))
        self.node.start_components(spawn, binaries["kube-node"], binaries["coredns"],
                                   self._server(), tokens, free_port)
        self._wait_node(logs)

    def restart_apiserver(self, down_seconds: float = 3.0) -> None:
        """Kill kube-apiserver (no drain) and start it again on the same port: what clients
        see during an upgrade or a crash of the control plane."""
        info = self.info()
        pid = int(info["pids"]["kube-apiserver"])
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
        while _alive(pid):
            time.sleep(0.05)
        time.sleep(down_seconds)
        info["pids"]["kube-apiserver"] = self._spawn(
            "kube-apiserver", list(info["apiserver_argv"]), self.state / "logs")
        self._save_info(info)
        if not self._ready(int(info["apiserver_port"]), timeout=120):
            raise RuntimeError("kube-apiserver did not come back")

    def _server(self) -> str:
        return f"https://{self.host}:{self.info()['apiserver_port']}"

    def _api(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """A call as the admin, verified against the API server's own certificate."""
        ctx = ssl.create_default_context(cafile=str(self.state / "pki" / "apiserver.crt"))
        req = urllib.request.Request(
            self._server() + path, method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"Bearer {self.admin_token()}",
                     "Content-Type": "application/json"})
        with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
            return json.loads(resp.read() or b"null")

    def _apply(self, obj: dict[str, Any]) -> None:
        plural = {"ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings"}
        path = f"/apis/rbac.authorization.k8s.io/v1/{plural[obj['kind']]}"
        try:
            self._api("POST", path, obj)
        except urllib.error.HTTPError as err:
            if err.code != 409:  # already there from an earlier `up`
                raise

    def _wait_etcd(self, port: int, pid: int, logs: Path, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _alive(pid):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if json.loads(r.read()).get("health") == "true":
                        return
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        tail = (logs / "etcd.log").read_text()[-3000:]
        self._down()
        raise RuntimeError(f"etcd did not become healthy:\n{tail}")

    def _wait_node(self, logs: Path, timeout: float = 180) -> None:
        """Until this kubelet has reported the node Ready (a Ready condition from before a
        `down` does not count), the default ServiceAccount exists (the controller-manager
        works) and CoreDNS has read the cluster's Services."""
        since = time.time() - 2  # the API server stamps with this machine's clock
        deadline = time.monotonic() + timeout

        def node_ready() -> bool:
            node = self._api("GET", f"/api/v1/nodes/{NODE_NAME}")
            return any(c["type"] == "Ready" and c["status"] == "True"
                       and _after(c["lastHeartbeatTime"], since)
                       for c in node["status"].get("conditions", []))

        def service_account() -> bool:
            self._api("GET", "/api/v1/namespaces/default/serviceaccounts/default")
            return True

        def coredns() -> bool:
            url = f"http://127.0.0.1:{self.node.coredns_ready_port}/ready"
            with urllib.request.urlopen(url, timeout=2) as resp:
                return resp.status == 200

        for what, check, log in (
                ("the node's kubelet (node Ready)", node_ready, "kubelet"),
                ("kube-controller-manager (the default ServiceAccount)", service_account,
                 "kube-controller-manager"),
                ("coredns", coredns, "coredns")):
            with self.progress.phase(what):
                self._until(what, check, deadline, timeout, logs, log)

    def _until(self, what: str, check: Callable[[], bool], deadline: float, timeout: float,
               logs: Path, log: str) -> None:
        """Poll `check` until it holds; a component that exits or the deadline ends it."""
        while time.monotonic() < deadline:
            dead = [name for name, pid in self.info()["pids"].items() if not _alive(int(pid))]
            if dead:
                tail = (logs / f"{dead[0]}.log").read_text()[-2000:]
                raise NodeError(f"{dead[0]} exited; the end of its log:\n{tail}")
            try:
                if check():
                    return
            except (OSError, urllib.error.HTTPError, KeyError):
                pass
            time.sleep(0.5)
        tail = (logs / f"{log}.log").read_text()[-1500:] if (logs / f"{log}.log").exists() else ""
        raise NodeError(f"timed out after {timeout:.0f} s waiting for {what}:\n--- {log}.log\n"
                        f"{tail}")

    def _spawn(self, name: str, argv: list[str], logs: Path) -> int:
        with open(logs / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        return proc.pid

    def _ready(self, port: int, timeout: float, pid: int | None = None) -> bool:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # only a readiness poll; clients verify the CA
        deadline = time.monotonic() + timeout
        while True:
            req = urllib.request.Request(f"https://{self.host}:{port}/readyz",
                                         headers={"Authorization": f"Bearer {self.admin_token()}"})
            try:
                with urllib.request.urlopen(req, context=ctx, timeout=2) as resp:
                    if resp.status == 200:
                        return True
            except OSError:
                pass
            if time.monotonic() > deadline or pid is not None and not _alive(pid):
                return False
            time.sleep(0.5)

    def _write_kubeconfig(self, port: int, ca: Path) -> None:
        write_secret(self.kubeconfig, json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "tsoracle-dev",
            "clusters": [{"name": "tsoracle-dev", "cluster": {
                "server": f"https://{self.host}:{port}", "certificate-authority": str(ca)}}],
            "users": [{"name": "admin", "user": {"token": self.admin_token()}}],
            "contexts": [{"name": "tsoracle-dev",
                          "context": {"cluster": "tsoracle-dev", "user": "admin"}}],
        }, indent=2))

    def down(self, purge: bool = False) -> None:
        """Stop every process; `purge` also deletes etcd's and PostgreSQL's data and the keys,
        so the next `up` starts an empty cluster (no CRD or release left from earlier runs)."""
        with self._node_lock():
            self._down(purge)

    def _down(self, purge: bool = False) -> None:
        info = self.info()
        # Only the node's owner tears it down: a stale folder must not stop another's node.
        if self.node.owned():
            self.node.teardown({k: int(v) for k, v in info.get("pids", {}).items()})
        # A recorded pid is ours only while its command line still names this folder.
        pids = [int(p) for p in info.get("pids", {}).values()
                if str(self.state).encode() in _cmdline(int(p))]
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5  # the API server drains for long; tests need no drain
        for pid in pids:
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if self.info_file.exists():
            self.info_file.unlink()
        if self.with_postgres:
            self.pg.stop()
        if purge:
            self.pg.destroy()  # its files may live outside the state folder (tsoracle_dev.localpg)
            shutil.rmtree(self.state, ignore_errors=True)

    def purge_when_this_process_exits(self) -> None:
        """However this process ends (an interrupt, a crash, SIGKILL), the cluster goes too."""
        run_when_this_process_exits([sys.executable, "-m", "tsoracle_dev.controlplane.cluster",
                                     "down", "--purge", str(self.state)])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("up", "down", "build"):
        print(__doc__, file=sys.stderr)
        return 2
    if argv[0] == "build":
        try:
            for name, version in VERSIONS.items():
                print(build(name, version))
        except RuntimeError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
        return 0
    flags = {"--purge": "down", "--no-node": "up"}
    given = [a for a in argv[1:] if a in flags]
    rest = [a for a in argv[1:] if a not in flags]
    if any(flags[f] != argv[0] for f in given) or any(a.startswith("-") for a in rest) \
            or len(rest) > 1:
        print(__doc__, file=sys.stderr)
        return 2
    cp = ControlPlane(rest[0] if rest else DEFAULT_STATE, node="--no-node" not in given,
                      progress=sys.stderr)
    if argv[0] == "down":
        cp.down(purge="--purge" in given)
        print(f"dev cluster stopped{'; its state deleted' if '--purge' in given else ''}")
        return 0
    try:
        kubeconfig = cp.up()
    except RuntimeError as err:  # NodeError, and a component that did not start
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"postgres: {cp.info()['postgres_url']}")
    # The kubectl and helm this cluster is tested with (tsoracle_dev.kubetools), for a shell
    # that evaluates these lines (docs/operator.md's first command).
    print(f'export PATH="{tools_dir()}:$PATH"')
    print(f"export KUBECONFIG={kubeconfig}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
