//! Thin gRPC adapters: unwrap the request, call the [`Farm`], map the answer.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tessera_proto as pb;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use crate::adapters::convert::{digest, job_id};
use crate::auth::{self, Identity, Role};
use crate::blobs::BlobStore;
use crate::error::Error;
use crate::farm::Farm;
use crate::model::job::JobId;
use crate::model::task::{FrameOutput, LeaseId};
use crate::model::worker::WorkerId;

mod inline;

pub use inline::{INLINE_COMPLETE_MAX, INLINE_RESULT_MAX};

/// Size of the chunks blobs are streamed in.
pub const CHUNK: usize = 1 << 20;

/// The longest a worker's lease call is held open.
const MAX_LEASE_WAIT: Duration = Duration::from_secs(30);

impl From<Error> for Status {
    fn from(e: Error) -> Self {
        match e {
            // A full volume or an unreachable blob store: the message names
            // it and what to do; the same call may succeed later.
            Error::NoSpace(m) => Status::resource_exhausted(m),
            Error::Unavailable(m) => Status::unavailable(m),
            Error::Invalid(m) => Status::invalid_argument(m),
            Error::NotFound(_) => Status::not_found(e.to_string()),
            Error::Conflict(m) => Status::failed_precondition(m),
            Error::LeaseLost(_) => Status::failed_precondition(e.to_string()),
            Error::Unauthenticated(m) => Status::unauthenticated(m),
            Error::PermissionDenied(m) => Status::permission_denied(m),
            // PostgreSQL is down or slow: worth trying again; the message
            // says what to check.
            Error::StoreUnavailable(m) => Status::unavailable(m),
            // Marked like a standby's refusal, so that clients move on.
            Error::NotActive(m) => crate::adapters::refusal::refusal_status(m),
            // A store failed: nothing was acknowledged. The failure names
            // its backend and that backend's fix.
            Error::Store(f) => {
                Status::resource_exhausted(format!("the coordinator cannot store this: {f}"))
            }
            Error::Io { .. } => Status::resource_exhausted(format!(
                "the coordinator cannot do this: {e}; check that path's disk and permissions, then try again"
            )),
            Error::Internal(m) => Status::internal(m),
        }
    }
}

/// Runs a domain call that waits for the store off the runtime's threads.
async fn blocking<T: Send + 'static>(
    farm: &Arc<Farm>,
    f: impl FnOnce(&Farm) -> Result<T, Error> + Send + 'static,
) -> Result<T, Status> {
    let farm = farm.clone();
    tokio::task::spawn_blocking(move || f(&farm))
        .await
        .map_err(|e| Status::internal(e.to_string()))?
        .map_err(Status::from)
}

/// Checks the bearer token of a request and attaches the caller's
/// [`Identity`]; only `roles` may call the service.
pub fn authorize(farm: &Farm, mut req: Request<()>, roles: &[Role]) -> Result<Request<()>, Status> {
    let header = req
        .metadata()
        .get("authorization")
        .and_then(|v| v.to_str().ok());
    let who = farm.authenticate(auth::bearer(header))?;
    if !roles.contains(&who.role) {
        return Err(Status::permission_denied(format!(
            "a {} token cannot do this; use a token with role {}",
            who.role.name(),
            roles
                .iter()
                .map(|r| r.name())
                .collect::<Vec<_>>()
                .join(" or ")
        )));
    }
    req.extensions_mut().insert(who);
    Ok(req)
}

/// The caller, as [`authorize`] attached it.
fn who<T>(req: &Request<T>) -> Result<Identity, Status> {
    req.extensions()
        .get::<Identity>()
        .cloned()
        .ok_or_else(|| Status::unauthenticated("no identity; the request bypassed authentication"))
}

fn lease(s: &str) -> Result<LeaseId, Status> {
    Ok(s.parse::<LeaseId>()?)
}

/// The `Blobs` service.
#[derive(Clone)]
pub struct BlobsService {
    farm: Arc<Farm>,
}

/// The `Farm` service.
#[derive(Clone)]
pub struct FarmService {
    farm: Arc<Farm>,
}

/// The `Work` service.
#[derive(Clone)]
pub struct WorkService {
    farm: Arc<Farm>,
}

impl BlobsService {
    /// Serves `farm`'s blob store.
    pub fn new(farm: Arc<Farm>) -> Self {
        Self { farm }
    }
}

impl FarmService {
    /// Serves `farm` to clients.
    pub fn new(farm: Arc<Farm>) -> Self {
        Self { farm }
    }

    /// The job a request names, once the caller may see it.
    fn owned(&self, req: &Request<pb::JobRef>) -> Result<crate::model::job::JobId, Status> {
        let id = job_id(req.get_ref());
        self.farm.check_owner(id, &who(req)?)?;
        Ok(id)
    }
}

impl WorkService {
    /// Serves `farm` to workers.
    pub fn new(farm: Arc<Farm>) -> Self {
        Self { farm }
    }
}

type ChunkStream = Pin<Box<dyn Stream<Item = Result<pb::BlobChunk, Status>> + Send>>;

#[tonic::async_trait]
impl pb::blobs_server::Blobs for BlobsService {
    async fn missing_blobs(
        &self,
        req: Request<pb::MissingBlobsRequest>,
    ) -> Result<Response<pb::MissingBlobsResponse>, Status> {
        let who = who(&req)?;
        let asked = req
            .into_inner()
            .digests
            .iter()
            .map(|d| digest("digests", d))
            .collect::<Result<Vec<_>, _>>()?;
        // A result naming these may follow: keep them from the collector.
        self.farm.touch_blobs(&asked).await;
        let missing = self.farm.missing_for(&who, &asked);
        Ok(Response::new(pb::MissingBlobsResponse {
            missing: missing.iter().map(|d| d.to_hex()).collect(),
        }))
    }

    async fn put_blob(
        &self,
        req: Request<Streaming<pb::BlobChunk>>,
    ) -> Result<Response<pb::PutBlobResponse>, Status> {
        let who = who(&req)?;
        let mut stream = req.into_inner();
        let first = stream.message().await?.ok_or_else(|| {
            Status::invalid_argument("empty upload; send at least one chunk naming the digest")
        })?;
        let d = digest("digest", &first.digest)?;
        let size = first.size;
        self.farm.touch_blobs(&[d]).await;
        let blobs = self.farm.blobs().clone();
        let mut writer = blobs.writer(d, size)?;
        writer.write(&first.data)?;
        while let Some(chunk) = stream.message().await? {
            writer.write(&chunk.data)?;
        }
        // The bytes were re-hashed: the uploader has proved it holds them.
        let farm = self.farm.clone();
        let already_present =
            tokio::task::spawn_blocking(move || farm.record_upload(&who, d, writer.commit()?))
                .await
                .map_err(|e| Status::internal(e.to_string()))??;
        tracing::debug!(digest = %d, size, already_present, "blob stored");
        Ok(Response::new(pb::PutBlobResponse {
            digest: d.to_hex(),
            size,
            already_present,
        }))
    }

    type GetBlobStream = ChunkStream;

    async fn get_blob(
        &self,
        req: Request<pb::GetBlobRequest>,
    ) -> Result<Response<ChunkStream>, Status> {
        let who = who(&req)?;
        let d = digest("digest", &req.into_inner().digest)?;
        self.farm.check_read(&who, &d)?;
        let blobs: Arc<dyn BlobStore> = self.farm.blobs().clone();
        // Unreachable (Unavailable, retried by the caller) is not missing.
        let size = blobs
            .try_size(&d)?
            .ok_or_else(|| Status::not_found(format!("blob {d} not found")))?;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::task::spawn_blocking(move || {
            let mut offset = 0u64;
            loop {
                let msg = blobs.read_range(&d, offset, CHUNK).map_err(Status::from);
                let done = match &msg {
                    Ok(data) => data.is_empty() || offset + data.len() as u64 >= size,
                    Err(_) => true,
                };
                let msg = msg.map(|data| {
                    let chunk = pb::BlobChunk {
                        digest: if offset == 0 {
                            d.to_hex()
                        } else {
                            String::new()
                        },
                        size,
                        data,
                    };
                    offset += chunk.data.len() as u64;
                    chunk
                });
                if tx.blocking_send(msg).is_err() || done {
                    break;
                }
            }
        });
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
        Ok(Response::new(Box::pin(stream) as ChunkStream))
    }
}

#[tonic::async_trait]
impl pb::farm_server::Farm for FarmService {
    async fn submit_job(
        &self,
        req: Request<pb::JobSpec>,
    ) -> Result<Response<pb::SubmitJobResponse>, Status> {
        let who = who(&req)?;
        let mut sub: crate::farm::Submission = req.into_inner().try_into()?;
        self.farm.check_submission(&who, &sub)?;
        sub.owner = who.name;
        let id = blocking(&self.farm, move |f| f.submit(sub)).await?;
        Ok(Response::new(pb::SubmitJobResponse { job_id: id.0 }))
    }

    async fn get_job(&self, req: Request<pb::JobRef>) -> Result<Response<pb::JobView>, Status> {
        let id = self.owned(&req)?;
        let snap = self
            .farm
            .job_page(id, crate::adapters::convert::page(req.get_ref()))?;
        let mut view: pb::JobView = (&snap).into();
        view.outages = self.farm.outages();
        Ok(Response::new(view))
    }

    async fn list_jobs(
        &self,
        req: Request<pb::ListJobsRequest>,
    ) -> Result<Response<pb::ListJobsResponse>, Status> {
        let who = who(&req)?;
        let r = req.get_ref();
        let limit = match r.limit {
            0 => 100,
            n => n.min(1000),
        };
        let (jobs, next) = self
            .farm
            .job_list(&who, r.after, limit as usize, r.archived);
        Ok(Response::new(pb::ListJobsResponse {
            jobs: jobs.iter().map(Into::into).collect(),
            next_after: next.unwrap_or(0),
        }))
    }

    type WatchJobStream = Pin<Box<dyn Stream<Item = Result<pb::JobEvent, Status>> + Send>>;

    async fn watch_job(
        &self,
        req: Request<pb::JobRef>,
    ) -> Result<Response<Self::WatchJobStream>, Status> {
        let id = self.owned(&req)?;
        let farm = self.farm.clone();
        let mut events = farm.subscribe();
        let first = farm.job_page(id, crate::farm::Page::SUMMARY)?;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            let mut snap = first;
            // At most 10 events a second; a change after a quiet spell
            // (the job's end, most often) goes at once.
            let mut pace = crate::adapters::throttle::Throttle::new(Duration::from_millis(100));
            pace.ready().await;
            loop {
                let done = snap.job.state.is_final();
                let event = pb::JobEvent {
                    job: Some((&snap).into()),
                };
                if tx.send(Ok(event)).await.is_err() || done {
                    return;
                }
                // Wait for a change of this job, then take in the rest of
                // its burst until the next event may go (at once when it
                // ended).
                let ended = loop {
                    match events.recv().await {
                        Ok(crate::farm::FarmEvent::Job(j)) if j == id => break false,
                        Ok(crate::farm::FarmEvent::JobEnded(j)) if j == id => break true,
                        Ok(_) => {}
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => break false,
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                    }
                };
                let ended_now = |e: Result<_, _>| matches!(e, Ok(crate::farm::FarmEvent::JobEnded(j)) if j == id);
                if !pace.burst(&mut events, ended, ended_now).await {
                    return;
                }
                snap = match farm.job_page(id, crate::farm::Page::SUMMARY) {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = tx.send(Err(e.into())).await;
                        return;
                    }
                };
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn archive_job(&self, req: Request<pb::JobRef>) -> Result<Response<pb::JobView>, Status> {
        let id = self.owned(&req)?;
        let view = blocking(&self.farm, move |f| f.archive(id)).await?;
        Ok(Response::new((&view).into()))
    }

    async fn delete_job(&self, req: Request<pb::JobRef>) -> Result<Response<pb::Ack>, Status> {
        let id = self.owned(&req)?;
        blocking(&self.farm, move |f| f.delete(id)).await?;
        Ok(Response::new(pb::Ack {}))
    }

    async fn cancel_job(&self, req: Request<pb::JobRef>) -> Result<Response<pb::JobView>, Status> {
        let id = self.owned(&req)?;
        let view = blocking(&self.farm, move |f| f.cancel(id)).await?;
        Ok(Response::new((&view).into()))
    }

    async fn pause_job(&self, req: Request<pb::JobRef>) -> Result<Response<pb::JobView>, Status> {
        let id = self.owned(&req)?;
        let view = blocking(&self.farm, move |f| f.pause(id)).await?;
        Ok(Response::new((&view).into()))
    }

    async fn resume_job(&self, req: Request<pb::JobRef>) -> Result<Response<pb::JobView>, Status> {
        let id = self.owned(&req)?;
        let view = blocking(&self.farm, move |f| f.resume(id)).await?;
        Ok(Response::new((&view).into()))
    }

    async fn retry_job(&self, req: Request<pb::JobRef>) -> Result<Response<pb::JobView>, Status> {
        let id = self.owned(&req)?;
        let view = blocking(&self.farm, move |f| f.retry(id)).await?;
        Ok(Response::new((&view).into()))
    }

    async fn retry_frames(
        &self,
        req: Request<pb::RetryFramesRequest>,
    ) -> Result<Response<pb::RetryFramesResponse>, Status> {
        let who = who(&req)?;
        let r = req.into_inner();
        let id = crate::model::job::JobId(r.job_id);
        self.farm.check_owner(id, &who)?;
        let (view, frames) = blocking(&self.farm, move |f| f.retry_frames(id, &r.frames)).await?;
        Ok(Response::new(pb::RetryFramesResponse {
            job: Some((&view).into()),
            frames,
        }))
    }

    async fn update_job(
        &self,
        req: Request<pb::UpdateJobRequest>,
    ) -> Result<Response<pb::JobView>, Status> {
        let who = who(&req)?;
        let r = req.into_inner();
        let id = crate::model::job::JobId(r.job_id);
        self.farm.check_owner(id, &who)?;
        let update = crate::farm::JobUpdate {
            after: r.set_after.then(|| {
                r.after
                    .iter()
                    .map(|a| crate::model::job::JobId(*a))
                    .collect()
            }),
            max_cost: match (r.clear_max_cost, r.max_cost) {
                (true, _) => Some(None),
                (false, Some(m)) => Some(Some(m)),
                (false, None) => None,
            },
        };
        let view = blocking(&self.farm, move |f| f.update(id, Some(&who), update)).await?;
        Ok(Response::new((&view).into()))
    }

    async fn make_preview(
        &self,
        req: Request<pb::JobRef>,
    ) -> Result<Response<pb::JobView>, Status> {
        let id = self.owned(&req)?;
        let view = blocking(&self.farm, move |f| f.request_preview(id)).await?;
        Ok(Response::new((&view).into()))
    }

    async fn list_workers(
        &self,
        _req: Request<pb::ListWorkersRequest>,
    ) -> Result<Response<pb::ListWorkersResponse>, Status> {
        let workers = self.farm.workers().iter().map(Into::into).collect();
        Ok(Response::new(pb::ListWorkersResponse { workers }))
    }

    async fn add_user(
        &self,
        req: Request<pb::AddUserRequest>,
    ) -> Result<Response<pb::AddUserResponse>, Status> {
        let who = who(&req)?;
        let r = req.into_inner();
        let role = Role::parse(&r.role)?;
        let name = r.name.clone();
        let token = blocking(&self.farm, move |f| f.add_user(&who, &name, role)).await?;
        Ok(Response::new(pb::AddUserResponse {
            name: r.name,
            token,
        }))
    }

    async fn list_users(
        &self,
        req: Request<pb::ListUsersRequest>,
    ) -> Result<Response<pb::ListUsersResponse>, Status> {
        let users = self
            .farm
            .users(&who(&req)?)?
            .into_iter()
            .map(|u| pb::UserView {
                name: u.name,
                role: u.role.name().into(),
                created_ms: u.created_ms,
            })
            .collect();
        Ok(Response::new(pb::ListUsersResponse { users }))
    }

    async fn remove_user(
        &self,
        req: Request<pb::RemoveUserRequest>,
    ) -> Result<Response<pb::Ack>, Status> {
        let who = who(&req)?;
        let name = req.into_inner().name;
        blocking(&self.farm, move |f| f.remove_user(&who, &name)).await?;
        Ok(Response::new(pb::Ack {}))
    }
}

/// The most leases one Renew call may carry: a worker holds at most three
/// a slot (one it reports, one it renders, one ahead).
const MAX_RENEW: usize = 4096;

/// What a lease request asks for, with the scenes it names that parse.
fn ask_of(req: &pb::LeaseRequest) -> crate::farm::NextAsk {
    crate::farm::NextAsk {
        worker: WorkerId(req.worker_id.clone()),
        cached: req
            .cached_scenes
            .iter()
            .filter_map(|d| d.parse().ok())
            .collect(),
        warm: req.warm_job.map(JobId),
        slot: req.slot,
        ahead: req.ahead,
    }
}

impl WorkService {
    /// Answers a lease request of `who`'s worker, waiting up to `wait` for a
    /// task (a request `ahead` never waits): for Lease, and for the next
    /// lease a Complete asks for (`wait` zero).
    async fn lease_for(
        &self,
        who: &Identity,
        req: pb::LeaseRequest,
        wait: Duration,
    ) -> Result<pb::LeaseResponse, Status> {
        let ask = ask_of(&req);
        self.farm.check_worker(who, &ask.worker)?;
        let (worker, cached, warm) = (&ask.worker, &ask.cached, ask.warm);
        let outcome = if ask.ahead {
            self.farm
                .lease_ahead(worker, cached, warm, ask.slot)
                .await?
        } else {
            self.farm
                .lease(worker, cached, warm, ask.slot, wait)
                .await?
        };
        Ok(pb::LeaseResponse {
            task: outcome.task.as_ref().map(Into::into),
            ended_jobs: outcome.ended.iter().map(|j| j.0).collect(),
        })
    }

    /// What a Progress call answers for each of `leases` (renewed under one
    /// take of the farm's lock), for Progress and Renew alike.
    fn renew_all(
        &self,
        who: &Identity,
        leases: &[pb::ProgressRequest],
    ) -> Vec<Result<pb::ProgressResponse, Status>> {
        let parsed: Vec<Result<crate::farm::Renewal, Status>> = leases
            .iter()
            .map(|p| {
                Ok(crate::farm::Renewal {
                    lease: lease(&p.lease_id)?,
                    frames_done: p.frames_done,
                    samples: (p.samples_done, p.samples_total),
                    waiting: p.waiting,
                })
            })
            .collect();
        let valid: Vec<crate::farm::Renewal> = parsed
            .iter()
            .filter_map(|r| r.as_ref().ok().copied())
            .collect();
        let mut renewed = self.farm.renew_all(who, &valid).into_iter();
        parsed
            .into_iter()
            .map(|p| {
                p?;
                let (keep_going, stop_reason) =
                    renewed.next().expect("an answer for every valid lease")?;
                Ok(pb::ProgressResponse {
                    keep_going,
                    stop_reason,
                })
            })
            .collect()
    }
}

#[tonic::async_trait]
impl pb::work_server::Work for WorkService {
    async fn register(
        &self,
        req: Request<pb::WorkerInfo>,
    ) -> Result<Response<pb::RegisterResponse>, Status> {
        let who = who(&req)?;
        let mut reg: crate::farm::Registration = req.into_inner().try_into()?;
        reg.owner = who.name;
        let (id, ttl) = blocking(&self.farm, move |f| f.register(reg)).await?;
        Ok(Response::new(pb::RegisterResponse {
            worker_id: id.0,
            lease_ttl_ms: ttl.min(u64::from(u32::MAX)) as u32,
            inline_result_max: INLINE_RESULT_MAX,
            inline_complete_max: INLINE_COMPLETE_MAX,
        }))
    }

    async fn lease(
        &self,
        req: Request<pb::LeaseRequest>,
    ) -> Result<Response<pb::LeaseResponse>, Status> {
        let who = who(&req)?;
        let req = req.into_inner();
        let wait = Duration::from_millis(u64::from(req.wait_ms)).min(MAX_LEASE_WAIT);
        Ok(Response::new(self.lease_for(&who, req, wait).await?))
    }

    async fn progress(
        &self,
        req: Request<pb::ProgressRequest>,
    ) -> Result<Response<pb::ProgressResponse>, Status> {
        let who = who(&req)?;
        self.farm.renewals_asked(false, 1);
        let mut answers = self.renew_all(&who, &[req.into_inner()]);
        Ok(Response::new(answers.remove(0)?))
    }

    async fn renew(
        &self,
        req: Request<pb::RenewRequest>,
    ) -> Result<Response<pb::RenewResponse>, Status> {
        let who = who(&req)?;
        let leases = req.into_inner().leases;
        if leases.len() > MAX_RENEW {
            return Err(Status::invalid_argument(format!(
                "{} leases in one renewal, over the limit of {MAX_RENEW}; send them in several calls",
                leases.len()
            )));
        }
        self.farm.renewals_asked(true, leases.len());
        let answers = self
            .renew_all(&who, &leases)
            .into_iter()
            .map(|answer| match answer {
                Ok(r) => pb::LeaseRenewal {
                    keep_going: r.keep_going,
                    stop_reason: r.stop_reason,
                    code: 0,
                    error: String::new(),
                },
                Err(s) => pb::LeaseRenewal {
                    keep_going: false,
                    stop_reason: String::new(),
                    code: s.code() as i32,
                    error: s.message().to_string(),
                },
            })
            .collect();
        Ok(Response::new(pb::RenewResponse { answers }))
    }

    async fn complete(
        &self,
        req: Request<pb::CompleteRequest>,
    ) -> Result<Response<pb::CompleteResponse>, Status> {
        let who = who(&req)?;
        let mut req = req.into_inner();
        let inline = inline::take(&mut req.outputs)?;
        let outputs = req
            .outputs
            .into_iter()
            .map(FrameOutput::try_from)
            .collect::<Result<Vec<_>, _>>()?;
        let lease = lease(&req.lease_id)?;
        // Bytes sent inline prove their sender holds them; every other
        // output must be a blob this token uploaded. Checked before any
        // byte is stored: only a lease's holder writes blobs through here.
        let carried = crate::farm::Carried::digests(&inline);
        let uploaded: Vec<FrameOutput> = outputs
            .iter()
            .filter(|o| !carried.contains(&o.digest))
            .cloned()
            .collect();
        self.farm.check_complete(&who, lease, &uploaded)?;
        if !outputs.is_empty() {
            self.farm.results_durable(inline).await?;
        }
        // Completing the last tile of a frame stitches it: disk and CPU work.
        // In memory under the lock, then wait for the store without holding
        // a thread; only a stitch (disk and CPU work) goes to one.
        // Render statistics: one per frame of the result at most.
        let stats = req
            .stats
            .iter()
            .filter(|s| {
                outputs
                    .iter()
                    .any(|o| o.frame == s.frame && o.pass.is_empty())
            })
            .take(outputs.len())
            .map(crate::model::verify::FrameStats::from)
            .collect();
        // The slot's next lease, asked for with the result: leased right
        // after the result is recorded (its slot is free), under the same
        // take of the lock, so that both changes share a commit; answered
        // once both are stored. Should the result's commit fail after the
        // lease was granted, the lease expires unused, as one whose answer
        // was lost. A lease request that fails (another worker's id, a
        // coordinator that stepped down) is left out of the answer, which
        // stands for the result alone: the worker's own Lease call then
        // meets the error and acts on it.
        let ask = req
            .next
            .as_ref()
            .map(ask_of)
            .filter(|a| self.farm.check_worker(&who, &a.worker).is_ok());
        let (pending, leased) =
            self.farm
                .complete_begin_asking(lease, outputs, stats, req.warnings, ask.as_ref())?;
        let next = async {
            let answer = match leased {
                Some(leased) => {
                    let task = match leased.task {
                        Some((assignment, ticket)) => {
                            ticket.stored().await.ok()?;
                            self.farm.lease_served(leased.started);
                            Some(assignment)
                        }
                        None => None,
                    };
                    pb::LeaseResponse {
                        task: task.as_ref().map(Into::into),
                        ended_jobs: leased.ended.iter().map(|j| j.0).collect(),
                    }
                }
                // Not leased with the result (a duplicate, a result held
                // for verification, ...): as a Lease call that does not wait.
                None => {
                    ask.as_ref()?;
                    let n = req.next?;
                    match self.lease_for(&who, n, Duration::ZERO).await {
                        Ok(answer) => answer,
                        Err(s) => {
                            tracing::debug!(lease = %lease, "no lease with the result: {}", s.message());
                            return None;
                        }
                    }
                }
            };
            if answer.task.is_some() {
                self.farm.lease_carried();
            }
            Some(answer)
        };
        let (stored, next) = tokio::join!(pending.ticket.stored(), next);
        stored?;
        if let Some((job, frame)) = pending.stitch {
            blocking(&self.farm, move |f| {
                f.stitch_ready(job, frame);
                Ok(())
            })
            .await?;
        }
        Ok(Response::new(pb::CompleteResponse {
            duplicate: pending.completion == crate::model::task::Completion::Duplicate,
            next,
        }))
    }

    async fn fail(&self, req: Request<pb::FailRequest>) -> Result<Response<pb::Ack>, Status> {
        let who = who(&req)?;
        let req = req.into_inner();
        let lease = lease(&req.lease_id)?;
        self.farm.check_lease(&who, lease)?;
        let scope = crate::adapters::convert::failure_scope(req.scope, req.permanent);
        blocking(&self.farm, move |f| {
            f.fail(lease, &req.reason, &req.log_tail, scope)
        })
        .await?;
        Ok(Response::new(pb::Ack {}))
    }

    async fn telemetry(
        &self,
        req: Request<pb::TelemetryRequest>,
    ) -> Result<Response<pb::Ack>, Status> {
        let who = who(&req)?;
        let req = req.into_inner();
        let worker = WorkerId(req.worker_id);
        self.farm.check_worker(&who, &worker)?;
        let gpus = req.gpus.into_iter().map(Into::into).collect();
        let slots = req
            .slot_info
            .iter()
            .map(crate::adapters::convert::slot_cap)
            .collect();
        blocking(&self.farm, move |f| f.telemetry(&worker, gpus, slots)).await?;
        Ok(Response::new(pb::Ack {}))
    }

    async fn release(&self, req: Request<pb::ReleaseRequest>) -> Result<Response<pb::Ack>, Status> {
        let who = who(&req)?;
        let req = req.into_inner();
        let lease = lease(&req.lease_id)?;
        self.farm.check_lease(&who, lease)?;
        let preempted = req.preempted;
        let reason = req.reason;
        blocking(&self.farm, move |f| {
            f.release_saying(lease, preempted, &reason)
        })
        .await?;
        Ok(Response::new(pb::Ack {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{Backend, StoreFailure};

    #[test]
    fn a_store_failure_keeps_its_code_and_names_its_backend() {
        let pg = Backend::Postgres {
            at: Some("db.example:5432/farm".into()),
        };
        let s = Status::from(Error::from(StoreFailure::new(
            pg,
            "cannot store a change: x",
        )));
        assert_eq!(s.code(), tonic::Code::ResourceExhausted);
        assert!(
            s.message().starts_with(
                "the coordinator cannot store this: the PostgreSQL store at db.example:5432/farm: "
            ),
            "{}",
            s.message()
        );
        assert!(!s.message().contains("--data"), "{}", s.message());
        let sled = Backend::Sled {
            dir: "/var/lib/tessera/db".into(),
        };
        let s = Status::from(Error::from(StoreFailure::new(sled, "cannot flush")));
        assert_eq!(s.code(), tonic::Code::ResourceExhausted);
        assert!(s.message().contains("--data volume"), "{}", s.message());
        let s = Status::from(Error::Internal("a task panicked".into()));
        assert_eq!(s.code(), tonic::Code::Internal);
    }
}
