//! Preview videos over HTTP: ask for one, and serve it as `video/mp4` to
//! the dashboard's `<video>` (with byte ranges, which browsers use to seek).

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use super::jobs::{job_json, owned};
use super::{ok, Api, ApiError, Caller};

/// `POST /api/v1/jobs/{id}/preview`: asks for the job's preview video
/// (made when the job is done; a failed one is tried again); answers the job.
pub async fn request(
    State(api): State<Api>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = owned(&api, &caller, &id)?;
    let farm = api.farm.clone();
    let snap = tokio::task::spawn_blocking(move || farm.request_preview(id))
        .await
        .map_err(|e| {
            ApiError::bad(format!("asking for the preview stopped: {e}"), "try again")
        })??;
    Ok(ok(job_json(&snap)))
}

/// `GET /api/v1/jobs/{id}/preview`: the MP4, whole or the byte range asked
/// for (`Range: bytes=A-B`).
pub async fn video(
    State(api): State<Api>,
    caller: Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let id = owned(&api, &caller, &id)?;
    let job = api.farm.job_page(id, crate::farm::Page::SUMMARY)?.job;
    let Some(digest) = job.preview.digest() else {
        let why = match job.preview.state_name() {
            Some("pending") => "it is not made yet; it is made when the job is done".to_string(),
            Some("failed") => format!(
                "making it failed; `tessera status {id}` says why, and `tessera preview {id}` tries again"
            ),
            _ => format!("none was asked for; `tessera preview {id}` makes one"),
        };
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("job {id} has no preview video: {why}"),
            format!("POST /api/v1/jobs/{id}/preview asks for one"),
        ));
    };
    api.farm.check_read(&caller.who, &digest)?;
    let etag = format!("\"{}\"", digest.to_hex());
    if headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        == Some(etag.as_str())
    {
        return Ok(StatusCode::NOT_MODIFIED.into_response());
    }
    let farm = api.farm.clone();
    let bytes = tokio::task::spawn_blocking(move || farm.blobs().read(&digest))
        .await
        .map_err(|e| ApiError::bad(format!("reading the preview stopped: {e}"), "try again"))??;
    let range = headers
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .map(|r| byte_range(r, bytes.len() as u64));
    let common = [
        (header::CONTENT_TYPE, "video/mp4".to_string()),
        (header::ACCEPT_RANGES, "bytes".to_string()),
        (header::ETAG, etag),
        (header::CACHE_CONTROL, "private, no-cache".to_string()),
    ];
    match range {
        None => Ok((common, bytes).into_response()),
        Some(Some((from, to))) => {
            let part = bytes[from as usize..=to as usize].to_vec();
            let mut r = (StatusCode::PARTIAL_CONTENT, common, part).into_response();
            let value = format!("bytes {from}-{to}/{}", bytes.len());
            if let Ok(v) = value.parse() {
                r.headers_mut().insert(header::CONTENT_RANGE, v);
            }
            Ok(r)
        }
        Some(None) => {
            let mut r = StatusCode::RANGE_NOT_SATISFIABLE.into_response();
            if let Ok(v) = format!("bytes */{}", bytes.len()).parse() {
                r.headers_mut().insert(header::CONTENT_RANGE, v);
            }
            Ok(r)
        }
    }
}

/// The first range of a `Range` header over `len` bytes, as inclusive
/// offsets; None when it cannot be served.
pub fn byte_range(header: &str, len: u64) -> Option<(u64, u64)> {
    let spec = header.trim().strip_prefix("bytes=")?;
    let first = spec.split(',').next()?.trim();
    let (a, b) = first.split_once('-')?;
    let (from, to) = match (a.trim(), b.trim()) {
        ("", suffix) => {
            let n: u64 = suffix.parse().ok()?;
            (len.checked_sub(n.min(len))?, len.checked_sub(1)?)
        }
        (a, "") => (a.parse().ok()?, len.checked_sub(1)?),
        (a, b) => (
            a.parse().ok()?,
            b.parse::<u64>().ok()?.min(len.checked_sub(1)?),
        ),
    };
    (from <= to && to < len).then_some((from, to))
}

#[cfg(test)]
mod tests {
    use super::byte_range;

    #[test]
    fn byte_ranges_are_read_like_browsers_send_them() {
        assert_eq!(byte_range("bytes=0-", 10), Some((0, 9)));
        assert_eq!(byte_range("bytes=2-4", 10), Some((2, 4)));
        assert_eq!(byte_range("bytes=5-100", 10), Some((5, 9)));
        assert_eq!(byte_range("bytes=-3", 10), Some((7, 9)));
        assert_eq!(byte_range("bytes=0-1, 4-5", 10), Some((0, 1)));
        assert_eq!(byte_range("bytes=10-", 10), None);
        assert_eq!(byte_range("bytes=4-2", 10), None);
        assert_eq!(byte_range("items=0-1", 10), None);
        assert_eq!(byte_range("bytes=0-", 0), None);
    }
}
