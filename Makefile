PYTHON ?= python3

.PHONY: dev-cluster dev-cluster-down test lint

dev-cluster:  ## start PostgreSQL, etcd and kube-apiserver; last line is `export KUBECONFIG=…`
	@$(PYTHON) tools/controlplane/cluster.py up

dev-cluster-down:
	@$(PYTHON) tools/controlplane/cluster.py down

test:
	$(PYTHON) -m pytest -q

lint:
	$(PYTHON) -m ruff check tsoracle tests tools
