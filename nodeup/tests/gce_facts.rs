//! nodeup on GCE: the instance's facts from the metadata server (the harness's, which Google's own
//! client reads the same way) — node name, zone and region, internal IP — and the provider id the
//! kubelet registers with, `gce://project/zone/name`. Flags still win.

use std::time::Duration;

use base::instance::{resolve, Overrides, Source};
use keelson_api::CloudProvider;
use nodeup::facts::{provider_id, Facts};
use testkit::gce_metadata::{self, InstanceFacts};

fn instance() -> InstanceFacts {
    InstanceFacts::example()
}

async fn gce_facts(md: &base::gce_metadata::GceMetadata, flags: &Overrides) -> Facts {
    Facts::from_instance("amd64".into(), resolve::<base::imds::Imds>(flags, Source::Gce(md)).await.expect("facts"))
}

#[tokio::test]
async fn facts_come_from_the_metadata_server_and_flags_win() {
    let server = gce_metadata::start(&instance());
    let md = base::gce_metadata::GceMetadata::new(Some(&server.addr().to_string()), Duration::from_secs(5)).expect("client");
    let facts = gce_facts(&md, &Overrides::default()).await;
    assert_eq!(facts.hostname, "nodes-europe-west1-b-x7k2", "the node name is the hostname's first label");
    assert_eq!(facts.zone.as_deref(), Some("europe-west1-b"));
    assert_eq!(facts.region.as_deref(), Some("europe-west1"));
    assert_eq!(facts.internal_ip.map(|i| i.to_string()).as_deref(), Some("10.0.16.7"));
    assert_eq!(provider_id(CloudProvider::Gce, &facts).as_deref(), Some("gce://acme-prod/europe-west1-b/nodes-europe-west1-b-x7k2"));
    assert_eq!(provider_id(CloudProvider::Aws, &facts).as_deref(), Some("aws:///europe-west1-b/4471938521837465123"), "each cloud its own shape");

    let flagged = gce_facts(&md, &Overrides { hostname: Some("given".into()), zone: Some("europe-west1-c".into()), ..Default::default() }).await;
    assert_eq!((flagged.hostname.as_str(), flagged.zone.as_deref()), ("given", Some("europe-west1-c")));
}

#[test]
fn without_the_facts_no_provider_id_is_made_up() {
    let facts = Facts { zone: Some("europe-west1-b".into()), ..Default::default() };
    assert_eq!(provider_id(CloudProvider::Gce, &facts), None);
    assert_eq!(provider_id(CloudProvider::OpenStack, &facts), None);
}
