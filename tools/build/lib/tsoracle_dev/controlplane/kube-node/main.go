// Command kube-node runs upstream's node and controller components from one binary (one link
// instead of four): `kube-node kubelet|kube-scheduler|kube-controller-manager|kube-proxy ARGS`.
package main

import (
	"context"
	"fmt"
	"os"
	_ "time/tzdata" // CronJob time zones, as upstream's controller-manager

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	commands := map[string]func() *cobra.Command{
		"kubelet":                 func() *cobra.Command { return kubelet.NewKubeletCommand(context.Background()) },
		"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
		"kube-controller-manager": controllermanager.NewControllerManagerCommand,
		"kube-proxy":              proxy.NewProxyCommand,
	}
	if len(os.Args) < 2 || commands[os.Args[1]] == nil {
		fmt.Fprintln(os.Stderr, "usage: kube-node kubelet|kube-scheduler|kube-controller-manager|kube-proxy [flags]")
		os.Exit(2)
	}
	command := commands[os.Args[1]]()
	os.Args = append(os.Args[:1], os.Args[2:]...)
	os.Exit(cli.Run(command))
}
