PYTHON ?= python3

.PHONY: dev-cluster dev-cluster-down test lint lincheck soak

DURATION ?= 600

dev-cluster:  ## start PostgreSQL, etcd and kube-apiserver; last line is `export KUBECONFIG=…`
	@$(PYTHON) tools/controlplane/cluster.py up

dev-cluster-down:
	@$(PYTHON) tools/controlplane/cluster.py down

test:
	$(PYTHON) -m pytest -q

lint:
	$(PYTHON) -m ruff check tsoracle tests tools

lincheck:  ## every nemesis scenario x both implementations, sized for CI (a few minutes)
	$(PYTHON) tools/lincheck/runner.py all --duration 8 --min-ops 3000

soak:  ## the same, long: make soak DURATION=3600 (seconds per scenario); not run in CI
	$(PYTHON) tools/lincheck/runner.py soak --duration $(DURATION) --min-ops 20000
