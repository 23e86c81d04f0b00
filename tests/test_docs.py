"""The documentation runs as written: every shell and Python block of README.md and docs/.

Blocks are found with markdown-it-py, the CommonMark parser (what GitHub renders is what runs).
pytest-markdown-docs and mktestdocs were the alternatives; both run Python blocks inside the
test process (an import a user would miss is already there, a fixture's globals leak in) and
neither runs shell blocks, so here each Python block runs as a program of its own and each
shell block in bash, with the virtual environment's commands on PATH, in a folder that looks
like a checkout.

The fence says what a block is (its first word; GitHub ignores the rest):

- ```` ```python ```` and ```` ```sh ```` run, in order, each page in one working folder;
- ```` ```sh ci ```` are the README's two commands, which `.ci/run` runs itself;
- ```` ```yaml kubectl ```` is applied with `kubectl apply --dry-run=server` (the API server
  validates it against the CRD), other ```` ```yaml ```` and ```` ```json ```` are parsed;
- ```` ```<lang> norun ```` and ```` ```text ```` do not run (the prose says why).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from markdown_it import MarkdownIt

from tsoracle_dev.controlplane.cluster import ControlPlane

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
RUNS = {"python", "sh"}
DATA = {"yaml", "json"}
SHOWN = {"text", "sql", "promql", "console"}
OPTIONS = {"norun", "ci", "kubectl"}
# What each page needs besides the embedded default (SQLite, local Spark).
NEEDS = {"docs/operator.md": "cluster", "docs/spark.md": "cluster",
         "docs/observability.md": "cluster"}
# The order a newcomer reads them in, on one dev cluster, in one shell: the README, then the
# pages that need the cluster (docs/operator.md starts it and installs the chart).
CHAIN = ["README.md", "docs/operator.md", "docs/spark.md", "docs/observability.md"]
CLUSTER_ORDER = CHAIN[1:]
# Pages whose blocks start servers themselves (tsoracle-localpg, the catalog), for the tiers.
PAGE_TIERS = {"docs/performance.md": pytest.mark.pg,
              "docs/iceberg.md": pytest.mark.served}  # `tsoracle catalog serve`
# Text replaced before running, to keep the suite short; the command is otherwise as written.
FASTER = {"docs/performance.md": [("--duration 3", "--duration 0.3"),
                                   ("--duration 0.5", "--duration 0.2"),
                                   ("--seconds 0.5", "--seconds 0.2")]}


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    options: frozenset[str]
    source: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line} ({self.lang})"


def blocks(page: Path) -> list[Block]:
    rel = str(page.relative_to(ROOT))
    found = []
    for token in MarkdownIt("commonmark").parse(page.read_text()):
        if token.type != "fence":
            continue
        words = token.info.split()
        found.append(Block(rel, token.map[0] + 1 if token.map else 0,
                           words[0] if words else "", frozenset(words[1:]), token.content))
    return found


def runnable(page: str) -> list[Block]:
    return [b for b in blocks(ROOT / page)
            if b.lang in RUNS | DATA and not b.options & {"norun", "ci"}]


def test_every_block_says_what_it_is() -> None:
    bad = []
    for page in PAGES:
        for b in blocks(page):
            if b.lang not in RUNS | DATA | SHOWN:
                known = sorted(RUNS | DATA | SHOWN)
                bad.append(f"{b}: the fence names no known language ({known})")
            if b.options - OPTIONS:
                bad.append(f"{b}: unknown fence options {sorted(b.options - OPTIONS)}")
    assert not bad, "\n".join(bad)


def test_readme_starts_with_the_two_commands_ci_runs() -> None:
    first = blocks(ROOT / "README.md")[0]
    assert (first.lang, first.options) == ("sh", frozenset({"ci"}))
    setup, tests = first.source.strip().splitlines()
    assert setup.endswith("tsoracle demo") and tests == "python3 -m pytest -q -n auto"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "README.md" in ci and "sh ci" in ci  # .ci/run takes them from the README


# --- running pages ------------------------------------------------------------------------


class Session:
    """One page's working folder and environment, like a user's shell in a checkout."""

    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        self.workdir = workdir
        self.marker = uuid.uuid4().hex
        self.env = {**env, "TSORACLE_DOCS_RUN": self.marker}
        self._env_file = workdir / f".env-{self.marker}"
        for entry in ROOT.iterdir():
            if entry.name not in (".git", ".venv", ".venv-core", ".dev-cluster"):
                (workdir / entry.name).symlink_to(entry)

    def run(self, block: Block, replace: list[tuple[str, str]]) -> None:
        source = block.source
        for old, new in replace:
            source = source.replace(old, new)
        if block.lang == "python":
            program = self.workdir / f"block_{block.line}.py"
            program.write_text(source)
            argv = [sys.executable, program.name]
        elif block.lang == "sh":
            # What a block exports stays for the next, as in the reader's shell.
            argv = ["bash", "-euo", "pipefail", "-c",
                    f"{source}\nenv -0 > {shlex.quote(str(self._env_file))}"]
        elif block.lang == "yaml" and "kubectl" in block.options:
            argv = ["kubectl", "apply", "--dry-run=server", "-f", "-"]
        else:
            list(yaml.safe_load_all(source)) if block.lang == "yaml" else json.loads(source)
            return
        started = time.monotonic()
        proc = subprocess.run(argv, cwd=self.workdir, env=self.env, capture_output=True,
                              text=True, timeout=900,
                              input=source if argv[0] == "kubectl" else None)
        # Where a page's time goes (shown with -s, or beside a failure).
        print(f"{block}: {time.monotonic() - started:.1f} s")
        assert proc.returncode == 0, (
            f"{block} failed with exit code {proc.returncode}\n--- block\n{source}"
            f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}")
        if block.lang == "sh":
            self._keep_exports()

    def _keep_exports(self) -> None:
        shell_own = {"PWD", "OLDPWD", "SHLVL", "_"}
        pairs = (item.partition("=") for item in
                 self._env_file.read_text().split("\0") if "=" in item)
        self.env = {k: v for k, _, v in pairs if k not in shell_own}

    def close(self) -> None:
        """Stop what the page left running in the background (`tsoracle operator &`)."""
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            try:
                environ = (proc / "environ").read_bytes()
            except OSError:
                continue
            if f"TSORACLE_DOCS_RUN={self.marker}".encode() in environ.split(b"\0"):
                try:
                    os.kill(int(proc.name), signal.SIGTERM)
                except ProcessLookupError:
                    pass


# Stand-ins for a machine's own kubectl and helm, first on a newcomer's PATH: a page that uses
# one without putting the dev cluster's on PATH first fails as on a machine without it.
ABSENT_TOOLS = ("kubectl", "helm")


def _absent_tools_dir() -> Path:
    folder = Path(tempfile.gettempdir()) / f"tsoracle-docs-absent-{os.getuid()}"
    folder.mkdir(exist_ok=True)
    for tool in ABSENT_TOOLS:
        stub = folder / tool
        stub.write_text(f"#!/bin/sh\necho \"{tool}: command not found (a newcomer has none "
                        "until a page puts one on PATH)\" >&2\nexit 127\n")
        stub.chmod(0o755)
    return folder


def user_env() -> dict[str, str]:
    """A newcomer's shell after the README's first command: the virtual environment's commands
    on PATH, and no kubectl or helm but what a page puts there (this machine's own must not
    make a page pass)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("TSORACLE_URL", "KUBECONFIG", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join([str(_absent_tools_dir()), str(Path(sys.executable).parent),
                                   env.get("PATH", "")])
    return env


def run_page(page: str, session: Session) -> None:
    todo = runnable(page)
    assert todo, f"{page} has no block to run"
    try:
        for block in todo:
            session.run(block, FASTER.get(page, []))
    finally:
        session.close()


SIMPLE = sorted(str(p.relative_to(ROOT)) for p in PAGES
                if runnable(str(p.relative_to(ROOT))) and str(p.relative_to(ROOT)) not in NEEDS)


@pytest.mark.parametrize("page", [pytest.param(p, marks=PAGE_TIERS.get(p, ())) for p in SIMPLE])
def test_page_runs_on_the_embedded_default(page: str, tmp_path: Path) -> None:
    run_page(page, Session(tmp_path, user_env()))


def test_readme_program_runs_on_postgresql(pg, tmp_path: Path) -> None:
    """The README's library program honours $TSORACLE_URL (here a real PostgreSQL)."""
    env = {**user_env(), "TSORACLE_URL": f"{pg.url()}?schema=t_docs_{uuid.uuid4().hex[:8]}"}
    run_page("README.md", Session(tmp_path, env))


@pytest.fixture(scope="module")
def dev_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """`make dev-cluster` as the docs use it, with its state in a folder of the test's own."""
    state = tmp_path_factory.mktemp("dev-cluster")
    env = {**user_env(), "TSORACLE_DEV_CLUSTER_STATE": str(state)}
    ControlPlane(state).purge_when_this_process_exits()
    try:
        yield env
    finally:
        subprocess.run([sys.executable, "-m", "tsoracle_dev.controlplane.cluster", "down",
                        "--purge", str(state)], capture_output=True, timeout=300)


@pytest.mark.pg
@pytest.mark.kube
@pytest.mark.node
def test_the_guides_chain_on_one_dev_cluster(dev_cluster: dict[str, str],
                                              tmp_path: Path) -> None:
    """README.md, docs/operator.md, docs/spark.md and docs/observability.md, in that order, in
    one working folder and one shell: each page starts from what the one before left (the
    cluster docs/operator.md's first line starts and puts on PATH, its chart and resources)."""
    session = Session(tmp_path, dev_cluster)
    try:
        for page in CHAIN:
            todo = runnable(page)
            assert todo, f"{page} has no block to run"
            for block in todo:
                session.run(block, FASTER.get(page, []))
    finally:
        # The cluster's daemons were started by a page, so they carry the session's marker:
        # stop them the way a user does before the marker's sweep ends what else was left.
        subprocess.run(["make", "-s", "dev-cluster-down"], cwd=tmp_path, env=session.env,
                       capture_output=True, timeout=300)
        session.close()


def test_pages_needing_the_cluster_are_run_there() -> None:
    assert sorted(NEEDS) == sorted(CLUSTER_ORDER)
    env = user_env()
    for tool in ABSENT_TOOLS:
        found = subprocess.run([tool, "version"], env=env, capture_output=True, text=True)
        assert found.returncode == 127 and "command not found" in found.stderr, tool
    assert shutil.which("make"), "docs/operator.md needs make (.ci/run installs it)"
