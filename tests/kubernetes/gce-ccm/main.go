// The GCE cloud-controller-manager keelson-local runs: k8s.io/cloud-provider's generic command with
// the GCE provider of k8s.io/cloud-provider-gcp/providers registered (its import's init), the way
// cloud-provider's own sample main builds an external CCM. The module with cloud-provider-gcp's
// command (k8s.io/cloud-provider-gcp) is not published on the Go module proxy; its providers module is.
// The controllers are the generic set (cloud-node, cloud-node-lifecycle, service, route).
package main

import (
	"os"

	"k8s.io/apimachinery/pkg/util/wait"
	cloudprovider "k8s.io/cloud-provider"
	"k8s.io/cloud-provider/app"
	cloudcontrollerconfig "k8s.io/cloud-provider/app/config"
	"k8s.io/cloud-provider/names"
	"k8s.io/cloud-provider/options"
	"k8s.io/component-base/cli"
	cliflag "k8s.io/component-base/cli/flag"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/klog/v2"

	_ "k8s.io/cloud-provider-gcp/providers/gce"
)

func main() {
	ccmOptions, err := options.NewCloudControllerManagerOptions()
	if err != nil {
		klog.Fatalf("unable to initialize command options: %v", err)
	}
	command := app.NewCloudControllerManagerCommand(ccmOptions, cloudInitializer, app.DefaultInitFuncConstructors,
		names.CCMControllerAliases(), cliflag.NamedFlagSets{}, wait.NeverStop)
	os.Exit(cli.Run(command))
}

func cloudInitializer(config *cloudcontrollerconfig.CompletedConfig) cloudprovider.Interface {
	shared := config.ComponentConfig.KubeCloudShared.CloudProvider
	cloud, err := cloudprovider.InitCloudProvider(shared.Name, shared.CloudConfigFile)
	if err != nil {
		klog.Fatalf("cloud provider could not be initialized: %v", err)
	}
	if cloud == nil {
		klog.Fatalf("cloud provider %q is nil", shared.Name)
	}
	if !cloud.HasClusterID() && !config.ComponentConfig.KubeCloudShared.AllowUntaggedCloud {
		klog.Fatalf("no ClusterID found: a ClusterID is required for the cloud provider to function properly")
	}
	return cloud
}
