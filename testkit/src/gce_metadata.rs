//! A GCE metadata server for tests and the local cloud. No emulator exists to install, so this one
//! follows the server's documented behaviour (cloud.google.com/compute/docs/metadata): values under
//! `/computeMetadata/v1/` as `text/plain`; every answer carries `Metadata-Flavor: Google`; a request
//! without `Metadata-Flavor: Google`, or with `X-Forwarded-For` (a proxied request), is refused with
//! 403; a directory (a path ending in `/`) lists its entries one per line, sub-directories with a
//! trailing `/`; anything else is 404. Its wire format is checked against Google's own Go client
//! (`cloud.google.com/go/compute/metadata`) by this crate's `gce_metadata_wire` test.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::httpd::{Request, Response, Server};

const PREFIX: &str = "/computeMetadata/v1/";

/// The instance a server describes.
#[derive(Debug, Clone, Default)]
pub struct InstanceFacts {
    pub project: String,
    pub numeric_project: String,
    pub zone: String,
    pub name: String,
    pub id: String,
    pub internal_ip: String,
    pub hostname: String,
    pub attributes: BTreeMap<String, String>,
}

impl InstanceFacts {
    /// Every value as the server holds it, by path under `/computeMetadata/v1/`.
    pub fn values(&self) -> BTreeMap<String, String> {
        let mut v = BTreeMap::from([
            ("project/project-id".to_string(), self.project.clone()),
            ("project/numeric-project-id".to_string(), self.numeric_project.clone()),
            ("instance/zone".to_string(), format!("projects/{}/zones/{}", self.numeric_project, self.zone)),
            ("instance/name".to_string(), self.name.clone()),
            ("instance/id".to_string(), self.id.clone()),
            ("instance/hostname".to_string(), self.hostname.clone()),
            ("instance/network-interfaces/0/ip".to_string(), self.internal_ip.clone()),
        ]);
        for (k, val) in &self.attributes {
            v.insert(format!("instance/attributes/{k}"), val.clone());
        }
        v
    }
}

/// The answer to one request (pure: the server is a thin wrapper around this).
pub fn answer(values: &BTreeMap<String, String>, req: &Request) -> Response {
    let flavored = |r: Response| r.header("Metadata-Flavor", "Google");
    if req.header("x-forwarded-for").is_some() {
        return flavored(Response::text(403, "Request had X-Forwarded-For header: not allowed."));
    }
    if req.header("metadata-flavor") != Some("Google") {
        return flavored(Response::text(403, "Missing Metadata-Flavor:Google header."));
    }
    if req.method != "GET" {
        return flavored(Response::text(405, "Method not allowed."));
    }
    let Some(path) = req.path.strip_prefix(PREFIX) else {
        return flavored(Response::text(404, "Not found."));
    };
    if let Some(v) = values.get(path) {
        return flavored(Response::text(200, v.clone()));
    }
    // A directory: its direct entries.
    let dir = if path.is_empty() || path.ends_with('/') { path.to_string() } else { format!("{path}/") };
    let entries: BTreeSet<String> = values
        .keys()
        .filter_map(|k| k.strip_prefix(&dir))
        .map(|rest| match rest.split_once('/') {
            Some((d, _)) => format!("{d}/"),
            None => rest.to_string(),
        })
        .collect();
    if entries.is_empty() {
        return flavored(Response::text(404, "Not found."));
    }
    flavored(Response::text(200, entries.into_iter().map(|e| e + "\n").collect::<String>()))
}

/// Serve `facts` on 127.0.0.1 (what `GCE_METADATA_HOST` takes: [`Server::addr`]).
pub fn start(facts: &InstanceFacts) -> Server {
    let values = facts.values();
    Server::start(Arc::new(move |req: &Request| answer(&values, req)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(path: &str, headers: &[(&str, &str)]) -> Request {
        Request {
            method: "GET".into(),
            path: path.into(),
            query: String::new(),
            headers: headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            peer: "127.0.0.1:1".into(),
            body: Vec::new(),
        }
    }

    #[test]
    fn values_need_the_flavor_header_and_refuse_proxied_requests() {
        let facts = InstanceFacts { project: "p".into(), numeric_project: "12".into(), zone: "z-1".into(), name: "n".into(), ..Default::default() };
        let v = facts.values();
        let google = [("metadata-flavor", "Google")];
        let r = answer(&v, &req("/computeMetadata/v1/instance/zone", &google));
        assert_eq!(r.status, 200);
        assert!(r.headers.iter().any(|(k, v)| k == "Metadata-Flavor" && v == "Google"));
        assert_eq!(answer(&v, &req("/computeMetadata/v1/instance/zone", &[])).status, 403);
        assert_eq!(answer(&v, &req("/computeMetadata/v1/instance/zone", &[("metadata-flavor", "Google"), ("x-forwarded-for", "1.2.3.4")])).status, 403);
        assert_eq!(answer(&v, &req("/computeMetadata/v1/instance/nope", &google)).status, 404);
        let dir = answer(&v, &req("/computeMetadata/v1/instance/", &google));
        match dir.body {
            crate::httpd::Body::Bytes(b) => assert!(String::from_utf8_lossy(&b).contains("network-interfaces/\n"), "{b:?}"),
            other => panic!("{other:?}"),
        }
    }
}
