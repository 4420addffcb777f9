//! Cloud Storage's access control, in front of `fake-gcs-server` (which has none): every request is
//! read up to its headers, its bearer token resolved to a caller (email and scopes), its JSON-API
//! method mapped to the permission and resource Cloud Storage checks, and decided by
//! [`crate::gce_iam::authorize`] from the project's and the bucket's policies. Allowed requests go
//! on to the emulator unchanged (with `Connection: close`, so one connection carries one checked
//! request); the rest get Google's 401/403. A bucket's policy (`/storage/v1/b/{b}/iam`) is served
//! by [`crate::gce_iam::GceIam`]. A resumable upload's session URI is its own authority, as on
//! Google's service (whoever started the upload was checked). A request the gate cannot map is
//! refused, never passed.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::gce_iam::{authorize, Caller, GceIam};
use crate::google_api::query;
use crate::httpd::Request;

/// Resolves a bearer token to its caller (`None`: not a token the cloud issued).
pub type Callers = Arc<dyn Fn(&str) -> Option<Caller> + Send + Sync>;

const MAX_HEAD: usize = 64 * 1024;
const MAX_IAM_BODY: usize = 1024 * 1024;
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// What a request needs: a permission on a resource, or nothing more (a session URI), or it is
/// the bucket policy method.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Need {
    Permission { permission: &'static str, bucket: String, resource: String },
    Session,
    BucketPolicy { bucket: String },
}

fn dec(s: &str) -> String {
    percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned()
}

/// The permission a JSON-API request needs (`Err`: the gate does not know the method).
pub fn need(method: &str, path: &str, q: &str) -> Result<Need, String> {
    let qs = query(q);
    let object = |bucket: &str, name: &str| format!("projects/_/buckets/{bucket}/objects/{name}");
    let perm = |permission, bucket: &str, resource: String| Ok(Need::Permission { permission, bucket: bucket.to_string(), resource });
    if let Some(rest) = path.strip_prefix("/upload/storage/v1/b/") {
        let bucket = dec(rest.split('/').next().unwrap_or_default());
        if qs.contains_key("upload_id") {
            return Ok(Need::Session);
        }
        return match (method, qs.get("name")) {
            ("POST", Some(name)) => perm("storage.objects.create", &bucket, object(&bucket, name)),
            _ => Err(format!("{method} {path}: an upload must name its object in the query")),
        };
    }
    let rest = path.strip_prefix("/download").unwrap_or(path);
    let Some(rest) = rest.strip_prefix("/storage/v1/b") else { return Err(format!("{method} {path}: not a Cloud Storage JSON API method")) };
    let segs: Vec<&str> = rest.trim_start_matches('/').splitn(3, '/').collect();
    match (method, segs.as_slice()) {
        ("POST", [""]) => Ok(Need::Permission { permission: "storage.buckets.create", bucket: String::new(), resource: "projects/_".into() }),
        (_, [b, "iam"]) => Ok(Need::BucketPolicy { bucket: dec(b) }),
        ("GET", [b]) => perm("storage.buckets.get", &dec(b), format!("projects/_/buckets/{}", dec(b))),
        ("GET", [b, "o"]) => perm("storage.objects.list", &dec(b), format!("projects/_/buckets/{}", dec(b))),
        ("GET", [b, "o", name]) => perm("storage.objects.get", &dec(b), object(&dec(b), &dec(name))),
        ("DELETE", [b, "o", name]) => perm("storage.objects.delete", &dec(b), object(&dec(b), &dec(name))),
        ("PATCH" | "PUT", [b, "o", name]) => perm("storage.objects.update", &dec(b), object(&dec(b), &dec(name))),
        _ => Err(format!("{method} {path}: a Cloud Storage method the local gate does not check")),
    }
}

fn error_response(code: u16, message: &str) -> Vec<u8> {
    let reason = if code == 401 { "Unauthorized" } else { "Forbidden" };
    let body = json!({"error": {"code": code, "message": message, "errors": [{"message": message, "domain": "global", "reason": if code == 401 { "required" } else { "forbidden" }}]}}).to_string();
    format!("HTTP/1.1 {code} {reason}\r\nContent-Type: application/json; charset=UTF-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())
        .into_bytes()
}

/// Accept on `listener`, check each request, pass the allowed ones to `upstream` (`host:port`).
pub async fn serve(listener: TcpListener, upstream: String, iam: GceIam, callers: Callers) {
    loop {
        let Ok((inbound, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let (upstream, iam, callers) = (upstream.clone(), iam.clone(), callers.clone());
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(3600), one(inbound, upstream, iam, callers)).await;
        });
    }
}

async fn one(mut inbound: TcpStream, upstream: String, iam: GceIam, callers: Callers) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    let end = loop {
        let n = tokio::time::timeout(HEAD_TIMEOUT, inbound.read(&mut buf)).await.map_err(|_| std::io::ErrorKind::TimedOut)??;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
        if let Some(i) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if head.len() > MAX_HEAD {
            return inbound.write_all(&error_response(400, "request head too large")).await;
        }
    };
    let text = String::from_utf8_lossy(&head[..end]).into_owned();
    let mut lines = text.split("\r\n");
    let mut first = lines.next().unwrap_or_default().split(' ');
    let (method, target) = (first.next().unwrap_or_default().to_string(), first.next().unwrap_or_default().to_string());
    let headers: Vec<(String, String)> = lines.filter_map(|l| l.split_once(':')).map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string())).collect();
    let header = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    let (path, q) = target.split_once('?').unwrap_or((&target, ""));
    let need = match need(&method, path, q) {
        Ok(n) => n,
        Err(why) => return inbound.write_all(&error_response(403, &why)).await,
    };
    if need != Need::Session {
        let token = header("authorization").and_then(|a| a.strip_prefix("Bearer ").map(|t| t.trim().to_string())).unwrap_or_default();
        let Some(caller) = (!token.is_empty()).then(|| callers(&token)).flatten() else {
            return inbound.write_all(&error_response(401, "Invalid Credentials")).await;
        };
        let (permission, bucket, resource) = match &need {
            Need::Permission { permission, bucket, resource } => (*permission, bucket.clone(), resource.clone()),
            Need::BucketPolicy { bucket } => {
                let p = if method == "GET" { "storage.buckets.getIamPolicy" } else { "storage.buckets.setIamPolicy" };
                (p, bucket.clone(), format!("projects/_/buckets/{bucket}"))
            }
            Need::Session => unreachable!("checked above"),
        };
        if let Err(why) = authorize(&iam.project_policy(), &iam.bucket_policy(&bucket), &caller, permission, &resource) {
            return inbound.write_all(&error_response(403, &why)).await;
        }
        if let Need::BucketPolicy { .. } = need {
            let len: usize = header("content-length").and_then(|l| l.parse().ok()).unwrap_or(0).min(MAX_IAM_BODY);
            let mut body = head[end..].to_vec();
            while body.len() < len {
                let n = tokio::time::timeout(HEAD_TIMEOUT, inbound.read(&mut buf)).await.map_err(|_| std::io::ErrorKind::TimedOut)??;
                if n == 0 {
                    break;
                }
                body.extend_from_slice(&buf[..n]);
            }
            let req = Request { method, path: path.to_string(), query: q.to_string(), headers, peer: String::new(), body };
            let r = iam.answer(&req);
            let crate::httpd::Body::Bytes(b) = r.body else { return Ok(()) };
            let out = format!("HTTP/1.1 {} OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", r.status, b.len());
            inbound.write_all(out.as_bytes()).await?;
            return inbound.write_all(&b).await;
        }
    }
    let mut out = TcpStream::connect(&upstream).await?;
    // The head as it came, one request per connection.
    let mut rewritten = String::new();
    for (i, line) in text.trim_end_matches("\r\n").split("\r\n").enumerate() {
        if i > 0 && line.to_ascii_lowercase().starts_with("connection:") {
            continue;
        }
        rewritten.push_str(line);
        rewritten.push_str("\r\n");
    }
    rewritten.push_str("Connection: close\r\n\r\n");
    out.write_all(rewritten.as_bytes()).await?;
    out.write_all(&head[end..]).await?;
    tokio::io::copy_bidirectional(&mut inbound, &mut out).await.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_api_methods_map_to_the_permissions_cloud_storage_checks() {
        let p = |permission, bucket: &str, resource: &str| Ok(Need::Permission { permission, bucket: bucket.into(), resource: resource.into() });
        assert_eq!(
            need("GET", "/storage/v1/b/b/o/c%2Fpki%2Fprivate%2Fx", "alt=media"),
            p("storage.objects.get", "b", "projects/_/buckets/b/objects/c/pki/private/x")
        );
        assert_eq!(need("GET", "/download/storage/v1/b/b/o/c%2Fx", "alt=media"), p("storage.objects.get", "b", "projects/_/buckets/b/objects/c/x"));
        assert_eq!(need("GET", "/storage/v1/b/b/o", "prefix=c%2F"), p("storage.objects.list", "b", "projects/_/buckets/b"));
        assert_eq!(need("DELETE", "/storage/v1/b/b/o/c%2Fx", ""), p("storage.objects.delete", "b", "projects/_/buckets/b/objects/c/x"));
        assert_eq!(
            need("POST", "/upload/storage/v1/b/b/o", "uploadType=media&name=c%2Faddons%2Fx&ifGenerationMatch=0"),
            p("storage.objects.create", "b", "projects/_/buckets/b/objects/c/addons/x")
        );
        assert_eq!(need("PUT", "/upload/storage/v1/b/b/o", "uploadType=resumable&upload_id=abc"), Ok(Need::Session));
        assert_eq!(need("PUT", "/storage/v1/b/b/iam", ""), Ok(Need::BucketPolicy { bucket: "b".into() }));
        assert!(need("POST", "/upload/storage/v1/b/b/o", "uploadType=multipart").is_err(), "an upload naming no object is refused");
        assert!(need("POST", "/storage/v1/b/b/o/x/rewriteTo/b/o/y", "").is_err(), "what the gate does not know is refused");
        assert!(need("GET", "/_internal/healthcheck", "").is_err());
    }
}
