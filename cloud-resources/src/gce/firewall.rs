//! A GCE firewall rule (ingress, on the cluster's network): who may reach which instances (by their
//! network tags) on which protocols and ports.

use serde_json::json;

use super::{GceTask, Network};
use crate::tasks::Link;
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
    fn name(&self) -> String {
        self.name.clone()
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
