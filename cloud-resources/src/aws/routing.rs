//! Egress of a VPC apply creates: the internet gateway, elastic IPs and NAT gateways, and route
//! tables with their routes and subnet associations (built by the model's network builder).

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_ec2::types as ec2_t;
use serde_json::json;

use super::network::{Subnet, Vpc};
use super::task::{AwsFuture, AwsTask, Exec, Typed};
use super::terraform::{tags_value, AwsTerraform};
use super::{api, cluster_filter, name_of, required, tag_spec, tags_of, AwsError, AwsLinked, AwsTarget, Discovered, Ids, Resolved};
use crate::model::ClusterModel;
use crate::plan::{Action, Change, Kind};
use crate::tasks::{joined_links, Fields, Link, Linked};
use crate::terraform_json::r;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InternetGateway {
    pub name: String,
    /// The VPC it is attached to; `None` when detached.
    pub vpc: Option<Link<Vpc>>,
    pub tags: BTreeMap<String, String>,
}

impl Linked for InternetGateway {
    const TF_TYPE: &'static str = "aws_internet_gateway";
    const TF_ATTR: &'static str = "id";
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElasticIp {
    pub name: String,
    pub domain: String,
    pub tags: BTreeMap<String, String>,
}

impl Linked for ElasticIp {
    const TF_TYPE: &'static str = "aws_eip";
    const TF_ATTR: &'static str = "id";
}

impl AwsLinked for ElasticIp {
    const KIND: Kind = Kind::ElasticIp;
    fn lookup(ids: &Ids, name: &str) -> Option<String> {
        ids.elastic_ips.get(name).cloned()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatGateway {
    pub name: String,
    /// The subnet it sits in.
    pub subnet: Link<Subnet>,
    /// Its elastic IP.
    pub eip: Link<ElasticIp>,
    pub tags: BTreeMap<String, String>,
}

impl Linked for NatGateway {
    const TF_TYPE: &'static str = "aws_nat_gateway";
    const TF_ATTR: &'static str = "id";
}

/// Where a route sends its traffic.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum RouteTarget {
    /// The cluster's internet gateway.
    InternetGateway(Link<InternetGateway>),
    /// A NAT gateway apply creates.
    NatGateway(Link<NatGateway>),
    /// `egress: nat-…` — an existing NAT gateway id.
    ExistingNatGateway(String),
    /// `egress: i-…` — an existing NAT instance id.
    Instance(String),
}

impl RouteTarget {
    /// The comparable form used in plans: `igw:<name>`, `nat:<name>`, `nat-id:<id>`, `instance:<id>`.
    pub fn label(&self) -> String {
        match self {
            RouteTarget::InternetGateway(n) => format!("igw:{n}"),
            RouteTarget::NatGateway(n) => format!("nat:{n}"),
            RouteTarget::ExistingNatGateway(id) => format!("nat-id:{id}"),
            RouteTarget::Instance(id) => format!("instance:{id}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteTable {
    pub name: String,
    pub vpc: Link<Vpc>,
    /// Destination CIDR → target.
    pub routes: BTreeMap<String, RouteTarget>,
    /// Associated subnets.
    pub subnets: BTreeSet<Link<Subnet>>,
    pub tags: BTreeMap<String, String>,
}

fn missing(kind: &'static str, name: &str, message: String) -> AwsError {
    AwsError::Missing { kind, name: name.to_string(), message }
}

impl AwsTask for InternetGateway {
    fn kind(&self) -> Kind {
        Kind::InternetGateway
    }
    fn name(&self) -> String {
        self.name.clone()
    }
    fn tags(&self) -> BTreeMap<String, String> {
        self.tags.clone()
    }
    fn fields(&self, f: &mut Fields) {
        f.set("vpc", self.vpc.as_ref().map(|v| v.name()).unwrap_or_default());
    }
    fn find<'a>(t: &'a AwsTarget, model: &'a ClusterModel, _resolved: &'a Resolved, d: &'a mut Discovered) -> AwsFuture<'a> {
        Box::pin(discover_internet_gateways(t, model, d))
    }
    fn render_terraform(&self, t: &mut AwsTerraform) {
        t.blocks.add("aws_internet_gateway", &self.name, json!({"vpc_id": self.vpc.as_ref().map(|v| v.tf()), "tags": tags_value(&self.tags)}));
    }
    fn render_aws<'a>(&'a self, cx: Exec<'a>, c: &'a Change) -> AwsFuture<'a> {
        Box::pin(async move {
            let c = Typed::<InternetGateway>::of(c);
            let (t, name) = (cx.target, c.name);
            let vpc = || cx.ids.vpc.clone().ok_or_else(|| missing("VPC", &cx.model.network.name, format!("needed by {name}")));
            match c.action {
                Action::Create => {
                    let want = c.want()?;
                    let vpc = vpc()?;
                    let resp = t
                        .ec2
                        .create_internet_gateway()
                        .tag_specifications(tag_spec(ec2_t::ResourceType::InternetGateway, &want.tags))
                        .send()
                        .await
                        .map_err(|e| api("CreateInternetGateway", name, e))?;
                    let id = required(resp.internet_gateway().and_then(|g| g.internet_gateway_id()), "InternetGateway", name, "InternetGatewayId")?.to_string();
                    cx.ids.internet_gateways.insert(name.to_string(), id.clone());
                    t.ec2.attach_internet_gateway().internet_gateway_id(&id).vpc_id(vpc).send().await.map_err(|e| api("AttachInternetGateway", name, e))?;
                }
                Action::Update(_) => {
                    let want = c.want()?;
                    let actual_id = c.id()?;
                    if c.changed("vpc") {
                        let vpc = vpc()?;
                        t.ec2
                            .attach_internet_gateway()
                            .internet_gateway_id(&actual_id)
                            .vpc_id(vpc)
                            .send()
                            .await
                            .map_err(|e| api("AttachInternetGateway", name, e))?;
                    }
                    if c.tags_changed() {
                        t.create_tags(&actual_id, &want.tags).await?;
                    }
                }
                Action::Delete => {
                    let have = c.have()?;
                    let actual_id = c.id()?;
                    if let Some(vpc) = &cx.ids.vpc {
                        if have.vpc.is_some() {
                            t.ec2
                                .detach_internet_gateway()
                                .internet_gateway_id(&actual_id)
                                .vpc_id(vpc)
                                .send()
                                .await
                                .map_err(|e| api("DetachInternetGateway", name, e))?;
                        }
                    }
                    t.delete_with_retry(name, || async {
                        t.ec2
                            .delete_internet_gateway()
                            .internet_gateway_id(&actual_id)
                            .send()
                            .await
                            .map(|_| ())
                            .map_err(|e| api("DeleteInternetGateway", name, e))
                    })
                    .await?;
                }
            }
            Ok(())
        })
    }
}

impl AwsTask for ElasticIp {
    fn kind(&self) -> Kind {
        Kind::ElasticIp
    }
    fn name(&self) -> String {
        self.name.clone()
    }
    fn tags(&self) -> BTreeMap<String, String> {
        self.tags.clone()
    }
    fn fields(&self, f: &mut Fields) {
        f.set("domain", &self.domain);
    }
    fn find<'a>(t: &'a AwsTarget, model: &'a ClusterModel, _resolved: &'a Resolved, d: &'a mut Discovered) -> AwsFuture<'a> {
        Box::pin(discover_elastic_ips(t, model, d))
    }
    fn render_terraform(&self, t: &mut AwsTerraform) {
        t.blocks.add("aws_eip", &self.name, json!({"domain": self.domain, "tags": tags_value(&self.tags)}));
    }
    fn render_aws<'a>(&'a self, cx: Exec<'a>, c: &'a Change) -> AwsFuture<'a> {
        Box::pin(async move {
            let c = Typed::<ElasticIp>::of(c);
            let (t, name) = (cx.target, c.name);
            match c.action {
                Action::Create => {
                    let want = c.want()?;
                    let resp = t
                        .ec2
                        .allocate_address()
                        .domain(ec2_t::DomainType::Vpc)
                        .tag_specifications(tag_spec(ec2_t::ResourceType::ElasticIp, &want.tags))
                        .send()
                        .await
                        .map_err(|e| api("AllocateAddress", name, e))?;
                    cx.ids.elastic_ips.insert(name.to_string(), required(resp.allocation_id(), "ElasticIP", name, "AllocationId")?.to_string());
                }
                Action::Update(_) => {
                    let want = c.want()?;
                    if c.tags_changed() {
                        t.create_tags(&c.id()?, &want.tags).await?;
                    }
                }
                Action::Delete => {
                    let actual_id = c.id()?;
                    t.delete_with_retry(name, || async {
                        t.ec2.release_address().allocation_id(&actual_id).send().await.map(|_| ()).map_err(|e| api("ReleaseAddress", name, e))
                    })
                    .await?;
                }
            }
            Ok(())
        })
    }
}

impl AwsTask for NatGateway {
    fn kind(&self) -> Kind {
        Kind::NatGateway
    }
    fn name(&self) -> String {
        self.name.clone()
    }
    fn tags(&self) -> BTreeMap<String, String> {
        self.tags.clone()
    }
    fn fields(&self, f: &mut Fields) {
        f.set("subnet", &self.subnet).set("eip", &self.eip);
    }
    fn find<'a>(t: &'a AwsTarget, model: &'a ClusterModel, _resolved: &'a Resolved, d: &'a mut Discovered) -> AwsFuture<'a> {
        Box::pin(discover_nat_gateways(t, model, d))
    }
    fn render_terraform(&self, t: &mut AwsTerraform) {
        t.blocks.add(
            "aws_nat_gateway",
            &self.name,
            json!({
                "allocation_id": self.eip.tf(),
                "subnet_id": self.subnet.tf(),
                "tags": tags_value(&self.tags),
            }),
        );
    }
    fn render_aws<'a>(&'a self, cx: Exec<'a>, c: &'a Change) -> AwsFuture<'a> {
        Box::pin(async move {
            let c = Typed::<NatGateway>::of(c);
            let (t, name) = (cx.target, c.name);
            match c.action {
                Action::Create => {
                    let want = c.want()?;
                    let user = format!("NAT gateway {name}");
                    let subnet = want.subnet.resolve(cx.ids, &user)?;
                    let eip = want.eip.resolve(cx.ids, &user)?;
                    let resp = t
                        .ec2
                        .create_nat_gateway()
                        .subnet_id(subnet)
                        .allocation_id(eip)
                        .tag_specifications(tag_spec(ec2_t::ResourceType::Natgateway, &want.tags))
                        .send()
                        .await
                        .map_err(|e| api("CreateNatGateway", name, e))?;
                    let id = required(resp.nat_gateway().and_then(|n| n.nat_gateway_id()), "NATGateway", name, "NatGatewayId")?.to_string();
                    cx.ids.nat_gateways.insert(name.to_string(), id.clone());
                    // Routes to it are only useful (and in some regions only accepted) once it is available.
                    t.wait_nat_available(&id, name).await?;
                }
                Action::Update(fields) => {
                    let want = c.want()?;
                    if c.attributes_changed() {
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
                    t.create_tags(&c.id()?, &want.tags).await?;
                }
                Action::Delete => {
                    let actual_id = c.id()?;
                    t.ec2.delete_nat_gateway().nat_gateway_id(&actual_id).send().await.map_err(|e| api("DeleteNatGateway", name, e))?;
                    t.wait_nat_deleted(&actual_id, name).await?;
                }
            }
            Ok(())
        })
    }
}

impl AwsTask for RouteTable {
    fn kind(&self) -> Kind {
        Kind::RouteTable
    }
    fn name(&self) -> String {
        self.name.clone()
    }
    fn tags(&self) -> BTreeMap<String, String> {
        self.tags.clone()
    }
    fn fields(&self, f: &mut Fields) {
        let routes: Vec<String> = self.routes.iter().map(|(cidr, target)| format!("{cidr}={}", target.label())).collect();
        f.set("vpc", &self.vpc).set("routes", routes.join(",")).set("subnets", joined_links(&self.subnets));
    }
    fn find<'a>(t: &'a AwsTarget, model: &'a ClusterModel, _resolved: &'a Resolved, d: &'a mut Discovered) -> AwsFuture<'a> {
        Box::pin(discover_route_tables(t, model, d))
    }
    fn render_terraform(&self, t: &mut AwsTerraform) {
        let table = t.blocks.add("aws_route_table", &self.name, json!({"vpc_id": self.vpc.tf(), "tags": tags_value(&self.tags)}));
        for (cidr, target) in &self.routes {
            let mut body = json!({"route_table_id": r(&table, "id"), "destination_cidr_block": cidr});
            match target {
                RouteTarget::InternetGateway(igw) => body["gateway_id"] = json!(igw.tf()),
                RouteTarget::NatGateway(nat) => body["nat_gateway_id"] = json!(nat.tf()),
                RouteTarget::ExistingNatGateway(id) => body["nat_gateway_id"] = json!(id),
                RouteTarget::Instance(id) => {
                    let instance = t.blocks.add_data("aws_instance", id, json!({"instance_id": id}));
                    body["network_interface_id"] = json!(r(&instance, "network_interface_id"));
                }
            }
            t.blocks.add("aws_route", &format!("{}-{cidr}", self.name), body);
        }
        for s in &self.subnets {
            t.blocks.add("aws_route_table_association", &format!("{s}-{}", self.name), json!({"subnet_id": s.tf(), "route_table_id": r(&table, "id")}));
        }
    }
    fn render_aws<'a>(&'a self, cx: Exec<'a>, c: &'a Change) -> AwsFuture<'a> {
        Box::pin(async move {
            let c = Typed::<RouteTable>::of(c);
            let (t, name) = (cx.target, c.name);
            match c.action {
                Action::Create => {
                    let want = c.want()?;
                    let vpc = cx.ids.vpc.clone().ok_or_else(|| missing("VPC", &cx.model.network.name, format!("needed by {name}")))?;
                    let resp = t
                        .ec2
                        .create_route_table()
                        .vpc_id(vpc)
                        .tag_specifications(tag_spec(ec2_t::ResourceType::RouteTable, &want.tags))
                        .send()
                        .await
                        .map_err(|e| api("CreateRouteTable", name, e))?;
                    let id = required(resp.route_table().and_then(|r| r.route_table_id()), "RouteTable", name, "RouteTableId")?.to_string();
                    cx.ids.route_tables.insert(name.to_string(), id.clone());
                    t.sync_routes(name, &id, &BTreeMap::new(), &want.routes, cx.ids).await?;
                    t.sync_associations(name, &id, &BTreeSet::new(), &want.subnets, cx.ids).await?;
                }
                Action::Update(_) => {
                    let want = c.want()?;
                    let have = c.have()?;
                    let actual_id = c.id()?;
                    if c.changed("routes") {
                        t.sync_routes(name, &actual_id, &have.routes, &want.routes, cx.ids).await?;
                    }
                    if c.changed("subnets") {
                        t.sync_associations(name, &actual_id, &have.subnets, &want.subnets, cx.ids).await?;
                    }
                    if c.tags_changed() {
                        t.create_tags(&actual_id, &want.tags).await?;
                    }
                }
                Action::Delete => {
                    let have = c.have()?;
                    let actual_id = c.id()?;
                    for s in &have.subnets {
                        if let Some(assoc) = cx.ids.route_associations.remove(s.name()) {
                            t.ec2.disassociate_route_table().association_id(assoc).send().await.map_err(|e| api("DisassociateRouteTable", name, e))?;
                        }
                    }
                    t.delete_with_retry(name, || async {
                        t.ec2.delete_route_table().route_table_id(&actual_id).send().await.map(|_| ()).map_err(|e| api("DeleteRouteTable", name, e))
                    })
                    .await?;
                }
            }
            Ok(())
        })
    }
}

/// The internet gateways tagged for the cluster (needs the VPC id).
async fn discover_internet_gateways(t: &AwsTarget, model: &ClusterModel, d: &mut Discovered) -> Result<(), AwsError> {
    let cluster = &model.cluster;
    let vpc_link = |ids: &Ids, id: &str| -> Link<Vpc> {
        if ids.vpc.as_deref() == Some(id) {
            Link::to(model.network.name.clone())
        } else {
            Link::to(id)
        }
    };
    let igws = t.ec2.describe_internet_gateways().filters(cluster_filter(cluster)).send().await.map_err(|e| api("DescribeInternetGateways", cluster, e))?;
    for g in igws.internet_gateways() {
        let id = required(g.internet_gateway_id(), "InternetGateway", cluster, "InternetGatewayId")?.to_string();
        let tags = tags_of(g.tags());
        let name = tags.get("Name").cloned().unwrap_or_else(|| id.clone());
        let vpc = g.attachments().iter().find_map(|a| a.vpc_id()).map(|v| vpc_link(&d.ids, v));
        d.ids.internet_gateways.insert(name.clone(), id.clone());
        d.found(InternetGateway { name, vpc, tags }, id);
    }
    Ok(())
}

/// The elastic IPs tagged for the cluster.
async fn discover_elastic_ips(t: &AwsTarget, model: &ClusterModel, d: &mut Discovered) -> Result<(), AwsError> {
    let cluster = &model.cluster;
    let eips = t.ec2.describe_addresses().filters(cluster_filter(cluster)).send().await.map_err(|e| api("DescribeAddresses", cluster, e))?;
    for a in eips.addresses() {
        let id = required(a.allocation_id(), "ElasticIP", cluster, "AllocationId")?.to_string();
        let tags = tags_of(a.tags());
        let name = tags.get("Name").cloned().unwrap_or_else(|| id.clone());
        d.ids.elastic_ips.insert(name.clone(), id.clone());
        let domain = a.domain().map(|d| d.as_str().to_string()).unwrap_or_else(|| "vpc".into());
        d.found(ElasticIp { name, domain, tags }, id);
    }
    Ok(())
}

/// The NAT gateways tagged for the cluster (needs the subnet and elastic IP ids).
async fn discover_nat_gateways(t: &AwsTarget, model: &ClusterModel, d: &mut Discovered) -> Result<(), AwsError> {
    let cluster = &model.cluster;
    let nats = t.ec2.describe_nat_gateways().filter(cluster_filter(cluster)).send().await.map_err(|e| api("DescribeNatGateways", cluster, e))?;
    for n in nats.nat_gateways() {
        // Deleted gateways stay visible for a while; they are gone for our purposes.
        if matches!(n.state(), Some(ec2_t::NatGatewayState::Deleted | ec2_t::NatGatewayState::Deleting | ec2_t::NatGatewayState::Failed)) {
            continue;
        }
        let id = required(n.nat_gateway_id(), "NATGateway", cluster, "NatGatewayId")?.to_string();
        let tags = tags_of(n.tags());
        let name = tags.get("Name").cloned().unwrap_or_else(|| id.clone());
        let eip =
            n.nat_gateway_addresses().iter().find_map(|a| a.allocation_id()).map(|alloc| Link::to(name_of(&d.ids.elastic_ips, alloc))).unwrap_or_default();
        let subnet = Link::to(d.ids.subnet_name(required(n.subnet_id(), "NATGateway", &name, "SubnetId")?));
        d.ids.nat_gateways.insert(name.clone(), id.clone());
        d.found(NatGateway { name, subnet, eip, tags }, id);
    }
    Ok(())
}

/// The route tables tagged for the cluster (needs the VPC, subnet, gateway ids).
/// Whether a route found in one of the cluster's route tables is apply's to manage: only the
/// destinations the model routes in that table (as kOps, whose routes are each a task of their own).
/// Every other route is someone else's and left as it is — above all the cloud-controller-manager's
/// pod-CIDR routes to instances (kubenet), which a replace-everything apply would delete on every
/// run, cutting the pod network until the route controller writes them again; or a user's.
pub fn route_is_ours(declared: Option<&BTreeMap<String, RouteTarget>>, cidr: &str) -> bool {
    declared.is_some_and(|routes| routes.contains_key(cidr))
}

async fn discover_route_tables(t: &AwsTarget, model: &ClusterModel, d: &mut Discovered) -> Result<(), AwsError> {
    let cluster = &model.cluster;
    let vpc_link = |ids: &Ids, id: &str| -> Link<Vpc> {
        if ids.vpc.as_deref() == Some(id) {
            Link::to(model.network.name.clone())
        } else {
            Link::to(id)
        }
    };
    let declared: BTreeMap<&str, &BTreeMap<String, RouteTarget>> = model.tasks.route_tables.iter().map(|r| (r.name.as_str(), &r.routes)).collect();
    let rts = t.ec2.describe_route_tables().filters(cluster_filter(cluster)).send().await.map_err(|e| api("DescribeRouteTables", cluster, e))?;
    for rt in rts.route_tables() {
        let id = required(rt.route_table_id(), "RouteTable", cluster, "RouteTableId")?.to_string();
        let tags = tags_of(rt.tags());
        let name = tags.get("Name").cloned().unwrap_or_else(|| id.clone());
        let mut routes = BTreeMap::new();
        for r in rt.routes() {
            let Some(cidr) = r.destination_cidr_block() else { continue };
            if !route_is_ours(declared.get(name.as_str()).copied(), cidr) {
                continue;
            }
            let target = if let Some(g) = r.gateway_id() {
                if g == "local" {
                    continue;
                }
                RouteTarget::InternetGateway(Link::to(name_of(&d.ids.internet_gateways, g)))
            } else if let Some(n) = r.nat_gateway_id() {
                match d.ids.nat_gateways.iter().find(|(_, v)| v.as_str() == n) {
                    Some((k, _)) => RouteTarget::NatGateway(Link::to(k.clone())),
                    None => RouteTarget::ExistingNatGateway(n.to_string()),
                }
            } else if let Some(i) = r.instance_id() {
                RouteTarget::Instance(i.to_string())
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
                subnets.insert(Link::to(subnet));
            }
        }
        d.ids.route_tables.insert(name.clone(), id.clone());
        let vpc = vpc_link(&d.ids, required(rt.vpc_id(), "RouteTable", &name, "VpcId")?);
        d.found(RouteTable { name, vpc, routes, subnets, tags }, id);
    }
    Ok(())
}

impl AwsTarget {
    /// Make the table's routes `want`, given `have`.
    async fn sync_routes(
        &self,
        name: &str,
        table: &str,
        have: &BTreeMap<String, RouteTarget>,
        want: &BTreeMap<String, RouteTarget>,
        ids: &Ids,
    ) -> Result<(), AwsError> {
        for (cidr, target) in want {
            if have.get(cidr).map(RouteTarget::label) == Some(target.label()) {
                continue;
            }
            let target_id = match target {
                RouteTarget::InternetGateway(l) => ids.internet_gateways.get(l.name()).cloned(),
                RouteTarget::NatGateway(l) => ids.nat_gateways.get(l.name()).cloned(),
                RouteTarget::ExistingNatGateway(id) | RouteTarget::Instance(id) => Some(id.clone()),
            };
            let target_id = target_id.ok_or_else(|| {
                let (kind, value) = match target {
                    RouteTarget::InternetGateway(l) => ("InternetGateway", l.name()),
                    RouteTarget::NatGateway(l) => ("NATGateway", l.name()),
                    RouteTarget::ExistingNatGateway(id) | RouteTarget::Instance(id) => ("Route", id.as_str()),
                };
                missing(kind, value, format!("route {cidr} of {name}"))
            })?;
            let replace = have.contains_key(cidr);
            macro_rules! send_route {
                ($req:expr, $op:literal) => {{
                    let req = $req.route_table_id(table).destination_cidr_block(cidr);
                    let req = match target {
                        RouteTarget::InternetGateway(_) => req.gateway_id(&target_id),
                        RouteTarget::NatGateway(_) | RouteTarget::ExistingNatGateway(_) => req.nat_gateway_id(&target_id),
                        RouteTarget::Instance(_) => req.instance_id(&target_id),
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
    async fn sync_associations(
        &self,
        name: &str,
        table: &str,
        have: &BTreeSet<Link<Subnet>>,
        want: &BTreeSet<Link<Subnet>>,
        ids: &mut Ids,
    ) -> Result<(), AwsError> {
        for s in want.difference(have) {
            let s = s.name();
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
            ids.route_associations.insert(s.to_string(), assoc);
        }
        for s in have.difference(want) {
            if let Some(assoc) = ids.route_associations.remove(s.name()) {
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
