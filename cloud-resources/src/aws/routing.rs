//! Egress of a VPC apply creates: the internet gateway, elastic IPs and NAT gateways, and route
//! tables with their routes and subnet associations (model: [`crate::model::Routing`]).

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_ec2::types as ec2_t;

use super::task::{actual_id, joined, typed, Fields, Task};
use super::{api, cluster_filter, name_of, required, tag_spec, tags_of, AwsError, AwsTarget, Discovered, Ids};
use crate::model::ClusterModel;
use crate::plan::{Action, Change, Kind, Resource};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InternetGateway {
    pub name: String,
    /// The VPC it is attached to (its name); `None` when detached.
    pub vpc: Option<String>,
    pub tags: BTreeMap<String, String>,
}

impl InternetGateway {
    pub fn fields(&self, f: &mut Fields) {
        f.set("vpc", self.vpc.clone().unwrap_or_default());
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElasticIp {
    pub name: String,
    pub domain: String,
    pub tags: BTreeMap<String, String>,
}

impl ElasticIp {
    pub fn fields(&self, f: &mut Fields) {
        f.set("domain", &self.domain);
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatGateway {
    pub name: String,
    /// The subnet it sits in (cloud name).
    pub subnet: String,
    /// Its elastic IP (name).
    pub eip: String,
    pub tags: BTreeMap<String, String>,
}

impl NatGateway {
    pub fn fields(&self, f: &mut Fields) {
        f.set("subnet", &self.subnet).set("eip", &self.eip);
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteTable {
    pub name: String,
    pub vpc: String,
    /// Destination CIDR → target label (`igw:<name>`, `nat:<name>`, `nat-id:<id>`, `instance:<id>`).
    pub routes: BTreeMap<String, String>,
    /// Associated subnets (cloud names).
    pub subnets: BTreeSet<String>,
    pub tags: BTreeMap<String, String>,
}

impl RouteTable {
    pub fn fields(&self, f: &mut Fields) {
        let routes: Vec<String> = self.routes.iter().map(|(cidr, target)| format!("{cidr}={target}")).collect();
        f.set("vpc", &self.vpc).set("routes", routes.join(",")).set("subnets", joined(&self.subnets));
    }
}

pub(super) fn desired(model: &ClusterModel, out: &mut Vec<Resource>) {
    let Some(routing) = &model.network.routing else { return };
    let vpc = &model.network.name;
    let igw = InternetGateway { name: routing.internet_gateway.clone(), vpc: Some(vpc.clone()), tags: routing.tags.clone() };
    out.push(Task::InternetGateway(igw).view(None));
    for nat in &routing.nat_gateways {
        out.push(Task::ElasticIp(ElasticIp { name: nat.name.clone(), domain: "vpc".into(), tags: nat.tags.clone() }).view(None));
        let gw = NatGateway { name: nat.name.clone(), subnet: nat.subnet.clone(), eip: nat.name.clone(), tags: nat.tags.clone() };
        out.push(Task::NatGateway(gw).view(None));
    }
    for rt in &routing.route_tables {
        let table = RouteTable {
            name: rt.name.clone(),
            vpc: vpc.clone(),
            routes: rt.routes.iter().map(|r| (r.cidr.clone(), r.target.label())).collect(),
            subnets: rt.subnets.iter().cloned().collect(),
            tags: rt.tags.clone(),
        };
        out.push(Task::RouteTable(table).view(None));
    }
}

/// Internet gateways, elastic IPs, NAT gateways and route tables tagged for the cluster.
/// Needs the VPC and subnet ids already discovered.
pub(super) async fn discover(t: &AwsTarget, model: &ClusterModel, d: &mut Discovered) -> Result<(), AwsError> {
    let cluster = &model.cluster;
    let vpc_name = |ids: &Ids, id: &str| if ids.vpc.as_deref() == Some(id) { model.network.name.clone() } else { id.to_string() };

    let igws = t.ec2.describe_internet_gateways().filters(cluster_filter(cluster)).send().await.map_err(|e| api("DescribeInternetGateways", cluster, e))?;
    for g in igws.internet_gateways() {
        let id = required(g.internet_gateway_id(), "InternetGateway", cluster, "InternetGatewayId")?.to_string();
        let tags = tags_of(g.tags());
        let name = tags.get("Name").cloned().unwrap_or_else(|| id.clone());
        let vpc = g.attachments().iter().find_map(|a| a.vpc_id()).map(|v| vpc_name(&d.ids, v));
        d.ids.internet_gateways.insert(name.clone(), id.clone());
        d.resources.push(Task::InternetGateway(InternetGateway { name, vpc, tags }).view(Some(id)));
    }

    let eips = t.ec2.describe_addresses().filters(cluster_filter(cluster)).send().await.map_err(|e| api("DescribeAddresses", cluster, e))?;
    for a in eips.addresses() {
        let id = required(a.allocation_id(), "ElasticIP", cluster, "AllocationId")?.to_string();
        let tags = tags_of(a.tags());
        let name = tags.get("Name").cloned().unwrap_or_else(|| id.clone());
        d.ids.elastic_ips.insert(name.clone(), id.clone());
        let domain = a.domain().map(|d| d.as_str().to_string()).unwrap_or_else(|| "vpc".into());
        d.resources.push(Task::ElasticIp(ElasticIp { name, domain, tags }).view(Some(id)));
    }

    let nats = t.ec2.describe_nat_gateways().filter(cluster_filter(cluster)).send().await.map_err(|e| api("DescribeNatGateways", cluster, e))?;
    for n in nats.nat_gateways() {
        // Deleted gateways stay visible for a while; they are gone for our purposes.
        if matches!(n.state(), Some(ec2_t::NatGatewayState::Deleted | ec2_t::NatGatewayState::Deleting | ec2_t::NatGatewayState::Failed)) {
            continue;
        }
        let id = required(n.nat_gateway_id(), "NATGateway", cluster, "NatGatewayId")?.to_string();
        let tags = tags_of(n.tags());
        let name = tags.get("Name").cloned().unwrap_or_else(|| id.clone());
        let eip = n.nat_gateway_addresses().iter().find_map(|a| a.allocation_id()).map(|alloc| name_of(&d.ids.elastic_ips, alloc)).unwrap_or_default();
        let subnet = d.ids.subnet_name(required(n.subnet_id(), "NATGateway", &name, "SubnetId")?);
        d.ids.nat_gateways.insert(name.clone(), id.clone());
        d.resources.push(Task::NatGateway(NatGateway { name, subnet, eip, tags }).view(Some(id)));
    }

    let rts = t.ec2.describe_route_tables().filters(cluster_filter(cluster)).send().await.map_err(|e| api("DescribeRouteTables", cluster, e))?;
    for rt in rts.route_tables() {
        let id = required(rt.route_table_id(), "RouteTable", cluster, "RouteTableId")?.to_string();
        let tags = tags_of(rt.tags());
        let name = tags.get("Name").cloned().unwrap_or_else(|| id.clone());
        let mut routes = BTreeMap::new();
        for r in rt.routes() {
            let Some(cidr) = r.destination_cidr_block() else { continue };
            let target = if let Some(g) = r.gateway_id() {
                if g == "local" {
                    continue;
                }
                format!("igw:{}", name_of(&d.ids.internet_gateways, g))
            } else if let Some(n) = r.nat_gateway_id() {
                match d.ids.nat_gateways.iter().find(|(_, v)| v.as_str() == n) {
                    Some((k, _)) => format!("nat:{k}"),
                    None => format!("nat-id:{n}"),
                }
            } else if let Some(i) = r.instance_id() {
                format!("instance:{i}")
            } else {
                continue;
            };
            routes.insert(cidr.to_string(), target);
        }
        let mut subnets = BTreeSet::new();
        for a in rt.associations() {
            if a.main().unwrap_or(false) {
                continue;
            }
            if let (Some(s), Some(assoc)) = (a.subnet_id(), a.route_table_association_id()) {
                let subnet = d.ids.subnet_name(s);
                d.ids.route_associations.insert(subnet.clone(), assoc.to_string());
                subnets.insert(subnet);
            }
        }
        d.ids.route_tables.insert(name.clone(), id.clone());
        let vpc = vpc_name(&d.ids, required(rt.vpc_id(), "RouteTable", &name, "VpcId")?);
        d.resources.push(Task::RouteTable(RouteTable { name, vpc, routes, subnets, tags }).view(Some(id)));
    }
    Ok(())
}

super::task::picker!(pick_igw, InternetGateway, InternetGateway);

super::task::picker!(pick_eip, ElasticIp, ElasticIp);

super::task::picker!(pick_nat, NatGateway, NatGateway);

super::task::picker!(pick_table, RouteTable, RouteTable);

fn missing(kind: &'static str, name: &str, message: String) -> AwsError {
    AwsError::Missing { kind, name: name.to_string(), message }
}

impl AwsTarget {
    /// Create, update or delete one routing resource.
    pub(super) async fn execute_routing(&self, model: &ClusterModel, c: &Change, ids: &mut Ids) -> Result<(), AwsError> {
        let name = c.name.as_str();
        let (kind, desired, actual) = (c.kind, c.desired.as_ref(), c.actual.as_ref());
        let tag_change = matches!(&c.action, Action::Update(f) if f.iter().any(|f| f.field.starts_with("tags[")));
        let field_changed = |field: &str| matches!(&c.action, Action::Update(f) if f.iter().any(|f| f.field == field));
        let vpc = || ids.vpc.clone().ok_or_else(|| missing("VPC", &model.network.name, format!("needed by {name}")));
        match (c.kind, &c.action) {
            (Kind::InternetGateway, Action::Create) => {
                let want = typed(desired, kind, name, "desired", pick_igw)?;
                let vpc = vpc()?;
                let resp = self
                    .ec2
                    .create_internet_gateway()
                    .tag_specifications(tag_spec(ec2_t::ResourceType::InternetGateway, &want.tags))
                    .send()
                    .await
                    .map_err(|e| api("CreateInternetGateway", name, e))?;
                let id = required(resp.internet_gateway().and_then(|g| g.internet_gateway_id()), "InternetGateway", name, "InternetGatewayId")?.to_string();
                ids.internet_gateways.insert(name.to_string(), id.clone());
                self.ec2.attach_internet_gateway().internet_gateway_id(&id).vpc_id(vpc).send().await.map_err(|e| api("AttachInternetGateway", name, e))?;
            }
            (Kind::InternetGateway, Action::Update(_)) => {
                let want = typed(desired, kind, name, "desired", pick_igw)?;
                let actual_id = actual_id(actual, kind, name)?;
                if field_changed("vpc") {
                    let vpc = vpc()?;
                    self.ec2
                        .attach_internet_gateway()
                        .internet_gateway_id(&actual_id)
                        .vpc_id(vpc)
                        .send()
                        .await
                        .map_err(|e| api("AttachInternetGateway", name, e))?;
                }
                if tag_change {
                    self.create_tags(&actual_id, &want.tags).await?;
                }
            }
            (Kind::InternetGateway, Action::Delete) => {
                let have = typed(actual, kind, name, "actual", pick_igw)?;
                let actual_id = actual_id(actual, kind, name)?;
                if let Some(vpc) = &ids.vpc {
                    if have.vpc.is_some() {
                        self.ec2
                            .detach_internet_gateway()
                            .internet_gateway_id(&actual_id)
                            .vpc_id(vpc)
                            .send()
                            .await
                            .map_err(|e| api("DetachInternetGateway", name, e))?;
                    }
                }
                self.delete_with_retry(name, || async {
                    self.ec2
                        .delete_internet_gateway()
                        .internet_gateway_id(&actual_id)
                        .send()
                        .await
                        .map(|_| ())
                        .map_err(|e| api("DeleteInternetGateway", name, e))
                })
                .await?;
            }
            (Kind::ElasticIp, Action::Create) => {
                let want = typed(desired, kind, name, "desired", pick_eip)?;
                let resp = self
                    .ec2
                    .allocate_address()
                    .domain(ec2_t::DomainType::Vpc)
                    .tag_specifications(tag_spec(ec2_t::ResourceType::ElasticIp, &want.tags))
                    .send()
                    .await
                    .map_err(|e| api("AllocateAddress", name, e))?;
                ids.elastic_ips.insert(name.to_string(), required(resp.allocation_id(), "ElasticIP", name, "AllocationId")?.to_string());
            }
            (Kind::ElasticIp, Action::Update(_)) => {
                let want = typed(desired, kind, name, "desired", pick_eip)?;
                if tag_change {
                    self.create_tags(&actual_id(actual, kind, name)?, &want.tags).await?;
                }
            }
            (Kind::ElasticIp, Action::Delete) => {
                let actual_id = actual_id(actual, kind, name)?;
                self.delete_with_retry(name, || async {
                    self.ec2.release_address().allocation_id(&actual_id).send().await.map(|_| ()).map_err(|e| api("ReleaseAddress", name, e))
                })
                .await?;
            }
            (Kind::NatGateway, Action::Create) => {
                let want = typed(desired, kind, name, "desired", pick_nat)?;
                let subnet = ids.subnets.get(&want.subnet).cloned().ok_or_else(|| missing("Subnet", &want.subnet, format!("needed by NAT gateway {name}")))?;
                let eip = ids.elastic_ips.get(&want.eip).cloned().ok_or_else(|| missing("ElasticIP", &want.eip, format!("needed by NAT gateway {name}")))?;
                let resp = self
                    .ec2
                    .create_nat_gateway()
                    .subnet_id(subnet)
                    .allocation_id(eip)
                    .tag_specifications(tag_spec(ec2_t::ResourceType::Natgateway, &want.tags))
                    .send()
                    .await
                    .map_err(|e| api("CreateNatGateway", name, e))?;
                let id = required(resp.nat_gateway().and_then(|n| n.nat_gateway_id()), "NATGateway", name, "NatGatewayId")?.to_string();
                ids.nat_gateways.insert(name.to_string(), id.clone());
                // Routes to it are only useful (and in some regions only accepted) once it is available.
                self.wait_nat_available(&id, name).await?;
            }
            (Kind::NatGateway, Action::Update(fields)) => {
                let want = typed(desired, kind, name, "desired", pick_nat)?;
                if fields.iter().any(|f| !f.field.starts_with("tags[")) {
                    // Subnet and address are fixed at creation: say so rather than replace egress silently.
                    return Err(missing(
                        "NATGateway",
                        name,
                        format!(
                            "{} changed; a NAT gateway cannot be moved — delete it (keelson delete, or in the console) and apply again",
                            fields.iter().map(|f| f.field.as_str()).collect::<Vec<_>>().join(", ")
                        ),
                    ));
                }
                self.create_tags(&actual_id(actual, kind, name)?, &want.tags).await?;
            }
            (Kind::NatGateway, Action::Delete) => {
                let actual_id = actual_id(actual, kind, name)?;
                self.ec2.delete_nat_gateway().nat_gateway_id(&actual_id).send().await.map_err(|e| api("DeleteNatGateway", name, e))?;
                self.wait_nat_deleted(&actual_id, name).await?;
            }
            (Kind::RouteTable, Action::Create) => {
                let want = typed(desired, kind, name, "desired", pick_table)?;
                let resp = self
                    .ec2
                    .create_route_table()
                    .vpc_id(vpc()?)
                    .tag_specifications(tag_spec(ec2_t::ResourceType::RouteTable, &want.tags))
                    .send()
                    .await
                    .map_err(|e| api("CreateRouteTable", name, e))?;
                let id = required(resp.route_table().and_then(|r| r.route_table_id()), "RouteTable", name, "RouteTableId")?.to_string();
                ids.route_tables.insert(name.to_string(), id.clone());
                self.sync_routes(name, &id, &BTreeMap::new(), &want.routes, ids).await?;
                self.sync_associations(name, &id, &BTreeSet::new(), &want.subnets, ids).await?;
            }
            (Kind::RouteTable, Action::Update(_)) => {
                let want = typed(desired, kind, name, "desired", pick_table)?;
                let have = typed(actual, kind, name, "actual", pick_table)?;
                let actual_id = actual_id(actual, kind, name)?;
                if field_changed("routes") {
                    self.sync_routes(name, &actual_id, &have.routes, &want.routes, ids).await?;
                }
                if field_changed("subnets") {
                    self.sync_associations(name, &actual_id, &have.subnets, &want.subnets, ids).await?;
                }
                if tag_change {
                    self.create_tags(&actual_id, &want.tags).await?;
                }
            }
            (Kind::RouteTable, Action::Delete) => {
                let have = typed(actual, kind, name, "actual", pick_table)?;
                let actual_id = actual_id(actual, kind, name)?;
                for s in &have.subnets {
                    if let Some(assoc) = ids.route_associations.remove(s) {
                        self.ec2.disassociate_route_table().association_id(assoc).send().await.map_err(|e| api("DisassociateRouteTable", name, e))?;
                    }
                }
                self.delete_with_retry(name, || async {
                    self.ec2.delete_route_table().route_table_id(&actual_id).send().await.map(|_| ()).map_err(|e| api("DeleteRouteTable", name, e))
                })
                .await?;
            }
            (kind, _) => return Err(missing("routing", name, format!("{} is not a routing resource", kind.as_str()))),
        }
        Ok(())
    }

    /// Make the table's routes `want` (CIDR → target label), given `have`.
    async fn sync_routes(&self, name: &str, table: &str, have: &BTreeMap<String, String>, want: &BTreeMap<String, String>, ids: &Ids) -> Result<(), AwsError> {
        for (cidr, target) in want {
            if have.get(cidr) == Some(target) {
                continue;
            }
            let (kind, value) = target.split_once(':').unwrap_or(("", target));
            let resolve = |map: &BTreeMap<String, String>, what: &'static str| {
                map.get(value).cloned().ok_or_else(|| missing(what, value, format!("route {cidr} of {name}")))
            };
            let target_id = match kind {
                "igw" => resolve(&ids.internet_gateways, "InternetGateway")?,
                "nat" => resolve(&ids.nat_gateways, "NATGateway")?,
                _ => value.to_string(),
            };
            let replace = have.contains_key(cidr);
            macro_rules! send_route {
                ($req:expr, $op:literal) => {{
                    let req = $req.route_table_id(table).destination_cidr_block(cidr);
                    let req = match kind {
                        "igw" => req.gateway_id(&target_id),
                        "nat" | "nat-id" => req.nat_gateway_id(&target_id),
                        _ => req.instance_id(&target_id),
                    };
                    req.send().await.map(|_| ()).map_err(|e| api($op, name, e))?;
                }};
            }
            if replace {
                send_route!(self.ec2.replace_route(), "ReplaceRoute");
            } else {
                send_route!(self.ec2.create_route(), "CreateRoute");
            }
        }
        for cidr in have.keys().filter(|c| !want.contains_key(*c)) {
            self.ec2.delete_route().route_table_id(table).destination_cidr_block(cidr).send().await.map_err(|e| api("DeleteRoute", name, e))?;
        }
        Ok(())
    }

    /// Associate the subnets in `want` with the table (moving them from another table if needed)
    /// and disassociate the ones only in `have`.
    async fn sync_associations(&self, name: &str, table: &str, have: &BTreeSet<String>, want: &BTreeSet<String>, ids: &mut Ids) -> Result<(), AwsError> {
        for s in want.difference(have) {
            let subnet = ids.subnets.get(s).cloned().ok_or_else(|| missing("Subnet", s, format!("associated with route table {name}")))?;
            let assoc = match ids.route_associations.get(s).cloned() {
                Some(old) => self
                    .ec2
                    .replace_route_table_association()
                    .association_id(old)
                    .route_table_id(table)
                    .send()
                    .await
                    .map_err(|e| api("ReplaceRouteTableAssociation", name, e))?
                    .new_association_id()
                    .ok_or_else(|| missing("RouteTable", name, "the API returned no NewAssociationId".into()))?
                    .to_string(),
                None => self
                    .ec2
                    .associate_route_table()
                    .route_table_id(table)
                    .subnet_id(subnet)
                    .send()
                    .await
                    .map_err(|e| api("AssociateRouteTable", name, e))?
                    .association_id()
                    .ok_or_else(|| missing("RouteTable", name, "the API returned no AssociationId".into()))?
                    .to_string(),
            };
            ids.route_associations.insert(s.clone(), assoc);
        }
        for s in have.difference(want) {
            if let Some(assoc) = ids.route_associations.remove(s) {
                self.ec2.disassociate_route_table().association_id(assoc).send().await.map_err(|e| api("DisassociateRouteTable", name, e))?;
            }
        }
        Ok(())
    }

    /// A new NAT gateway takes a minute or two to become available (bounded wait).
    async fn wait_nat_available(&self, id: &str, name: &str) -> Result<(), AwsError> {
        for _ in 0..self.dependency_retries.max(1) {
            let resp = self.ec2.describe_nat_gateways().nat_gateway_ids(id).send().await.map_err(|e| api("DescribeNatGateways", name, e))?;
            match resp.nat_gateways().first().and_then(|n| n.state()) {
                Some(ec2_t::NatGatewayState::Available) => return Ok(()),
                Some(ec2_t::NatGatewayState::Failed) => {
                    let why = resp.nat_gateways().first().and_then(|n| n.failure_message()).unwrap_or("no reason given").to_string();
                    return Err(missing("NATGateway", name, format!("failed: {why}; delete it and apply again")));
                }
                _ => tokio::time::sleep(self.dependency_delay).await,
            }
        }
        Err(missing("NATGateway", name, "not available yet; rerun apply to continue".into()))
    }

    /// NAT gateways take minutes to delete; their subnet and address are busy until then (bounded).
    async fn wait_nat_deleted(&self, id: &str, name: &str) -> Result<(), AwsError> {
        for _ in 0..self.dependency_retries.max(1) {
            let resp = self.ec2.describe_nat_gateways().nat_gateway_ids(id).send().await.map_err(|e| api("DescribeNatGateways", name, e))?;
            if resp.nat_gateways().iter().all(|n| matches!(n.state(), Some(ec2_t::NatGatewayState::Deleted) | None)) {
                return Ok(());
            }
            tokio::time::sleep(self.dependency_delay).await;
        }
        Err(missing("NATGateway", name, "still deleting; rerun delete later".into()))
    }
}
