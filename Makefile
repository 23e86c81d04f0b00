PYTHON ?= python3

.PHONY: dev-cluster dev-cluster-down test lint lincheck soak

OPS ?= 100000

dev-cluster:  ## start PostgreSQL, etcd and kube-apiserver; last line is `export KUBECONFIG=…`
	@$(PYTHON) tools/controlplane/cluster.py up

dev-cluster-down:
	@$(PYTHON) tools/controlplane/cluster.py down

test:
	$(PYTHON) -m pytest -q

lint:
	$(PYTHON) -m ruff check tsoracle tests tools

lincheck:  ## every nemesis scenario x both implementations, 3000 operations each (a few minutes)
	$(PYTHON) tools/lincheck/runner.py all --min-ops 3000

soak:  ## the same, long: make soak OPS=200000 (operations per scenario); not run in CI
	$(PYTHON) tools/lincheck/runner.py soak --min-ops $(OPS)
