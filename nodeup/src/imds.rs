//! EC2 instance metadata (IMDSv2 only): session token, then reads; 404 → `None`, 401 → new
//! token and one retry; every request has a timeout and the whole lookup a deadline with
//! jittered backoff. The base URL is injectable (tests serve it locally).

use std::time::{Duration, Instant};

use crate::model::Facts;

/// Why metadata could not be read.
#[derive(Debug, thiserror::Error)]
#[error("instance metadata {url}: {message}")]
pub struct ImdsError {
    pub url: String,
    pub message: String,
}

pub const DEFAULT_BASE: &str = "http://169.254.169.254";

pub struct Imds {
    base: String,
    client: reqwest::blocking::Client,
    token: Option<String>,
    deadline: Duration,
}

impl Imds {
    pub fn new(base: &str, deadline: Duration) -> Result<Imds, ImdsError> {
        let client = reqwest::blocking::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(3))
            .no_proxy()
            .build()
            .map_err(|e| ImdsError { url: base.into(), message: e.to_string() })?;
        Ok(Imds { base: base.trim_end_matches('/').to_string(), client, token: None, deadline })
    }

    fn refresh_token(&mut self) -> Result<(), ImdsError> {
        let url = format!("{}/latest/api/token", self.base);
        let resp = self
            .client
            .put(&url)
            .header("X-aws-ec2-metadata-token-ttl-seconds", "21600")
            .send()
            .map_err(|e| ImdsError { url: url.clone(), message: e.to_string() })?;
        if !resp.status().is_success() {
            return Err(ImdsError { url, message: format!("token: HTTP {}", resp.status()) });
        }
        self.token = Some(resp.text().map_err(|e| ImdsError { url, message: e.to_string() })?.trim().to_string());
        Ok(())
    }

    fn once(&mut self, path: &str) -> Result<Option<String>, ImdsError> {
        if self.token.is_none() {
            self.refresh_token()?;
        }
        let url = format!("{}/latest/meta-data/{}", self.base, path.trim_start_matches('/'));
        for _ in 0..2 {
            let resp = self
                .client
                .get(&url)
                .header("X-aws-ec2-metadata-token", self.token.clone().unwrap_or_default())
                .send()
                .map_err(|e| ImdsError { url: url.clone(), message: e.to_string() })?;
            match resp.status().as_u16() {
                200 => return Ok(Some(resp.text().map_err(|e| ImdsError { url: url.clone(), message: e.to_string() })?.trim().to_string())),
                404 => return Ok(None),
                401 => self.refresh_token()?,
                s => return Err(ImdsError { url: url.clone(), message: format!("HTTP {s}") }),
            }
        }
        Err(ImdsError { url, message: "unauthorised after a fresh token".into() })
    }

    /// Read a metadata path, retrying transient failures until the deadline.
    pub fn get(&mut self, path: &str) -> Result<Option<String>, ImdsError> {
        let start = Instant::now();
        let mut backoff = Duration::from_millis(100);
        let mut seed = std::process::id() as u64 ^ start.elapsed().as_nanos() as u64;
        for _ in 0..64 {
            match self.once(path) {
                Ok(v) => return Ok(v),
                Err(e) if start.elapsed() + backoff >= self.deadline => return Err(e),
                Err(e) => {
                    tracing::warn!("{e}; retrying");
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    let jitter = Duration::from_millis(seed % (backoff.as_millis() as u64 + 1));
                    std::thread::sleep(backoff / 2 + jitter / 2);
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
        Err(ImdsError { url: format!("{}/latest/meta-data/{path}", self.base), message: "too many attempts".into() })
    }

    /// Fill the facts the flags left unset.
    pub fn fill(&mut self, facts: &mut Facts) -> Result<(), ImdsError> {
        if facts.instance_id.is_none() {
            facts.instance_id = self.get("instance-id")?;
        }
        if facts.zone.is_none() {
            facts.zone = self.get("placement/availability-zone")?;
        }
        if facts.region.is_none() {
            facts.region = self.get("placement/region")?;
        }
        if facts.internal_ip.is_none() {
            facts.internal_ip = self.get("local-ipv4")?.and_then(|s| s.parse().ok());
        }
        if facts.hostname.is_empty() {
            facts.hostname = self.get("local-hostname")?.unwrap_or_default();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testsupport::{Behaviour, Mirror};

    #[test]
    fn reads_facts_with_a_token_and_maps_404_to_none() {
        let m = Mirror::start();
        m.put("latest/api/token", b"tok".to_vec());
        m.put("latest/meta-data/instance-id", b"i-0abc".to_vec());
        m.put("latest/meta-data/placement/availability-zone", b"eu-west-1a".to_vec());
        m.put("latest/meta-data/local-ipv4", b"172.20.33.10\n".to_vec());
        m.put("latest/meta-data/local-hostname", b"ip-172-20-33-10.eu-west-1.compute.internal".to_vec());
        m.set("latest/meta-data/placement/region", Behaviour::NotFound);
        let mut imds = Imds::new(&m.url(""), Duration::from_secs(2)).expect("client");
        let mut facts = Facts::default();
        imds.fill(&mut facts).expect("facts");
        assert_eq!(facts.instance_id.as_deref(), Some("i-0abc"));
        assert_eq!(facts.zone.as_deref(), Some("eu-west-1a"));
        assert_eq!(facts.region, None, "404 is None");
        assert_eq!(facts.internal_ip.map(|i| i.to_string()).as_deref(), Some("172.20.33.10"));
        assert_eq!(facts.hostname, "ip-172-20-33-10.eu-west-1.compute.internal");
        assert_eq!(m.hits("latest/api/token"), 1, "one token for all reads");
    }

    #[test]
    fn unreachable_imds_fails_within_the_deadline() {
        let m = Mirror::start();
        m.set("latest/api/token", Behaviour::NotFound);
        let mut imds = Imds::new(&m.url(""), Duration::from_millis(800)).expect("client");
        let t = Instant::now();
        assert!(imds.get("instance-id").is_err());
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    }
}
