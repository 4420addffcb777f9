//! Fuzz targets of what nodeup reads before it touches the host (docs/fuzzing.md): the BootConfig
//! from user-data and the NodeupConfig it pins, parsed and then built into a worker's task list
//! (every file rendered, no host touched). Each runs `KEELSON_FUZZ_CASES` inputs (a small default,
//! so `cargo test` stays fast); a panic fails the test with the shrunk input. Crashes found are
//! regression tests in `tests/fuzz_regressions.rs`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use keelson_api::Role;
use nodeup::config::{self, StateStore};
use nodeup::model::{self, Facts, Inputs};
use testkit::fuzz;

const CI_CASES: u32 = 200;

/// The compiled examples' boot and node configs (`bootconfig/*.yaml`, `nodeup/*.yaml`).
fn compiled(prefix: &str) -> Vec<Vec<u8>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let asset =
        |arch: &str, a: &str| (spec_compiler::versions::Arch::parse(arch).expect("arch"), spec_compiler::userdata::NodeupAsset::parse(a).expect("asset"));
    let options = spec_compiler::CompileOptions {
        nodeup_assets: [
            asset("amd64", "8b1a9953c4611296a827abf8c47804d7e6c49c6b8f0b8c1f4ee3a5e6a1b1c2d3@https://nodeup.mirror.test/amd64/nodeup"),
            asset("arm64", "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0@https://nodeup.mirror.test/arm64/nodeup"),
        ]
        .into_iter()
        .collect(),
        protokube_assets: [
            asset("amd64", "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8@https://nodeup.mirror.test/amd64/protokube"),
            asset("arm64", "6b86b273ff34fce19d6b804eff5a3f5747ada4eaa22f1d49c01e52ddb7875b4b@https://nodeup.mirror.test/arm64/protokube"),
        ]
        .into_iter()
        .collect(),
        ..Default::default()
    };
    let mut out = Vec::new();
    for example in ["minimal.yaml", "ha.yaml", "gce.yaml", "gossip.yaml", "private.yaml"] {
        let docs = spec_compiler::load::load_spec(&root.join("examples").join(example)).expect("example");
        let compiled = spec_compiler::compile(&docs, &options).expect("compiles");
        out.extend(compiled.tree.files.iter().filter(|(k, _)| k.starts_with(prefix)).map(|(_, v)| v.clone()));
    }
    assert!(!out.is_empty(), "no {prefix} files in the compiled examples");
    out
}

#[test]
fn boot_config() {
    fuzz::run("boot-config", compiled("bootconfig/"), fuzz::cases(CI_CASES), |b| match config::parse_boot_config("fuzz.yaml", b) {
        Err(_) => "refused",
        Ok(boot) => match config::boot_role(&boot, Path::new("fuzz.yaml")) {
            Ok(_) => "parsed",
            Err(_) => "role refused",
        },
    });
}

/// The compiled node configs with the cluster CA pinned, as `keelson apply` pins it (a worker's
/// configuration is refused without it).
fn pinned_node_configs() -> Vec<Vec<u8>> {
    let ca = base::pki::create_ca("kubernetes-ca").expect("CA");
    compiled("nodeup/")
        .into_iter()
        .map(|bytes| {
            let mut cfg: keelson_api::nodeup::NodeupConfig = serde_yaml_ng::from_slice(&bytes).expect("a compiled NodeupConfig");
            cfg.cas.insert("kubernetes-ca".into(), ca.cert_pem.clone());
            serde_yaml_ng::to_string(&cfg).expect("yaml").into_bytes()
        })
        .collect()
}

/// A NodeupConfig whose hash the BootConfig pins (so parsing is reached), built into a worker's
/// tasks; the same bytes against another pin must be refused.
#[test]
fn nodeup_config() {
    let boot_bytes = compiled("bootconfig/").into_iter().next().expect("a boot config");
    let mut boot = config::parse_boot_config("boot.yaml", &boot_bytes).expect("boot config");
    boot.instance_group_role = Role::Node;
    let facts = Facts {
        arch: "amd64".into(),
        hostname: "ip-10-0-1-5.eu-west-1.compute.internal".into(),
        internal_ip: Some("10.0.1.5".parse().expect("ip")),
        instance_id: Some("i-0123456789abcdef0".into()),
        zone: Some("eu-west-1a".into()),
        region: Some("eu-west-1".into()),
        imds_url: Some("http://127.0.0.1:1".into()),
        ..Default::default()
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let store = Arc::new(StateStore::with_runtime(base::StateStore::dir(dir.path()), runtime));
    fuzz::run("nodeup-config", pinned_node_configs(), fuzz::cases(CI_CASES), |b| {
        let pin = base::nodeup_config_hash(b);
        assert!(config::parse_nodeup_config("fuzz.yaml", &format!("{pin}0"), b).is_err(), "accepted against another pin");
        let Ok(cfg) = config::parse_nodeup_config("fuzz.yaml", &pin, b) else { return "refused" };
        let inputs = Inputs {
            boot: &boot,
            boot_bytes: &boot_bytes,
            role: Role::Node,
            config: &cfg,
            facts: &facts,
            store: &store,
            renewal_interval: Duration::from_secs(3600),
            bootstrap_token_wait: Duration::ZERO,
        };
        match model::build(&inputs) {
            Ok(_) => "built",
            Err(_) => "build refused",
        }
    });
}
