//! The one fake IMDSv2: session tokens (PUT `/latest/api/token` with a TTL header, then the token on
//! every GET; 401 without a valid one), the metadata paths nodeup and protokube read, the instance
//! identity document and user-data; plus scripted faults for client tests ([`Faults`]).
//! `keelson-local` runs one per machine, inside that machine's network namespace, on
//! 169.254.169.254:80; unit tests start one on 127.0.0.1 with [`ImdsServer::start`].

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::httpd::{Request, Response};

pub const TOKEN_PATH: &str = "/latest/api/token";
pub const TTL_HEADER: &str = "x-aws-ec2-metadata-token-ttl-seconds";
pub const TOKEN_HEADER: &str = "x-aws-ec2-metadata-token";
pub const MAX_TTL: u64 = 21_600;

/// What the metadata service knows about its instance (written by the harness from moto).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct InstanceData {
    pub instance_id: String,
    pub region: String,
    pub zone: String,
    pub private_ip: String,
    #[serde(default)]
    pub public_ip: Option<String>,
    #[serde(default)]
    pub instance_type: String,
    #[serde(default)]
    pub image_id: String,
    #[serde(default)]
    pub mac: String,
    #[serde(default)]
    pub subnet_id: String,
    #[serde(default)]
    pub vpc_id: String,
    #[serde(default)]
    pub security_groups: Vec<String>,
    /// Decoded user-data bytes; `None` → 404 as on EC2.
    #[serde(default)]
    pub user_data: Option<String>,
    #[serde(default)]
    pub tags: Vec<(String, String)>,
    /// The instance role's credentials, as EC2 serves them under `iam/` when the instance has an
    /// instance profile; `None` → no `iam/` (404), as for an instance without one.
    #[serde(default)]
    pub iam: Option<RoleCredentials>,
    /// `local-hostname` as EC2 reports it (its private DNS name); `None`: derived from the address.
    #[serde(default)]
    pub local_hostname: Option<String>,
    /// Any other `/latest/meta-data/<path>` → value (wins over the fields above).
    #[serde(default)]
    pub extra: BTreeMap<String, String>,
}

/// Temporary credentials of an instance's role (from `sts:AssumeRole`, as EC2 gets them) and the
/// instance profile they come through: what `iam/info` and `iam/security-credentials/<role>` serve.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RoleCredentials {
    pub instance_profile_arn: String,
    pub instance_profile_id: String,
    pub role_name: String,
    pub access_key_id: String,
    pub secret_access_key: String,
    pub token: String,
    /// RFC 3339 UTC, e.g. `2026-01-01T06:00:00Z`.
    pub expiration: String,
    /// RFC 3339 UTC: when the credentials were obtained.
    pub last_updated: String,
}

impl RoleCredentials {
    /// `iam/info`, EC2's JSON.
    pub fn info_json(&self) -> String {
        serde_json::to_string_pretty(&serde_json::json!({
            "Code": "Success",
            "LastUpdated": self.last_updated,
            "InstanceProfileArn": self.instance_profile_arn,
            "InstanceProfileId": self.instance_profile_id,
        }))
        .unwrap_or_default()
    }

    /// `iam/security-credentials/<role>`, EC2's JSON.
    pub fn credentials_json(&self) -> String {
        serde_json::to_string_pretty(&serde_json::json!({
            "Code": "Success",
            "LastUpdated": self.last_updated,
            "Type": "AWS-HMAC",
            "AccessKeyId": self.access_key_id,
            "SecretAccessKey": self.secret_access_key,
            "Token": self.token,
            "Expiration": self.expiration,
        }))
        .unwrap_or_default()
    }
}

impl InstanceData {
    pub fn local_hostname(&self) -> String {
        if let Some(name) = &self.local_hostname {
            return name.clone();
        }
        format!("ip-{}.{}.compute.internal", self.private_ip.replace('.', "-"), self.region)
    }

    fn identity_document(&self) -> String {
        serde_json::json!({
            "accountId": "123456789012",
            "architecture": "x86_64",
            "availabilityZone": self.zone,
            "imageId": self.image_id,
            "instanceId": self.instance_id,
            "instanceType": self.instance_type,
            "privateIp": self.private_ip,
            "region": self.region,
            "version": "2017-09-30",
        })
        .to_string()
    }

    /// Value of a `/latest/meta-data/<path>` (directories end in `/` and list their children).
    pub fn meta(&self, path: &str) -> Option<String> {
        if let Some(v) = self.extra.get(path) {
            return Some(v.clone());
        }
        let mac = &self.mac;
        let v = match path {
            "" if !self.extra.is_empty() => return None,
            "" if self.iam.is_some() => {
                "ami-id\nhostname\niam/\ninstance-id\ninstance-type\nlocal-hostname\nlocal-ipv4\nmac\nnetwork/\nplacement/\npublic-ipv4\nsecurity-groups\ntags/"
                    .to_string()
            }
            "" => "ami-id\nhostname\ninstance-id\ninstance-type\nlocal-hostname\nlocal-ipv4\nmac\nnetwork/\nplacement/\npublic-ipv4\nsecurity-groups\ntags/"
                .to_string(),
            "iam/" => {
                self.iam.as_ref()?;
                "info\nsecurity-credentials/".to_string()
            }
            "iam/info" => self.iam.as_ref()?.info_json(),
            "iam/security-credentials/" => self.iam.as_ref()?.role_name.clone(),
            "ami-id" => self.image_id.clone(),
            "instance-id" => self.instance_id.clone(),
            "instance-type" => self.instance_type.clone(),
            "hostname" | "local-hostname" => self.local_hostname(),
            "local-ipv4" => self.private_ip.clone(),
            "public-ipv4" => self.public_ip.clone()?,
            "mac" => mac.clone(),
            "security-groups" => self.security_groups.join("\n"),
            "placement/" => "availability-zone\nregion".to_string(),
            "placement/availability-zone" => self.zone.clone(),
            "placement/region" => self.region.clone(),
            "network/" => "interfaces/".to_string(),
            "network/interfaces/" => "macs/".to_string(),
            "network/interfaces/macs/" => format!("{mac}/"),
            "tags/" => "instance/".to_string(),
            "tags/instance/" => self.tags.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>().join("\n"),
            p => {
                if let Some(role) = p.strip_prefix("iam/security-credentials/") {
                    return self.iam.as_ref().filter(|c| c.role_name == role).map(RoleCredentials::credentials_json);
                }
                if let Some(k) = p.strip_prefix("tags/instance/") {
                    return self.tags.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
                }
                let rest = p.strip_prefix(&format!("network/interfaces/macs/{mac}/"))?;
                match rest {
                    "" => "device-number\nlocal-ipv4s\nmac\nsubnet-id\nvpc-id".to_string(),
                    "device-number" => "0".to_string(),
                    "local-ipv4s" => self.private_ip.clone(),
                    "mac" => mac.clone(),
                    "subnet-id" => self.subnet_id.clone(),
                    "vpc-id" => self.vpc_id.clone(),
                    _ => return None,
                }
            }
        };
        Some(v)
    }
}

/// Faults scripted by a test, and what the service saw.
#[derive(Debug, Default)]
pub struct Faults {
    /// Status codes answered to the next GETs, in order, before normal service.
    pub fail_next: Vec<u16>,
    /// Revoke every token after this many successful GETs (the next GET gets 401).
    pub revoke_after: Option<u32>,
    pub tokens_issued: u32,
    pub gets: u32,
    /// `METHOD path` of every request.
    pub requests: Vec<String>,
}

/// The service: instance data plus the issued tokens.
pub struct Imds {
    data: InstanceData,
    tokens: Mutex<HashMap<String, Instant>>,
    faults: Mutex<Faults>,
}

fn random_token() -> String {
    let mut b = [0u8; 24];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = f.read_exact(&mut b);
    }
    base64::Engine::encode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, b)
}

impl Imds {
    pub fn new(data: InstanceData) -> Arc<Imds> {
        Arc::new(Imds { data, tokens: Mutex::new(HashMap::new()), faults: Mutex::new(Faults::default()) })
    }

    /// The scripted faults and counters.
    pub fn faults(&self) -> std::sync::MutexGuard<'_, Faults> {
        self.faults.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn handle(&self, req: &Request) -> Response {
        self.faults().requests.push(format!("{} {}", req.method, req.path));
        if req.path == TOKEN_PATH {
            return self.token(req);
        }
        if req.method != "GET" && req.method != "HEAD" {
            return Response::text(405, "method not allowed\n");
        }
        {
            let mut f = self.faults();
            if !f.fail_next.is_empty() {
                let status = f.fail_next.remove(0);
                return Response::text(status, "");
            }
        }
        let response = self.metadata(req);
        if response.status == 200 {
            let mut f = self.faults();
            f.gets += 1;
            if f.revoke_after == Some(f.gets) {
                drop(f);
                self.revoke_all();
            }
        }
        response
    }

    fn metadata(&self, req: &Request) -> Response {
        let valid = req.header(TOKEN_HEADER).is_some_and(|t| {
            let mut tokens = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            tokens.retain(|_, exp| *exp > now);
            tokens.contains_key(t)
        });
        if !valid {
            // IMDSv2 only ("httpTokens: required"): no token, no metadata.
            return Response::text(401, "");
        }
        let path = req.path.as_str();
        if path == "/latest/user-data" || path == "/latest/user-data/" {
            return match &self.data.user_data {
                Some(u) => Response::bytes(200, u.clone().into_bytes()),
                None => Response::text(404, "not found\n"),
            };
        }
        if path == "/latest/dynamic/instance-identity/document" {
            return Response::text(200, self.data.identity_document()).header("Content-Type", "application/json");
        }
        if let Some(p) = path.strip_prefix("/latest/meta-data/") {
            if let Some(v) = self.data.meta(p) {
                return Response::text(200, v);
            }
        } else if path == "/latest/meta-data" {
            if let Some(v) = self.data.meta("") {
                return Response::text(200, v);
            }
        }
        Response::text(404, "not found\n")
    }

    fn token(&self, req: &Request) -> Response {
        if req.method != "PUT" {
            return Response::text(405, "");
        }
        // EC2 refuses token requests that went through a proxy.
        if req.header("x-forwarded-for").is_some() {
            return Response::text(403, "");
        }
        let Some(ttl) = req.header(TTL_HEADER).and_then(|v| v.parse::<u64>().ok()) else {
            return Response::text(400, "missing or invalid x-aws-ec2-metadata-token-ttl-seconds\n");
        };
        if ttl == 0 || ttl > MAX_TTL {
            return Response::text(400, "invalid ttl\n");
        }
        let token = random_token();
        self.faults().tokens_issued += 1;
        self.tokens.lock().unwrap_or_else(|e| e.into_inner()).insert(token.clone(), Instant::now() + Duration::from_secs(ttl));
        Response::text(200, token).header(TTL_HEADER, ttl.to_string())
    }

    /// Revoke every token (tests: the next GET gets 401 and a client must refresh).
    pub fn revoke_all(&self) {
        self.tokens.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

/// A fake IMDS on 127.0.0.1 for client tests, stopped when dropped.
pub struct ImdsServer {
    pub url: String,
    pub imds: Arc<Imds>,
    _server: crate::httpd::Server,
}

impl ImdsServer {
    /// Serve these `/latest/meta-data/<path>` values (and nothing else).
    pub fn start(values: &[(&str, &str)]) -> ImdsServer {
        let data = InstanceData { extra: values.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(), ..Default::default() };
        ImdsServer::start_for(data)
    }

    /// Serve an instance.
    pub fn start_for(data: InstanceData) -> ImdsServer {
        let imds = Imds::new(data);
        let handler = imds.clone();
        let server = crate::httpd::Server::start(Arc::new(move |r: &Request| handler.handle(r)));
        ImdsServer { url: format!("http://{}", server.addr()), imds, _server: server }
    }

    pub fn faults(&self) -> std::sync::MutexGuard<'_, Faults> {
        self.imds.faults()
    }
}

/// Serve `data` on `addr` (e.g. `169.254.169.254:80`) until the process is stopped.
pub async fn serve(addr: &str, data: InstanceData) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let imds = Imds::new(data);
    crate::httpd::serve(listener, Arc::new(move |r: &Request| imds.handle(r))).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: &str, path: &str, headers: &[(&str, &str)]) -> Request {
        Request {
            method: method.into(),
            path: path.into(),
            query: String::new(),
            headers: headers.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect(),
            peer: "x".into(),
            body: Vec::new(),
        }
    }

    fn body(r: &Response) -> String {
        match &r.body {
            crate::httpd::Body::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
            _ => String::new(),
        }
    }

    fn data() -> InstanceData {
        InstanceData {
            instance_id: "i-0abc".into(),
            region: "eu-west-1".into(),
            zone: "eu-west-1b".into(),
            private_ip: "172.20.64.5".into(),
            mac: "0e:00:00:00:00:01".into(),
            user_data: Some("#!/bin/bash\necho hi\n".into()),
            ..Default::default()
        }
    }

    #[test]
    fn token_flow() {
        let imds = Imds::new(data());
        assert_eq!(imds.handle(&req("GET", "/latest/meta-data/instance-id", &[])).status, 401);
        assert_eq!(imds.handle(&req("PUT", TOKEN_PATH, &[])).status, 400);
        assert_eq!(imds.handle(&req("PUT", TOKEN_PATH, &[(TTL_HEADER, "0")])).status, 400);
        assert_eq!(imds.handle(&req("PUT", TOKEN_PATH, &[(TTL_HEADER, "99999")])).status, 400);
        assert_eq!(imds.handle(&req("GET", TOKEN_PATH, &[(TTL_HEADER, "60")])).status, 405);
        assert_eq!(imds.handle(&req("PUT", TOKEN_PATH, &[(TTL_HEADER, "60"), ("x-forwarded-for", "1.2.3.4")])).status, 403);
        let t = imds.handle(&req("PUT", TOKEN_PATH, &[(TTL_HEADER, "60")]));
        assert_eq!(t.status, 200);
        let token = body(&t);
        let get = |p: &str, tok: &str| imds.handle(&req("GET", p, &[(TOKEN_HEADER, tok)]));
        assert_eq!(get("/latest/meta-data/instance-id", "bogus").status, 401);
        let r = get("/latest/meta-data/instance-id", &token);
        assert_eq!((r.status, body(&r)), (200, "i-0abc".to_string()));
        assert_eq!(body(&get("/latest/meta-data/placement/availability-zone", &token)), "eu-west-1b");
        assert_eq!(body(&get("/latest/meta-data/placement/region", &token)), "eu-west-1");
        assert_eq!(body(&get("/latest/meta-data/local-ipv4", &token)), "172.20.64.5");
        assert_eq!(get("/latest/meta-data/public-ipv4", &token).status, 404);
        assert_eq!(get("/latest/meta-data/nope", &token).status, 404);
        assert_eq!(body(&get("/latest/user-data", &token)), "#!/bin/bash\necho hi\n");
        assert!(body(&get("/latest/dynamic/instance-identity/document", &token)).contains("\"availabilityZone\":\"eu-west-1b\""));
        assert_eq!(body(&get("/latest/meta-data/network/interfaces/macs/0e:00:00:00:00:01/local-ipv4s", &token)), "172.20.64.5");
        imds.revoke_all();
        assert_eq!(get("/latest/meta-data/instance-id", &token).status, 401);
    }

    #[test]
    fn instance_role_credentials_as_ec2_serves_them() {
        let get_all = |d: InstanceData, paths: &[&str]| -> Vec<(u16, String)> {
            let imds = Imds::new(d);
            let token = body(&imds.handle(&req("PUT", TOKEN_PATH, &[(TTL_HEADER, "60")])));
            paths.iter().map(|p| imds.handle(&req("GET", p, &[(TOKEN_HEADER, &token)]))).map(|r| (r.status, body(&r))).collect()
        };
        let paths = [
            "/latest/meta-data/iam/security-credentials/",
            "/latest/meta-data/iam/info",
            "/latest/meta-data/iam/security-credentials/nodes.c",
            "/latest/meta-data/iam/security-credentials/other",
            "/latest/meta-data/",
        ];
        let none = get_all(data(), &paths);
        assert!(none[..4].iter().all(|(s, _)| *s == 404), "{none:?}");
        assert!(!none[4].1.contains("iam/"));
        let creds = RoleCredentials {
            instance_profile_arn: "arn:aws:iam::123456789012:instance-profile/nodes.c".into(),
            instance_profile_id: "AIPA1".into(),
            role_name: "nodes.c".into(),
            access_key_id: "ASIA1".into(),
            secret_access_key: "secret".into(),
            token: "tok".into(),
            expiration: "2026-01-01T06:00:00Z".into(),
            last_updated: "2026-01-01T00:00:00Z".into(),
        };
        let got = get_all(InstanceData { iam: Some(creds), ..data() }, &paths);
        assert_eq!(got[0], (200, "nodes.c".to_string()));
        let info: serde_json::Value = serde_json::from_str(&got[1].1).expect("info json");
        assert_eq!(info["InstanceProfileArn"], "arn:aws:iam::123456789012:instance-profile/nodes.c");
        let c: serde_json::Value = serde_json::from_str(&got[2].1).expect("credentials json");
        for (k, v) in [
            ("Code", "Success"),
            ("Type", "AWS-HMAC"),
            ("AccessKeyId", "ASIA1"),
            ("SecretAccessKey", "secret"),
            ("Token", "tok"),
            ("Expiration", "2026-01-01T06:00:00Z"),
            ("LastUpdated", "2026-01-01T00:00:00Z"),
        ] {
            assert_eq!(c[k], v, "{k}");
        }
        assert_eq!(got[3].0, 404);
        assert!(got[4].1.contains("iam/"));
    }

    #[test]
    fn no_user_data_is_404() {
        let imds = Imds::new(InstanceData { user_data: None, ..data() });
        let token = body(&imds.handle(&req("PUT", TOKEN_PATH, &[(TTL_HEADER, "60")])));
        assert_eq!(imds.handle(&req("GET", "/latest/user-data", &[(TOKEN_HEADER, &token)])).status, 404);
    }
}

#[cfg(test)]
mod server_tests {
    use super::*;

    fn get(url: &str, method: &str, headers: &[(&str, &str)]) -> (u16, String) {
        use std::io::{Read as _, Write as _};
        let addr = url.trim_start_matches("http://").split('/').next().unwrap_or("");
        let path = &url[url.find(addr).map(|i| i + addr.len()).unwrap_or(0)..];
        let mut s = std::net::TcpStream::connect(addr).expect("connect");
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
        for (n, v) in headers {
            req.push_str(&format!("{n}: {v}\r\n"));
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes()).expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("read");
        let status = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        (status, out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
    }

    #[test]
    fn scripted_faults_and_counters() {
        let srv = ImdsServer::start(&[("instance-id", "i-1")]);
        let (status, token) = get(&format!("{}{TOKEN_PATH}", srv.url), "PUT", &[(TTL_HEADER, "60")]);
        assert_eq!(status, 200);
        let meta = format!("{}/latest/meta-data/instance-id", srv.url);
        assert_eq!(get(&meta, "GET", &[(TOKEN_HEADER, &token)]), (200, "i-1".to_string()));
        srv.faults().fail_next = vec![503];
        assert_eq!(get(&meta, "GET", &[(TOKEN_HEADER, &token)]).0, 503);
        srv.faults().revoke_after = Some(2);
        assert_eq!(get(&meta, "GET", &[(TOKEN_HEADER, &token)]).0, 200);
        assert_eq!(get(&meta, "GET", &[(TOKEN_HEADER, &token)]).0, 401, "revoked after the 2nd success");
        assert_eq!(get(&format!("{}/latest/meta-data/local-ipv4", srv.url), "GET", &[(TOKEN_HEADER, "x")]).0, 401);
        let f = srv.faults();
        assert_eq!((f.tokens_issued, f.gets), (1, 2));
        assert_eq!(f.requests.len(), 6);
    }
}
