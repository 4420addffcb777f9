//! etcd TLS material for this member, issued from the cluster CAs in the state store (kOps' names,
//! and one client CA per etcd cluster: [`base::pki`]'s "etcd client trust"):
//! `etcd-clients-ca-<cluster>` (an intermediate under `etcd-clients-ca`) signs the client-port
//! serving certificate and protokube's client certificate; the member accepts clients of that
//! intermediate and the API server's (`clients-ca.crt`), never another cluster's; clients verify
//! servers against the root (`ca.crt`). `etcd-peers-ca-<cluster>` signs the peer certificate.
//! Re-issued only when the member name, the address or a CA changes.

use std::path::{Path, PathBuf};

use base::pki::{self, CertSpec, Keypair, Usage};
use sha2::Digest as _;

use crate::config::EtcdCluster;
use crate::paths;

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("{0}")]
    State(#[from] base::StoreError),
    #[error("etcd TLS for {cluster}: CA keyset {keyset} is missing from the state store and {dir} holds no certificates")]
    MissingCa { cluster: String, keyset: String, dir: String },
    #[error("etcd TLS for {cluster}: {source}")]
    Issue {
        cluster: String,
        #[source]
        source: pki::PkiError,
    },
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

const FILES: [&str; 9] = ["ca.crt", "clients-ca.crt", "peer-ca.crt", "server.crt", "server.key", "peer.crt", "peer.key", "client.crt", "client.key"];
const STAMP: &str = "issued-for";

fn write(path: &Path, body: &str, mode: u32) -> Result<(), PkiError> {
    let io = |source| PkiError::Io { path: path.display().to_string(), source };
    // The mode is set before the first byte is written: a key is never readable by others.
    base::fs::write_atomic(path, body.as_bytes(), mode, None).map_err(|e| io(e.source))
}

async fn ca(store: &base::StateStore, name: &str) -> Result<Option<Keypair>, PkiError> {
    let rel = format!("pki/private/{name}/keyset.yaml");
    match store.get(&rel).await? {
        None => Ok(None),
        Some(bytes) => pki::parse_private_keyset(name, &bytes).map(Some).map_err(|source| PkiError::Issue { cluster: name.to_string(), source }),
    }
}

/// Make sure this member's certificates exist and match `member_dns` and `ip`. Returns the
/// directory (under `root`) and whether anything was (re)issued.
pub async fn ensure(root: &Path, store: &base::StateStore, ec: &EtcdCluster, member_id: &str, member_dns: &str, ip: &str) -> Result<(PathBuf, bool), PkiError> {
    let dir = paths::under(root, &paths::etcd_pki_dir(&ec.name));
    let have_all = FILES.iter().all(|f| dir.join(f).exists());
    let root_name = pki::ETCD_CLIENTS_CA.to_string();
    let clients_name = pki::etcd_clients_ca(&ec.name);
    let peers_name = format!("etcd-peers-ca-{}", ec.name);
    let [_, apiserver_name] = pki::etcd_client_trust(&ec.name);
    let cas = (ca(store, &root_name).await?, ca(store, &clients_name).await?, ca(store, &apiserver_name).await?, ca(store, &peers_name).await?);
    let (Some(root), Some(clients), Some(apiserver), Some(peers)) = cas else {
        if have_all {
            // Provisioned by other means (e.g. baked into the image): use what is there.
            return Ok((dir, false));
        }
        return Err(PkiError::MissingCa {
            cluster: ec.name.clone(),
            keyset: [&root_name, &clients_name, &apiserver_name, &peers_name].map(|n| format!("pki/private/{n}")).join(", "),
            dir: dir.display().to_string(),
        });
    };
    let digest = |kp: &Keypair| hex::encode(sha2::Sha256::digest(kp.cert_pem.as_bytes()));
    let stamp = format!("{member_dns} {ip} {} {} {} {}\n", digest(&root), digest(&clients), digest(&apiserver), digest(&peers));
    if have_all && std::fs::read_to_string(dir.join(STAMP)).ok().as_deref() == Some(stamp.as_str()) {
        return Ok((dir, false));
    }
    let err = |source: pki::PkiError| PkiError::Issue { cluster: ec.name.clone(), source };
    let ip_addr: Option<std::net::IpAddr> = ip.parse().ok();
    let loopback: std::net::IpAddr = std::net::Ipv4Addr::LOCALHOST.into();
    let server = pki::issue(
        &clients_name,
        &clients,
        &CertSpec {
            cn: member_id.to_string(),
            orgs: vec![],
            dns: vec![member_dns.to_string(), "localhost".into()],
            ips: std::iter::once(loopback).chain(ip_addr).collect(),
            // etcd's gateway also presents the serving certificate as a client.
            usage: Usage::ClientServer,
        },
    )
    .map_err(err)?;
    let peer = pki::issue(
        &peers_name,
        &peers,
        &CertSpec {
            cn: member_id.to_string(),
            orgs: vec![],
            dns: vec![member_dns.to_string()],
            ips: ip_addr.into_iter().collect(),
            usage: Usage::ClientServer,
        },
    )
    .map_err(err)?;
    let client = pki::issue(&clients_name, &clients, &CertSpec::client("protokube", &[])).map_err(err)?;
    write(&dir.join("ca.crt"), &root.cert_pem, 0o644)?;
    write(&dir.join("clients-ca.crt"), &format!("{}\n{}", clients.cert_pem.trim_end(), apiserver.cert_pem), 0o644)?;
    write(&dir.join("peer-ca.crt"), &peers.cert_pem, 0o644)?;
    for (name, kp) in [("server", &server), ("peer", &peer), ("client", &client)] {
        write(&dir.join(format!("{name}.key")), &kp.key_pem, 0o600)?;
        write(&dir.join(format!("{name}.crt")), &kp.cert_pem, 0o644)?;
    }
    write(&dir.join(STAMP), &stamp, 0o644)?;
    tracing::info!(dir = %dir.display(), member = %member_dns, "issued etcd certificates");
    Ok((dir, true))
}
