//! Jobs and workers over HTTP: the same calls as the gRPC `Farm` service
//! (`SubmitJob`, `GetJob`, `ListJobs`, the job actions, `ListWorkers`), and
//! frames as images.

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{json, Value};
use tessera_proto::{self as pb, json};
use utoipa::ToSchema;

use super::{json_response, number, ok, query, read_json, Api, ApiError, Caller};
use crate::farm::{JobSnapshot, Page, Submission};
use crate::model::job::JobId;

/// Tasks in a job view unless `task_limit` says otherwise.
pub const DEFAULT_TASK_LIMIT: u32 = 1000;
/// Outputs in a job view unless `output_limit` says otherwise.
pub const DEFAULT_OUTPUT_LIMIT: u32 = 10_000;

/// The answer of `GET /api/v1/jobs`: a page of jobs.
#[derive(Serialize, ToSchema)]
pub struct JobList {
    jobs: Vec<json::Job>,
    /// The `after` of the next page; null on the last one.
    next_after: Option<u64>,
}

/// The answer of `POST /api/v1/jobs`.
#[derive(Serialize, ToSchema)]
pub struct JobCreated {
    job_id: u64,
}

/// The answer of `POST /api/v1/jobs/check`: what the job would be.
#[derive(Serialize, ToSchema)]
pub struct JobCheck {
    /// Tasks it would split into (without `chunk`, the most: one a frame).
    tasks: u64,
    /// Frames it renders.
    frames: u64,
    /// Online, healthy workers with a slot that can render it.
    workers: u32,
    /// Why it would wait (empty when a worker would take it).
    waiting: String,
}

/// The answer of `GET /api/v1/workers`.
#[derive(Serialize, ToSchema)]
pub struct WorkerList {
    workers: Vec<json::Worker>,
}

/// A job as JSON: the same object as `tessera status --json`.
pub fn job_json(snap: &JobSnapshot) -> Value {
    tessera_proto::json::job(&pb::JobView::from(snap))
}

/// Parses the `{id}` of a job path.
pub fn job_id(s: &str) -> Result<JobId, ApiError> {
    s.parse().map(JobId).map_err(|_| {
        ApiError::bad(
            format!("`{s}` is not a job id"),
            "give the job's number, as `tessera jobs` lists it",
        )
    })
}

/// The job a path names, once the caller may see it (another user's job
/// answers 404, like a missing one).
pub(super) fn owned(api: &Api, caller: &Caller, id: &str) -> Result<JobId, ApiError> {
    let who = caller.client()?;
    let id = job_id(id)?;
    api.farm.check_owner(id, who)?;
    Ok(id)
}

/// A JobSpec from a JSON body, as a submission.
async fn spec(api: &Api, body: Body, allow_no_scene: bool) -> Result<Submission, ApiError> {
    let mut spec: pb::JobSpec = read_json(body, api.farm.config().max_message, "JobSpec").await?;
    if allow_no_scene && spec.scene_digest.is_empty() {
        // A check before the scene is hashed: any digest will do, it is
        // never looked up.
        spec.scene_digest = "0".repeat(64);
    }
    Ok(spec.try_into()?)
}

/// `GET /api/v1/jobs?limit=&after=&archived=`: summaries, oldest first
/// (archived jobs too with `archived=true`).
pub async fn list(
    State(api): State<Api>,
    caller: Caller,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let who = caller.client()?;
    let q = query(q.as_deref());
    let limit = match number::<u32>(&q, "limit", 100)? {
        0 => 100,
        n => n.min(1000),
    };
    let after = number::<u64>(&q, "after", 0)?;
    let archived = q
        .iter()
        .any(|(k, v)| *k == "archived" && (*v == "true" || *v == "1"));
    let (jobs, next) = api.farm.job_list(who, after, limit as usize, archived);
    Ok(ok(JobList {
        jobs: jobs
            .iter()
            .map(|j| json::Job::from(&pb::JobView::from(j)))
            .collect(),
        next_after: next,
    }))
}

/// `GET /api/v1/jobs/{id}?task_from=&task_limit=&output_from=&output_limit=`.
pub async fn view(
    State(api): State<Api>,
    caller: Caller,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let id = owned(&api, &caller, &id)?;
    let q = query(q.as_deref());
    let page = Page {
        task_from: number(&q, "task_from", 0)?,
        task_limit: number(&q, "task_limit", DEFAULT_TASK_LIMIT)?,
        output_from: number(&q, "output_from", 0)?,
        output_limit: number(&q, "output_limit", DEFAULT_OUTPUT_LIMIT)?,
    }
    .capped();
    let mut job = job_json(&api.farm.job_page(id, page)?);
    job["outages"] = json!(api.farm.outages());
    Ok(ok(job))
}

/// `POST /api/v1/jobs`: submits a JobSpec; 201 `{"job_id": N}`.
pub async fn submit(
    State(api): State<Api>,
    caller: Caller,
    body: Body,
) -> Result<Response, ApiError> {
    let who = caller.client()?.clone();
    let mut sub = spec(&api, body, false).await?;
    api.farm.check_submission(&who, &sub)?;
    sub.owner = who.name;
    let farm = api.farm.clone();
    let id = tokio::task::spawn_blocking(move || farm.submit(sub))
        .await
        .map_err(|e| ApiError::bad(format!("submit stopped: {e}"), "send it again"))??;
    Ok(json_response(
        StatusCode::CREATED,
        &JobCreated { job_id: id.0 },
    ))
}

/// `POST /api/v1/jobs/check`: what a submit would check, except that the
/// scene and file set are uploaded; creates nothing.
pub async fn check(
    State(api): State<Api>,
    caller: Caller,
    body: Body,
) -> Result<Response, ApiError> {
    let who = caller.client()?.clone();
    let mut sub = spec(&api, body, true).await?;
    sub.owner = who.name;
    let c = api.farm.check_job(&sub)?;
    Ok(ok(JobCheck {
        tasks: c.tasks,
        frames: c.frames,
        workers: c.workers,
        waiting: c.waiting,
    }))
}

macro_rules! action {
    ($name:ident, $call:ident, $doc:literal) => {
        #[doc = $doc]
        pub async fn $name(
            State(api): State<Api>,
            caller: Caller,
            Path(id): Path<String>,
        ) -> Result<Response, ApiError> {
            let id = owned(&api, &caller, &id)?;
            Ok(ok(job_json(&api.farm.$call(id)?)))
        }
    };
}

action!(cancel, cancel, "`POST /api/v1/jobs/{id}/cancel`.");
action!(pause, pause, "`POST /api/v1/jobs/{id}/pause`.");
action!(resume, resume, "`POST /api/v1/jobs/{id}/resume`.");
action!(retry, retry, "`POST /api/v1/jobs/{id}/retry`.");

/// `GET /api/v1/workers`: `{"workers": [...]}`.
pub async fn workers(State(api): State<Api>, caller: Caller) -> Result<Response, ApiError> {
    caller.client()?;
    let workers = api
        .farm
        .workers()
        .iter()
        .map(|w| json::Worker::from(&pb::WorkerView::from(w)))
        .collect();
    Ok(ok(WorkerList { workers }))
}

/// `GET /api/v1/jobs/{id}/frames/{frame}[?thumb=N][&pass=NAME]`: the frame's
/// image (or one of its passes), or a PNG thumbnail of it.
pub async fn frame(
    State(api): State<Api>,
    caller: Caller,
    Path((id, frame)): Path<(String, String)>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let id = owned(&api, &caller, &id)?;
    let frame: u32 = frame.parse().map_err(|_| {
        ApiError::bad(
            format!("`{frame}` is not a frame number"),
            "give the frame as a whole number, e.g. /frames/12",
        )
    })?;
    let q = query(q.as_deref());
    let thumb = number::<u32>(&q, "thumb", 0)?;
    let pass = q.get("pass").copied().unwrap_or("");
    // Outputs are ordered by frame: page through them to this frame's.
    let mut from = 0u32;
    let output = loop {
        let page = Page {
            output_from: from,
            output_limit: Page::MAX,
            ..Page::SUMMARY
        };
        let snap = api.farm.job_page(id, page)?;
        if let Some(o) = snap
            .outputs
            .iter()
            .find(|o| o.frame == frame && o.pass == pass)
        {
            break o.clone();
        }
        let past = snap.outputs.last().is_none_or(|o| o.frame > frame);
        if past || snap.outputs.len() < Page::MAX as usize {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!("frame {frame} of job {id} is not rendered yet"),
                "wait for it (GET /api/v1/events tells when) or check the frame number",
            ));
        }
        from += Page::MAX;
    };
    api.farm.check_read(&caller.who, &output.digest)?;
    let etag = format!("\"{}-{thumb}\"", output.digest.to_hex());
    if headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        == Some(etag.as_str())
    {
        return Ok(StatusCode::NOT_MODIFIED.into_response());
    }
    let farm = api.farm.clone();
    let (bytes, kind) = tokio::task::spawn_blocking(move || {
        let bytes = farm.blobs().read(&output.digest)?;
        if thumb == 0 {
            let kind = match output.ext.as_str() {
                "png" => "image/png",
                "exr" => "image/x-exr",
                "jpg" | "jpeg" => "image/jpeg",
                _ => "application/octet-stream",
            };
            return Ok::<_, crate::error::Error>((bytes, kind));
        }
        let limit = farm.config().max_pixels;
        Ok((
            super::thumb::thumbnail(&bytes, &output.ext, thumb, limit)?,
            "image/png",
        ))
    })
    .await
    .map_err(|e| ApiError::bad(format!("reading the frame stopped: {e}"), "try again"))??;
    Ok((
        [
            (header::CONTENT_TYPE, kind.to_string()),
            (header::ETAG, etag),
            (header::CACHE_CONTROL, "private, no-cache".to_string()),
        ],
        bytes,
    )
        .into_response())
}

/// The page `GET /api/v1/jobs/{id}` shows without query parameters.
#[cfg(test)]
pub(super) fn page_for_tests() -> Page {
    Page {
        task_from: 0,
        task_limit: DEFAULT_TASK_LIMIT,
        output_from: 0,
        output_limit: DEFAULT_OUTPUT_LIMIT,
    }
    .capped()
}
