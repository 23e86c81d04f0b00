"""Driving a real API server from tests and benches: kubectl, helm, waiting, the operator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from tsoracle.resource import GROUP, PLURAL, VERSION
from tsoracle_dev.controlplane.node import write_secret
from tsoracle_dev.localpg import free_port


class Kube:
    def __init__(self, kubeconfig: Path, tools: Path, plane: Any = None) -> None:
        self.kubeconfig = kubeconfig
        self.tools = tools
        self.plane = plane  # the local ControlPlane, when the tests started one
        self._objects: Any = None  # the client's CustomObjectsApi, made on first use

    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None,
                kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
        env = self.env()
        if kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig)
        proc = subprocess.run([str(self.tools / "kubectl"), *args], capture_output=True,
                              text=True, env=env, input=stdin, timeout=120)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {proc.stderr}")
        return proc

    def helm(self, *args: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([str(self.tools / "helm"), *args], capture_output=True, text=True,
                              env=self.env(), timeout=300)
        if proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed: {proc.stderr}")
        return proc

    def backend_secret(self, ns: str, name: str, url: str, *, label: bool = True) -> None:
        """A Secret holding a backend URL, opted in for the operator (unless label=False)."""
        self.kubectl("-n", ns, "create", "secret", "generic", name, f"--from-literal=url={url}")
        if label:
            self.kubectl("-n", ns, "label", "secret", name, "tsoracle.io/backend=true")

    def new_namespace(self, prefix: str = "t") -> str:
        # Without kube-controller-manager namespaces never finish deleting: use fresh ones.
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        self.kubectl("create", "namespace", name)
        return name

    def get(self, namespace: str, kind: str, name: str) -> dict[str, Any]:
        return json.loads(self.kubectl("-n", namespace, "get", kind, name, "-o", "json").stdout)

    def tso(self, namespace: str, name: str) -> dict[str, Any]:
        # The Kubernetes client, not kubectl: wait_tso polls this five times a second, and each
        # kubectl costs a fork and 65 ms of CPU (1,600 of them in a suite run; issue 33).
        try:
            if self._objects is None:
                from kubernetes import client, config

                self._objects = client.CustomObjectsApi(
                    config.new_client_from_config(config_file=str(self.kubeconfig)))
            # kubectl's own limit was the 120 s of Kube.kubectl: a server that accepts and
            # never answers must fail the poll, not hang it.
            found = self._objects.get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, _request_timeout=(5, 30))
        except client_errors() as exc:
            raise AssertionError(f"reading timestamporacle {namespace}/{name} failed: "
                                 f"{exc}") from None
        return dict(found)

    def wait_tso(self, namespace: str, name: str, predicate: Any, timeout: float = 60,
                 what: str = "condition") -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        obj: dict[str, Any] = {}
        while time.monotonic() < deadline:
            obj = self.tso(namespace, name)
            if predicate(obj):
                return obj
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}: {json.dumps(obj.get('status'))}")

    def events(self, namespace: str, reason: str | None = None) -> list[dict[str, Any]]:
        items = json.loads(self.kubectl("-n", namespace, "get", "events", "-o",
                                        "json").stdout)["items"]
        return [e for e in items if reason is None or e.get("reason") == reason]

    def token_kubeconfig(self, namespace: str, sa: str, out: Path) -> Path:
        """A kubeconfig for a ServiceAccount, its token minted with the TokenRequest API."""
        token = self.kubectl("-n", namespace, "create", "token", sa, "--duration",
                             "2h").stdout.strip()
        cfg = json.loads(self.kubectl("config", "view", "--raw", "-o", "json").stdout)
        cfg["users"] = [{"name": sa, "user": {"token": token}}]
        for ctx in cfg["contexts"]:
            ctx["context"]["user"] = sa
        write_secret(out, json.dumps(cfg))  # it holds the token
        return out


def client_errors() -> tuple[type[Exception], ...]:
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config import ConfigException
    from urllib3.exceptions import HTTPError

    return ApiException, ConfigException, HTTPError


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return c
    return {}


def is_ready(obj: dict[str, Any]) -> bool:
    return condition(obj, "Ready").get("status") == "True"


class Operator:
    """`tsoracle operator` as a real process, watching one namespace."""

    def __init__(self, kubeconfig: Path, namespace: str, log: Path,
                 env: dict[str, str] | None = None,
                 lease: tuple[str, str] | None = None, crash_after_flip: bool = False,
                 module: str | None = None) -> None:
        """`lease`: (namespace, name) of the Lease to hold; without it the operator runs alone
        (tests run many operators side by side, each watching its own namespace).
        `crash_after_flip`: run tsoracle_dev.crashing_operator instead; `module`: run this
        wrapper of the command line instead (`python -m module operator ...`)."""
        self.kubeconfig, self.namespace, self.log = kubeconfig, namespace, log
        self.extra_env = env or {}
        self.module = module or ("tsoracle_dev.crashing_operator" if crash_after_flip
                                 else "tsoracle.cli")
        self.lease = lease
        self.proc: subprocess.Popen[bytes] | None = None
        self.metrics_port = free_port()
        self.liveness_port = free_port()

    def start(self) -> Operator:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), **self.extra_env}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", self.module, "operator", "--namespace",
                 self.namespace, "--liveness-port", str(self.liveness_port), "--metrics-port",
                 str(self.metrics_port), "--bind", "127.0.0.1",
                 *(["--lease-namespace", self.lease[0], "--lease-name", self.lease[1]]
                   if self.lease else [])],
                stdout=log, stderr=subprocess.STDOUT, env=env)
        return self

    def reconciles(self) -> float:
        """Successful reconcile passes so far, from the operator's own /metrics."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            text = resp.read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith('tsoracle_operator_reconciles_total{result="ok"}'))

    def wait_reconciles(self, at_least: float, cap: float = 120) -> None:
        deadline = time.monotonic() + cap  # only a hang reaches this
        while self.reconciles() < at_least:
            assert time.monotonic() < deadline, f"fewer than {at_least} reconcile passes"
            time.sleep(0.2)

    def wait_exit(self, timeout: float = 60) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
