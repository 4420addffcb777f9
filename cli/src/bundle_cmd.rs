//! `keelson bundle create | push | bake`: air-gapped bundles (docs/bundles.md). Parses the flags and calls
//! `keelson-bundle`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;

#[derive(Debug, clap::Subcommand)]
pub enum BundleCommand {
    /// Every file and image the spec uses, verified, in one archive (`-o FILE`); run it again to
    /// resume a failed run.
    Create(CreateArgs),
    /// A bundle's files into a file repository and its images into a registry, skipping what is
    /// there; then set the spec's `assets.fileRepository` / `assets.containerRegistry` to them.
    Push(PushArgs),
    /// A bundle's files and images into a machine image's root filesystem (the AMI build step):
    /// nodeup's cache and containerd's store, images pinned, so machines booted from it download
    /// nothing. Needs root (containerd's snapshotter mounts).
    Bake(BakeArgs),
}

#[derive(Debug, clap::Args)]
pub struct CreateArgs {
    /// The spec file (one Cluster and its InstanceGroups).
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// The architectures whose files and image manifests the bundle holds (comma-separated).
    #[arg(long = "arch", value_delimiter = ',', value_name = "ARCH,…", default_value = "amd64,arm64")]
    pub arch: Vec<String>,
    /// The archive to write.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: PathBuf,
    /// Download the files from this mirror (laid out as `assets.fileRepository` expects) instead
    /// of their upstream URLs.
    #[arg(long = "from-mirror", value_name = "URL")]
    pub from_mirror: Option<String>,
    /// Copy the images from this registry (laid out as `assets.containerRegistry` expects)
    /// instead of their own registries.
    #[arg(long = "from-registry", value_name = "HOST[:PORT]")]
    pub from_registry: Option<String>,
    #[command(flatten)]
    pub compile: crate::args::CompileFlags,
}

#[derive(Debug, clap::Args)]
pub struct PushArgs {
    /// The bundle `keelson bundle create` wrote.
    pub bundle: PathBuf,
    /// Where the files go: the target spec's `assets.fileRepository` (`file:///DIR`,
    /// `s3://BUCKET/PREFIX`, `gs://BUCKET/PREFIX`).
    #[arg(long = "file-repository", value_name = "URL")]
    pub file_repository: String,
    /// The S3 endpoint of an `s3://` file repository (e.g. a local moto); defaults to
    /// $AWS_ENDPOINT_URL, then AWS itself. Credentials and region come from the standard AWS chain.
    #[arg(long = "endpoint-url", value_name = "URL")]
    pub endpoint_url: Option<String>,
    /// Where the images go: the target spec's `assets.containerRegistry`.
    #[arg(long = "registry", value_name = "HOST[:PORT]")]
    pub registry: String,
    /// Speak plain http to the registry although it is not on loopback.
    #[arg(long = "plain-http")]
    pub plain_http: bool,
}

#[derive(Debug, clap::Args)]
pub struct BakeArgs {
    /// The bundle `keelson bundle create` wrote.
    pub bundle: PathBuf,
    /// The machine image's root filesystem (a mounted image, or a directory a build packs).
    #[arg(long = "root", value_name = "DIR")]
    pub root: PathBuf,
    /// The cluster's `assets.containerRegistry`: images are named as its nodes ask for them (the
    /// names `keelson bundle push --registry` gives them). Without it, their upstream names.
    #[arg(long = "registry", value_name = "HOST[:PORT]")]
    pub registry: Option<String>,
    /// The architecture to bake (default: this machine's).
    #[arg(long = "arch", value_name = "ARCH")]
    pub arch: Option<String>,
    /// containerd's root inside the image (the spec's `containerd.root`, if it sets one).
    #[arg(long = "containerd-root", value_name = "PATH", default_value = bundle::bake::DEFAULT_CONTAINERD_ROOT)]
    pub containerd_root: String,
}

pub fn run(command: BundleCommand) -> anyhow::Result<ExitCode> {
    match command {
        BundleCommand::Create(args) => create(&args),
        BundleCommand::Push(args) => push(&args),
        BundleCommand::Bake(args) => bake(&args),
    }
}

fn bake(args: &BakeArgs) -> anyhow::Result<ExitCode> {
    if let Some(arch) = &args.arch {
        crate::args::parse_arches(std::slice::from_ref(arch))?;
    }
    let opts = bundle::BakeOptions {
        root: args.root.clone(),
        registry: args.registry.clone(),
        arch: args.arch.clone(),
        containerd_root: args.containerd_root.clone(),
    };
    let report = bundle::bake(&args.bundle, &opts).with_context(|| format!("baking {} into {}", args.bundle.display(), args.root.display()))?;
    for i in &report.images {
        println!("image    {i}");
    }
    println!("{}: {report}", args.root.display());
    Ok(ExitCode::SUCCESS)
}

fn create(args: &CreateArgs) -> anyhow::Result<ExitCode> {
    if let Some(file) = &args.compile.image_digests {
        // bundle.json records each image by the reference the spec names it with: a bundle made
        // from pinned references would record those, and no compile would find its digests.
        anyhow::bail!(
            "--image-digests {}: a bundle is made from the images' tags (it records the digests it copies); give the digests to the commands that compile against a pushed bundle (compile, apply, get assets)",
            file.display()
        );
    }
    let arches = crate::args::parse_arches(&args.arch)?;
    let docs = match spec_compiler::load::load_spec(&args.file) {
        Ok(d) => d,
        Err(e) => return Ok(crate::report(&e)),
    };
    let options = args.compile.options(Default::default())?;
    let plan = bundle::plan(&docs, &options, &arches).with_context(|| format!("{}", args.file.display()))?;
    let opts = bundle::CreateOptions { output: args.output.clone(), from_mirror: args.from_mirror.clone(), from_registry: args.from_registry.clone() };
    let report = bundle::create(&plan, &opts).with_context(|| format!("creating {}", args.output.display()))?;
    println!("{}: {report}", args.output.display());
    Ok(ExitCode::SUCCESS)
}

fn push(args: &PushArgs) -> anyhow::Result<ExitCode> {
    let store = bundle::open_repository(&args.file_repository, args.endpoint_url.as_deref())?;
    let opts = bundle::PushOptions { file_repository: args.file_repository.clone(), registry: args.registry.clone(), plain_http: args.plain_http };
    let report = bundle::push(&args.bundle, &store, &opts).with_context(|| format!("pushing {}", args.bundle.display()))?;
    for f in &report.files_pushed {
        println!("pushed   {f}");
    }
    for f in &report.files_skipped {
        println!("skipped  {f} (already there)");
    }
    for i in &report.images_pushed {
        println!("pushed   {i}");
    }
    for i in &report.images_skipped {
        println!("skipped  {i} (already there)");
    }
    println!(
        "files: {} pushed, {} already there; images: {} pushed, {} already there; blobs: {} pushed, {} already there; {} bytes sent",
        report.files_pushed.len(),
        report.files_skipped.len(),
        report.images_pushed.len(),
        report.images_skipped.len(),
        report.blobs_pushed,
        report.blobs_skipped,
        report.bytes_pushed
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(subcommand)]
        command: BundleCommand,
    }

    /// The commands docs/bundles.md shows parse as written.
    #[test]
    fn the_documented_commands_parse() {
        let create = Cli::try_parse_from("keelson-bundle create -f examples/minimal.yaml --arch amd64,arm64 -o minimal-bundle.tar".split(' ')).expect("create");
        let BundleCommand::Create(c) = create.command else { panic!("not create") };
        assert_eq!((c.arch.as_slice(), c.output.to_str()), (["amd64".to_string(), "arm64".to_string()].as_slice(), Some("minimal-bundle.tar")));
        let push = Cli::try_parse_from(
            "keelson-bundle push minimal-bundle.tar --file-repository file:///srv/keelson-assets --registry registry.internal.example.com:5000".split(' '),
        )
        .expect("push");
        let BundleCommand::Push(p) = push.command else { panic!("not push") };
        assert_eq!(
            (p.file_repository.as_str(), p.registry.as_str(), p.plain_http),
            ("file:///srv/keelson-assets", "registry.internal.example.com:5000", false)
        );
        let default_arches = Cli::try_parse_from(["k", "create", "-f", "s.yaml", "-o", "b.tar"]).expect("create");
        let BundleCommand::Create(c) = default_arches.command else { panic!("not create") };
        assert_eq!(c.arch, ["amd64", "arm64"]);
        assert!(Cli::try_parse_from(["k", "push", "b.tar", "--registry", "r:5000"]).is_err(), "--file-repository is required");
        let bake = Cli::try_parse_from("keelson-bundle bake minimal-bundle.tar --root /mnt/image --registry registry.internal.example.com:5000".split(' '))
            .expect("bake");
        let BundleCommand::Bake(b) = bake.command else { panic!("not bake") };
        assert_eq!(
            (b.root.to_str(), b.registry.as_deref(), b.containerd_root.as_str()),
            (Some("/mnt/image"), Some("registry.internal.example.com:5000"), "/var/lib/containerd")
        );
        assert!(Cli::try_parse_from(["k", "bake", "b.tar"]).is_err(), "--root is required");
    }

    #[test]
    fn create_refuses_image_digests_naming_the_file() {
        let cli = Cli::try_parse_from(["k", "create", "-f", "s.yaml", "-o", "b.tar", "--image-digests", "old-bundle.tar"]).expect("parses");
        let BundleCommand::Create(c) = cli.command else { panic!("not create") };
        let e = create(&c).expect_err("refused").to_string();
        assert!(e.contains("--image-digests old-bundle.tar") && e.contains("compile, apply, get assets"), "{e}");
    }
}
