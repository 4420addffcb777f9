//! The state store as `keelson compile` leaves it for protokube: each control-plane group's
//! protokube config, made by the compiler's own derivation from a completed spec (so these tests
//! cannot drift from what the product writes).

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::path::Path;

/// Write the protokube config of every group with an etcd member in `spec` (a completed Cluster
/// document), and of each of `more_groups`, into the file state store at `state`. Returns the
/// groups written.
pub fn write_protokube_configs(state: &Path, spec: &str, more_groups: &[String]) -> BTreeSet<String> {
    let cluster = keelson_api::parse_documents(spec.as_bytes()).unwrap_or_else(|e| panic!("test spec: {e:?}\n{spec}")).cluster;
    let mut groups: BTreeSet<String> = more_groups.iter().cloned().collect();
    for ec in cluster.spec.etcd_clusters.iter().flatten() {
        groups.extend(ec.etcd_members.iter().flatten().filter_map(|m| m.instance_group.clone()));
    }
    // The versions table the compile of this spec uses (its mirrors write the etcd image); the
    // small specs of these tests name no Kubernetes version.
    let mut table_spec = cluster.spec.clone();
    table_spec.kubernetes_version.get_or_insert_with(|| "1.34.4".parse().expect("version"));
    let versions = spec_compiler::complete::versions_for(&table_spec, &Default::default()).unwrap_or_else(|e| panic!("test spec: {e}"));
    for group in &groups {
        let config = spec_compiler::protokube_config::build(&cluster, group, &versions).unwrap_or_else(|e| panic!("protokube config of {group}: {e}"));
        let path = state.join(keelson_api::protokube::state_key(group));
        std::fs::create_dir_all(path.parent().expect("parent")).expect("igconfig dir");
        std::fs::write(&path, serde_yaml_ng::to_string(&config).expect("yaml")).expect("write protokube config");
    }
    groups
}
