// Drives keelson-testkit's Compute Engine and Cloud DNS emulators through Google's own Go clients
// (google.golang.org/api/compute/v1 and dns/v1) the way a kOps-style tool does, checks what comes
// back, and prints a JSON summary for the Rust side: the wire-format check of the emulators.
// Usage: gce-api-wire http://127.0.0.1:PORT/
//
//	gce-api-wire oauth CREDENTIALS.json   # Application Default Credentials through golang.org/x/oauth2/google:
//	                                      # trade the file for a token at its token_uri and print it as JSON
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/google"
	compute "google.golang.org/api/compute/v1"
	dns "google.golang.org/api/dns/v1"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/option"
)

const (
	project = "acme-prod"
	region  = "europe-west1"
	zone    = "europe-west1-b"
)

var ctx = context.Background()

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "FAIL: "+format+"\n", args...)
	os.Exit(1)
}

func must[T any](v T, err error) func(what string) T {
	return func(what string) T {
		if err != nil {
			fail("%s: %v", what, err)
		}
		return v
	}
}

// apiErr asserts err is a googleapi.Error with this code and reason.
func apiErr(what string, err error, code int, reason string) {
	var ge *googleapi.Error
	if !errors.As(err, &ge) {
		fail("%s: want googleapi.Error %d %s, got %v", what, code, reason, err)
	}
	if ge.Code != code || len(ge.Errors) == 0 || ge.Errors[0].Reason != reason {
		fail("%s: want %d %s, got %d %+v (%s)", what, code, reason, ge.Code, ge.Errors, ge.Message)
	}
}

func last(link string) string { return link[strings.LastIndex(link, "/")+1:] }

type waiter struct{ c *compute.Service }

// wait follows an operation to DONE with the scope's wait method and fails on an operation error.
func (w waiter) wait(what string, op *compute.Operation) *compute.Operation {
	for i := 0; i < 50 && op.Status != "DONE"; i++ {
		var err error
		switch {
		case op.Zone != "":
			op, err = w.c.ZoneOperations.Wait(project, last(op.Zone), op.Name).Do()
		case op.Region != "":
			op, err = w.c.RegionOperations.Wait(project, last(op.Region), op.Name).Do()
		default:
			op, err = w.c.GlobalOperations.Wait(project, op.Name).Do()
		}
		if err != nil {
			fail("%s: wait: %v", what, err)
		}
	}
	if op.Status != "DONE" {
		fail("%s: operation %s not DONE: %s", what, op.Name, op.Status)
	}
	if op.Error != nil && len(op.Error.Errors) > 0 {
		fail("%s: operation failed: %s %s", what, op.Error.Errors[0].Code, op.Error.Errors[0].Message)
	}
	return op
}

func managed(c *compute.Service, mig string) []*compute.ManagedInstance {
	var all []*compute.ManagedInstance
	pages := 0
	err := c.InstanceGroupManagers.ListManagedInstances(project, zone, mig).MaxResults(1).Pages(ctx, func(r *compute.InstanceGroupManagersListManagedInstancesResponse) error {
		pages++
		all = append(all, r.ManagedInstances...)
		return nil
	})
	if err != nil {
		fail("listManagedInstances: %v", err)
	}
	if len(all) > 1 && pages != len(all) {
		fail("listManagedInstances with maxResults=1: %d instances in %d pages", len(all), pages)
	}
	return all
}

// oauthToken: what Google's own client sends to a token endpoint for a credentials file.
func oauthToken(file string) {
	data := must(os.ReadFile(file))("read " + file)
	creds := must(google.CredentialsFromJSON(ctx, data, "https://www.googleapis.com/auth/cloud-platform"))("credentials")
	tok := must(creds.TokenSource.Token())("token")
	b, _ := json.Marshal(map[string]any{"access_token": tok.AccessToken, "valid": tok.Valid()})
	fmt.Println(string(b))
}

func main() {
	if len(os.Args) == 3 && os.Args[1] == "oauth" {
		oauthToken(os.Args[2])
		return
	}
	if len(os.Args) != 2 {
		fail("usage: gce-api-wire http://127.0.0.1:PORT/")
	}
	base := os.Args[1]
	token := option.WithTokenSource(oauth2.StaticTokenSource(&oauth2.Token{AccessToken: "keelson-test-token", TokenType: "Bearer"}))
	c := must(compute.NewService(ctx, option.WithEndpoint(base+"compute/v1/"), token))("compute client")
	w := waiter{c}
	out := map[string]any{}

	// Without credentials: 401.
	anon := must(compute.NewService(ctx, option.WithEndpoint(base+"compute/v1/"), option.WithoutAuthentication()))("anonymous client")
	_, err := anon.Projects.Get(project).Do()
	apiErr("projects.get without a token", err, 401, "required")

	p := must(c.Projects.Get(project).Do())("projects.get")
	if p.Name != project || p.Id == 0 {
		fail("project: %+v", p)
	}
	zones := must(c.Zones.List(project).Do())("zones.list")
	if len(zones.Items) != 3 || zones.Items[0].Name != zone {
		fail("zones: %d, first %s", len(zones.Items), zones.Items[0].Name)
	}
	r := must(c.Regions.Get(project, region).Do())("regions.get")
	if len(r.Zones) != 3 || last(r.Zones[0]) != zone {
		fail("region zones: %v", r.Zones)
	}

	// Network, subnetwork, firewall.
	op := must(c.Networks.Insert(project, &compute.Network{Name: "gce-k8s", AutoCreateSubnetworks: false, ForceSendFields: []string{"AutoCreateSubnetworks"}}).Do())("networks.insert")
	if op.Status == "DONE" {
		fail("a new operation is already DONE (want PENDING or RUNNING)")
	}
	out["first_op_status"] = op.Status
	// Follow one operation with get, as a poller does.
	for i := 0; i < 100 && op.Status != "DONE"; i++ {
		time.Sleep(20 * time.Millisecond)
		op = must(c.GlobalOperations.Get(project, op.Name).Do())("globalOperations.get")
	}
	if op.Status != "DONE" || op.Progress != 100 || last(op.TargetLink) != "gce-k8s" {
		fail("network insert op: %+v", op)
	}
	_, err = c.Networks.Insert(project, &compute.Network{Name: "gce-k8s"}).Do()
	apiErr("second networks.insert", err, 409, "alreadyExists")
	w.wait("subnetworks.insert", must(c.Subnetworks.Insert(project, region, &compute.Subnetwork{Name: "gce-k8s-" + region, Network: "global/networks/gce-k8s", IpCidrRange: "10.0.16.0/20"}).Do())("subnetworks.insert"))
	sub := must(c.Subnetworks.Get(project, region, "gce-k8s-"+region).Do())("subnetworks.get")
	if sub.GatewayAddress != "10.0.16.1" || last(sub.Network) != "gce-k8s" {
		fail("subnetwork: %+v", sub)
	}
	w.wait("firewalls.insert", must(c.Firewalls.Insert(project, &compute.Firewall{
		Name: "https-api-gce-k8s", Network: "global/networks/gce-k8s",
		Allowed:      []*compute.FirewallAllowed{{IPProtocol: "tcp", Ports: []string{"443"}}},
		SourceRanges: []string{"0.0.0.0/0"}, TargetTags: []string{"gce-k8s-master"},
	}).Do())("firewalls.insert"))
	w.wait("firewalls.patch", must(c.Firewalls.Patch(project, "https-api-gce-k8s", &compute.Firewall{SourceRanges: []string{"192.0.2.0/24"}}).Do())("firewalls.patch"))
	fw := must(c.Firewalls.Get(project, "https-api-gce-k8s").Do())("firewalls.get")
	if len(fw.SourceRanges) != 1 || fw.SourceRanges[0] != "192.0.2.0/24" || fw.Allowed[0].Ports[0] != "443" || fw.Priority != 1000 {
		fail("patched firewall: %+v", fw)
	}
	// Deleting the network it still uses fails in the operation, as GCE does.
	op = must(c.Networks.Delete(project, "gce-k8s").Do())("networks.delete")
	for i := 0; i < 50 && op.Status != "DONE"; i++ {
		op = must(c.GlobalOperations.Wait(project, op.Name).Do())("globalOperations.wait")
	}
	if op.Error == nil || op.Error.Errors[0].Code != "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE" {
		fail("deleting a network in use: %+v", op.Error)
	}

	// Template and MIG.
	userData := "#!/bin/bash\necho keelson\n"
	cluster := "gce-k8s"
	tmpl := &compute.InstanceTemplate{Name: "nodes-gce-k8s-1", Properties: &compute.InstanceProperties{
		MachineType: "e2-medium",
		Disks: []*compute.AttachedDisk{{Boot: true, AutoDelete: true, Type: "PERSISTENT", Mode: "READ_WRITE",
			InitializeParams: &compute.AttachedDiskInitializeParams{DiskSizeGb: 20, DiskType: "pd-standard", SourceImage: "projects/ubuntu-os-cloud/global/images/ubuntu-2404"}}},
		NetworkInterfaces: []*compute.NetworkInterface{{Network: "global/networks/gce-k8s", Subnetwork: "regions/" + region + "/subnetworks/gce-k8s-" + region,
			AccessConfigs: []*compute.AccessConfig{{Type: "ONE_TO_ONE_NAT"}}}},
		Metadata:        &compute.Metadata{Items: []*compute.MetadataItems{{Key: "user-data", Value: &userData}, {Key: "cluster-name", Value: &cluster}}},
		Labels:          map[string]string{"k8s-io-cluster-name": "gce-k8s", "k8s-io-instance-group": "nodes"},
		ServiceAccounts: []*compute.ServiceAccount{{Email: "default", Scopes: []string{"https://www.googleapis.com/auth/compute"}}},
		Tags:            &compute.Tags{Items: []string{"gce-k8s-k8s-io-role-node"}},
	}}
	w.wait("instanceTemplates.insert", must(c.InstanceTemplates.Insert(project, tmpl).Do())("instanceTemplates.insert"))
	t := must(c.InstanceTemplates.Get(project, "nodes-gce-k8s-1").Do())("instanceTemplates.get")
	if t.Properties.MachineType != "e2-medium" || t.Properties.Disks[0].InitializeParams.DiskSizeGb != 20 || len(t.Properties.Metadata.Items) != 2 {
		fail("template round trip: %+v", t.Properties)
	}
	w.wait("instanceGroupManagers.insert", must(c.InstanceGroupManagers.Insert(project, zone, &compute.InstanceGroupManager{
		Name: "nodes", BaseInstanceName: "nodes", InstanceTemplate: t.SelfLink, TargetSize: 2,
	}).Do())("instanceGroupManagers.insert"))
	mis := managed(c, "nodes")
	if len(mis) != 2 {
		fail("managed instances: %d", len(mis))
	}
	for _, m := range mis {
		n := last(m.Instance)
		if m.Id == 0 || !strings.HasPrefix(n, "nodes-") || len(n) != len("nodes-")+4 || m.InstanceStatus == "" || m.CurrentAction == "" {
			fail("managed instance: %+v", m)
		}
	}
	first := last(mis[0].Instance)
	inst := must(c.Instances.Get(project, zone, first).Do())("instances.get")
	meta := map[string]string{}
	for _, it := range inst.Metadata.Items {
		meta[it.Key] = *it.Value
	}
	if meta["user-data"] != userData || !strings.HasSuffix(meta["created-by"], "/zones/"+zone+"/instanceGroupManagers/nodes") {
		fail("instance metadata: %v", meta)
	}
	_, subnet, _ := net.ParseCIDR("10.0.16.0/20")
	if ip := net.ParseIP(inst.NetworkInterfaces[0].NetworkIP); ip == nil || !subnet.Contains(ip) {
		fail("instance address %q not in 10.0.16.0/20", inst.NetworkInterfaces[0].NetworkIP)
	}
	if inst.Labels["k8s-io-instance-group"] != "nodes" || inst.Id != mis[0].Id || !inst.Disks[0].Boot {
		fail("instance: %+v", inst)
	}
	out["instances"] = []string{last(mis[0].Instance), last(mis[1].Instance)}
	_, err = c.Instances.Get(project, zone, "no-such-instance").Do()
	apiErr("instances.get of nothing", err, 404, "notFound")
	il := must(c.Instances.List(project, zone).Filter("labels.k8s-io-instance-group=nodes").Do())("instances.list")
	if len(il.Items) != 2 {
		fail("instances with the group label: %d", len(il.Items))
	}
	// An instance of no MIG, from the template (instances.insert with sourceInstanceTemplate).
	insertOp := must(c.Instances.Insert(project, zone, &compute.Instance{Name: "bare-1"}).SourceInstanceTemplate("global/instanceTemplates/nodes-gce-k8s-1").Do())("instances.insert")
	w.wait("instances.insert", insertOp)
	bare := must(c.Instances.Get(project, zone, "bare-1").Do())("instances.get bare-1")
	for _, it := range bare.Metadata.Items {
		if it.Key == "created-by" {
			fail("an instance of no MIG has created-by %q", *it.Value)
		}
	}
	if bare.Id == 0 || bare.Id != insertOp.TargetId || len(bare.Disks) == 0 || !bare.Disks[0].Boot {
		fail("inserted instance: %+v (operation target %d)", bare, insertOp.TargetId)
	}
	w.wait("instances.delete", must(c.Instances.Delete(project, zone, "bare-1").Do())("instances.delete"))

	// A labelled disk, found by label filter, attached, refused to a second writer.
	w.wait("disks.insert", must(c.Disks.Insert(project, zone, &compute.Disk{Name: "a-etcd-main-gce-k8s", SizeGb: 20, Type: "zones/" + zone + "/diskTypes/pd-ssd",
		Labels: map[string]string{"k8s-io-cluster-name": "gce-k8s", "k8s-io-etcd-main": "a-2fa"}}).Do())("disks.insert"))
	dl := must(c.Disks.List(project, zone).Filter("labels.k8s-io-cluster-name=gce-k8s AND labels.k8s-io-etcd-main:*").Do())("disks.list")
	if len(dl.Items) != 1 || dl.Items[0].Name != "a-etcd-main-gce-k8s" || dl.Items[0].SizeGb != 20 {
		fail("disks by label: %d", len(dl.Items))
	}
	disk := dl.Items[0]
	w.wait("instances.attachDisk", must(c.Instances.AttachDisk(project, zone, first, &compute.AttachedDisk{Source: disk.SelfLink, DeviceName: "etcd-main", Mode: "READ_WRITE"}).Do())("attachDisk"))
	disk = must(c.Disks.Get(project, zone, disk.Name).Do())("disks.get")
	if len(disk.Users) != 1 || last(disk.Users[0]) != first || disk.Status != "READY" {
		fail("disk users after attach: %v (%s)", disk.Users, disk.Status)
	}
	_, err = c.Instances.AttachDisk(project, zone, last(mis[1].Instance), &compute.AttachedDisk{Source: disk.SelfLink, Mode: "READ_WRITE"}).Do()
	apiErr("attaching a disk in use", err, 400, "resourceInUseByAnotherResource")

	// Labels and metadata with fingerprints.
	_, err = c.Disks.SetLabels(project, zone, disk.Name, &compute.ZoneSetLabelsRequest{LabelFingerprint: "c3RhbGUhIQ==", Labels: map[string]string{"x": "y"}}).Do()
	apiErr("disks.setLabels with a stale fingerprint", err, 412, "conditionNotMet")
	labels := disk.Labels
	labels["k8s-io-role-master"] = "master"
	w.wait("disks.setLabels", must(c.Disks.SetLabels(project, zone, disk.Name, &compute.ZoneSetLabelsRequest{LabelFingerprint: disk.LabelFingerprint, Labels: labels}).Do())("disks.setLabels"))
	disk2 := must(c.Disks.Get(project, zone, disk.Name).Do())("disks.get")
	if disk2.Labels["k8s-io-role-master"] != "master" || disk2.LabelFingerprint == disk.LabelFingerprint {
		fail("labels after setLabels: %v", disk2.Labels)
	}
	inst.Metadata.Items = append(inst.Metadata.Items, &compute.MetadataItems{Key: "kops-k8s-io-instance-group-name", Value: &cluster})
	w.wait("instances.setMetadata", must(c.Instances.SetMetadata(project, zone, first, inst.Metadata).Do())("setMetadata"))
	_, err = c.Instances.SetMetadata(project, zone, first, inst.Metadata).Do()
	apiErr("setMetadata with the old fingerprint", err, 412, "conditionNotMet")
	w.wait("instances.detachDisk", must(c.Instances.DetachDisk(project, zone, first, "etcd-main").Do())("detachDisk"))

	// Routes as the GCE cloud-controller-manager's route controller writes and lists them: the
	// network as a full URL, the next hop as a partial instance URL (stored in full), the
	// description as its tag, and the regexp filter k8s-cloud-provider renders.
	networkURL := c.BasePath + "projects/" + project + "/global/networks/gce-k8s"
	route := &compute.Route{Name: "gce-k8s-0f6a", DestRange: "100.96.3.0/24", NextHopInstance: "zones/" + zone + "/instances/" + first,
		Network: networkURL, Priority: 1000, Description: "k8s-node-route"}
	w.wait("routes.insert", must(c.Routes.Insert(project, route).Do())("routes.insert"))
	_, err = c.Routes.Insert(project, route).Do()
	apiErr("second routes.insert", err, 409, "alreadyExists")
	_, err = c.Routes.Insert(project, &compute.Route{Name: "gce-k8s-dead", DestRange: "100.96.4.0/24", NextHopInstance: "zones/" + zone + "/instances/no-such-instance", Network: networkURL}).Do()
	apiErr("routes.insert via a missing instance", err, 404, "notFound")
	rl := must(c.Routes.List(project).Filter("(name eq gce-k8s-.*) (network eq " + networkURL + ") (description eq k8s-node-route)").Do())("routes.list")
	if len(rl.Items) != 1 || rl.Items[0].DestRange != "100.96.3.0/24" || rl.Items[0].NextHopInstance != c.BasePath+"projects/"+project+"/zones/"+zone+"/instances/"+first {
		fail("routes by filter: %+v", rl.Items)
	}
	if rl2 := must(c.Routes.List(project).Filter("(name eq other-.*)").Do())("routes.list other"); len(rl2.Items) != 0 {
		fail("routes of another cluster: %d", len(rl2.Items))
	}
	w.wait("routes.delete", must(c.Routes.Delete(project, "gce-k8s-0f6a").Do())("routes.delete"))
	_, err = c.Routes.Get(project, "gce-k8s-0f6a").Do()
	apiErr("routes.get after delete", err, 404, "notFound")

	// Recreate keeps the name, gives a new id.
	w.wait("recreateInstances", must(c.InstanceGroupManagers.RecreateInstances(project, zone, "nodes", &compute.InstanceGroupManagersRecreateInstancesRequest{Instances: []string{mis[0].Instance}}).Do())("recreateInstances"))
	after := must(c.Instances.Get(project, zone, first).Do())("instances.get after recreate")
	if after.Id == inst.Id {
		fail("recreated instance kept its id %d", after.Id)
	}
	out["recreated"] = first
	out["recreated_id"] = fmt.Sprint(after.Id)

	// Resize, new template, delete an instance.
	w.wait("resize", must(c.InstanceGroupManagers.Resize(project, zone, "nodes", 3).Do())("resize"))
	if n := len(managed(c, "nodes")); n != 3 {
		fail("after resize to 3: %d", n)
	}
	tmpl.Name = "nodes-gce-k8s-2"
	w.wait("instanceTemplates.insert 2", must(c.InstanceTemplates.Insert(project, tmpl).Do())("instanceTemplates.insert 2"))
	w.wait("setInstanceTemplate", must(c.InstanceGroupManagers.SetInstanceTemplate(project, zone, "nodes", &compute.InstanceGroupManagersSetInstanceTemplateRequest{InstanceTemplate: "global/instanceTemplates/nodes-gce-k8s-2"}).Do())("setInstanceTemplate"))
	w.wait("deleteInstances", must(c.InstanceGroupManagers.DeleteInstances(project, zone, "nodes", &compute.InstanceGroupManagersDeleteInstancesRequest{Instances: []string{"zones/" + zone + "/instances/" + last(mis[1].Instance)}}).Do())("deleteInstances"))
	g := must(c.InstanceGroupManagers.Get(project, zone, "nodes").Do())("instanceGroupManagers.get")
	if g.TargetSize != 2 || last(g.InstanceTemplate) != "nodes-gce-k8s-2" || g.CurrentActions == nil {
		fail("group after changes: size %d template %s", g.TargetSize, g.InstanceTemplate)
	}
	gl := must(c.InstanceGroupManagers.List(project, zone).Do())("instanceGroupManagers.list")
	if len(gl.Items) != 1 {
		fail("groups: %d", len(gl.Items))
	}
	out["final_instances"] = len(managed(c, "nodes"))

	// Cloud DNS.
	d := must(dns.NewService(ctx, option.WithEndpoint(base), token))("dns client")
	mz := must(d.ManagedZones.Create(project, &dns.ManagedZone{Name: "gce-k8s", DnsName: "gce.k8s.example.com.", Description: "keelson"}).Do())("managedZones.create")
	if len(mz.NameServers) == 0 || mz.Id == 0 {
		fail("zone: %+v", mz)
	}
	a := func(name, ip string, ttl int64) *dns.ResourceRecordSet {
		return &dns.ResourceRecordSet{Name: name, Type: "A", Ttl: ttl, Rrdatas: []string{ip}}
	}
	api := "api.internal.gce.k8s.example.com."
	ch := must(d.Changes.Create(project, "gce-k8s", &dns.Change{Additions: []*dns.ResourceRecordSet{a(api, "10.0.16.2", 60)}}).Do())("changes.create")
	for i := 0; i < 100 && ch.Status != "done"; i++ {
		time.Sleep(20 * time.Millisecond)
		ch = must(d.Changes.Get(project, "gce-k8s", ch.Id).Do())("changes.get")
	}
	if ch.Status != "done" {
		fail("change %s still %s", ch.Id, ch.Status)
	}
	_, err = d.Changes.Create(project, "gce-k8s", &dns.Change{Deletions: []*dns.ResourceRecordSet{a(api, "10.0.16.2", 300)}}).Do()
	apiErr("a deletion that does not match", err, 412, "conditionNotMet")
	_, err = d.Changes.Create(project, "gce-k8s", &dns.Change{Additions: []*dns.ResourceRecordSet{a(api, "10.0.16.3", 60)}}).Do()
	apiErr("a conflicting addition", err, 409, "alreadyExists")
	must(d.Changes.Create(project, "gce-k8s", &dns.Change{Deletions: []*dns.ResourceRecordSet{a(api, "10.0.16.2", 60)}, Additions: []*dns.ResourceRecordSet{a(api, "10.0.16.4", 60)}}).Do())("replacing change")
	rr := must(d.ResourceRecordSets.List(project, "gce-k8s").Name(api).Type("A").Do())("resourceRecordSets.list")
	if len(rr.Rrsets) != 1 || rr.Rrsets[0].Rrdatas[0] != "10.0.16.4" || rr.Rrsets[0].Ttl != 60 {
		fail("record sets: %+v", rr.Rrsets)
	}
	all := must(d.ResourceRecordSets.List(project, "gce-k8s").Do())("resourceRecordSets.list all")
	out["rrset_count"] = len(all.Rrsets)
	out["api_record"] = rr.Rrsets[0].Rrdatas[0]

	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		os.Exit(1)
	}
}
