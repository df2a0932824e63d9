//! Blobs in an S3-compatible bucket: `--blobs s3://bucket/prefix`.
//!
//! Objects are keyed like [`FsBlobStore`](crate::blobs::FsBlobStore)'s
//! files, `prefix/ab/cdef...`. An upload is hashed as it arrives and becomes
//! visible under its digest only after the digest and size verify: a small
//! blob (up to [`PART_SIZE`]) is buffered and sent with one PUT at commit; a
//! larger one is a multipart upload whose parts stream while the bytes arrive
//! and which is completed only after the check. A mismatch, a failed part or
//! a writer dropped before its commit aborts the multipart upload, so nothing
//! is left under the digest. (A coordinator killed mid-upload leaves an
//! incomplete multipart upload, invisible to readers; a bucket lifecycle rule
//! `AbortIncompleteMultipartUpload` reclaims its space.)
//!
//! The [`BlobStore`] traits are synchronous and called from blocking threads
//! as well as from async handlers. The S3 client is async, so the store owns
//! a small runtime of its own ([`crate::bridge::Bridge`]) that runs every request; a caller waits
//! for the answer on a plain channel, inside `block_in_place` when it is a
//! worker thread of a multi-threaded runtime, so it never stalls that runtime's
//! other tasks, and it never waits on a task of its own runtime, so it cannot
//! deadlock.
//!
//! Every request the store waits for tells a [`StoreHealth`]: a server that
//! does not answer (connection refused, a timeout, a 5xx) after the S3
//! client's own few quick retries turns `tessera_blobs_up` to 0, names the
//! outage in `tessera status`, and fails the call as
//! [`Error::Unavailable`], which callers retry with their own capped
//! backoff: a worker holds its rendered frames and uploads them again, and
//! fetches a scene again, until the store answers (see the worker's agent).
//! While the store is down a probe every [`PROBE_EVERY`] notices its return
//! without waiting for a caller; while it is up, a probe every few of those
//! notices an outage on an idle farm.
//!
//! Endpoint, region and credentials come from the standard AWS environment
//! variables (`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_ALLOW_HTTP`, ...), then
//! from the AWS shared config files ([`crate::blobs::aws_profile`]).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path as Key;
use object_store::{
    ClientConfigKey, GetOptions, MultipartUpload, ObjectStore, ObjectStoreExt, PutPayload,
    RetryConfig,
};
use tokio::task::JoinHandle;

use crate::blobs::{BlobStore, BlobWriter};
use crate::digest::Digest;
use crate::error::{Backend, Error, StoreFailure};
use crate::health::StoreHealth;

/// Blobs up to this size go up in one PUT; larger ones as multipart uploads
/// in parts of this size (S3 wants at least 5 MiB per part but the last).
pub const PART_SIZE: usize = 8 << 20;
/// Parts of one upload in flight at once: the memory an upload holds is
/// about this many parts plus the one being filled.
const PARTS_IN_FLIGHT: usize = 2;
/// How long the start-up check may take before the endpoint counts as unreachable.
const CHECK_TIMEOUT: Duration = Duration::from_secs(30);
/// Most sizes remembered (blobs are immutable: a size once seen stays true
/// until this coordinator removes the blob).
const SIZES_REMEMBERED: usize = 100_000;
/// How often a store that is down is probed (and one that is up, every
/// [`PROBES_WHILE_UP`] of these).
const PROBE_EVERY: Duration = Duration::from_secs(2);
/// Probes skipped while the store answers: an idle farm notices an outage
/// within `PROBE_EVERY * PROBES_WHILE_UP`.
const PROBES_WHILE_UP: u32 = 5;

/// What the store and its writers share.
#[derive(Debug)]
struct Inner {
    s3: Arc<AmazonS3>,
    io: crate::bridge::Bridge,
    /// `s3://bucket/prefix`, for messages.
    location: String,
    /// The endpoint URL (or `AWS S3`), for messages.
    endpoint: String,
    /// The key prefix without slashes at either end ("" for none).
    prefix: String,
    max_blob: u64,
    sizes: Mutex<HashMap<Digest, u64>>,
    /// Whether the server answered the latest request.
    health: StoreHealth,
}

/// Blobs as objects in an S3-compatible bucket.
#[derive(Debug)]
pub struct S3BlobStore {
    inner: Arc<Inner>,
}

/// Splits `s3://bucket/prefix` into the bucket and the prefix (no slashes at its ends).
pub fn parse_url(url: &str) -> Result<(String, String), Error> {
    let rest = url.strip_prefix("s3://").ok_or_else(|| {
        Error::invalid(format!(
            "{url} is not an S3 location; write it as s3://bucket/prefix"
        ))
    })?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let valid = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.';
    if bucket.len() < 3 || bucket.len() > 63 || !bucket.chars().all(valid) {
        return Err(Error::invalid(format!(
            "{url}: {bucket:?} is not a bucket name (3-63 characters: lowercase letters, digits, '-' and '.'); write s3://bucket/prefix"
        )));
    }
    let prefix = prefix.trim_matches('/');
    if prefix.split('/').any(|p| p == "." || p == "..")
        || prefix.contains("//")
        || prefix.chars().any(|c| c.is_control() || c == '\\')
    {
        return Err(Error::invalid(format!(
            "{url}: the prefix {prefix:?} is not a plain key prefix; use letters, digits and single slashes"
        )));
    }
    Ok((bucket.to_string(), prefix.to_string()))
}

impl S3BlobStore {
    /// Opens `s3://bucket/prefix` with the endpoint and credentials of the
    /// environment (or the AWS config files), and checks at once that the
    /// bucket exists and that the credentials may list, write and delete
    /// there, so a misconfigured coordinator refuses to start.
    pub fn open(url: &str, max_blob: u64) -> Result<Self, Error> {
        Self::open_with(url, max_blob, &[])
    }

    /// [`open`](Self::open) with `settings` (named like the environment
    /// variables, e.g. `("AWS_ENDPOINT_URL", "http://...")`) over the environment's.
    pub fn open_with(url: &str, max_blob: u64, settings: &[(&str, &str)]) -> Result<Self, Error> {
        let (bucket, prefix) = parse_url(url)?;
        // object_store's HTTPS client uses the process's rustls provider:
        // the ring one the rest of Tessera's TLS uses.
        let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
        let mut builder = AmazonS3Builder::from_env();
        for (name, value) in settings {
            let key: AmazonS3ConfigKey = name.to_ascii_lowercase().parse().map_err(|_| {
                Error::invalid(format!(
                    "{name} is not an S3 setting; name an AWS_* variable"
                ))
            })?;
            builder = builder.with_config(key, *value);
        }
        for (key, value) in crate::blobs::aws_profile::settings() {
            if builder.get_config_value(&key).is_none() {
                builder = builder.with_config(key, value);
            }
        }
        let client = |k| AmazonS3ConfigKey::Client(k);
        if builder
            .get_config_value(&client(ClientConfigKey::ConnectTimeout))
            .is_none()
        {
            builder = builder.with_config(client(ClientConfigKey::ConnectTimeout), "5s");
        }
        if builder
            .get_config_value(&client(ClientConfigKey::Timeout))
            .is_none()
        {
            // A whole part must fit in one request's time.
            builder = builder.with_config(client(ClientConfigKey::Timeout), "300s");
        }
        let endpoint = builder.get_config_value(&AmazonS3ConfigKey::Endpoint);
        let allow_http = builder
            .get_config_value(&client(ClientConfigKey::AllowHttp))
            .is_some_and(|v| v.eq_ignore_ascii_case("true"));
        if let Some(e) = &endpoint {
            if e.starts_with("http://") && !allow_http {
                return Err(Error::invalid(format!(
                    "the S3 endpoint {e} is plain http, which is refused by default; set AWS_ALLOW_HTTP=true for a test server on a trusted network, or use https"
                )));
            }
        }
        let retry = RetryConfig {
            max_retries: 4,
            retry_timeout: Duration::from_secs(60),
            ..RetryConfig::default()
        };
        let s3 = builder
            .with_bucket_name(&bucket)
            .with_retry(retry)
            .build()
            .map_err(|e| {
                Error::invalid(format!(
                    "cannot use {url}: {e}; check AWS_ENDPOINT_URL, AWS_REGION and the credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)"
                ))
            })?;
        let location = url.trim_end_matches('/').to_string();
        let endpoint = endpoint.unwrap_or_else(|| "AWS S3".into());
        let store = Self {
            inner: Arc::new(Inner {
                s3: Arc::new(s3),
                io: crate::bridge::Bridge::new("s3", "the S3 client")?,
                health: StoreHealth::blobs(format!("S3 {location} at {endpoint}")),
                location,
                endpoint: endpoint.clone(),
                prefix,
                max_blob,
                sizes: Mutex::new(HashMap::new()),
            }),
        };
        store.check(&endpoint)?;
        store.inner.io.spawn(probe(Arc::downgrade(&store.inner)));
        Ok(store)
    }

    /// Lists the prefix, then writes and deletes a probe object.
    fn check(&self, endpoint: &str) -> Result<(), Error> {
        let inner = &self.inner;
        let s3 = inner.s3.clone();
        let prefix = (!inner.prefix.is_empty()).then(|| Key::from(inner.prefix.as_str()));
        let probe = inner.key_of(&format!(
            ".tessera-probe-{}",
            &Digest::of(
                format!("{:?}{}", std::time::SystemTime::now(), std::process::id()).as_bytes()
            )
            .to_hex()[..16]
        ));
        let steps = async move {
            s3.list_with_delimiter(prefix.as_ref())
                .await
                .map_err(|e| ("list", e))?;
            s3.put(&probe, PutPayload::from_static(b"tessera"))
                .await
                .map_err(|e| ("write", e))?;
            s3.delete(&probe).await.map_err(|e| ("delete", e))
        };
        let answer = inner
            .io
            // The timer is made inside: it belongs to the store's runtime.
            .run(async move { tokio::time::timeout(CHECK_TIMEOUT, steps).await })
            .ok_or_else(|| Error::invalid("the S3 client stopped during its start-up check"))?;
        let loc = &inner.location;
        let bucket = loc
            .trim_start_matches("s3://")
            .split('/')
            .next()
            .unwrap_or("");
        let (what, e) = match answer {
            Ok(Ok(())) => return Ok(()),
            Err(_) => {
                return Err(Error::invalid(format!(
                    "cannot reach the S3 endpoint {endpoint} for {loc} within {}s; check AWS_ENDPOINT_URL and that the server is up",
                    CHECK_TIMEOUT.as_secs()
                )))
            }
            Ok(Err(failed)) => failed,
        };
        let refused = "check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, and that this key may list, read, write and delete in the bucket";
        let msg = match (&e, s3_code(&e).as_deref(), transport_failed(&e)) {
            (_, _, true) => format!(
                "cannot reach the S3 endpoint {endpoint} for {loc}: {e}; check AWS_ENDPOINT_URL and that the server is up"
            ),
            (_, Some("NoSuchBucket"), _) => format!(
                "the bucket {bucket:?} does not exist at {endpoint}; create it (e.g. `aws s3 mb s3://{bucket}`) or fix the bucket in --blobs {loc}"
            ),
            (
                object_store::Error::PermissionDenied { .. }
                | object_store::Error::Unauthenticated { .. },
                _,
                _,
            )
            | (
                _,
                Some(
                    "AccessDenied"
                    | "InvalidAccessKeyId"
                    | "SignatureDoesNotMatch"
                    | "InvalidToken"
                    | "ExpiredToken",
                ),
                _,
            ) => format!("the S3 server at {endpoint} refused to {what} in {loc}: {e}; {refused}"),
            _ => format!(
                "cannot {what} in {loc} at {endpoint}: {e}; check AWS_ENDPOINT_URL (and AWS_ALLOW_HTTP=true for a plain-http server), AWS_REGION and the credentials"
            ),
        };
        Err(Error::invalid(msg))
    }

    /// The keys of every object under the prefix (blobs and anything else),
    /// sorted: what an operator (or a test) sees in the bucket.
    pub fn keys(&self) -> Result<Vec<String>, Error> {
        let inner = &self.inner;
        let s3 = inner.s3.clone();
        let prefix = (!inner.prefix.is_empty()).then(|| Key::from(inner.prefix.as_str()));
        let listed = inner.run(async move {
            use tokio_stream::StreamExt;
            let mut stream = s3.list(prefix.as_ref());
            let mut keys = Vec::new();
            while let Some(meta) = stream.next().await {
                keys.push(meta?.location.to_string());
            }
            Ok::<_, object_store::Error>(keys)
        });
        let mut keys = listed
            .ok_or_else(|| inner.stopped())?
            .map_err(|e| inner.error("list the objects".into(), e))?;
        keys.sort();
        Ok(keys)
    }

    /// The object key of a blob (present or not).
    pub fn key(&self, digest: &Digest) -> String {
        self.inner.blob_key(digest).to_string()
    }
}

/// The S3 error code (`<Code>NoSuchBucket</Code>`) of a failed request.
/// object_store keeps the response body only in its error's text, so the
/// code, a field of the S3 protocol, is read from there.
fn s3_code(e: &object_store::Error) -> Option<String> {
    let text = e.to_string();
    let start = text.find("<Code>")? + "<Code>".len();
    let len = text[start..].find("</Code>")?;
    Some(text[start..start + len].to_string())
}

/// Whether a request failed before any answer (connection refused, timeout).
fn transport_failed(e: &object_store::Error) -> bool {
    use object_store::client::HttpErrorKind;
    matches!(
        http_kind(e),
        Some(HttpErrorKind::Connect | HttpErrorKind::Timeout)
    )
}

/// The kind of the HTTP failure under `e`, if it is one.
fn http_kind(e: &object_store::Error) -> Option<object_store::client::HttpErrorKind> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(h) = s.downcast_ref::<object_store::client::HttpError>() {
            return Some(h.kind());
        }
        source = s.source();
    }
    None
}

/// Whether `e` says the server is down or failing rather than that the
/// request was wrong: no answer at all (refused, cut, timed out), or a 5xx.
fn unreachable(e: &object_store::Error) -> bool {
    use object_store::client::HttpErrorKind;
    if matches!(
        http_kind(e),
        Some(
            HttpErrorKind::Connect
                | HttpErrorKind::Request
                | HttpErrorKind::Timeout
                | HttpErrorKind::Interrupted
        )
    ) {
        return true;
    }
    // object_store keeps the status of a failed answer only in its error's
    // text (its retry error type is private): read the S3 code or the status.
    matches!(
        s3_code(e).as_deref(),
        Some("InternalError" | "ServiceUnavailable" | "SlowDown")
    ) || e.to_string().contains("non-2xx status code: 5")
}

/// Looks at the server now and then (see the module doc) until the store
/// is dropped.
async fn probe(inner: std::sync::Weak<Inner>) {
    let mut skipped = 0;
    loop {
        tokio::time::sleep(PROBE_EVERY).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if inner.health.up() && skipped + 1 < PROBES_WHILE_UP {
            skipped += 1;
            continue;
        }
        skipped = 0;
        let s3 = inner.s3.clone();
        let key = inner.key_of(".tessera-health");
        // A missing object is an answer too.
        let answer = tokio::time::timeout(CHECK_TIMEOUT, s3.head(&key)).await;
        match answer {
            Err(_) => inner
                .health
                .failed(&format!("no answer within {}s", CHECK_TIMEOUT.as_secs())),
            Ok(r) => inner.note(&r),
        }
    }
}

impl Inner {
    fn key_of(&self, name: &str) -> Key {
        if self.prefix.is_empty() {
            Key::from(name)
        } else {
            Key::from(format!("{}/{name}", self.prefix))
        }
    }

    fn blob_key(&self, digest: &Digest) -> Key {
        let hex = digest.to_hex();
        self.key_of(&format!("{}/{}", &hex[..2], &hex[2..]))
    }

    /// Tells the store's health what a request's answer says about the server.
    fn note<T>(&self, answer: &object_store::Result<T>) {
        match answer {
            Err(e) if unreachable(e) => self.health.failed(&e.to_string()),
            _ => self.health.answered(),
        }
    }

    /// Runs one request on the store's runtime, waits for it, and notes the
    /// answer in the store's health.
    fn run<T, F>(&self, fut: F) -> Option<object_store::Result<T>>
    where
        F: std::future::Future<Output = object_store::Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        let answer = self.io.run(fut)?;
        self.note(&answer);
        Some(answer)
    }

    /// An S3 failure as the coordinator's error.
    fn error(&self, what: String, e: object_store::Error) -> Error {
        match e {
            object_store::Error::NotFound { .. } => Error::NotFound(what),
            e if unreachable(&e) => {
                self.health.failed(&e.to_string());
                Error::Unavailable(format!(
                    "cannot {what}: the blob store {} does not answer ({e}); check that the S3 server is up and reachable; the call may be made again",
                    self.location
                ))
            }
            e => StoreFailure::new(self.backend(), format!("cannot {what}: {e}")).into(),
        }
    }

    /// What its failures name: the bucket and the endpoint.
    fn backend(&self) -> Backend {
        Backend::S3 {
            location: self.location.clone(),
            endpoint: self.endpoint.clone(),
        }
    }

    fn stopped(&self) -> Error {
        StoreFailure::new(
            self.backend(),
            "its client stopped: the coordinator is shutting down",
        )
        .fix("try again once the coordinator is back")
        .into()
    }

    fn remember(&self, digest: Digest, size: u64) {
        let mut sizes = self.sizes.lock().unwrap_or_else(|p| p.into_inner());
        if sizes.len() >= SIZES_REMEMBERED {
            sizes.clear();
        }
        sizes.insert(digest, size);
    }

    fn forget(&self, digest: &Digest) {
        self.sizes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(digest);
    }

    fn size(&self, digest: &Digest) -> Result<Option<u64>, Error> {
        if let Some(&size) = self
            .sizes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(digest)
        {
            return Ok(Some(size));
        }
        let s3 = self.s3.clone();
        let key = self.blob_key(digest);
        match self.run(async move { s3.head(&key).await }) {
            None => Err(self.stopped()),
            Some(Ok(meta)) => {
                self.remember(*digest, meta.size);
                Ok(Some(meta.size))
            }
            Some(Err(object_store::Error::NotFound { .. })) => Ok(None),
            Some(Err(e)) => Err(self.error(format!("look up blob {digest}"), e)),
        }
    }
}

/// How an upload's bytes travel.
enum Upload {
    /// The store already holds the blob: the bytes are only hashed.
    Present,
    /// A small blob, sent with one PUT at commit.
    Whole(Vec<u8>),
    /// A multipart upload: full parts are sent as they fill.
    Parts {
        upload: Option<Box<dyn MultipartUpload>>,
        filling: Vec<u8>,
        sent: VecDeque<JoinHandle<object_store::Result<()>>>,
    },
}

struct S3Writer {
    inner: Arc<Inner>,
    claimed: Digest,
    claimed_size: u64,
    written: u64,
    hasher: blake3::Hasher,
    upload: Upload,
}

/// Waits for every sent part, then completes the upload; aborts it instead
/// when a part failed or `complete` is false.
async fn finish(
    mut upload: Box<dyn MultipartUpload>,
    sent: VecDeque<JoinHandle<object_store::Result<()>>>,
    complete: bool,
) -> object_store::Result<()> {
    let mut failed = None;
    for part in sent {
        let result = match part.await {
            Ok(r) => r,
            Err(e) => Err(object_store::Error::JoinError { source: e }),
        };
        if let Err(e) = result {
            failed.get_or_insert(e);
        }
    }
    if let (true, None) = (complete, &failed) {
        match upload.complete().await {
            Ok(_) => return Ok(()),
            Err(e) => failed = Some(e),
        }
    }
    let _ = upload.abort().await;
    failed.map_or(Ok(()), Err)
}

impl S3Writer {
    /// Sends the filled part; waits for the oldest when too many are in flight.
    fn send_part(&mut self) -> Result<(), Error> {
        let Upload::Parts {
            upload: Some(upload),
            filling,
            sent,
        } = &mut self.upload
        else {
            return Ok(());
        };
        let part = std::mem::replace(filling, Vec::with_capacity(PART_SIZE));
        sent.push_back(self.inner.io.spawn(upload.put_part(part.into())));
        if sent.len() <= PARTS_IN_FLIGHT {
            return Ok(());
        }
        let oldest = sent.pop_front().expect("more parts than the limit");
        let result = match self.inner.io.run(oldest) {
            Some(Ok(r)) => r,
            Some(Err(e)) => Err(object_store::Error::JoinError { source: e }),
            None => return Err(self.inner.stopped()),
        };
        result.map_err(|e| {
            self.abort();
            self.inner
                .error(format!("upload part of blob {}", self.claimed), e)
        })
    }

    /// Abandons a multipart upload in the background (a writer dropped or failed).
    fn abort(&mut self) {
        if let Upload::Parts { upload, sent, .. } = &mut self.upload {
            if let Some(upload) = upload.take() {
                let sent = std::mem::take(sent);
                self.inner.io.spawn(finish(upload, sent, false));
            }
        }
    }
}

impl Drop for S3Writer {
    fn drop(&mut self) {
        self.abort();
    }
}

impl BlobWriter for S3Writer {
    fn write(&mut self, mut data: &[u8]) -> Result<(), Error> {
        self.written += data.len() as u64;
        if self.written > self.claimed_size || self.written > self.inner.max_blob {
            self.abort();
            return Err(Error::invalid(format!(
                "upload of {} is larger than its declared size of {} bytes (limit {} bytes); send the file again",
                self.claimed, self.claimed_size, self.inner.max_blob
            )));
        }
        self.hasher.update(data);
        if let Upload::Whole(buf) = &mut self.upload {
            buf.extend_from_slice(data);
        }
        while !data.is_empty() {
            let Upload::Parts { filling, .. } = &mut self.upload else {
                break;
            };
            let n = (PART_SIZE - filling.len()).min(data.len());
            filling.extend_from_slice(&data[..n]);
            data = &data[n..];
            if filling.len() == PART_SIZE {
                self.send_part()?;
            }
        }
        Ok(())
    }

    fn commit(mut self: Box<Self>) -> Result<bool, Error> {
        let got = Digest::from_hasher(&self.hasher);
        if got != self.claimed || self.written != self.claimed_size {
            self.abort();
            return Err(Error::invalid(format!(
                "upload does not match its digest: claimed {} ({} bytes), received {} ({} bytes); the file changed or was corrupted in transit, send it again",
                self.claimed, self.claimed_size, got, self.written
            )));
        }
        let inner = self.inner.clone();
        let (digest, size) = (self.claimed, self.claimed_size);
        let key = inner.blob_key(&digest);
        let s3 = inner.s3.clone();
        let answer = match std::mem::replace(&mut self.upload, Upload::Present) {
            Upload::Present => return Ok(true),
            Upload::Whole(buf) => {
                inner.run(async move { s3.put(&key, buf.into()).await.map(|_| ()) })
            }
            Upload::Parts {
                upload,
                filling,
                mut sent,
            } => {
                let Some(mut upload) = upload else {
                    return Err(inner.stopped());
                };
                if !filling.is_empty() {
                    sent.push_back(inner.io.spawn(upload.put_part(filling.into())));
                }
                inner.run(finish(upload, sent, true))
            }
        };
        match answer {
            None => Err(inner.stopped()),
            Some(Err(e)) => Err(inner.error(format!("store blob {digest}"), e)),
            Some(Ok(())) => {
                inner.remember(digest, size);
                Ok(false)
            }
        }
    }
}

impl BlobStore for S3BlobStore {
    fn contains(&self, digest: &Digest) -> bool {
        self.size(digest).is_some()
    }

    fn size(&self, digest: &Digest) -> Option<u64> {
        self.inner.size(digest).unwrap_or_else(|e| {
            tracing::warn!("{e}");
            None
        })
    }

    fn try_size(&self, digest: &Digest) -> Result<Option<u64>, Error> {
        self.inner.size(digest)
    }

    fn health(&self) -> Option<StoreHealth> {
        Some(self.inner.health.clone())
    }

    fn writer(&self, digest: Digest, size: u64) -> Result<Box<dyn BlobWriter>, Error> {
        let inner = &self.inner;
        if size > inner.max_blob {
            return Err(Error::invalid(format!(
                "blob of {size} bytes is over the coordinator's upload limit of {} bytes; make the scene smaller or raise the coordinator's --max-upload-mib",
                inner.max_blob
            )));
        }
        let upload = if inner.size(&digest)?.is_some() {
            Upload::Present
        } else if size <= PART_SIZE as u64 {
            Upload::Whole(Vec::with_capacity(size as usize))
        } else {
            let s3 = inner.s3.clone();
            let key = inner.blob_key(&digest);
            let upload = inner
                .run(async move { s3.put_multipart(&key).await })
                .ok_or_else(|| inner.stopped())?
                .map_err(|e| inner.error(format!("start the upload of blob {digest}"), e))?;
            Upload::Parts {
                upload: Some(upload),
                filling: Vec::with_capacity(PART_SIZE),
                sent: VecDeque::new(),
            }
        };
        Ok(Box::new(S3Writer {
            inner: inner.clone(),
            claimed: digest,
            claimed_size: size,
            written: 0,
            hasher: blake3::Hasher::new(),
            upload,
        }))
    }

    fn read(&self, digest: &Digest) -> Result<Vec<u8>, Error> {
        let inner = &self.inner;
        let s3 = inner.s3.clone();
        let key = inner.blob_key(digest);
        inner
            .run(async move { s3.get(&key).await?.bytes().await })
            .ok_or_else(|| inner.stopped())?
            .map(Vec::from)
            .map_err(|e| inner.error(format!("blob {digest}"), e))
    }

    fn read_range(&self, digest: &Digest, offset: u64, len: usize) -> Result<Vec<u8>, Error> {
        let inner = &self.inner;
        if len == 0 {
            return Ok(Vec::new());
        }
        let s3 = inner.s3.clone();
        let key = inner.blob_key(digest);
        let range = offset..offset.saturating_add(len as u64);
        let answer = inner
            .run(async move {
                let options = GetOptions::new().with_range(Some(range));
                s3.get_opts(&key, options).await?.bytes().await
            })
            .ok_or_else(|| inner.stopped())?;
        match answer {
            Ok(bytes) => Ok(Vec::from(bytes)),
            Err(e @ object_store::Error::NotFound { .. }) => {
                Err(inner.error(format!("blob {digest}"), e))
            }
            // A range that starts at or past the end reads nothing, as a
            // file would; S3 refuses it instead.
            Err(e) => match inner.size(digest)? {
                Some(size) if offset >= size => Ok(Vec::new()),
                _ => Err(inner.error(format!("read blob {digest}"), e)),
            },
        }
    }

    fn remove(&self, digest: &Digest) -> Result<(), Error> {
        let inner = &self.inner;
        inner.forget(digest);
        let s3 = inner.s3.clone();
        let key = inner.blob_key(digest);
        match inner.run(async move { s3.delete(&key).await }) {
            None => Err(inner.stopped()),
            Some(Ok(())) | Some(Err(object_store::Error::NotFound { .. })) => Ok(()),
            Some(Err(e)) => Err(inner.error(format!("remove blob {digest}"), e)),
        }
    }

    /// One bulk `DeleteObjects` request per thousand blobs.
    fn remove_many(&self, digests: &[Digest]) -> Result<(), crate::blobs::RemoveFailed> {
        let inner = &self.inner;
        let mut keys: HashMap<String, Digest> = digests
            .iter()
            .map(|d| {
                inner.forget(d);
                (inner.blob_key(d).to_string(), *d)
            })
            .collect();
        let s3 = inner.s3.clone();
        let locations: Vec<object_store::Result<Key>> =
            keys.keys().map(|k| Ok(Key::from(k.as_str()))).collect();
        let answer = inner.run(async move {
            use tokio_stream::StreamExt;
            let mut answers = s3.delete_stream(Box::pin(tokio_stream::iter(locations)));
            let (mut gone, mut failure) = (Vec::new(), None);
            while let Some(a) = answers.next().await {
                match a {
                    Ok(key) => gone.push(key.to_string()),
                    Err(object_store::Error::NotFound { path, .. }) => gone.push(path),
                    Err(e) => {
                        failure.get_or_insert(e);
                    }
                }
            }
            Ok((gone, failure))
        });
        let error = match answer {
            None => inner.stopped(),
            Some(Err(e)) => inner.error(format!("remove {} blobs", digests.len()), e),
            Some(Ok((gone, failure))) => {
                for k in gone {
                    keys.remove(&k);
                }
                match failure {
                    None if keys.is_empty() => return Ok(()),
                    None => Error::io(
                        format!("remove {} blobs in {}", keys.len(), inner.location),
                        std::io::Error::other("the store did not confirm their deletion"),
                    ),
                    Some(e) => inner.error(format!("remove {} blobs", keys.len()), e),
                }
            }
        };
        Err(crate::blobs::RemoveFailed {
            left: keys.into_values().collect(),
            error,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_a_bucket_and_a_prefix() {
        assert_eq!(
            parse_url("s3://renders/farm/a/").unwrap(),
            ("renders".into(), "farm/a".into())
        );
        assert_eq!(
            parse_url("s3://renders").unwrap(),
            ("renders".into(), "".into())
        );
        for bad in [
            "s3://",
            "s3://A_B/x",
            "s3://ab",
            "s3://ok-bucket/../x",
            "s3://ok-bucket/a//b",
            "http://x",
        ] {
            let e = parse_url(bad).unwrap_err();
            assert!(matches!(e, Error::Invalid(_)), "{bad}: {e}");
        }
    }
}
