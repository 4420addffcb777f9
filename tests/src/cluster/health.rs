//! The health of the whole cluster, as `up` waits for it and `ps` shows it: machines, containerd,
//! etcd members, and what the Kubernetes API says.

use std::collections::BTreeMap;
use std::path::Path;

use crate::kubeapi::NodeState;
use crate::machine::{self, MachineInfo};
use crate::{cmd, etcd};

use super::state::ClusterState;

/// Health of the whole cluster, as `up` waits for it and `ps` shows it.
#[derive(Debug, Default, Clone)]
pub struct Health {
    pub lines: Vec<String>,
    pub problems: Vec<String>,
}

/// Every group has its desired machines; every machine runs containerd; every control-plane
/// machine has a healthy member of every etcd cluster and each cluster has all members.
pub fn health(cs: &ClusterState) -> Health {
    let mut h = Health::default();
    for (g, want) in &cs.groups {
        let have = cs.machines.iter().filter(|m| &m.group == g && m.init_pid.is_some_and(cmd::alive)).count();
        if (have as i32) < *want {
            h.problems.push(format!("group {g}: {have}/{want} machines"));
        }
    }
    let cps = cs.machines.iter().filter(|m| m.role == "control-plane").count();
    for m in &cs.machines {
        let Some(pid) = m.init_pid.filter(|p| cmd::alive(*p)) else {
            h.problems.push(format!("{}: machine not running", m.instance_id));
            continue;
        };
        let ctr = machine::exec_in(pid, &["ctr", "version"]).is_ok();
        let vols: Vec<String> = cs.exposed.iter().filter(|(_, (i, _))| i == &m.instance_id).map(|(v, _)| v.clone()).collect();
        let mut line = format!(
            "{:<21} {:<14} {:<26} {:<15} {:<11} containerd={} volumes=[{}]",
            m.instance_id,
            m.role,
            m.group,
            m.ip,
            m.zone,
            if ctr { "running" } else { "DOWN" },
            vols.join(",")
        );
        if !ctr {
            h.problems.push(format!("{}: containerd not answering (ctr version)", m.instance_id));
        }
        if m.role == "control-plane" {
            for c in &cs.etcd_clusters {
                match etcd::endpoint(&m.root, c) {
                    None => {
                        line.push_str(&format!(" etcd-{c}=no-manifest"));
                        h.problems.push(format!("{}: no etcd-{c} manifest yet", m.instance_id));
                    }
                    Some(ep) => {
                        let ok = etcd::healthy(pid, &ep);
                        let members = etcd::members(pid, &ep).map(|m| m.len()).unwrap_or(0);
                        line.push_str(&format!(" etcd-{c}={}({}/{cps} members)", if ok { "healthy" } else { "UNHEALTHY" }, members));
                        if !ok {
                            h.problems.push(format!("{}: etcd {c} member {} unhealthy", m.instance_id, ep.member));
                        } else if members != cps {
                            h.problems.push(format!("{}: etcd {c} has {members} members, want {cps}", m.instance_id));
                        }
                    }
                }
            }
        }
        h.lines.push(line);
    }
    if cs.machines.is_empty() {
        h.problems.push("no machines yet".into());
    }
    if h.problems.is_empty() && !cs.kubeconfig.is_empty() {
        h.problems.extend(kube_problems(cs, &mut h.lines));
    }
    h
}

/// The static pods every control plane runs (etcd per etcd cluster; kube-proxy runs everywhere).
pub fn control_plane_pods(cs: &ClusterState) -> Vec<String> {
    let mut v: Vec<String> = cs.etcd_clusters.iter().map(|c| format!("etcd-{c}")).collect();
    v.extend(["kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy"].map(String::from));
    v
}

/// The failing checks of /readyz (`[-]name failed: …`) or the first 160 characters, on one line.
fn one_line(text: &str) -> String {
    let failed: Vec<&str> = text.split("\\n").flat_map(|l| l.lines()).filter(|l| l.trim_start().starts_with("[-]")).map(str::trim).collect();
    if !failed.is_empty() {
        return failed.join(" ");
    }
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    flat.chars().take(160).collect()
}

/// What the Kubernetes API says is not right yet: the API through every control plane, every
/// machine a Ready Node, every control-plane static pod and every kube-proxy running.
pub fn kube_problems(cs: &ClusterState, lines: &mut [String]) -> Vec<String> {
    use crate::kubeapi::{self, Target};
    let kc = Path::new(&cs.kubeconfig);
    let mut p = Vec::new();
    for m in cs.machines.iter().filter(|m| m.role == "control-plane") {
        let t = Target { server: Some(format!("https://{}", m.ip)), tls_server_name: None };
        match kubeapi::readyz(kc, &t) {
            Ok(body) if body.trim() == "ok" => {}
            Ok(body) => p.push(format!("{}: /readyz says {}", m.instance_id, one_line(&body))),
            Err(e) => p.push(format!("{}: /readyz: {}", m.instance_id, one_line(&e.to_string()))),
        }
    }
    if !p.is_empty() {
        return p;
    }
    let nodes = match kubeapi::nodes(kc) {
        Ok(n) => n,
        Err(e) => return vec![format!("listing nodes: {e}")],
    };
    let pods = match kubeapi::system_pods(kc) {
        Ok(x) => x,
        Err(e) => return vec![format!("listing kube-system pods: {e}")],
    };
    for m in &cs.machines {
        let Some((name, n)) = nodes.iter().find(|(_, n)| n.internal_ip.as_deref() == Some(m.ip.as_str())) else {
            p.push(format!("{}: no Node with InternalIP {}", m.instance_id, m.ip));
            continue;
        };
        if !n.ready {
            p.push(format!("{}: Node {name} not Ready", m.instance_id));
        }
        // nodeup runs kube-proxy as a static pod on control planes only (workers get it with the
        // kube-proxy addon, which does not exist yet).
        let want = if m.role == "control-plane" { control_plane_pods(cs) } else { vec![] };
        let mut running = 0;
        for w in &want {
            match pods.get(&format!("{w}-{name}")) {
                Some((_, true)) => running += 1,
                Some((_, false)) => p.push(format!("{}: pod {w} not running and ready", m.instance_id)),
                None => p.push(format!("{}: no pod {w}-{name}", m.instance_id)),
            }
        }
        if let Some(l) = lines.iter_mut().find(|l| l.starts_with(&m.instance_id)) {
            l.push_str(&format!(" node={} pods={running}/{}", if n.ready { "Ready" } else { "NotReady" }, want.len()));
        }
    }
    p
}

/// The labels of a Node's instance group, as protokube's node labeller puts them (the kubelet may
/// not): `node-role.kubernetes.io/node` on workers; `node-role.kubernetes.io/control-plane`,
/// `kops.k8s.io/kops-controller-pki` and `node.kubernetes.io/exclude-from-external-load-balancers`
/// on control planes; `kops.k8s.io/instancegroup=<group>` on every Node. A worker with a
/// control-plane label is wrong too. `machines`' groups are their autoscaling groups'
/// (`<group>.<cluster>`); Nodes are found by InternalIP. Empty when every machine's Node is right.
pub fn group_label_problems(cluster: &str, machines: &[MachineInfo], nodes: &BTreeMap<String, NodeState>) -> Vec<String> {
    const CONTROL_PLANE: [&str; 3] =
        ["node-role.kubernetes.io/control-plane", "kops.k8s.io/kops-controller-pki", "node.kubernetes.io/exclude-from-external-load-balancers"];
    const WORKER: &str = "node-role.kubernetes.io/node";
    let mut p = Vec::new();
    for m in machines {
        let Some((name, n)) = nodes.iter().find(|(_, n)| n.internal_ip.as_deref() == Some(m.ip.as_str())) else {
            p.push(format!("{}: no Node with InternalIP {}", m.instance_id, m.ip));
            continue;
        };
        let group = m.group.strip_suffix(&format!(".{cluster}")).unwrap_or(&m.group);
        let mut want: Vec<(&str, &str)> = vec![("kops.k8s.io/instancegroup", group)];
        let mut never: Vec<&str> = Vec::new();
        if m.role == "control-plane" {
            want.extend(CONTROL_PLANE.map(|k| (k, "")));
            never.push(WORKER);
        } else {
            want.push((WORKER, ""));
            never.extend(CONTROL_PLANE);
        }
        for (k, v) in want {
            if n.labels.get(k).map(String::as_str) != Some(v) {
                p.push(format!("{name} ({} of {group}): label {k}={:?}, want {v:?}", m.role, n.labels.get(k)));
            }
        }
        for k in never {
            if n.labels.contains_key(k) {
                p.push(format!("{name} ({} of {group}): carries {k}", m.role));
            }
        }
    }
    p
}

/// The control-plane machines that are running.
pub(super) fn control_planes(cs: &ClusterState) -> Vec<MachineInfo> {
    cs.machines.iter().filter(|m| m.role == "control-plane" && m.init_pid.is_some_and(cmd::alive)).cloned().collect()
}

/// A cluster without DNS records: how every worker resolves `api.internal.<cluster>` and the join
/// server's name. The harness plays no resolver for them (its VPC-resolver block holds Route53
/// records only, and there are none), so they must come from the product — nodeup's managed block
/// of the worker's own hosts file — and name exactly the live control planes, in the worker's
/// `/etc/hosts`, in every host-network pod's copy of it (kube-proxy's), and as `getent` answers
/// inside the machine. `Ok(summary)` when every worker does, else what is wrong.
pub fn workers_resolve_api(cs: &ClusterState) -> Result<String, Vec<String>> {
    let mut live: Vec<String> = control_planes(cs).iter().map(|m| m.ip.clone()).collect();
    live.sort();
    let names = keelson_api::nodeup::api_server_names(&cs.name);
    let workers: Vec<&MachineInfo> = cs.machines.iter().filter(|m| m.role == "node" && m.init_pid.is_some_and(cmd::alive)).collect();
    let (mut wrong, mut copies) = (Vec::new(), 0);
    if workers.is_empty() {
        wrong.push("no running worker".to_string());
    }
    for m in &workers {
        let hosts = crate::paths::in_root(&m.root, keelson_api::host_paths::HOSTS_FILE);
        let text = std::fs::read_to_string(&hosts).unwrap_or_default();
        let resolver_block = match (text.find(super::fleet::HOSTS_BEGIN), text.find(super::fleet::HOSTS_END)) {
            (Some(b), Some(e)) if e > b => &text[b..e],
            _ => "",
        };
        let mut files = vec![hosts.clone()];
        let pods = crate::paths::in_root(&m.root, keelson_api::host_paths::KUBELET_PODS_DIR);
        for pod in std::fs::read_dir(&pods).into_iter().flatten().flatten() {
            let copy = pod.path().join(base::hosts::KUBELET_POD_HOSTS_FILE);
            if std::fs::read_to_string(&copy).is_ok_and(|t| t.starts_with(base::hosts::KUBELET_HOST_NETWORK_HEADER)) {
                files.push(copy);
                copies += 1;
            }
        }
        for name in &names {
            if resolver_block.contains(name.as_str()) {
                wrong.push(format!("{}: the harness's resolver block names {name}", m.instance_id));
            }
            for f in &files {
                match base::hosts::read(f) {
                    Ok(e) if e.get(name) == Some(&live) => {}
                    Ok(e) => wrong.push(format!("{}: {}: {name} = {:?}, want the live control planes {live:?}", m.instance_id, f.display(), e.get(name))),
                    Err(e) => wrong.push(format!("{}: {e}", m.instance_id)),
                }
            }
            let answer = m.init_pid.map(|pid| machine::exec_in(pid, &["getent", "hosts", name]).unwrap_or_default()).unwrap_or_default();
            if !answer.split_whitespace().next().is_some_and(|ip| live.iter().any(|l| l == ip)) {
                wrong.push(format!("{}: getent hosts {name} = {:?}, want one of {live:?}", m.instance_id, answer.trim()));
            }
        }
    }
    if !wrong.is_empty() {
        return Err(wrong);
    }
    Ok(format!(
        "{n}/{n} workers resolve {} and {} to the {} live control planes through nodeup's entries in their hosts files ({copies} host-network pods' copies too)",
        names[0],
        names[1],
        live.len(),
        n = workers.len()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(id: &str, ip: &str, role: &str, group: &str) -> MachineInfo {
        MachineInfo {
            instance_id: id.into(),
            ip: ip.into(),
            zone: String::new(),
            netns: String::new(),
            veth: String::new(),
            root: Default::default(),
            overlay: false,
            nspawn_pid: 0,
            imds_pid: 0,
            init_pid: None,
            role: role.into(),
            group: group.into(),
            name: String::new(),
            cgroups: Vec::new(),
        }
    }

    fn node(ip: &str, labels: &[(&str, &str)]) -> NodeState {
        NodeState {
            ready: true,
            internal_ip: Some(ip.into()),
            provider_id: None,
            pod_cidr: None,
            taints: vec![],
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            provider_id_managers: vec![],
            kubelet_version: String::new(),
            os_image: String::new(),
            ready_since: None,
            ready_heartbeat: None,
            ready_reason: String::new(),
        }
    }

    #[test]
    fn group_labels_are_checked_per_role_and_group() {
        let machines = [machine("i-1", "10.0.0.1", "node", "nodes.c.example.com"), machine("i-2", "10.0.0.2", "control-plane", "cp-a.c.example.com")];
        let good = BTreeMap::from([
            ("w".to_string(), node("10.0.0.1", &[("node-role.kubernetes.io/node", ""), ("kops.k8s.io/instancegroup", "nodes")])),
            (
                "cp".to_string(),
                node(
                    "10.0.0.2",
                    &[
                        ("node-role.kubernetes.io/control-plane", ""),
                        ("kops.k8s.io/kops-controller-pki", ""),
                        ("node.kubernetes.io/exclude-from-external-load-balancers", ""),
                        ("kops.k8s.io/instancegroup", "cp-a"),
                    ],
                ),
            ),
        ]);
        assert_eq!(group_label_problems("c.example.com", &machines, &good), Vec::<String>::new());
        let mut bad = good.clone();
        bad.insert(
            "w".into(),
            node("10.0.0.1", &[("node-role.kubernetes.io/node", ""), ("kops.k8s.io/instancegroup", "cp-a"), ("node-role.kubernetes.io/control-plane", "")]),
        );
        let p = group_label_problems("c.example.com", &machines, &bad);
        assert_eq!(p.len(), 2, "{p:?}");
        bad.remove("cp");
        assert_eq!(group_label_problems("c.example.com", &machines, &bad).len(), 3);
    }
}
