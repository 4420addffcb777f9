//! Terraform JSON (`kubernetes.tf.json` plus `data/` files) for the same resources the direct
//! target manages. Offline and deterministic: images and the DNS zone become data sources.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Map, Value};

use super::iam_policy::{assume_role_policy, policy};
use super::model::{cluster_tags, ApiLoadBalancer, CloudKind, ClusterModel, RouteTarget, Routing, DNS_TTL, PLACEHOLDER_IP};
use base::Tree;

/// The main file's name inside `--out`.
pub const MAIN_FILE: &str = "kubernetes.tf.json";

/// A Terraform resource name from a cloud name (`nodes.minimal.example.com` → `nodes-minimal-example-com`).
pub fn tf_name(name: &str) -> String {
    let mut s: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '-' }).collect();
    if !s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
        s.insert(0, '_');
    }
    s
}

/// Collects `resource`/`data` blocks keyed by type then name (sorted output).
#[derive(Default)]
pub struct Blocks {
    pub resource: BTreeMap<String, BTreeMap<String, Value>>,
    pub data: BTreeMap<String, BTreeMap<String, Value>>,
    pub output: BTreeMap<String, Value>,
    pub files: Tree,
}

impl Blocks {
    pub fn add(&mut self, ty: &str, name: &str, body: Value) -> String {
        let n = tf_name(name);
        self.resource.entry(ty.to_string()).or_default().insert(n.clone(), body);
        format!("{ty}.{n}")
    }
    pub fn add_data(&mut self, ty: &str, name: &str, body: Value) -> String {
        let n = tf_name(name);
        self.data.entry(ty.to_string()).or_default().insert(n.clone(), body);
        format!("data.{ty}.{n}")
    }
    /// Write a data file and return the expression that reads it base64-encoded.
    pub fn data_file_base64(&mut self, file: &str, bytes: &[u8]) -> String {
        self.files.insert(format!("data/{file}"), bytes.to_vec());
        format!("${{filebase64(\"${{path.module}}/data/{file}\")}}")
    }
    pub fn data_file(&mut self, file: &str, bytes: &[u8]) -> String {
        self.files.insert(format!("data/{file}"), bytes.to_vec());
        format!("${{file(\"${{path.module}}/data/{file}\")}}")
    }
    pub fn finish(mut self, header: Value) -> Tree {
        let mut root = match header {
            Value::Object(m) => m,
            _ => Map::new(),
        };
        let to_value =
            |m: BTreeMap<String, BTreeMap<String, Value>>| Value::Object(m.into_iter().map(|(k, v)| (k, Value::Object(v.into_iter().collect()))).collect());
        if !self.data.is_empty() {
            root.insert("data".into(), to_value(std::mem::take(&mut self.data)));
        }
        root.insert("resource".into(), to_value(std::mem::take(&mut self.resource)));
        if !self.output.is_empty() {
            root.insert("output".into(), Value::Object(std::mem::take(&mut self.output).into_iter().collect()));
        }
        let mut text = serde_json::to_string_pretty(&Value::Object(root)).unwrap_or_default();
        text.push('\n');
        self.files.insert(MAIN_FILE, text);
        self.files
    }
}

fn r(reference: &str, attr: &str) -> String {
    format!("${{{reference}.{attr}}}")
}

fn tags_value(tags: &BTreeMap<String, String>) -> Value {
    Value::Object(tags.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect())
}

/// Render Terraform for the model (AWS or GCE; a model of another cloud is an error naming it).
pub fn render(model: &ClusterModel) -> Result<Tree, super::model::ModelError> {
    match model.cloud {
        CloudKind::Aws => Ok(render_aws(model)),
        CloudKind::Gce => Ok(super::gce::render(model)),
        other => Err(super::model::ModelError::UnsupportedCloud { cluster: model.cluster.clone(), cloud: format!("{other:?}") }),
    }
}

fn render_aws(model: &ClusterModel) -> Tree {
    let mut b = Blocks::default();
    let cluster = &model.cluster;
    let net = &model.network;
    let vpc_id = match &net.existing_id {
        Some(id) => id.clone(),
        None => {
            let vpc = b.add(
                "aws_vpc",
                &net.name,
                json!({
                    "cidr_block": net.cidr.clone().unwrap_or_default(),
                    "enable_dns_hostnames": true,
                    "enable_dns_support": true,
                    "tags": tags_value(&cluster_tags(cluster, &net.name)),
                }),
            );
            r(&vpc, "id")
        }
    };
    let mut subnet_ids: BTreeMap<String, String> = BTreeMap::new();
    for s in &net.subnets {
        let id = match &s.existing_id {
            Some(id) => id.clone(),
            None => {
                let mut tags = cluster_tags(cluster, &s.cloud_name);
                tags.insert("SubnetType".into(), s.kind.clone());
                let role = if s.kind == "Private" { "kubernetes.io/role/internal-elb" } else { "kubernetes.io/role/elb" };
                tags.insert(role.into(), "1".into());
                let reference = b.add(
                    "aws_subnet",
                    &s.cloud_name,
                    json!({
                        "vpc_id": vpc_id,
                        "cidr_block": s.cidr.clone().unwrap_or_default(),
                        "availability_zone": s.zone.clone().unwrap_or_default(),
                        "map_public_ip_on_launch": matches!(s.kind.as_str(), "Public" | "Utility"),
                        "tags": tags_value(&tags),
                    }),
                );
                r(&reference, "id")
            }
        };
        subnet_ids.insert(s.cloud_name.clone(), id);
    }
    if let Some(routing) = &net.routing {
        render_routing(&mut b, routing, &vpc_id, &subnet_ids);
    }
    let zone_ref = match &model.dns {
        Some(dns) => dns.zone.as_ref().map(|zone| {
            let zone_body =
                if zone.starts_with('Z') && !zone.contains('.') { json!({"zone_id": zone}) } else { json!({"name": zone, "private_zone": dns.private}) };
            b.add_data("aws_route53_zone", "dns-zone", zone_body)
        }),
        None => None,
    };
    let profile_refs = render_iam(&mut b, model, zone_ref.as_deref());
    let mut sg_ids: BTreeMap<String, String> = BTreeMap::new();
    for sg in &model.security_groups {
        let reference =
            b.add("aws_security_group", &sg.name, json!({"name": sg.name, "description": sg.description, "vpc_id": vpc_id, "tags": tags_value(&sg.tags)}));
        sg_ids.insert(sg.name.clone(), r(&reference, "id"));
    }
    for sg in &model.security_groups {
        for rule in &sg.ingress {
            let (protocol, from, to) = if rule.protocol == "all" {
                ("-1".to_string(), 0, 0)
            } else if !rule.has_ports() {
                (rule.protocol.clone(), 0, 0)
            } else {
                (rule.protocol.clone(), rule.from_port, rule.to_port)
            };
            let mut body = json!({
                "type": "ingress",
                "security_group_id": sg_ids[&sg.name],
                "protocol": protocol,
                "from_port": from,
                "to_port": to,
            });
            match &rule.source {
                super::model::RuleSource::Cidr(c) => body["cidr_blocks"] = json!([c]),
                super::model::RuleSource::Group(g) => body["source_security_group_id"] = json!(sg_ids.get(g).cloned().unwrap_or_else(|| g.clone())),
            }
            b.add("aws_security_group_rule", &rule.name().replace(": ", "-").replace(' ', "-"), body);
        }
    }
    let lb_refs = model.load_balancer.as_ref().map(|lb| render_load_balancer(&mut b, lb, &vpc_id, &subnet_ids, &sg_ids));
    let mut amis: BTreeMap<String, String> = BTreeMap::new();
    for lt in &model.launch_templates {
        if amis.contains_key(&lt.image) {
            continue;
        }
        let body = if lt.image.starts_with("ami-") {
            json!({"filter": [{"name": "image-id", "values": [lt.image]}]})
        } else {
            let (owner, name) = lt.image.split_once('/').unwrap_or(("self", lt.image.as_str()));
            json!({"most_recent": true, "owners": [owner], "filter": [{"name": "name", "values": [name]}]})
        };
        let reference = b.add_data("aws_ami", &format!("image-{}", amis.len()), body);
        amis.insert(lt.image.clone(), reference);
    }
    let mut lt_refs: BTreeMap<String, String> = BTreeMap::new();
    for lt in &model.launch_templates {
        let ami = &amis[&lt.image];
        let mut ebs = json!({
            "volume_size": lt.root_volume_size,
            "volume_type": lt.root_volume_type,
            "encrypted": lt.root_volume_encrypted,
            "delete_on_termination": true,
        });
        if let Some(i) = lt.root_volume_iops {
            ebs["iops"] = json!(i);
        }
        if let Some(t) = lt.root_volume_throughput {
            ebs["throughput"] = json!(t);
        }
        let sgs: Vec<String> =
            lt.security_groups.iter().chain(lt.additional_security_groups.iter()).map(|s| sg_ids.get(s).cloned().unwrap_or_else(|| s.clone())).collect();
        let user_data = b.data_file_base64(&format!("aws_launch_template_{}_user_data", tf_name(&lt.name)), &lt.user_data);
        let mut body = json!({
            "name": lt.name,
            "image_id": r(ami, "id"),
            "instance_type": lt.machine_type,
            "metadata_options": {
                "http_endpoint": "enabled",
                "http_tokens": lt.http_tokens,
                "http_put_response_hop_limit": lt.hop_limit,
            },
            "block_device_mappings": [{"device_name": r(ami, "root_device_name"), "ebs": ebs}],
            "vpc_security_group_ids": sgs,
            "iam_instance_profile": {"name": profile_refs.get(&lt.instance_profile).cloned().unwrap_or_else(|| lt.instance_profile.clone())},
            "user_data": user_data,
            "tag_specifications": [
                {"resource_type": "instance", "tags": tags_value(&lt.tags)},
                {"resource_type": "volume", "tags": tags_value(&lt.tags)},
            ],
            "tags": tags_value(&lt.tags),
            "lifecycle": {"create_before_destroy": true},
        });
        if let Some(spot) = &lt.spot {
            let mut options = json!({"instance_interruption_behavior": spot.interruption_behavior});
            if let Some(p) = &spot.max_price {
                options["max_price"] = json!(p);
            }
            body["instance_market_options"] = json!({"market_type": "spot", "spot_options": options});
        }
        if let Some(c) = &lt.cpu_credits {
            body["credit_specification"] = json!({"cpu_credits": c});
        }
        if lt.associate_public_ip_explicit {
            // An explicit associatePublicIp needs the interface spelled out (its groups move onto it).
            if let Some(obj) = body.as_object_mut() {
                obj.remove("vpc_security_group_ids");
            }
            body["network_interfaces"] = json!([{
                "device_index": 0,
                "associate_public_ip_address": lt.associate_public_ip,
                "delete_on_termination": true,
                "security_groups": sgs,
            }]);
        }
        let reference = b.add("aws_launch_template", &lt.name, body);
        lt_refs.insert(lt.name.clone(), reference);
    }
    for g in &model.groups {
        let lt = lt_refs.get(&g.launch_template).cloned().unwrap_or_default();
        let tags: Vec<Value> = g.tags.iter().map(|(k, v)| json!({"key": k, "value": v, "propagate_at_launch": true})).collect();
        let subnets: Vec<String> = g.subnets.iter().map(|s| subnet_ids.get(s).cloned().unwrap_or_else(|| s.clone())).collect();
        let mut body = json!({
            "name": g.name,
            "min_size": g.min_size,
            "max_size": g.max_size,
            "vpc_zone_identifier": subnets,
            "launch_template": {"id": r(&lt, "id"), "version": r(&lt, "latest_version")},
            "tag": tags,
        });
        if let Some(m) = &g.mixed {
            let launch = body.as_object_mut().and_then(|o| o.remove("launch_template")).unwrap_or_default();
            let mut distribution = json!({
                "on_demand_allocation_strategy": m.on_demand_allocation_strategy,
                "on_demand_base_capacity": m.on_demand_base,
                "on_demand_percentage_above_base_capacity": m.on_demand_above_base,
                "spot_allocation_strategy": m.spot_allocation_strategy,
            });
            if let Some(p) = m.spot_instance_pools {
                distribution["spot_instance_pools"] = json!(p);
            }
            if let Some(p) = &m.spot_max_price {
                distribution["spot_max_price"] = json!(p);
            }
            body["mixed_instances_policy"] = json!({
                "launch_template": {
                    "launch_template_specification": {"launch_template_id": launch["id"], "version": launch["version"]},
                    "override": m.instance_types.iter().map(|t| json!({"instance_type": t})).collect::<Vec<_>>(),
                },
                "instances_distribution": distribution,
            });
        }
        if let Some((tg, _)) = lb_refs.as_ref().filter(|_| !g.target_groups.is_empty()) {
            body["target_group_arns"] = json!([r(tg, "arn")]);
        }
        b.add("aws_autoscaling_group", &g.name, body);
    }
    for v in &model.volumes {
        let mut body = json!({
            "availability_zone": v.zone,
            "size": v.size_gib,
            "type": v.volume_type,
            "encrypted": v.encrypted,
            "tags": tags_value(&v.tags),
        });
        if let Some(i) = v.iops {
            body["iops"] = json!(i);
        }
        if let Some(t) = v.throughput {
            body["throughput"] = json!(t);
        }
        if let Some(k) = &v.kms_key_id {
            body["kms_key_id"] = json!(k);
        }
        b.add("aws_ebs_volume", &v.name, body);
    }
    if let (Some(dns), Some(z)) = (&model.dns, &zone_ref) {
        {
            for name in &dns.records {
                b.add(
                    "aws_route53_record",
                    name,
                    json!({
                        "zone_id": r(z, "zone_id"),
                        "name": name,
                        "type": "A",
                        "ttl": DNS_TTL,
                        "records": [PLACEHOLDER_IP],
                        "allow_overwrite": false,
                        "lifecycle": {"ignore_changes": ["records"]},
                    }),
                );
            }
            if let Some((_, lb)) = &lb_refs {
                for name in &dns.alias_records {
                    b.add(
                        "aws_route53_record",
                        name,
                        json!({
                            "zone_id": r(z, "zone_id"),
                            "name": name,
                            "type": "A",
                            "alias": {"name": r(lb, "dns_name"), "zone_id": r(lb, "zone_id"), "evaluate_target_health": false},
                        }),
                    );
                }
            }
        }
    }
    b.output.insert("cluster_name".into(), json!({"value": cluster}));
    b.output.insert("region".into(), json!({"value": model.region}));
    b.output.insert("vpc_id".into(), json!({"value": vpc_id}));
    b.output.insert(
        "node_autoscaling_group_ids".into(),
        json!({"value": model.groups.iter().map(|g| r(&format!("aws_autoscaling_group.{}", tf_name(&g.name)), "id")).collect::<Vec<_>>()}),
    );
    b.finish(json!({
        "terraform": {
            "required_version": ">= 1.3.0",
            "required_providers": {"aws": {"source": "hashicorp/aws", "version": ">= 5.0.0"}},
        },
        "provider": {"aws": [{"region": model.region}]},
        "locals": {"cluster_name": cluster, "region": model.region},
    }))
}

/// Internet gateway, elastic IPs, NAT gateways, route tables, routes and associations.
fn render_routing(b: &mut Blocks, routing: &Routing, vpc_id: &str, subnet_ids: &BTreeMap<String, String>) {
    let igw = b.add("aws_internet_gateway", &routing.internet_gateway, json!({"vpc_id": vpc_id, "tags": tags_value(&routing.tags)}));
    let mut nats: BTreeMap<String, String> = BTreeMap::new();
    for n in &routing.nat_gateways {
        let eip = b.add("aws_eip", &n.name, json!({"domain": "vpc", "tags": tags_value(&n.tags)}));
        let nat = b.add(
            "aws_nat_gateway",
            &n.name,
            json!({
                "allocation_id": r(&eip, "id"),
                "subnet_id": subnet_ids.get(&n.subnet).cloned().unwrap_or_else(|| n.subnet.clone()),
                "tags": tags_value(&n.tags),
            }),
        );
        nats.insert(n.name.clone(), nat);
    }
    for rt in &routing.route_tables {
        let table = b.add("aws_route_table", &rt.name, json!({"vpc_id": vpc_id, "tags": tags_value(&rt.tags)}));
        for route in &rt.routes {
            let mut body = json!({"route_table_id": r(&table, "id"), "destination_cidr_block": route.cidr});
            match &route.target {
                RouteTarget::InternetGateway(_) => body["gateway_id"] = json!(r(&igw, "id")),
                RouteTarget::NatGateway(n) => body["nat_gateway_id"] = json!(nats.get(n).map(|x| r(x, "id")).unwrap_or_default()),
                RouteTarget::ExistingNatGateway(id) => body["nat_gateway_id"] = json!(id),
                RouteTarget::Instance(id) => body["network_interface_id"] = json!(format!("${{data.aws_instance.{}.network_interface_id}}", tf_name(id))),
            }
            if let RouteTarget::Instance(id) = &route.target {
                b.add_data("aws_instance", id, json!({"instance_id": id}));
            }
            b.add("aws_route", &format!("{}-{}", rt.name, route.cidr), body);
        }
        for s in &rt.subnets {
            b.add(
                "aws_route_table_association",
                &format!("{s}-{}", rt.name),
                json!({
                    "subnet_id": subnet_ids.get(s).cloned().unwrap_or_else(|| s.clone()),
                    "route_table_id": r(&table, "id"),
                }),
            );
        }
    }
}

/// IAM roles, inline policies, managed-policy attachments and instance profiles; returns the
/// profile references by name (launch templates use them so Terraform orders them first).
fn render_iam(b: &mut Blocks, model: &ClusterModel, zone_ref: Option<&str>) -> BTreeMap<String, String> {
    let mut profiles = BTreeMap::new();
    let zone_id = zone_ref.map(|z| r(z, "zone_id"));
    for role in &model.iam_roles {
        let mut body = json!({
            "name": role.name,
            "assume_role_policy": serde_json::to_string(&assume_role_policy(&model.policy_inputs.partition)).unwrap_or_default(),
            "tags": tags_value(&role.tags),
        });
        if let Some(boundary) = &role.permissions_boundary {
            body["permissions_boundary"] = json!(boundary);
        }
        let role_ref = b.add("aws_iam_role", &role.name, body);
        if let Some(doc) = policy(role, &model.policy_inputs, zone_id.as_deref()) {
            b.add(
                "aws_iam_role_policy",
                &role.name,
                json!({"name": role.name, "role": r(&role_ref, "name"), "policy": serde_json::to_string(&doc).unwrap_or_default()}),
            );
        }
        for (i, arn) in role.managed_policies.iter().enumerate() {
            b.add("aws_iam_role_policy_attachment", &format!("{}-{i}", role.name), json!({"role": r(&role_ref, "name"), "policy_arn": arn}));
        }
        let profile = b.add("aws_iam_instance_profile", &role.name, json!({"name": role.name, "role": r(&role_ref, "name"), "tags": tags_value(&role.tags)}));
        profiles.insert(role.name.clone(), r(&profile, "id"));
    }
    profiles
}

/// The API's network load balancer, its target group and listener; returns (target group, balancer) references.
fn render_load_balancer(
    b: &mut Blocks,
    lb: &ApiLoadBalancer,
    vpc_id: &str,
    subnet_ids: &BTreeMap<String, String>,
    sg_ids: &BTreeMap<String, String>,
) -> (String, String) {
    let tg = b.add(
        "aws_lb_target_group",
        &lb.target_group,
        json!({
            "name": lb.target_group,
            "port": 443,
            "protocol": "TCP",
            "vpc_id": vpc_id,
            "deregistration_delay": "30",
            "connection_termination": true,
            "health_check": {"protocol": "TCP", "interval": 10, "healthy_threshold": 2, "unhealthy_threshold": 2},
            "tags": tags_value(&lb.target_group_tags),
        }),
    );
    let balancer = b.add(
        "aws_lb",
        &lb.name,
        json!({
            "name": lb.aws_name,
            "internal": lb.internal,
            "load_balancer_type": "network",
            "subnets": lb.subnets.iter().map(|s| subnet_ids.get(s).cloned().unwrap_or_else(|| s.clone())).collect::<Vec<_>>(),
            "security_groups": lb.security_groups.iter().map(|s| sg_ids.get(s).cloned().unwrap_or_else(|| s.clone())).collect::<Vec<_>>(),
            "enable_cross_zone_load_balancing": lb.cross_zone,
            "tags": tags_value(&lb.tags),
        }),
    );
    b.add(
        "aws_lb_listener",
        &format!("{}-443", lb.name),
        json!({
            "load_balancer_arn": r(&balancer, "arn"),
            "port": 443,
            "protocol": "TCP",
            "default_action": [{"type": "forward", "target_group_arn": r(&tg, "arn")}],
        }),
    );
    (tg, balancer)
}

/// Every problem with a rendered Terraform tree: invalid JSON, references to resources, data
/// sources, locals or files that do not exist. Empty means the structure checks pass.
pub fn structural_problems(tree: &Tree) -> Vec<String> {
    let mut problems = Vec::new();
    let Some(bytes) = tree.files.get(MAIN_FILE) else {
        return vec![format!("{MAIN_FILE}: missing")];
    };
    let root: Value = match serde_json::from_slice(bytes) {
        Ok(v) => v,
        Err(e) => return vec![format!("{MAIN_FILE}: invalid JSON: {e}")],
    };
    let mut defined: BTreeSet<String> = BTreeSet::new();
    for (section, prefix) in [("resource", ""), ("data", "data.")] {
        if let Some(types) = root.get(section).and_then(Value::as_object) {
            for (ty, items) in types {
                for name in items.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>()).unwrap_or_default() {
                    let valid = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                    if !valid {
                        problems.push(format!("{prefix}{ty}.{name}: not a valid Terraform name"));
                    }
                    defined.insert(format!("{prefix}{ty}.{name}"));
                }
            }
        }
    }
    let locals: BTreeSet<String> = root.get("locals").and_then(Value::as_object).map(|o| o.keys().cloned().collect()).unwrap_or_default();
    let mut strings = Vec::new();
    let mut stack = vec![&root];
    while let Some(v) = stack.pop() {
        match v {
            Value::String(s) => strings.push(s.clone()),
            Value::Array(a) => stack.extend(a.iter()),
            Value::Object(o) => stack.extend(o.values()),
            _ => {}
        }
    }
    for s in strings {
        let mut rest = s.as_str();
        while let Some(start) = rest.find("${") {
            let after = &rest[start + 2..];
            let Some(end) = matching_brace(after) else {
                problems.push(format!("unterminated interpolation in {s:?}"));
                break;
            };
            let expr = &after[..end];
            check_expression(expr, &defined, &locals, tree, &mut problems);
            rest = &after[end + 1..];
        }
    }
    problems.sort();
    problems.dedup();
    problems
}

fn matching_brace(s: &str) -> Option<usize> {
    let mut depth = 0i32;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => return Some(i),
            '}' => depth -= 1,
            _ => {}
        }
    }
    None
}

fn check_expression(expr: &str, defined: &BTreeSet<String>, locals: &BTreeSet<String>, tree: &Tree, problems: &mut Vec<String>) {
    // File functions: the file must exist in the rendered tree.
    for func in ["filebase64(\"", "file(\""] {
        if let Some(pos) = expr.find(func) {
            let arg = &expr[pos + func.len()..];
            let path = arg.split('"').next().unwrap_or_default().replace("${path.module}/", "");
            if !tree.files.contains_key(&path) {
                problems.push(format!("{expr}: file {path} not rendered"));
            }
            return;
        }
    }
    if expr.starts_with("path.") {
        return;
    }
    let parts: Vec<&str> = expr.split('.').collect();
    let key = match parts.as_slice() {
        ["local", name, ..] => {
            if !locals.contains(*name) {
                problems.push(format!("{expr}: no local {name}"));
            }
            return;
        }
        ["data", ty, name, _attr, ..] => format!("data.{ty}.{name}"),
        [ty, name, _attr, ..] => format!("{ty}.{name}"),
        _ => {
            problems.push(format!("{expr}: not a reference this checker understands"));
            return;
        }
    };
    if !defined.contains(&key) {
        problems.push(format!("{expr}: {key} is not defined"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_terraform_identifiers() {
        assert_eq!(tf_name("nodes.minimal.example.com"), "nodes-minimal-example-com");
        assert_eq!(tf_name("a.etcd-main.c"), "a-etcd-main-c");
        assert_eq!(tf_name("1.x"), "_1-x");
    }

    #[test]
    fn checker_finds_dangling_references_and_files() {
        let mut t = Tree::default();
        t.insert(MAIN_FILE, r#"{"resource":{"aws_vpc":{"v":{"x":"${aws_subnet.s.id}","y":"${filebase64(\"${path.module}/data/nope\")}"}}}}"#);
        let p = structural_problems(&t);
        assert_eq!(p.len(), 2, "{p:?}");
        t.insert(MAIN_FILE, r#"{"resource":{"aws_vpc":{"v":{"x":"${aws_vpc.v.id}"}}}}"#);
        assert!(structural_problems(&t).is_empty());
        t.insert(MAIN_FILE, "{");
        assert!(structural_problems(&t)[0].contains("invalid JSON"));
    }
}
