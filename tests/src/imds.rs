//! An IMDSv2 endpoint for one instance: session tokens (PUT `/latest/api/token` with a TTL header,
//! then the token on every GET; 401 without a valid one), the metadata paths nodeup and protokube
//! read, the instance identity document, and the user-data moto holds for the instance.
//! The harness runs one per machine, inside that machine's network namespace, on 169.254.169.254:80.

use std::collections::HashMap;
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
}

impl InstanceData {
    pub fn local_hostname(&self) -> String {
        format!(
            "ip-{}.{}.compute.internal",
            self.private_ip.replace('.', "-"),
            self.region
        )
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
        let mac = &self.mac;
        let v = match path {
            "" => "ami-id\nhostname\ninstance-id\ninstance-type\nlocal-hostname\nlocal-ipv4\nmac\nnetwork/\nplacement/\npublic-ipv4\nsecurity-groups\ntags/".to_string(),
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
            "tags/instance/" => self
                .tags
                .iter()
                .map(|(k, _)| k.as_str())
                .collect::<Vec<_>>()
                .join("\n"),
            p => {
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

/// The service: instance data plus the issued tokens.
pub struct Imds {
    data: InstanceData,
    tokens: Mutex<HashMap<String, Instant>>,
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
        Arc::new(Imds {
            data,
            tokens: Mutex::new(HashMap::new()),
        })
    }

    pub fn handle(&self, req: &Request) -> Response {
        if req.path == TOKEN_PATH {
            return self.token(req);
        }
        if req.method != "GET" && req.method != "HEAD" {
            return Response::text(405, "method not allowed\n");
        }
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
            return Response::text(200, self.data.identity_document())
                .header("Content-Type", "application/json");
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
        self.tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(token.clone(), Instant::now() + Duration::from_secs(ttl));
        Response::text(200, token).header(TTL_HEADER, ttl.to_string())
    }

    /// Revoke every token (tests: the next GET gets 401 and a client must refresh).
    pub fn revoke_all(&self) {
        self.tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
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
            headers: headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            peer: "x".into(),
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
        assert_eq!(
            imds.handle(&req("PUT", TOKEN_PATH, &[(TTL_HEADER, "60"), ("x-forwarded-for", "1.2.3.4")]))
                .status,
            403
        );
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
        assert_eq!(
            body(&get("/latest/meta-data/network/interfaces/macs/0e:00:00:00:00:01/local-ipv4s", &token)),
            "172.20.64.5"
        );
        imds.revoke_all();
        assert_eq!(get("/latest/meta-data/instance-id", &token).status, 401);
    }

    #[test]
    fn no_user_data_is_404() {
        let imds = Imds::new(InstanceData { user_data: None, ..data() });
        let token = body(&imds.handle(&req("PUT", TOKEN_PATH, &[(TTL_HEADER, "60")])));
        assert_eq!(
            imds.handle(&req("GET", "/latest/user-data", &[(TOKEN_HEADER, &token)])).status,
            404
        );
    }
}
