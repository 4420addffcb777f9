//! The `s3://bucket/prefix` backend (feature `aws`, through `aws-sdk-s3`): a bucket in another
//! region is followed, large files go up in parts, and the lock is a conditional PUT
//! (`If-None-Match: *`).

use aws_sdk_s3::error::ProvideErrorMetadata;
use aws_sdk_s3::operation::get_object::GetObjectOutput;
use aws_sdk_s3::primitives::ByteStream;

use super::StoreError;

/// A bucket and the prefix the store's keys live under.
#[derive(Debug, Clone)]
pub(super) struct S3Store {
    client: aws_sdk_s3::Client,
    bucket: String,
    prefix: String,
}

impl S3Store {
    pub fn new(client: aws_sdk_s3::Client, bucket: &str, prefix: &str) -> S3Store {
        S3Store { client, bucket: bucket.to_string(), prefix: prefix.to_string() }
    }

    fn key(&self, rel: &str) -> String {
        super::config_base::s3_key(&self.prefix, rel)
    }

    pub async fn get(&self, rel: &str) -> Result<Option<Vec<u8>>, StoreError> {
        get(&self.client, &self.bucket, &self.key(rel)).await
    }

    pub async fn put(&self, rel: &str, bytes: &[u8]) -> Result<(), StoreError> {
        put(&self.client, &self.bucket, &self.key(rel), bytes.to_vec(), false).await
    }

    pub async fn delete(&self, rel: &str) -> Result<(), StoreError> {
        delete(&self.client, &self.bucket, &self.key(rel)).await
    }

    pub async fn put_file(&self, rel: &str, source: &std::path::Path, part_size: u64) -> Result<(), StoreError> {
        put_file(&self.client, &self.bucket, &self.key(rel), source, part_size).await
    }

    pub async fn read_chunks(&self, rel: &str, sink: &mut (dyn FnMut(&[u8]) -> std::io::Result<()> + Send)) -> Result<Option<u64>, StoreError> {
        read_chunks(&self.client, &self.bucket, &self.key(rel), sink).await
    }

    pub async fn list_modified(&self, rel_prefix: &str) -> Result<Vec<(String, Option<time::OffsetDateTime>)>, StoreError> {
        list_modified(&self.client, &self.bucket, &self.prefix, rel_prefix).await
    }

    /// Create `rel` holding `content` only if it does not exist (a conditional PUT): `Ok(None)`
    /// when created, `Ok(Some(what is there))` when it already exists.
    pub async fn create_exclusive(&self, rel: &str, content: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        match put(&self.client, &self.bucket, &self.key(rel), content.to_vec(), true).await {
            Ok(()) => Ok(None),
            Err(StoreError::S3 { message, .. }) if is_precondition_failure(&message) => Ok(Some(self.get(rel).await?.unwrap_or_default())),
            Err(e) => Err(e),
        }
    }
}

fn err<E>(op: &'static str, bucket: &str, key: &str, e: E) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let message = match (e.code(), e.message()) {
        (Some(c), Some(m)) => format!("{c}: {m}"),
        (Some(c), None) => c.to_string(),
        _ => innermost(&e),
    };
    StoreError::S3 { op, bucket: bucket.into(), key: key.into(), message, source: Box::new(e) }
}

/// A failure outside the service's answer (reading a body, a local file).
fn other<E: std::error::Error + Send + Sync + 'static>(op: &'static str, bucket: &str, key: &str, message: String, e: E) -> StoreError {
    StoreError::S3 { op, bucket: bucket.into(), key: key.into(), message, source: Box::new(e) }
}

/// The local file being uploaded could not be read.
fn unreadable<E: std::error::Error + Send + Sync + 'static>(op: &'static str, bucket: &str, key: &str, file: &std::path::Path, e: E) -> StoreError {
    other(op, bucket, key, format!("reading {}: {e}", file.display()), e)
}

/// The innermost cause (SDK errors say little at the top level: "dispatch failure").
fn innermost(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(s) = cur.source() {
        cur = s;
    }
    cur.to_string()
}

fn is_precondition_failure(message: &str) -> bool {
    message.starts_with("PreconditionFailed") || message.starts_with("ConditionalRequestConflict")
}

/// GetObject, following a bucket that lives in another region; `Ok(None)` when the key does not exist.
async fn get_object(client: &aws_sdk_s3::Client, bucket: &str, key: &str) -> Result<Option<GetObjectOutput>, StoreError> {
    match client.get_object().bucket(bucket).key(key).send().await {
        Ok(r) => Ok(Some(r)),
        Err(e) if e.as_service_error().is_some_and(|s| s.is_no_such_key()) => Ok(None),
        Err(e) if matches!(e.code(), Some("PermanentRedirect") | Some("AuthorizationHeaderMalformed")) => {
            // The bucket lives in another region: ask where, then read from there.
            let loc = client.get_bucket_location().bucket(bucket).send().await.map_err(|e| err("GetBucketLocation", bucket, key, e))?;
            let region = loc.location_constraint().map(|c| c.as_str().to_string()).filter(|r| !r.is_empty()).unwrap_or_else(|| "us-east-1".into());
            let conf = client.config().to_builder().region(aws_sdk_s3::config::Region::new(region)).build();
            match aws_sdk_s3::Client::from_conf(conf).get_object().bucket(bucket).key(key).send().await {
                Ok(r) => Ok(Some(r)),
                Err(e) if e.as_service_error().is_some_and(|s| s.is_no_such_key()) => Ok(None),
                Err(e) => Err(err("GetObject", bucket, key, e)),
            }
        }
        Err(e) => Err(err("GetObject", bucket, key, e)),
    }
}

async fn get(client: &aws_sdk_s3::Client, bucket: &str, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
    let Some(resp) = get_object(client, bucket, key).await? else { return Ok(None) };
    let body = resp.body.collect().await.map_err(|e| other("GetObject", bucket, key, e.to_string(), e))?;
    Ok(Some(body.into_bytes().to_vec()))
}

async fn put(client: &aws_sdk_s3::Client, bucket: &str, key: &str, bytes: Vec<u8>, if_absent: bool) -> Result<(), StoreError> {
    let mut req = client.put_object().bucket(bucket).key(key).body(ByteStream::from(bytes));
    if if_absent {
        req = req.if_none_match("*");
    }
    req.send().await.map_err(|e| err("PutObject", bucket, key, e.into_service_error()))?;
    Ok(())
}

/// One PutObject when the file fits in one part, else a multipart upload: parts read from the
/// file one at a time (streamed), the upload aborted if any step fails (no orphaned parts).
async fn put_file(client: &aws_sdk_s3::Client, bucket: &str, key: &str, source: &std::path::Path, part_size: u64) -> Result<(), StoreError> {
    let size = tokio::fs::metadata(source).await.map_err(|e| unreadable("PutObject", bucket, key, source, e))?.len();
    let parts = super::s3_parts::plan(size, part_size);
    if parts.len() <= 1 {
        let body = ByteStream::from_path(source).await.map_err(|e| unreadable("PutObject", bucket, key, source, e))?;
        client.put_object().bucket(bucket).key(key).body(body).send().await.map_err(|e| err("PutObject", bucket, key, e.into_service_error()))?;
        return Ok(());
    }
    let created =
        client.create_multipart_upload().bucket(bucket).key(key).send().await.map_err(|e| err("CreateMultipartUpload", bucket, key, e.into_service_error()))?;
    let upload_id = created.upload_id().unwrap_or_default().to_string();
    let result = async {
        let mut done = Vec::with_capacity(parts.len());
        for (i, (offset, length)) in parts.iter().enumerate() {
            let number = i as i32 + 1;
            let body = ByteStream::read_from()
                .path(source)
                .offset(*offset)
                .length(aws_sdk_s3::primitives::Length::Exact(*length))
                .build()
                .await
                .map_err(|e| unreadable("UploadPart", bucket, key, source, e))?;
            let part = client
                .upload_part()
                .bucket(bucket)
                .key(key)
                .upload_id(&upload_id)
                .part_number(number)
                .body(body)
                .send()
                .await
                .map_err(|e| err("UploadPart", bucket, key, e.into_service_error()))?;
            done.push(aws_sdk_s3::types::CompletedPart::builder().part_number(number).set_e_tag(part.e_tag().map(str::to_string)).build());
        }
        let completed = aws_sdk_s3::types::CompletedMultipartUpload::builder().set_parts(Some(done)).build();
        client
            .complete_multipart_upload()
            .bucket(bucket)
            .key(key)
            .upload_id(&upload_id)
            .multipart_upload(completed)
            .send()
            .await
            .map_err(|e| err("CompleteMultipartUpload", bucket, key, e.into_service_error()))?;
        Ok(())
    }
    .await;
    if result.is_err() {
        let _ = client.abort_multipart_upload().bucket(bucket).key(key).upload_id(&upload_id).send().await;
    }
    result
}

async fn read_chunks(
    client: &aws_sdk_s3::Client,
    bucket: &str,
    key: &str,
    sink: &mut (dyn FnMut(&[u8]) -> std::io::Result<()> + Send),
) -> Result<Option<u64>, StoreError> {
    let Some(resp) = get_object(client, bucket, key).await? else { return Ok(None) };
    let mut body = resp.body;
    let mut total = 0u64;
    loop {
        let next = body.try_next().await.map_err(|e| other("GetObject", bucket, key, e.to_string(), e))?;
        let Some(chunk) = next else { return Ok(Some(total)) };
        total += chunk.len() as u64;
        sink(&chunk).map_err(|e| other("GetObject", bucket, key, format!("writing what was read: {e}"), e))?;
    }
}

async fn delete(client: &aws_sdk_s3::Client, bucket: &str, key: &str) -> Result<(), StoreError> {
    client.delete_object().bucket(bucket).key(key).send().await.map_err(|e| err("DeleteObject", bucket, key, e.into_service_error()))?;
    Ok(())
}

async fn list_modified(
    client: &aws_sdk_s3::Client,
    bucket: &str,
    prefix: &str,
    rel_prefix: &str,
) -> Result<Vec<(String, Option<time::OffsetDateTime>)>, StoreError> {
    let full = super::config_base::s3_key(prefix, rel_prefix);
    let mut out = Vec::new();
    let objects = client
        .list_objects_v2()
        .bucket(bucket)
        .prefix(&full)
        .into_paginator()
        .send()
        .try_collect()
        .await
        .map_err(|e| err("ListObjectsV2", bucket, &full, e.into_service_error()))?;
    for o in objects.iter().flat_map(|page| page.contents()) {
        if let Some(k) = o.key() {
            let rel = if prefix.is_empty() { k } else { k.strip_prefix(&format!("{prefix}/")).unwrap_or(k) };
            let modified = o.last_modified().and_then(|t| time::OffsetDateTime::from_unix_timestamp(t.secs()).ok());
            out.push((rel.to_string(), modified));
        }
    }
    out.sort();
    Ok(out)
}
