// Reads the instance's facts through Google's own metadata client, pointed at GCE_METADATA_HOST,
// and prints them as JSON: the wire-format check of keelson-testkit's GCE metadata server.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"cloud.google.com/go/compute/metadata"
)

func main() {
	ctx := context.Background()
	c := metadata.NewClient(nil)
	out := map[string]string{}
	get := func(key string, f func(context.Context) (string, error)) {
		v, err := f(ctx)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", key, err)
			os.Exit(1)
		}
		out[key] = v
	}
	get("project", c.ProjectIDWithContext)
	get("zone", c.ZoneWithContext)
	get("name", c.InstanceNameWithContext)
	get("id", c.InstanceIDWithContext)
	get("internal_ip", c.InternalIPWithContext)
	get("hostname", c.HostnameWithContext)
	get("cluster_name", func(ctx context.Context) (string, error) { return c.InstanceAttributeValueWithContext(ctx, "cluster-name") })
	_, err := c.InstanceAttributeValueWithContext(ctx, "no-such-attribute")
	var undefined metadata.NotDefinedError
	out["missing_is_not_defined"] = fmt.Sprint(errors.As(err, &undefined))
	attrs, err := c.InstanceAttributesWithContext(ctx)
	if err != nil {
		fmt.Fprintf(os.Stderr, "attributes: %v\n", err)
		os.Exit(1)
	}
	out["attributes"] = fmt.Sprint(attrs)
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		os.Exit(1)
	}
}
