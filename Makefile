PYTHON ?= python3

.PHONY: dev-cluster dev-cluster-down dev-cluster-reset images spark-k8s-demo test test-fast test-serial lint lincheck soak

OPS ?= 100000

dev-cluster:  ## start PostgreSQL and a one-node cluster (root), saying what it waits for; last line is `export KUBECONFIG=…`
	@$(PYTHON) -m tsoracle_dev.controlplane.cluster up

images:  ## build the operator and pause images (OCI archives) and import them into the dev node
	@$(PYTHON) -m tsoracle_dev.images --import

spark-k8s-demo:  ## two Spark drivers with executor pods on the dev node, a flip between them
	@$(PYTHON) -m tsoracle_dev.spark_k8s demo

dev-cluster-down:  ## stop it (pods, shims, interfaces too); etcd, PostgreSQL and images stay for the next `make dev-cluster`
	@$(PYTHON) -m tsoracle_dev.controlplane.cluster down

dev-cluster-reset:  ## stop it and delete its state: the next `make dev-cluster` starts empty, with a new PostgreSQL password
	@$(PYTHON) -m tsoracle_dev.controlplane.cluster down --purge

test:  ## the whole suite as CI runs it: a worker per core and one more (at most 4), the node's tests in one worker, in order
	$(PYTHON) -m pytest -q -n auto

test-serial:  ## the whole suite in this one process (slower; tracebacks and pdb as usual)
	$(PYTHON) -m pytest -q

test-fast:  ## the tests that start no server or process: no PostgreSQL, API server, node, Spark, CLI or catalog (under a minute)
	$(PYTHON) -m pytest -q -n auto -m "not (pg or kube or node or spark or slow or served)"

lint:  ## ruff and deptry, as CI runs them
	bash .ci/lint

lincheck:  ## every nemesis scenario x both implementations x both isolation levels, 3000 operations each (a few minutes)
	$(PYTHON) -m tsoracle_dev.lincheck.runner all --min-ops 3000

soak:  ## the same, long: make soak OPS=200000 (operations per scenario); not run in CI
	$(PYTHON) -m tsoracle_dev.lincheck.runner soak --min-ops $(OPS)
