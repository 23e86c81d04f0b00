"""A local Kubernetes control plane (etcd, kube-apiserver) and its node, built from Go
modules; the Go wrappers live in the folders beside this package's modules."""
