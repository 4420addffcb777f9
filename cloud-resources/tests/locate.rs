//! Where a cluster lives, read before compiling (`keelson apply` opens the state store and pins
//! its CAs with it, then compiles once), is what the compiled model was built from, for every
//! example: compiling changes none of it.

mod support;

use std::path::Path;

#[test]
fn the_spec_locates_its_cluster_as_the_compiled_model_does() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("examples") {
        let path = entry.expect("entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let docs = spec_compiler::load::load_spec(&path).expect("spec");
        let before = cloud_resources::model::locate(&docs.cluster).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let compiled = spec_compiler::compile(&docs, &support::options()).expect("compile");
        let model = cloud_resources::model::build(&docs, &compiled).expect("model");
        assert_eq!(before, model.location(), "{}", path.display());
        assert_eq!(before, cloud_resources::model::locate(&compiled.completed).expect("completed"), "{}", path.display());
        seen += 1;
    }
    assert!(seen >= 5, "only {seen} examples read from {}", dir.display());
}
