//! A GCE firewall rule (ingress, on the cluster's network): who may reach which instances (by their
//! network tags) on which protocols and ports.

use serde_json::{json, Value};

use super::views::{sorted_joined, Names};
use super::{Exec, GceFuture, GceTask, Network, Typed};
use crate::plan::{Action, Change, Kind};
use crate::tasks::{Fields, Link};
use crate::terraform_json::Blocks;

/// One protocol and its ports (`tcp` + `["22"]`; no ports: all of them).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Allowed {
    pub protocol: String,
    pub ports: Vec<String>,
}

impl Allowed {
    pub fn new(protocol: &str, ports: &[&str]) -> Allowed {
        Allowed { protocol: protocol.to_string(), ports: ports.iter().map(|p| p.to_string()).collect() }
    }
    /// `tcp:22,443` or `udp`.
    pub fn label(&self) -> String {
        if self.ports.is_empty() {
            self.protocol.clone()
        } else {
            format!("{}:{}", self.protocol, self.ports.join(","))
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Firewall {
    /// The GCE name (`<rule>-<cluster>`, kOps' names).
    pub name: String,
    pub network: Link<Network>,
    pub source_ranges: Vec<String>,
    pub source_tags: Vec<String>,
    pub target_tags: Vec<String>,
    pub allowed: Vec<Allowed>,
}

impl GceTask for Firewall {
    fn kind(&self) -> Kind {
        Kind::GceFirewall
    }
    fn name(&self) -> String {
        self.name.clone()
    }
    fn gce_name(&self, _names: &Names) -> String {
        self.name.clone()
    }
    fn fields(&self, f: &mut Fields, names: &Names) {
        let mut allowed: Vec<String> = self.allowed.iter().map(Allowed::label).collect();
        allowed.sort();
        f.set("network", names.network(&self.network))
            .set("allowed", allowed.join(" "))
            .set("source_ranges", sorted_joined(&self.source_ranges))
            .set("source_tags", sorted_joined(&self.source_tags))
            .set("target_tags", sorted_joined(&self.target_tags));
    }
    fn body(&self, names: &Names) -> Value {
        let mut v = json!({
            "name": self.name,
            "network": names.network_link(&self.network),
            "direction": "INGRESS",
            "priority": 1000,
            "targetTags": self.target_tags,
            "allowed": self.allowed.iter().map(|a| {
                let mut r = json!({"IPProtocol": a.protocol});
                if !a.ports.is_empty() {
                    r["ports"] = json!(a.ports);
                }
                r
            }).collect::<Vec<_>>(),
        });
        // A patch replaces what it sends: both lists always sent (empty clears).
        v["sourceRanges"] = json!(self.source_ranges);
        v["sourceTags"] = json!(self.source_tags);
        v
    }
    /// Changed in place (a patch of the whole rule).
    fn render_gce<'a>(&'a self, cx: Exec<'a>, c: &'a Change) -> GceFuture<'a> {
        Box::pin(async move {
            let c = Typed::<Firewall>::of(c);
            let compute = &cx.target.compute;
            match c.action {
                Action::Create => compute.insert_firewall(&self.body(cx.names)).await?,
                Action::Update(_) => compute.patch_firewall(c.name, &self.body(cx.names)).await?,
                Action::Delete => cx.target.delete_with_retry(c.name, || compute.delete_firewall(&self.name)).await?,
            }
            Ok(())
        })
    }
    fn render_terraform(&self, b: &mut Blocks) {
        let allow: Vec<_> = self.allowed.iter().map(|a| json!({"protocol": a.protocol, "ports": a.ports})).collect();
        let mut v = json!({"name": self.name, "network": self.network.tf(), "allow": allow, "target_tags": self.target_tags});
        if !self.source_ranges.is_empty() {
            v["source_ranges"] = json!(self.source_ranges);
        }
        if !self.source_tags.is_empty() {
            v["source_tags"] = json!(self.source_tags);
        }
        b.add("google_compute_firewall", &self.name, v);
    }
}
