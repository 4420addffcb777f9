//! `keelson etcd backup list | create | restore -f SPEC --etcd-cluster NAME`.
//!
//! The command never talks to etcd: the control planes' protokube does the work, driven through the
//! etcd cluster's backup store ([`base::etcd_backup`]). `create` asks the leader for a backup and
//! waits for it; `restore` writes a restore request and moves it through its phases (every member
//! stopped → every member restored → every member healthy → complete), so a rerun after any
//! interruption continues the same request.

use std::collections::BTreeMap;
use std::io::{BufRead as _, IsTerminal as _, Write as _};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use base::etcd_backup::{self, BackupId, BackupMeta, BackupRequest, BackupStore, MemberState, MemberStatus, RestorePhase, RestoreRequest};

use super::commands::{aws_target, load, open_store, runtime, Common};
use crate::prepare::prepare_with;

/// Options every `keelson etcd backup` command takes.
#[derive(Debug, clap::Args)]
pub struct BackupCommon {
    #[command(flatten)]
    pub common: Common,
    /// The etcd cluster (`main`, `events`, …).
    #[arg(long = "etcd-cluster", default_value = "main")]
    pub etcd_cluster: String,
}

#[derive(Debug, clap::Subcommand)]
pub enum BackupAction {
    /// List the backups of an etcd cluster, oldest first.
    List(BackupCommon),
    /// Ask the etcd leader for a backup now and wait until it is written.
    Create {
        #[command(flatten)]
        target: BackupCommon,
        /// Longest wait for the backup (Go duration).
        #[arg(long, default_value = "10m")]
        timeout: String,
    },
    /// Bring every member of the etcd cluster back to a backup: members stop, their data is moved
    /// aside (deleted only once the restored cluster is healthy), the snapshot is restored under a
    /// new cluster identity, members restart. A rerun after an interruption finishes the job.
    Restore {
        #[command(flatten)]
        target: BackupCommon,
        /// The backup to restore (an id from `list`).
        #[arg(long, conflicts_with = "latest", required_unless_present = "latest")]
        backup: Option<String>,
        /// Restore the newest backup.
        #[arg(long)]
        latest: bool,
        /// Do it without asking (the cluster's current data is replaced).
        #[arg(long)]
        yes: bool,
        /// Longest wait for the restored cluster to be healthy (Go duration).
        #[arg(long, default_value = "15m")]
        timeout: String,
    },
}

/// The backup store of one etcd cluster and the members that take part in it.
struct Target {
    store: BackupStore,
    etcd_cluster: String,
    members: Vec<String>,
}

fn duration(flag: &str, text: &str) -> anyhow::Result<Duration> {
    let d: keelson_api::Duration = text.parse().map_err(|e| anyhow::anyhow!("{flag} {text:?}: {e}"))?;
    u64::try_from(d.as_nanos()).map(Duration::from_nanos).map_err(|_| anyhow::anyhow!("{flag} {text:?}: must not be negative"))
}

/// Find the backup store and the members of the etcd cluster as the control planes run it: from a
/// control-plane group's protokube config in the state store (the compiler's derivation, which every
/// group's holds for every etcd cluster), with the spec file only naming the cluster and its state
/// store.
async fn target(args: &BackupCommon) -> anyhow::Result<Result<Target, ExitCode>> {
    let (docs, options) = match load(&args.common)? {
        Ok(x) => x,
        Err(code) => return Ok(Err(code)),
    };
    let file = args.common.file.display().to_string();
    let (model, _) = prepare_with(&docs, &options, false).with_context(|| format!("{file}: completing the spec"))?;
    let s3 = aws_target(&args.common, &model.region).await.s3;
    let state = open_store(&model.config_base, Some(s3.clone()))?;
    let prefix = keelson_api::protokube::state_prefix();
    let suffix = format!("/{}", keelson_api::protokube::FILE_NAME);
    let Some(rel) = state.list(&prefix).await.with_context(|| state.url(&prefix))?.into_iter().find(|k| k.ends_with(&suffix)) else {
        bail!(
            "{}: no control-plane group has a protokube config (*{suffix}): has `keelson apply -f {file} --yes` run with this keelson? (an older keelson did not write it: apply again)",
            state.url(&prefix)
        );
    };
    let bytes = state.get_required(&rel).await.with_context(|| state.url(&rel))?;
    let plan = keelson_api::protokube::ProtokubeConfig::parse(&bytes).with_context(|| state.url(&rel))?;
    let Some(ec) = plan.etcd_clusters.iter().find(|c| c.name == args.etcd_cluster) else {
        let names: Vec<&str> = plan.etcd_clusters.iter().map(|c| c.name.as_str()).collect();
        bail!("--etcd-cluster {}: the cluster has no such etcd cluster (it has {})", args.etcd_cluster, names.join(", "));
    };
    let store = open_store(&ec.backup_store, Some(s3))?;
    let members = ec.members.iter().map(|m| m.name.clone()).collect();
    Ok(Ok(Target { store: BackupStore::new(store), etcd_cluster: args.etcd_cluster.clone(), members }))
}

pub fn run(action: BackupAction) -> anyhow::Result<ExitCode> {
    let rt = runtime()?;
    rt.block_on(async {
        match action {
            BackupAction::List(args) => {
                let t = match target(&args).await? {
                    Ok(t) => t,
                    Err(code) => return Ok(code),
                };
                list(&t).await
            }
            BackupAction::Create { target: args, timeout } => {
                let timeout = duration("--timeout", &timeout)?;
                let t = match target(&args).await? {
                    Ok(t) => t,
                    Err(code) => return Ok(code),
                };
                create(&t, timeout).await
            }
            BackupAction::Restore { target: args, backup, latest, yes, timeout } => {
                let timeout = duration("--timeout", &timeout)?;
                let t = match target(&args).await? {
                    Ok(t) => t,
                    Err(code) => return Ok(code),
                };
                restore(&t, backup.as_deref(), latest, yes, timeout).await
            }
        }
    })
}

fn human_size(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}

async fn list(t: &Target) -> anyhow::Result<ExitCode> {
    let backups = t.store.list().await?;
    println!("{:<28} {:<22} {:>10} {:>10} {:<8} MEMBERS", "BACKUP", "REASON", "REVISION", "SIZE", "ETCD");
    for b in &backups {
        println!("{:<28} {:<22} {:>10} {:>10} {:<8} {}", b.id, b.reason, b.revision, human_size(b.size), b.etcd_version, b.members.join(","));
    }
    println!("{} backups of etcd {} in {}", backups.len(), t.etcd_cluster, t.store.url(""));
    Ok(ExitCode::SUCCESS)
}

fn print_backup(verb: &str, m: &BackupMeta) {
    println!(
        "{verb} backup {} of etcd {}: revision {}, {}, etcd {}, taken from {}",
        m.id,
        m.etcd_cluster,
        m.revision,
        human_size(m.size),
        m.etcd_version,
        m.taken_from
    );
}

async fn create(t: &Target, timeout: Duration) -> anyhow::Result<ExitCode> {
    let now = time::OffsetDateTime::now_utc();
    let req = BackupRequest { id: etcd_backup::request_id(now), requested_at: etcd_backup::rfc3339(now) };
    t.store.put_backup_request(&req).await?;
    eprintln!("keelson: asked the etcd {} leader for a backup (request {})", t.etcd_cluster, req.id);
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(done) = t.store.backup_request_done().await?.filter(|d| d.id == req.id) {
            let id = BackupId::parse(&done.backup).with_context(|| format!("the answer names {:?}, not a backup id", done.backup))?;
            print_backup("created", &t.store.meta(&id).await?);
            return Ok(ExitCode::SUCCESS);
        }
        if Instant::now() >= deadline {
            bail!("no backup after {timeout:?}: is protokube running on the control planes, and is etcd {} healthy?", t.etcd_cluster);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Ask on the terminal; `false` unless the answer is `yes`.
fn confirm(question: &str) -> bool {
    if !std::io::stdin().is_terminal() {
        return false;
    }
    print!("{question} Type `yes` to go on: ");
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).is_ok() && line.trim() == "yes"
}

async fn restore(t: &Target, backup: Option<&str>, latest: bool, yes: bool, timeout: Duration) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    let existing = t.store.restore_request().await?.filter(|r| r.phase != RestorePhase::Complete);
    let req = match existing {
        Some(r) if latest || backup == Some(r.backup.as_str()) => {
            println!("continuing restore {} of etcd {} from backup {} (phase {:?})", r.id, t.etcd_cluster, r.backup, r.phase);
            r
        }
        Some(r) => bail!(
            "restore {} of etcd {} from backup {} is not finished (phase {:?}); rerun with --backup {} to finish it first",
            r.id,
            t.etcd_cluster,
            r.backup,
            r.phase,
            r.backup
        ),
        None => {
            let meta = match backup {
                Some(id) => {
                    let parsed = BackupId::parse(id).with_context(|| format!("--backup {id:?}: not a backup id (`keelson etcd backup list` shows them)"))?;
                    t.store.meta(&parsed).await?
                }
                None => {
                    let ids = t.store.ids().await?;
                    if ids.is_empty() {
                        bail!("etcd {} has no backups in {}", t.etcd_cluster, t.store.url(""));
                    }
                    let now = time::OffsetDateTime::now_utc();
                    let Some(newest) = etcd_backup::latest_restorable(&ids, now) else {
                        bail!(
                            "every backup of etcd {} in {} is dated in the future (the newest, {}, was taken by a control plane whose clock ran ahead); name one with --backup if you trust it",
                            t.etcd_cluster,
                            t.store.url(""),
                            ids.last().map(ToString::to_string).unwrap_or_default()
                        );
                    };
                    let future: Vec<String> = ids.iter().filter(|i| **i > newest).map(ToString::to_string).collect();
                    if !future.is_empty() {
                        println!(
                            "ignoring {} backup(s) dated more than {} min in the future (taken by a control plane whose clock ran ahead): {}",
                            future.len(),
                            etcd_backup::MAX_FUTURE.as_secs() / 60,
                            future.join(", ")
                        );
                    }
                    t.store.meta(&newest).await?
                }
            };
            print_backup("restoring", &meta);
            println!(
                "every member of etcd {} ({}) stops, its data is moved aside, and the cluster restarts from this backup: changes made after {} are lost",
                t.etcd_cluster,
                t.members.join(", "),
                meta.taken_at
            );
            if !yes && !confirm("Restore?") {
                bail!("not restoring without --yes (or `yes` at the prompt)");
            }
            let now = time::OffsetDateTime::now_utc();
            let r = RestoreRequest {
                id: etcd_backup::RestoreId::new(now),
                backup: meta.id.clone(),
                phase: RestorePhase::Stop,
                members: t.members.clone(),
                requested_at: etcd_backup::rfc3339(now),
                requested_by: std::env::var("USER").unwrap_or_default(),
            };
            t.store.put_restore_request(&r).await?;
            r
        }
    };
    let healthy = drive(t, req, started, timeout).await?;
    let revision = healthy.iter().filter_map(|s| s.revision).max().unwrap_or(0);
    let cluster_id = healthy.first().and_then(|s| s.cluster_id.clone()).unwrap_or_default();
    println!(
        "restored etcd {} in {:.1}s: revision {revision}, {}/{} members healthy, cluster {cluster_id}",
        t.etcd_cluster,
        started.elapsed().as_secs_f64(),
        healthy.len(),
        t.members.len()
    );
    Ok(ExitCode::SUCCESS)
}

/// Move the request through its phases until every member is healthy; returns their statuses.
async fn drive(t: &Target, mut req: RestoreRequest, started: Instant, timeout: Duration) -> anyhow::Result<Vec<MemberStatus>> {
    let deadline = Instant::now() + timeout;
    let mut shown: BTreeMap<String, MemberState> = BTreeMap::new();
    loop {
        let mut statuses = Vec::new();
        for m in &req.members {
            if let Some(s) = t.store.member_status(m).await?.filter(|s| s.request == req.id) {
                if shown.get(m) != Some(&s.state) {
                    println!("  {:>6.1}s  etcd-{m}: {:?} ({})", started.elapsed().as_secs_f64(), s.state, s.detail);
                    shown.insert(m.clone(), s.state);
                }
                statuses.push(s);
            }
        }
        // A failed step is retried by its member every pass: shown above, waited through.
        let all = statuses.len() == req.members.len();
        let at_least = |state: MemberState| all && statuses.iter().all(|s| s.state >= state);
        match req.phase {
            RestorePhase::Stop if at_least(MemberState::Stopped) => {
                req.phase = RestorePhase::Restore;
                t.store.put_restore_request(&req).await?;
                println!("  {:>6.1}s  every member stopped: restoring", started.elapsed().as_secs_f64());
                continue;
            }
            RestorePhase::Restore if at_least(MemberState::Healthy) => {
                let ids: std::collections::BTreeSet<&Option<String>> = statuses.iter().map(|s| &s.cluster_id).collect();
                if ids.len() == 1 && !ids.contains(&None) {
                    req.phase = RestorePhase::Complete;
                    t.store.put_restore_request(&req).await?;
                    return Ok(statuses);
                }
            }
            RestorePhase::Complete => return Ok(statuses),
            _ => {}
        }
        if Instant::now() >= deadline {
            let missing: Vec<String> = req
                .members
                .iter()
                .filter(|m| !statuses.iter().any(|s| &&s.member == m))
                .map(|m| format!("etcd-{m} (no report)"))
                .chain(statuses.iter().map(|s| format!("etcd-{}: {:?} ({})", s.member, s.state, s.detail)))
                .collect();
            bail!(
                "restore {} is at phase {:?} after {timeout:?}: {}; fix what a member reports and rerun the same command to keep \
                 waiting (the request stays; the data moved aside is kept)",
                req.id,
                req.phase,
                missing.join(", ")
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
