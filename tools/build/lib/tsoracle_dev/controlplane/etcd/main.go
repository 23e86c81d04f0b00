// Command etcd is upstream's etcd server, built from Go modules (Debian's etcd is too old for
// current Kubernetes).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
