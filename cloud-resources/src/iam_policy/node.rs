//! Nodes: their own instance-group config, the cluster CA and the bootstrap token from the state
//! store, ECR pulls when allowed.

use serde_json::{json, Value};

use super::{statement, PolicyInputs, ECR_READ};

pub(super) fn node(p: &PolicyInputs) -> Vec<Value> {
    let mut out = Vec::new();
    if let Some((bucket, key)) = &p.state_store {
        let prefix = key.trim_end_matches('/');
        let object = |rel: &str| {
            if prefix.is_empty() {
                format!("arn:{}:s3:::{bucket}/{rel}", p.partition)
            } else {
                format!("arn:{}:s3:::{bucket}/{prefix}/{rel}", p.partition)
            }
        };
        // What a worker reads on every cloud (GCE grants the same prefixes on its bucket).
        let key = |rel: &str| if prefix.is_empty() { rel.to_string() } else { format!("{prefix}/{rel}") };
        let token = base::bootstrap_token::state_key();
        let mut readable: Vec<String> = keelson_api::nodeup::NODE_READABLE_PREFIXES.iter().map(|p| object(&format!("{p}*"))).collect();
        if p.bootstrap_token {
            readable.push(object(&token));
        }
        out.push(statement(&["s3:GetObject"], json!(readable), None));
        // A worker lists nothing; the listing it may make is of what it may read (the bucket's
        // ListBucket is also what turns a missing object into 404 rather than 403).
        let bucket_arn = json!([format!("arn:{}:s3:::{bucket}", p.partition)]);
        out.push(statement(&["s3:GetBucketLocation", "s3:GetEncryptionConfiguration"], bucket_arn.clone(), None));
        let mut listable: Vec<String> = keelson_api::nodeup::NODE_READABLE_PREFIXES.iter().map(|p| key(&format!("{p}*"))).collect();
        if p.bootstrap_token {
            listable.push(key(&token));
        }
        out.push(statement(&["s3:ListBucket"], bucket_arn, Some(json!({"StringLike": {"s3:prefix": listable}}))));
    }
    if p.allow_container_registry {
        out.push(statement(ECR_READ, json!("*"), None));
    }
    out
}
