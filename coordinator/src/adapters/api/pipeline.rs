//! The pipeline over HTTP: rendering some frames of a job again, and
//! changing what a job waits for or may cost (the gRPC `RetryFrames` and
//! `UpdateJob`).

use axum::body::Body;
use axum::extract::{Path, State};
use axum::response::Response;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::jobs::{job_json, owned};
use super::{ok, read_json, Api, ApiError, Caller};
use crate::farm::JobUpdate;
use crate::model::job::JobId;

/// The body of `POST /api/v1/jobs/{id}/rerun`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Rerun {
    /// The frames to render again.
    #[schema(examples("10-20"))]
    frames: String,
}

/// The answer of `POST /api/v1/jobs/{id}/rerun`.
#[derive(Serialize, ToSchema)]
pub struct Reran {
    job: tessera_proto::json::Job,
    /// The frames that will render again.
    frames: Vec<u32>,
}

/// The body of `POST /api/v1/jobs/{id}/update`.
#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = JobUpdate)]
pub struct Update {
    /// Replaces the jobs it waits for (`[]`: none).
    #[serde(default)]
    after: Option<Vec<u64>>,
    /// A new budget; `null` leaves it, see `clear_max_cost`.
    #[serde(default)]
    max_cost: Option<f64>,
    /// Removes the budget.
    #[serde(default)]
    clear_max_cost: bool,
}

/// `POST /api/v1/jobs/{id}/rerun` `{"frames": "10-20"}`: those frames are
/// rendered again; answers `{"job": ..., "frames": [...]}`.
pub async fn rerun(
    State(api): State<Api>,
    caller: Caller,
    Path(id): Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    let id = owned(&api, &caller, &id)?;
    let r: Rerun = read_json(body, 64 << 10, "rerun request").await?;
    let farm = api.farm.clone();
    let (snap, frames) = tokio::task::spawn_blocking(move || farm.retry_frames(id, &r.frames))
        .await
        .map_err(|e| {
            ApiError::from(crate::error::Error::Internal(format!(
                "the change stopped: {e}; see the coordinator's log"
            )))
        })??;
    let job = (&tessera_proto::v1::JobView::from(&snap)).into();
    Ok(ok(Reran { job, frames }))
}

/// `POST /api/v1/jobs/{id}/update` `{"after": [3], "max_cost": 40}`:
/// answers the job.
pub async fn update(
    State(api): State<Api>,
    caller: Caller,
    Path(id): Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    let id = owned(&api, &caller, &id)?;
    let who = caller.client()?.clone();
    let u: Update = read_json(body, 64 << 10, "update request").await?;
    if u.after.is_none() && u.max_cost.is_none() && !u.clear_max_cost {
        return Err(ApiError::bad(
            "nothing to change",
            "send `after` (a list of job ids), `max_cost` or `clear_max_cost`",
        ));
    }
    let update = JobUpdate {
        after: u.after.map(|a| a.into_iter().map(JobId).collect()),
        max_cost: match (u.clear_max_cost, u.max_cost) {
            (true, _) => Some(None),
            (false, m) => m.map(Some),
        },
    };
    let farm = api.farm.clone();
    let snap = tokio::task::spawn_blocking(move || farm.update(id, Some(&who), update))
        .await
        .map_err(|e| {
            ApiError::from(crate::error::Error::Internal(format!(
                "the change stopped: {e}; see the coordinator's log"
            )))
        })??;
    Ok(ok(job_json(&snap)))
}
