//! What the integration tests of this crate share.

/// The builds user-data boots, as the tests of `keelson compile` give them.
pub fn options() -> spec_compiler::CompileOptions {
    let assets = |items: &[(&str, &str)]| {
        items
            .iter()
            .map(|(arch, asset)| {
                (spec_compiler::versions::Arch::parse(arch).expect("arch"), spec_compiler::userdata::NodeupAsset::parse(asset).expect("asset"))
            })
            .collect()
    };
    spec_compiler::CompileOptions {
        nodeup_assets: assets(&[
            ("amd64", "8b1a9953c4611296a827abf8c47804d7e6c49c6b8f0b8c1f4ee3a5e6a1b1c2d3@https://nodeup.mirror.test/amd64/nodeup,https://backup.mirror.test/amd64/nodeup"),
            ("arm64", "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0@https://nodeup.mirror.test/arm64/nodeup"),
        ]),
        protokube_assets: assets(&[
            ("amd64", "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8@https://nodeup.mirror.test/amd64/protokube"),
            ("arm64", "6b86b273ff34fce19d6b804eff5a3f5747ada4eaa22f1d49c01e52ddb7875b4b@https://nodeup.mirror.test/arm64/protokube"),
        ]),
        ..Default::default()
    }
}
