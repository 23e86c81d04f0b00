PYTHON ?= python3

.PHONY: dev-cluster dev-cluster-down dev-cluster-reset test lint lincheck soak

OPS ?= 100000

dev-cluster:  ## start PostgreSQL, etcd and kube-apiserver; last line is `export KUBECONFIG=…`
	@$(PYTHON) tools/controlplane/cluster.py up

dev-cluster-down:  ## stop it; etcd and PostgreSQL keep their data for the next `make dev-cluster`
	@$(PYTHON) tools/controlplane/cluster.py down

dev-cluster-reset:  ## stop it and delete its state: the next `make dev-cluster` starts empty
	@$(PYTHON) tools/controlplane/cluster.py down --purge

test:
	$(PYTHON) -m pytest -q

lint:  ## ruff and deptry, as CI runs them
	bash .ci/lint

lincheck:  ## every nemesis scenario x both implementations x both isolation levels, 3000 operations each (a few minutes)
	$(PYTHON) tools/lincheck/runner.py all --min-ops 3000

soak:  ## the same, long: make soak OPS=200000 (operations per scenario); not run in CI
	$(PYTHON) tools/lincheck/runner.py soak --min-ops $(OPS)
