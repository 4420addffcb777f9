//! `keelson-local`: run a Keelson cluster on this machine. See the crate docs and README.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "keelson-local", about = "Run a Keelson cluster on your machine (moto + systemd-nspawn machines)")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Build (or find) the cached Debian rootfs and print its path.
    Rootfs,
    /// Serve IMDSv2 for one instance on 169.254.169.254:80 (run inside its namespace).
    #[command(hide = true)]
    Imds {
        #[arg(long)]
        data: PathBuf,
        #[arg(long, default_value = "169.254.169.254:80")]
        listen: String,
    },
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(cli) {
        eprintln!("keelson-local: {e}");
        let mut src = e.source();
        while let Some(s) = src {
            eprintln!("  caused by: {s}");
            src = s.source();
        }
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Cmd::Rootfs => {
            let p = keelson_local::rootfs::ensure(&keelson_local::paths::cache_dir())?;
            println!("{}", p.display());
        }
        Cmd::Imds { data, listen } => {
            let text = std::fs::read_to_string(&data)?;
            let d: keelson_local::imds::InstanceData = serde_json::from_str(&text)?;
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(async move {
                let l = tokio::net::TcpListener::bind(&listen).await?;
                println!("imds: listening on {listen} for {}", d.instance_id);
                let imds = keelson_local::imds::Imds::new(d);
                keelson_local::httpd::serve(l, std::sync::Arc::new(move |r: &keelson_local::httpd::Request| imds.handle(r))).await;
                Ok::<(), anyhow::Error>(())
            })?;
        }
    }
    Ok(())
}
