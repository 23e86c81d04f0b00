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
package: tsoracle_dev.hosttools). Each component is a type of its own (components.py, on
process.py's one process abstraction); `up` starts them in order, and if one fails, stops those
started in reverse order. `up` is idempotent: it reuses running processes, and says on
stderr what it waits for; the PostgreSQL role's password is random per state folder, kept until
`down --purge`. Every file holding a secret is its owner's alone (0600).

With --no-node (and for the tests' API-server fixture) only etcd and kube-apiserver run, on
loopback: objects are stored and validated, no pod runs, namespaces never finish deleting, and
no default ServiceAccount appears.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import secrets
import shutil
import signal
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

from tsoracle_dev import CHECKOUT, hosttools
from tsoracle_dev.controlplane.components import (
    APIServer,
    Containerd,
    ControllerManager,
    CoreDNS,
    Etcd,
    Kubelet,
    KubeProxy,
    Scheduler,
)
from tsoracle_dev.controlplane.node import (
    NODE_IP,
    POD_CIDR,
    Node,
    NodeError,
    missing_prerequisites,
    write_secret,
)
from tsoracle_dev.controlplane.process import Process, Started, StartError, alive, cmdline, stop
from tsoracle_dev.kubetools import tools_dir
from tsoracle_dev.localpg import PASSWORD as FIXED_PASSWORD
from tsoracle_dev.localpg import LocalPostgres, free_port, run_when_this_process_exits

HERE = Path(__file__).resolve().parent  # the Go wrapper modules are folders beside this file

# Every version the cluster is built from, in one place.
K8S_VERSION = "v1.35.4"
ETCD_VERSION = "v3.6.16"
COREDNS_VERSION = "v1.14.7"
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
        self.logs = self.state / "logs"
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

    def _record(self, info: dict[str, Any], proc: Process) -> None:
        info["pids"][proc.name] = proc.pid  # at once: a failed start still cleans up
        self._save_info(info)

    def info(self) -> dict[str, Any]:
        return json.loads(self.info_file.read_text()) if self.info_file.exists() else {}

    def _apiserver(self, info: dict[str, Any]) -> APIServer:
        """The recorded kube-apiserver."""
        return APIServer(list(info["apiserver_argv"]), self.logs, self.host,
                         int(info["apiserver_port"]), self.admin_token(),
                         pid=int(info["pids"]["kube-apiserver"]))

    def healthy(self) -> bool:
        info = self.info()
        if not info or not all(alive(int(p)) for p in info.get("pids", {}).values()):
            return False
        if bool(info.get("node")) != self.with_node or "kube-apiserver" not in info["pids"]:
            return False
        try:
            self._apiserver(info).wait_ready(timeout=2)
        except StartError:
            return False
        return True

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
        """Start everything in order; on any failure, what started stops in reverse order and
        the node and PostgreSQL go down (`_down`) before the error goes on."""
        self.state.mkdir(parents=True, exist_ok=True)
        info: dict[str, Any] = {"pids": {}, "node": self.with_node, "host": self.host,
                                "postgres_url": None}
        started = Started(record=lambda proc: self._record(info, proc),
                          phase=self.progress.phase)
        try:
            if self.with_node:
                self.node.network_up()
            if self.with_postgres:
                with self.progress.phase("PostgreSQL"):
                    info["postgres_url"] = self.pg.start()
            tokens = self._prepare_pki()
            etcd = Etcd(binaries["etcd"], self.state / "etcd", self.logs)
            api_port = free_port()
            argv = APIServer.flags(binaries["kube-apiserver"], etcd.port, api_port, self.host,
                                   self.state / "pki",
                                   self.node.apiserver_flags() if self.with_node else [])
            apiserver = APIServer(argv, self.logs, self.host, api_port, self.admin_token())
            info.update(apiserver_port=api_port, etcd_port=etcd.port, apiserver_argv=argv)
            started.start(etcd)
            started.start(apiserver)
            self._write_kubeconfig(api_port, self.state / "pki" / "apiserver.crt")
            if self.with_node:
                self._start_node(started, info, binaries, tokens)
        except BaseException:
            started.stop()
            self._down()
            raise
        return self.kubeconfig

    def _prepare_pki(self) -> dict[str, str]:
        """Keys and tokens (pki/, 0700); returns the node's component -> token."""
        pki = self.state / "pki"
        pki.mkdir(exist_ok=True)
        pki.chmod(0o700)
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
        return tokens

    def _start_node(self, started: Started, info: dict[str, Any], binaries: dict[str, Path],
                    tokens: dict[str, str]) -> None:
        # Here, not at the top: only a node needs the images, and they import this module.
        from tsoracle_dev import images

        for item in CoreDNS.RBAC:
            self._apply(item)
        info["containerd_address"] = str(self.node.address)  # where `make images` imports
        started.start(Containerd(self.node, images.PAUSE_IMAGE, self.logs))
        with self.progress.phase("the pause image (build and import)"):
            images.import_archive(images.build_pause(), str(self.node.address))
        api = functools.partial(self._api, "GET")
        # Side by side; `up` waits for them in this order (scheduler and proxy: no wait).
        started.start(*(kind(binaries[kind.built_from], self.node, self._server(),
                             tokens[kind.name], self.logs, api)
                        for kind in (Kubelet, KubeProxy, ControllerManager, Scheduler, CoreDNS)))

    def restart_apiserver(self, down_seconds: float = 3.0) -> None:
        """Kill kube-apiserver (no drain) and start it again on the same port: what clients
        see during an upgrade or a crash of the control plane."""
        info = self.info()
        apiserver = self._apiserver(info)
        if apiserver.alive():
            os.kill(int(info["pids"]["kube-apiserver"]), signal.SIGKILL)
        while apiserver.alive():
            time.sleep(0.05)
        time.sleep(down_seconds)
        apiserver.spawn()
        self._record(info, apiserver)
        apiserver.wait_ready()

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
        stop([int(p) for p in info.get("pids", {}).values()
              if str(self.state).encode() in cmdline(int(p))],
             timeout=5)  # the API server drains for long; tests need no drain
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
