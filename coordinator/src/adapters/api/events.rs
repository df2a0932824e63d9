//! `GET /api/v1/events`: Server-Sent Events of job and worker changes, from
//! the farm's event channel, so that nothing polls.
//!
//! Events (each `data` is one JSON object):
//! - `hello`: `{"user": NAME}`, first;
//! - `job`: a job's summary (the job JSON without tasks and outputs), for
//!   each job the caller may see, when it or one of its tasks changed;
//! - `worker`: a worker's JSON, when it registered or reported.
//!
//! Bursts are folded: at most one send per [`SETTLE`], each job once in
//! it, and a change after a quiet spell (a job's end) goes at once. A
//! stream that falls behind the channel resends every unfinished job and
//! every worker, then goes on.

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;

use super::jobs::job_json;
use super::{Api, ApiError, Caller, MAX_STREAMS_PER_USER};
use crate::auth::Identity;
use crate::farm::{FarmEvent, Page};
use crate::model::job::JobId;
use crate::model::worker::WorkerId;

/// The least time between two sends of a stream: a burst of changes
/// within it is folded into one.
pub const SETTLE: Duration = Duration::from_millis(150);

/// Counts a user's open streams; the count drops with the stream.
struct Slot {
    api: Api,
    user: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.api.streams.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.user) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.user);
            }
        }
    }
}

/// `GET /api/v1/events`.
pub async fn stream(State(api): State<Api>, caller: Caller) -> Result<Response, ApiError> {
    let who = caller.client()?.clone();
    let slot = {
        let mut open = api.streams.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(who.name.clone()).or_default();
        if *n >= MAX_STREAMS_PER_USER {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "{} already has {MAX_STREAMS_PER_USER} event streams open",
                    who.name
                ),
                "close some dashboard tabs or add-on sessions, then try again",
            ));
        }
        *n += 1;
        Slot {
            api: api.clone(),
            user: who.name.clone(),
        }
    };
    let (tx, rx) = mpsc::channel::<Event>(64);
    tokio::spawn(async move {
        let _slot = slot;
        tokio::select! {
            _ = forward(&api, &who, &tx) => {}
            _ = tx.closed() => {}
        }
    });
    let events = tokio_stream::wrappers::ReceiverStream::new(rx);
    let events = tokio_stream::StreamExt::map(events, Ok::<_, Infallible>);
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}

/// Sends the farm's changes that `who` may see until the channel closes or
/// the client goes.
async fn forward(api: &Api, who: &Identity, tx: &mpsc::Sender<Event>) {
    let mut changes = api.farm.subscribe();
    let hello = Event::default()
        .event("hello")
        .data(json!({"user": who.name}).to_string());
    if tx.send(hello).await.is_err() {
        return;
    }
    let mut pace = crate::adapters::throttle::Throttle::new(SETTLE);
    loop {
        let mut jobs = BTreeSet::new();
        let mut workers = BTreeSet::new();
        let mut resend = false;
        // A job's end goes at once; other changes wait for the interval.
        let ended = match changes.recv().await {
            Ok(e) => note(e, &mut jobs, &mut workers),
            Err(RecvError::Lagged(_)) => {
                resend = true;
                false
            }
            Err(RecvError::Closed) => return,
        };
        let take = |e: Result<FarmEvent, RecvError>| match e {
            Ok(e) => note(e, &mut jobs, &mut workers),
            Err(_) => {
                resend = true;
                false
            }
        };
        if !pace.burst(&mut changes, ended, take).await {
            return;
        }
        if resend {
            jobs.extend(open_jobs(api, who));
            workers.extend(api.farm.workers().into_iter().map(|w| w.record.id));
        }
        for event in render(api, who, &jobs, &workers) {
            if tx.send(event).await.is_err() {
                return;
            }
        }
    }
}

/// Notes a change; true when it is a job's end (sent without waiting).
fn note(e: FarmEvent, jobs: &mut BTreeSet<JobId>, workers: &mut BTreeSet<WorkerId>) -> bool {
    match e {
        FarmEvent::Job(j) => {
            jobs.insert(j);
            false
        }
        FarmEvent::JobEnded(j) => {
            jobs.insert(j);
            true
        }
        FarmEvent::Worker(w) => {
            workers.insert(w);
            false
        }
    }
}

/// Every unfinished job `who` may see.
fn open_jobs(api: &Api, who: &Identity) -> Vec<JobId> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let (page, next) = api.farm.job_list(who, after, 1000, false);
        out.extend(
            page.iter()
                .filter(|s| !s.job.state.is_final())
                .map(|s| s.job.id),
        );
        match next {
            Some(n) => after = n,
            None => return out,
        }
    }
}

fn render(
    api: &Api,
    who: &Identity,
    jobs: &BTreeSet<JobId>,
    workers: &BTreeSet<WorkerId>,
) -> Vec<Event> {
    let mut out = Vec::new();
    for id in jobs {
        if let Ok(snap) = api.farm.job_page(*id, Page::SUMMARY) {
            if who.may_see(&snap.job.owner) {
                out.push(
                    Event::default()
                        .event("job")
                        .data(job_json(&snap).to_string()),
                );
            }
        }
    }
    if !workers.is_empty() {
        for w in api.farm.workers() {
            if workers.contains(&w.record.id) {
                let v = tessera_proto::json::worker(&(&w).into());
                out.push(Event::default().event("worker").data(v.to_string()));
            }
        }
    }
    out
}
