//! Blobs over HTTP: the same calls and checks as the gRPC `Blobs` service
//! (`MissingBlobs`, `PutBlob`), so limits and possession are the same, and
//! file sets built from JSON.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use prost::Message;
use serde::{Deserialize, Serialize};
use tessera_proto as pb;
use tokio_stream::StreamExt;
use utoipa::ToSchema;

use super::{ok, read_json, too_large_error, Api, ApiError, Caller};
use crate::adapters::convert::digest;
use crate::auth::{Identity, Role};
use crate::digest::Digest;

/// The body of `POST /api/v1/blobs/missing`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = Digests)]
pub struct MissingRequest {
    /// Blobs by their BLAKE3 digest, lowercase hex.
    digests: Vec<String>,
}

/// The answer of `POST /api/v1/blobs/missing`.
#[derive(Serialize, ToSchema)]
pub struct Missing {
    /// The digests the caller must upload.
    missing: Vec<String>,
}

/// The answer of `PUT /api/v1/blobs/{digest}`.
#[derive(Serialize, ToSchema)]
pub struct BlobStored {
    digest: String,
    size: u64,
    /// The blob was there already (nothing was written).
    already_present: bool,
}

/// The answer of `POST /api/v1/filesets`.
#[derive(Serialize, ToSchema)]
pub struct FileSetStored {
    /// The file set's digest, to submit a job with.
    digest: String,
}

/// The most digests one `missing` call may name.
const MAX_ASKED: usize = 100_000;

/// `POST /api/v1/blobs/missing` `{"digests": [...]}` -> `{"missing": [...]}`.
pub async fn missing(
    State(api): State<Api>,
    caller: Caller,
    body: Body,
) -> Result<Response, ApiError> {
    let who = caller.need(&[Role::Admin, Role::User, Role::Worker])?;
    let req: MissingRequest =
        read_json(body, api.farm.config().max_message, "list of digests").await?;
    if req.digests.len() > MAX_ASKED {
        return Err(ApiError::bad(
            format!(
                "{} digests asked at once, over the limit of {MAX_ASKED}",
                req.digests.len()
            ),
            "ask in several calls",
        ));
    }
    let asked = req
        .digests
        .iter()
        .map(|d| digest("digests", d))
        .collect::<Result<Vec<_>, _>>()?;
    // A job naming these may follow: keep them from the collector.
    api.farm.touch_blobs(&asked).await;
    let missing = api.farm.missing_for(who, &asked);
    Ok(ok(Missing {
        missing: missing.iter().map(|d| d.to_hex()).collect(),
    }))
}

/// Stores `bytes` (or the stream behind `body`) as blob `d` for `who`, as
/// the gRPC `PutBlob` does: re-hashed while written, refused on a mismatch,
/// and recorded as possessed by `who`.
async fn store(
    api: &Api,
    who: &Identity,
    d: Digest,
    size: u64,
    body: Body,
) -> Result<Response, ApiError> {
    api.farm.touch_blobs(&[d]).await;
    let mut writer = api.farm.blobs().writer(d, size)?;
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            ApiError::bad(
                format!("the upload of {d} broke off: {e}"),
                "send the file again",
            )
        })?;
        writer.write(&chunk)?;
    }
    let farm = api.farm.clone();
    let who = who.clone();
    let already_present =
        tokio::task::spawn_blocking(move || farm.record_upload(&who, d, writer.commit()?))
            .await
            .map_err(|e| ApiError::bad(format!("the upload stopped: {e}"), "send it again"))??;
    tracing::debug!(digest = %d, size, already_present, "blob stored over HTTP");
    Ok(ok(BlobStored {
        digest: d.to_hex(),
        size,
        already_present,
    }))
}

/// `PUT /api/v1/blobs/{digest}` with the raw bytes (and a Content-Length).
pub async fn put(
    State(api): State<Api>,
    caller: Caller,
    Path(d): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let who = caller.need(&[Role::Admin, Role::User, Role::Worker])?;
    let d = digest("digest", &d)?;
    let size: u64 = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::LENGTH_REQUIRED,
                "the upload has no Content-Length",
                "send the blob's size in Content-Length (not chunked), so it can be checked before it is stored",
            )
        })?;
    let limit = api.farm.config().max_upload;
    if size > limit {
        return Err(too_large_error(limit));
    }
    store(&api, who, d, size, body).await
}

/// `POST /api/v1/filesets`: a FileSet as JSON, stored as the FileSet
/// protobuf blob `tessera submit` uploads; answers `{"digest": hex}`.
pub async fn file_set(
    State(api): State<Api>,
    caller: Caller,
    body: Body,
) -> Result<Response, ApiError> {
    let who = caller.client()?.clone();
    let set: pb::FileSet = read_json(body, api.farm.config().max_message, "FileSet").await?;
    let scene = set
        .files
        .iter()
        .find(|f| f.path == set.scene)
        .ok_or_else(|| {
            ApiError::bad(
                format!(
                    "the file set's scene `{}` is not among its files",
                    set.scene
                ),
                "list the scene itself in files, with its digest and size",
            )
        })?;
    let scene = digest("the scene's digest", &scene.digest)?;
    let bytes = set.encode_to_vec();
    crate::model::fileset::check(&bytes, &scene)?;
    let d = Digest::of(&bytes);
    let size = bytes.len() as u64;
    let r = store(&api, &who, d, size, Body::from(bytes)).await?;
    drop(r);
    Ok(ok(FileSetStored { digest: d.to_hex() }))
}
