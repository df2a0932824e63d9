//! The worker's lease loop: register, then one loop per slot that leases a
//! task, fetches its scene, renders, uploads the frames and reports the result.
//! While it renders, a slot leases its next task ahead (see `agent/ahead.rs`) and
//! starts it as soon as the render ends, uploading and reporting meanwhile.
//!
//! Every call to the coordinator has a deadline (see [`crate::deadline`]) and
//! is retried while the coordinator is unreachable or silent (it may be
//! restarting, or another one taking over); answers that say the lease is
//! over for good (see [`dropped`]) end the task, logging the coordinator's
//! reason: the job was cancelled, the lease expired and the task was served
//! again, and so on. A failed render is reported with Blender's log tail and
//! its scope (who could render it instead), and the slot carries on. A result
//! the coordinator refuses for good is reported as a failure everywhere, so it
//! is not rendered again and again.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tessera_proto as pb;
use tokio::sync::{watch, RwLock};
use tonic::Code;
use tracing::Instrument;

use crate::blender::{
    failure, Device, Progress, RenderFailure, RenderRequest, Renderer, NO_DEVICE,
};
use crate::cache::SceneCache;
use crate::connect::{channel_with_deadline, transient, Access, Conn};
use crate::error::Error;
use crate::failure::{Kind, Scope};
use crate::gpu::{GpuInfo, Hardware, Telemetry};
use crate::slots::SlotPlan;
use crate::transfer;

/// How a worker runs.
pub struct WorkerConfig {
    /// How to reach the coordinator.
    pub access: Access,
    /// Name shown in `tessera workers`.
    pub name: String,
    /// Scene cache and scratch space.
    pub cache: PathBuf,
    /// The slots and what each renders with.
    pub slots: Vec<SlotPlan>,
    /// The Blenders it renders with, each with what it can render (see
    /// [`crate::runtime`]); the coordinator picks one for each task.
    pub runtimes: Vec<crate::runtime::Offered>,
    /// Render threads per slot (None: all cores).
    pub threads: Option<u32>,
    /// The GPUs (probed, then declared) and where their telemetry comes from.
    pub hardware: HardwareConfig,
    /// Tags jobs can require.
    pub tags: Vec<String>,
    /// Most bytes of job files kept in the cache (least recently used go first).
    pub cache_max_bytes: u64,
    /// Most bytes of copies in one job root (files that cannot be linked).
    pub max_root_bytes: u64,
    /// Where this machine sees the studio's shared storage: (artist's
    /// prefix, local folder), for jobs submitted with `--shared`.
    pub path_map: Vec<(String, PathBuf)>,
    /// How long renders in flight may run on after a shutdown signal before
    /// they are released to other workers.
    pub grace: Duration,
    /// TESTS ONLY: the first Blender session of each slot fails its renders
    /// as a crashing GPU driver would (`tessera worker --fail-first-render`).
    #[cfg(feature = "test-hooks")]
    pub fail_first_render: bool,
    /// What the whole machine costs per hour (`--price-per-hour`).
    pub price_per_hour: f64,
    /// How its capacity is bought: on-demand, spot or reserved.
    pub capacity: String,
    /// An untrusted machine: the coordinator verifies a share of its tasks.
    pub untrusted: bool,
    /// TESTS ONLY: change one pixel of every PNG frame (`tessera worker
    /// --test-corrupt-pixel`, see [`crate::corrupt`]).
    #[cfg(feature = "test-hooks")]
    pub test_corrupt_pixel: bool,
    /// The admin lets jobs run the Python stored in their scenes
    /// (`--allow-scene-python`; the worker then reports the `scene-python`
    /// feature, see [`crate::isolation::blender_flags`]).
    pub allow_scene_python: bool,
    /// Keep a spare Blender started on each idle slot, so that a job's first
    /// task there does not wait for Blender to start (`--no-spare-blender`
    /// turns it off: an idle slot then holds no process).
    pub spare_blender: bool,
    /// Start the spares with the scene's stored Python allowed, as every
    /// task of this worker will ask (`tessera render --scene-python`, whose
    /// worker serves its one job); else without it, as a task asks unless
    /// its job says otherwise. A spare started otherwise than its task asks
    /// is ended and another started.
    pub spare_scene_python: bool,
}

/// A worker's GPUs and their telemetry sources.
#[derive(Default)]
pub struct HardwareConfig {
    /// Every GPU: probed ones first, then declared ones.
    pub gpus: Vec<GpuInfo>,
    /// How many of `gpus` were probed (the rest are declared).
    pub probed: usize,
    /// The probe, kept for live NVML telemetry.
    pub probe: Option<Arc<Hardware>>,
    /// A JSON file of declared GPUs' telemetry (tests of GPU health).
    #[cfg(feature = "test-hooks")]
    pub declared_telemetry: Option<PathBuf>,
    /// How often telemetry is sent.
    pub interval: Duration,
    /// What the probe noted.
    pub notes: Vec<String>,
}

impl std::fmt::Debug for WorkerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerConfig")
            .field("coordinator", &self.access.url)
            .field("name", &self.name)
            .field("slots", &self.slots)
            .finish_non_exhaustive()
    }
}

/// Whether an answer about a lease says it is over for good: its job was
/// cancelled or is gone, its lease expired or went to another worker, or it
/// is not this token's. The task is dropped; asking again would not help.
pub fn dropped(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        Code::FailedPrecondition | Code::NotFound | Code::PermissionDenied
    )
}

/// Capped exponential backoff between tries of one call, bounded by a
/// patience so that nothing waits without end.
struct Backoff {
    start: tokio::time::Instant,
    delay: Duration,
    patience: Duration,
}

impl Backoff {
    /// The first wait, and the longest.
    const FIRST: Duration = Duration::from_millis(200);
    const CAP: Duration = Duration::from_secs(3);

    fn new(patience: Duration) -> Self {
        Self {
            start: tokio::time::Instant::now(),
            delay: Self::FIRST,
            patience,
        }
    }

    /// Waits before the next try of `what`, which failed with `why`; false
    /// (without waiting) once the patience is spent.
    async fn wait(&mut self, what: &str, why: &str) -> bool {
        if self.start.elapsed() >= self.patience {
            return false;
        }
        let delay = self.delay;
        tracing::warn!("{what}: {why}; retrying in {delay:?}");
        tokio::time::sleep(delay).await;
        self.delay = (delay * 2).min(Self::CAP);
        true
    }
}

/// Retries `f` while it fails transiently, up to `patience`.
async fn retry<T, F, Fut>(what: &str, patience: Duration, mut f: F) -> Result<T, tonic::Status>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let mut backoff = Backoff::new(patience);
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(s) if transient(&s) => {
                if !backoff.wait(what, s.message()).await {
                    return Err(s);
                }
            }
            Err(s) => return Err(s),
        }
    }
}

/// How long a task's scene and files are fetched again while the
/// coordinator (or its blob store) does not answer, before the task is
/// given back as failed for another try. The lease is renewed meanwhile.
const FETCH_PATIENCE: Duration = Duration::from_secs(120);

/// How long results are held for a coordinator that is down.
const RESULT_PATIENCE: Duration = Duration::from_secs(600);

struct Shared<R> {
    config: WorkerConfig,
    /// Slots as they stand (a slot whose GPU Blender cannot use turns to CPU).
    plans: std::sync::Mutex<Vec<SlotPlan>>,
    /// Slots changed since the last telemetry.
    changed: std::sync::Mutex<Vec<u32>>,
    renderer: R,
    cache: SceneCache,
    /// Files of jobs with file sets, and the roots built from them.
    files: Arc<crate::fileset::FileCache>,
    channel: Conn,
    worker_id: RwLock<String>,
    ttl_ms: AtomicU32,
    /// What the coordinator accepts inline in Complete, as it said when
    /// this worker registered.
    inline: std::sync::Mutex<InlineBudget>,
    /// Every lease the worker holds, renewed together (see [`renew`]).
    renewals: Arc<renew::Renewals>,
}

impl<R> Shared<R> {
    /// How often leases are renewed: a third of the lease TTL, at most a
    /// second apart (renewals also carry sample progress and bring word of
    /// a cancelled job).
    fn renew_every(&self) -> Duration {
        let ttl = u64::from(self.ttl_ms.load(Ordering::Relaxed));
        Duration::from_millis((ttl / 3).clamp(100, 1000))
    }
}

/// Runs a worker until `shutdown` turns true. Tasks in flight are released
/// back to the coordinator on shutdown.
pub async fn run<R: Renderer>(
    config: WorkerConfig,
    renderer: R,
    shutdown: watch::Receiver<bool>,
) -> Result<(), Error> {
    let channel = channel_with_deadline(&config.access, crate::deadline::WORKER_CALL)?;
    let cache = SceneCache::open(&config.cache)?;
    let files = crate::fileset::FileCache::open(
        &config.cache.join("files"),
        config.cache_max_bytes,
        config.max_root_bytes,
        config.path_map.clone(),
    )?;
    let plans = std::sync::Mutex::new(config.slots.clone());
    let shared = Arc::new(Shared {
        plans,
        changed: std::sync::Mutex::new(Vec::new()),
        cache,
        files,
        channel,
        renderer,
        worker_id: RwLock::new(String::new()),
        ttl_ms: AtomicU32::new(30_000),
        inline: std::sync::Mutex::new(InlineBudget::default()),
        renewals: Arc::default(),
        config,
    });
    // Blender starts while the worker registers and waits for its first task.
    let planned = shared.plans.lock().unwrap().clone();
    prepare_slots(&shared.renderer, &planned);
    register(&shared, &shutdown).await?;
    // Runs until every slot has ended, so that results still uploading at
    // a shutdown keep their leases.
    let renewer = {
        let shared = shared.clone();
        let client = pb::work_client::WorkClient::new(shared.channel.clone());
        tokio::spawn(async move {
            let renewals = shared.renewals.clone();
            renew::run(
                renewals,
                client,
                || shared.renew_every(),
                || {
                    crate::deadline::renewal(Duration::from_millis(u64::from(
                        shared.ttl_ms.load(Ordering::Relaxed),
                    )))
                },
            )
            .await
        })
    };
    let mut slots = Vec::new();
    {
        let shared = shared.clone();
        let mut shutdown = shutdown.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(
                shared
                    .config
                    .hardware
                    .interval
                    .max(Duration::from_millis(100)),
            );
            loop {
                tokio::select! {
                    _ = tick.tick() => send_telemetry(&shared).await,
                    _ = shutdown.changed() => return,
                }
            }
        });
    }
    let slot_count = shared.plans.lock().unwrap().len() as u32;
    for slot in 0..slot_count.max(1) {
        let shared = shared.clone();
        let shutdown = shutdown.clone();
        slots.push(tokio::spawn(async move {
            slot_loop(shared, slot, shutdown).await
        }));
    }
    for s in slots {
        let _ = s.await;
    }
    renewer.abort();
    tracing::info!("worker stopped");
    Ok(())
}

async fn register<R: Renderer>(
    shared: &Shared<R>,
    shutdown: &watch::Receiver<bool>,
) -> Result<(), Error> {
    let mut client = pb::work_client::WorkClient::new(shared.channel.clone());
    let previous = shared.worker_id.read().await.clone();
    let plans = shared.plans.lock().unwrap().clone();
    let devices: Vec<&str> = plans.iter().map(|p| p.device.name()).collect();
    let mut devices_seen = devices.clone();
    devices_seen.dedup();
    let info = pb::WorkerInfo {
        name: shared.config.name.clone(),
        slots: plans.len() as u32,
        device: devices_seen.join(","),
        blender_version: shared
            .config
            .runtimes
            .first()
            .map(|o| format!("Blender {}", o.caps.version))
            .unwrap_or_default(),
        cpu_cores: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
        previous_id: previous,
        gpus: gpu_messages(&shared.config.hardware, None),
        slot_info: plans.iter().map(slot_info).collect(),
        tags: shared.config.tags.clone(),
        memory_bytes: memory_bytes(),
        cached_scenes: shared.cache.digests(),
        notes: shared.config.hardware.notes.clone(),
        blender_features: shared
            .config
            .runtimes
            .first()
            .map(|o| o.caps.features.clone())
            .unwrap_or_default(),
        runtimes: shared
            .config
            .runtimes
            .iter()
            .map(|o| pb::BlenderRuntime {
                version: o.caps.version.clone(),
                kind: o.runtime.kind.name().into(),
                path: o.runtime.exe.display().to_string(),
                features: o.caps.features.clone(),
                devices: o.caps.devices.clone(),
            })
            .collect(),
        price_per_hour: shared.config.price_per_hour,
        capacity: shared.config.capacity.clone(),
        untrusted: shared.config.untrusted,
    };
    let mut delay = Duration::from_millis(200);
    loop {
        match client.register(info.clone()).await {
            Ok(r) => {
                let r = r.into_inner();
                tracing::info!(worker = %r.worker_id, coordinator = %shared.config.access.url, "registered");
                *shared.worker_id.write().await = r.worker_id;
                shared
                    .ttl_ms
                    .store(r.lease_ttl_ms.max(300), Ordering::Relaxed);
                *shared.inline.lock().unwrap() = InlineBudget {
                    file_max: r.inline_result_max,
                    left: r.inline_complete_max,
                };
                return Ok(());
            }
            Err(s) if transient(&s) && !*shutdown.borrow() => {
                tracing::warn!(
                    "cannot reach the coordinator at {}: {}; retrying",
                    shared.config.access.url,
                    s.message()
                );
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(3));
            }
            Err(s) => return Err(s.into()),
        }
    }
}

/// One slot's loop: lease a task, render it, upload and report it.
///
/// While a render runs, the slot leases its next task ahead (see
/// [`ahead`]), and it starts that task's render as soon as the current
/// render ends: the current task's frames are uploaded and its result
/// reported meanwhile, by a finisher that the slot awaits before it starts
/// the task after next (so at most one task finishes while one renders,
/// and a slot never renders two at once). The overlap is safe because a
/// finished render shares nothing with the next: its frames sit in its
/// own work folder, its lease is renewed by its own heartbeat until it is
/// reported, and Blender and the GPU are done with it. A task leased ahead
/// is released at once when the slot will not run it: the worker shuts
/// down, the cache has no room, or the slot's GPU turned out unusable.
async fn slot_loop<R: Renderer>(
    shared: Arc<Shared<R>>,
    slot: u32,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut client = pb::work_client::WorkClient::new(shared.channel.clone());
    let mut delay = Duration::from_millis(200);
    let mut next: Option<ahead::Ahead> = None;
    let mut finishing: Option<tokio::task::JoinHandle<()>> = None;
    let carry = Arc::new(carry::Carry::default());
    while !*shutdown.borrow() {
        let task = match next.take() {
            Some(a) => match a.start().await {
                Some(task) => task,
                None => continue,
            },
            None => match lease(&shared, &mut client, slot, &mut shutdown, &mut delay).await {
                Leased::Task(task) => *task,
                Leased::Nothing => continue,
                Leased::Stop => break,
            },
        };
        // Every line of the task, Blender's included, carries the fields
        // the coordinator logs it with.
        let worker = shared.worker_id.read().await.clone();
        let span = tracing::info_span!(
            "task",
            job = task.job_id,
            task = task.task_index,
            lease = %task.lease_id,
            worker = %worker,
        );
        let end = run_task(&shared, task, slot, shutdown.clone(), &carry)
            .instrument(span)
            .await;
        if let Some(before) = finishing.replace(end.finish) {
            let _ = before.await;
        }
        match (end.stops, end.next) {
            (Some(why), Some(a)) => a.release(why).await,
            (_, ahead) => next = ahead,
        }
    }
    if let Some(a) = next {
        a.release("the worker is shutting down").await;
    }
    if let Some(f) = finishing {
        let _ = f.await;
    }
}

/// What a plain lease call brought a slot.
enum Leased {
    /// A task to run.
    Task(Box<pb::TaskAssignment>),
    /// Nothing this time: ask again.
    Nothing,
    /// The worker is shutting down.
    Stop,
}

/// Leases a task for `slot`, waiting for one up to the long-poll's wait.
async fn lease<R: Renderer>(
    shared: &Arc<Shared<R>>,
    client: &mut pb::work_client::WorkClient<Conn>,
    slot: u32,
    shutdown: &mut watch::Receiver<bool>,
    delay: &mut Duration,
) -> Leased {
    // A full cache takes no work it could not hold (the refusal said why,
    // with its numbers); it looks again every two seconds.
    if !shared.cache.has_room() {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(2)) => return Leased::Nothing,
            _ = shutdown.changed() => return Leased::Stop,
        }
    }
    let req = pb::LeaseRequest {
        worker_id: shared.worker_id.read().await.clone(),
        slot,
        cached_scenes: shared.cache.digests(),
        wait_ms: 15_000,
        warm_job: shared.renderer.warm_job(slot),
        ahead: false,
    };
    let wait = Duration::from_millis(u64::from(req.wait_ms));
    let answer = tokio::select! {
        a = client.lease(crate::deadline::request(req, crate::deadline::lease(wait))) => a,
        _ = shutdown.changed() => return Leased::Stop,
    };
    match answer {
        Ok(r) => {
            *delay = Duration::from_millis(200);
            let r = r.into_inner();
            if !r.ended_jobs.is_empty() {
                shared.renderer.end_jobs(&r.ended_jobs);
            }
            r.task
                .map_or(Leased::Nothing, |t| Leased::Task(Box::new(t)))
        }
        Err(s) if s.code() == Code::NotFound => {
            tracing::warn!("the coordinator does not know this worker; registering again");
            if let Err(e) = register(shared, shutdown).await {
                tracing::error!("cannot register again: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Leased::Nothing
        }
        Err(s) => {
            tracing::warn!(slot, "lease failed: {}; retrying in {delay:?}", s.message());
            tokio::time::sleep(*delay).await;
            *delay = (*delay * 2).min(Duration::from_secs(3));
            Leased::Nothing
        }
    }
}

/// How a task's render ended, for its slot.
struct RenderEnd {
    /// The slot's next task, leased ahead while this one rendered.
    next: Option<ahead::Ahead>,
    /// Uploads the frames and reports the result (or the failure): the
    /// task's end, whatever happens.
    finish: tokio::task::JoinHandle<()>,
    /// Why the slot may not run a task leased ahead, when it may not.
    stops: Option<&'static str>,
}

/// Runs one task until its render ends, asking for the slot's next task
/// ahead once the render has started (with the report of the slot's
/// previous task when that is on its way, see [`carry`]); leaves the rest
/// of the task (upload, report) to the finisher it returns, whose report
/// may carry the next ask in turn. Never panics the slot.
async fn run_task<R: Renderer>(
    shared: &Arc<Shared<R>>,
    task: pb::TaskAssignment,
    slot: u32,
    shutdown: watch::Receiver<bool>,
    carry: &Arc<carry::Carry>,
) -> RenderEnd {
    let lease = task.lease_id.clone();
    tracing::info!(%lease, frames = ?task.frames, attempt = task.attempt, "task started");
    let client = pb::work_client::WorkClient::new(shared.channel.clone());
    let progress = Arc::new(Progress::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    let lost = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let heartbeat = {
        let mut renewal = shared
            .renewals
            .hold(&lease, renew::Holding::Running(progress.clone()));
        let lease = lease.clone();
        let stop_tx = stop_tx.clone();
        let lost = lost.clone();
        // Renewed with the worker's other leases until the task has
        // reported (aborting this drops the renewal).
        tokio::spawn(async move {
            let why = renewal.over().await;
            tracing::warn!(%lease, "stopping the task: {why}");
            lost.store(true, Ordering::Relaxed);
            let _ = stop_tx.send(true);
        })
    };
    // A shutdown stops the render after the grace period; the task is then
    // released at once instead of waiting for its lease to expire.
    let watcher = {
        let mut shutdown = shutdown.clone();
        let stop_tx = stop_tx.clone();
        let grace = shared.config.grace;
        tokio::spawn(async move {
            while !*shutdown.borrow() {
                if shutdown.changed().await.is_err() {
                    return;
                }
            }
            if !grace.is_zero() {
                tracing::info!("shutting down: letting the render run for up to {grace:?}");
                tokio::time::sleep(grace).await;
            }
            let _ = stop_tx.send(true);
        })
    };
    // The next task is asked for once the render has started (see
    // [`ahead`]); the answer is awaited, never dropped, so that a granted
    // lease is always held or released.
    let (started, render_started) = tokio::sync::oneshot::channel();
    let asker = {
        let (shared, shutdown, job) = (shared.clone(), shutdown.clone(), task.job_id);
        let carry = carry.clone();
        tokio::spawn(
            async move {
                render_started.await.ok()?;
                ahead::ask(&shared, slot, job, &shutdown, &carry).await
            }
            .in_current_span(),
        )
    };
    let rendered = render(shared, &task, slot, progress.clone(), stop_rx, started).await;
    watcher.abort();
    let next = asker.await.ok().flatten();
    let stops = match &rendered {
        Err(RenderFailure::NoRoom(_)) => Some("this worker has no room for more work"),
        Err(RenderFailure::Failed {
            reason, log_tail, ..
        }) if reason.contains(NO_DEVICE) || log_tail.contains(NO_DEVICE) => {
            stop_gpu_work(shared, slot);
            Some("this slot's GPU cannot render")
        }
        Err(RenderFailure::Stopped) if *shutdown.borrow() => Some("the worker is shutting down"),
        _ => None,
    };
    let finish = {
        let shared = shared.clone();
        // Opened before the slot moves on, so that its next render's ask
        // finds this report on its way; a slot that starts a task it held
        // ahead asks within moments, so the report waits for that.
        let opened = carry.open();
        let patience = if next.is_some() && stops.is_none() {
            carry::ASK_PATIENCE
        } else {
            Duration::ZERO
        };
        tokio::spawn(
            async move {
                let outcome = match &rendered {
                    Ok(frames) => upload_frames(&shared, frames.clone()).await,
                    Err(f) => Err(f.clone()),
                };
                heartbeat.abort();
                let again = outcome.as_ref().ok().cloned();
                let reported = report(&shared, &client, &lease, outcome, &lost, (&opened, patience)).await;
                // The coordinator lost an upload (it restarted before the
                // commit that would have made it durable): once more, from
                // the work folder, which a lost blob leaves in place.
                if let (Reported::BlobLost, Ok(frames), Some(again)) = (reported, &rendered, again) {
                    tracing::info!(%lease, "the coordinator lost an uploaded result; uploading it again");
                    let outcome = upload_again(&shared, frames, &again.0).await.map(|()| again);
                    report(&shared, &client, &lease, outcome, &lost, (&opened, Duration::ZERO)).await;
                }
            }
            .in_current_span(),
        )
    };
    RenderEnd {
        next,
        finish,
        stops,
    }
}

/// What became of a report.
#[derive(Debug, PartialEq, Eq)]
enum Reported {
    /// Answered, whichever way.
    Done,
    /// The coordinator does not hold one of the result's uploaded blobs: it
    /// lost it (a restart before the commit that makes uploads durable).
    BlobLost,
}

/// Reports how the task of `lease` ended, and removes its work folder
/// (unless a blob of the result was lost: it is uploaded again from there).
/// A result's Complete carries the slot's next ask when one waits on
/// `opened` or comes within its patience (see [`carry`]).
async fn report<R: Renderer>(
    shared: &Shared<R>,
    client: &pb::work_client::WorkClient<Conn>,
    lease: &str,
    outcome: Result<Report, RenderFailure>,
    lost: &std::sync::atomic::AtomicBool,
    (opened, patience): (&carry::Opened, Duration),
) -> Reported {
    let lease = lease.to_string();
    match outcome {
        Ok((outputs, stats, warnings)) => {
            let digests: Vec<String> = outputs.iter().map(|o| o.digest.clone()).collect();
            let carried = opened.take(patience).await;
            let req = pb::CompleteRequest {
                lease_id: lease.clone(),
                outputs,
                stats,
                warnings,
                next: carried.as_ref().map(|c| c.request.clone()),
            };
            let answer = retry("reporting a result", RESULT_PATIENCE, || {
                let (mut c, r) = (client.clone(), req.clone());
                async move { c.complete(r).await }
            })
            .await;
            if let Some(c) = carried {
                let next = answer.as_ref().ok().and_then(|r| r.get_ref().next.clone());
                if let Some(task) = c.answer(next).and_then(|n| n.task) {
                    let why = "its slot stopped waiting for it";
                    ahead::release(client, &task.lease_id, why).await;
                }
            }
            match answer {
                Ok(r) if r.get_ref().duplicate => tracing::info!(
                    %lease,
                    "result already recorded: an earlier report of it, or another worker's after this lease expired"
                ),
                Ok(_) => tracing::info!(%lease, "task done"),
                Err(s) if s.code() == Code::InvalidArgument => {
                    // Refused for good: rendering it again would not change
                    // that, so the task fails instead of coming back forever.
                    let what = format!("the coordinator refused the result: {}", s.message());
                    tracing::warn!(%lease, "{what}");
                    let f = failure(Kind::Refused, what, "", String::new());
                    report_failure(client, &lease, f).await;
                }
                Err(s)
                    if s.code() == Code::NotFound
                        && digests.iter().any(|d| s.message().contains(d.as_str())) =>
                {
                    tracing::warn!(%lease, "result not recorded: {}", s.message());
                    return Reported::BlobLost;
                }
                Err(s) if dropped(&s) => {
                    tracing::warn!(%lease, "result not recorded, task dropped: {}", s.message())
                }
                Err(s) => tracing::warn!(%lease, "result not recorded: {}", s.message()),
            }
        }
        Err(RenderFailure::NoRoom(why)) => {
            // Not the task's fault nor the machine's for good: given back
            // uncharged, with the reason kept on the job for `status`; the
            // lease loop takes no work until there is room.
            let req = pb::ReleaseRequest {
                lease_id: lease.clone(),
                preempted: false,
                reason: format!("worker {}: {why}", shared.config.name),
            };
            tracing::warn!(%lease, "giving the task back: {why}");
            match retry("giving a task back", Duration::from_secs(5), || {
                let (mut c, r) = (client.clone(), req.clone());
                async move { c.release(r).await }
            })
            .await
            {
                Ok(_) => tracing::info!(%lease, "task given back for another worker"),
                Err(s) => tracing::warn!(%lease, "cannot give the task back: {}", s.message()),
            }
        }
        Err(RenderFailure::Stopped) if lost.load(Ordering::Relaxed) => {
            tracing::info!(%lease, "task stopped");
        }
        Err(RenderFailure::Stopped) => {
            // Only a shutdown stops a render whose lease still holds: the
            // worker was preempted, scaled in or stopped.
            let req = pb::ReleaseRequest {
                lease_id: lease.clone(),
                preempted: true,
                reason: String::new(),
            };
            match retry("releasing a task", Duration::from_secs(5), || {
                let (mut c, r) = (client.clone(), req.clone());
                async move { c.release(r).await }
            })
            .await
            {
                Ok(_) => tracing::info!(%lease, "task released for another worker"),
                Err(s) => tracing::warn!(%lease, "cannot release the task: {}", s.message()),
            }
        }
        Err(f) => report_failure(client, &lease, f).await,
    }
    let _ = std::fs::remove_dir_all(shared.config.cache.join("work").join(&lease));
    Reported::Done
}

/// Reports a failed task with its scope.
async fn report_failure(client: &pb::work_client::WorkClient<Conn>, lease: &str, f: RenderFailure) {
    let RenderFailure::Failed {
        reason,
        log_tail,
        scope,
    } = f
    else {
        return;
    };
    tracing::warn!(%lease, %scope, "task failed: {reason}");
    let req = pb::FailRequest {
        lease_id: lease.to_string(),
        reason,
        log_tail,
        permanent: scope == Scope::Everywhere,
        scope: scope.to_proto() as i32,
    };
    if let Err(s) = retry("reporting a failure", RESULT_PATIENCE, || {
        let (mut c, r) = (client.clone(), req.clone());
        async move { c.fail(r).await }
    })
    .await
    {
        tracing::warn!(%lease, "failure not recorded: {}", s.message());
    }
}

/// Blender cannot use this slot's GPU: the slot takes CPU work only from now on.
fn stop_gpu_work<R: Renderer>(shared: &Shared<R>, slot: u32) {
    let mut plans = shared.plans.lock().unwrap();
    if let Some(p) = plans
        .iter_mut()
        .find(|p| p.slot == slot && p.device != Device::Cpu)
    {
        tracing::error!(slot, gpu = ?p.gpu, "Blender found no {} device for this slot; it takes no GPU work from now on", p.device.name());
        p.device = Device::Cpu;
        p.vram_bytes = 0;
        shared.changed.lock().unwrap().push(slot);
    }
}

/// What a task reports when done: its outputs, their render statistics and
/// warnings for the job.
type Report = (Vec<pb::FrameOutput>, Vec<pb::FrameStats>, Vec<String>);

/// Fetches the task's scene and files and renders it, saying on `started`
/// when the render is handed to Blender.
async fn render<R: Renderer>(
    shared: &Shared<R>,
    task: &pb::TaskAssignment,
    slot: u32,
    progress: Arc<Progress>,
    stop: watch::Receiver<bool>,
    started: tokio::sync::oneshot::Sender<()>,
) -> Result<Vec<crate::blender::RenderedFrame>, RenderFailure> {
    let transfer_failed = |what: String| failure(Kind::Transfer, what, "", String::new());
    if task.scene_python && !shared.config.allow_scene_python {
        // The coordinator matches the feature; this guards against one that
        // does not (an older one), since auto-run is the admin's decision.
        return Err(failure(
            Kind::NotAllowed,
            "the job runs the scene's stored Python, which this worker does not allow".into(),
            "",
            String::new(),
        ));
    }
    let mut blobs = pb::blobs_client::BlobsClient::new(shared.channel.clone());
    // A job with a file set renders from its root, built from the file cache.
    let root = match task.file_set_digest.as_str() {
        "" => None,
        set => {
            let mut backoff = Backoff::new(FETCH_PATIENCE);
            loop {
                match shared.files.root(set, &mut blobs).await {
                    Ok(g) => break Some(g),
                    Err(e @ Error::NoSpace { needed, .. }) => {
                        // The file cache evicts by its own bound; this
                        // worker waits for the room as for a scene.
                        shared.cache.want_room(needed);
                        tracing::error!("{e}; taking no work until there is room");
                        return Err(RenderFailure::NoRoom(e.to_string()));
                    }
                    Err(Error::Rpc(s)) if transient(&s) => {
                        if *stop.borrow() {
                            return Err(RenderFailure::Stopped);
                        }
                        if !backoff.wait("fetching the job's files", s.message()).await {
                            return Err(transfer_failed(format!(
                                "cannot fetch the job's files for {}s: {}",
                                FETCH_PATIENCE.as_secs(),
                                s.message()
                            )));
                        }
                    }
                    Err(e @ Error::Io { .. }) => {
                        return Err(failure(
                            Kind::WorkerDisk,
                            format!("cannot build the job's files: {e}"),
                            "",
                            String::new(),
                        ))
                    }
                    Err(e) => {
                        return Err(transfer_failed(format!(
                            "cannot fetch the job's files: {e}"
                        )))
                    }
                }
            }
        }
    };
    // Held until the render ends: the scene is not evicted meanwhile.
    let (scene, _scene_hold) = if let Some(g) = &root {
        (g.root.scene.clone(), None)
    } else {
        let mut backoff = Backoff::new(FETCH_PATIENCE);
        loop {
            match shared.cache.scene(&task.scene_digest, &mut blobs).await {
                Ok(hold) => break (hold.path.clone(), Some(hold)),
                Err(e @ Error::NoSpace { .. }) => return Err(RenderFailure::NoRoom(e.to_string())),
                Err(Error::Rpc(s)) if transient(&s) => {
                    if *stop.borrow() {
                        return Err(RenderFailure::Stopped);
                    }
                    if !backoff.wait("fetching the scene", s.message()).await {
                        return Err(transfer_failed(format!(
                            "cannot fetch the scene for {}s: {}",
                            FETCH_PATIENCE.as_secs(),
                            s.message()
                        )));
                    }
                }
                Err(e @ Error::Io { .. }) => {
                    return Err(failure(
                        Kind::WorkerDisk,
                        format!("cannot store the scene: {e}"),
                        "",
                        String::new(),
                    ))
                }
                Err(e) => return Err(transfer_failed(format!("cannot fetch the scene: {e}"))),
            }
        }
    };
    let out_dir = shared
        .cache
        .work_dir(&task.lease_id)
        .map_err(|e| failure(Kind::WorkerDisk, e.to_string(), "", String::new()))?;
    let (device, gpu_uuid) = slot_device(shared, slot, task);
    let req = RenderRequest {
        job: task.job_id,
        slot,
        device,
        gpu_uuid,
        scene,
        root: root.as_ref().map(|g| g.root.clone()),
        frames: task.frames.clone(),
        out_dir,
        blender: Some(task.blender.clone()).filter(|b| !b.is_empty()),
        threads: shared.config.threads,
        max_pixels: (task.max_width > 0 && task.max_height > 0)
            .then_some((task.max_width, task.max_height)),
        tile: task.tile.as_ref().and_then(|t| {
            let r = t.rendered.as_ref()?;
            Some(crate::blender::TileRender {
                size: (r.w, r.h),
                frame: (t.frame_width, t.frame_height),
                border: [
                    t.border_min_x,
                    t.border_max_x,
                    t.border_min_y,
                    t.border_max_y,
                ],
            })
        }),
        scene_python: task.scene_python,
    };
    let _ = started.send(());
    let frames = shared.renderer.render(req, progress, stop).await;
    drop(root);
    if let Err(e) = shared.files.evict() {
        tracing::warn!("cannot trim the file cache: {e}");
    }
    frames
}

/// Uploads again the files of `outputs` (made by [`upload_frames`] from
/// `frames`, in its order) that went by PutBlob and that the coordinator
/// says it does not hold.
async fn upload_again<R: Renderer>(
    shared: &Shared<R>,
    frames: &[crate::blender::RenderedFrame],
    outputs: &[pb::FrameOutput],
) -> Result<(), RenderFailure> {
    let mut blobs = pb::blobs_client::BlobsClient::new(shared.channel.clone());
    let mut paths: Vec<std::path::PathBuf> = Vec::new();
    for f in frames {
        paths.push(f.path.clone());
        paths.extend(f.passes.iter().map(|p| p.path.clone()));
    }
    for (path, o) in paths.iter().zip(outputs) {
        if o.data.is_some() {
            continue;
        }
        transfer::upload_file(&mut blobs, path, &o.digest, o.size)
            .await
            .map_err(|e| {
                let what = format!("cannot upload frame {} again: {e}", o.frame);
                failure(Kind::Transfer, what, "", String::new())
            })?;
    }
    Ok(())
}

/// Settles and uploads the rendered frames and their passes; returns what
/// to report.
async fn upload_frames<R: Renderer>(
    shared: &Shared<R>,
    frames: Vec<crate::blender::RenderedFrame>,
) -> Result<Report, RenderFailure> {
    let transfer_failed = |what: String| failure(Kind::Transfer, what, "", String::new());
    let blobs = pb::blobs_client::BlobsClient::new(shared.channel.clone());
    let mut inline = *shared.inline.lock().unwrap();
    let mut outputs = Vec::with_capacity(frames.len());
    let mut stats = Vec::with_capacity(frames.len());
    let mut warnings: Vec<String> = Vec::new();
    #[cfg(feature = "test-hooks")]
    let corrupt = shared.config.test_corrupt_pixel;
    #[cfg(not(feature = "test-hooks"))]
    let corrupt = false;
    for f in frames {
        for w in &f.warnings {
            if !warnings.contains(w) {
                warnings.push(w.clone());
            }
        }
        stats.push(stamps::settle(&f.path, f.frame, corrupt).await);
        for p in &f.passes {
            stamps::settle(&p.path, f.frame, false).await;
        }
        let output = upload(&blobs, &f.path, f.frame, &mut inline)
            .await
            .map_err(|e| transfer_failed(format!("cannot upload frame {}: {e}", f.frame)))?;
        outputs.push(pb::FrameOutput {
            ext: f.ext,
            ..output
        });
        for p in f.passes {
            let output = upload(&blobs, &p.path, f.frame, &mut inline)
                .await
                .map_err(|e| {
                    transfer_failed(format!(
                        "cannot upload {} of frame {}: {e}",
                        p.name, f.frame
                    ))
                })?;
            outputs.push(pb::FrameOutput {
                ext: crate::passes::extension(&p.name),
                pass: p.name,
                ..output
            });
        }
    }
    Ok((outputs, stats, warnings))
}

/// How many result bytes may still travel inside one Complete: what the
/// coordinator advertised at registration (nothing for an older one).
#[derive(Debug, Clone, Copy, Default)]
struct InlineBudget {
    /// The largest file sent inline (0: none).
    file_max: u64,
    /// Bytes the Complete may still carry inline.
    left: u64,
}

impl InlineBudget {
    /// The most bytes the next file may have to go inline, if any may.
    fn keep(&self) -> Option<u64> {
        (self.file_max > 0).then(|| self.file_max.min(self.left))
    }
}

/// Hashes one file of `frame` and, unless it fits what `inline` still
/// allows (then its bytes go in the output, for Complete to carry), uploads
/// it; the output lacks its extension and pass.
async fn upload(
    blobs: &pb::blobs_client::BlobsClient<Conn>,
    path: &std::path::Path,
    frame: u32,
    inline: &mut InlineBudget,
) -> Result<pb::FrameOutput, String> {
    let hashed = transfer::read_small(path, inline.keep())
        .await
        .map_err(|e| e.to_string())?;
    let (digest, size, data) = (hashed.digest, hashed.size, hashed.bytes);
    if data.is_some() {
        inline.left -= size;
    } else {
        upload_result(blobs, path, &digest, size).await?;
    }
    Ok(pb::FrameOutput {
        frame,
        digest,
        ext: String::new(),
        size,
        pass: String::new(),
        data,
    })
}

/// Uploads a result file with PutBlob (unless the coordinator has it),
/// retrying while the coordinator is unreachable.
async fn upload_result(
    blobs: &pb::blobs_client::BlobsClient<Conn>,
    path: &std::path::Path,
    digest: &str,
    size: u64,
) -> Result<(), String> {
    retry("uploading a frame", RESULT_PATIENCE, || {
        let mut blobs = blobs.clone();
        let (path, digest) = (path.to_path_buf(), digest.to_string());
        async move {
            transfer::upload_file(&mut blobs, &path, &digest, size)
                .await
                .map_err(|e| match e {
                    Error::Rpc(s) => s,
                    other => tonic::Status::internal(other.to_string()),
                })
        }
    })
    .await
    .map(drop)
    .map_err(|s| s.message().to_string())
}

/// How a worker runs Blender.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenderMode {
    /// A fresh Blender process per task (run and checked like a session).
    FreshProcess,
    /// Warm sessions, one per job and slot, closed after `idle` without work.
    Sessions {
        /// Idle time after which a session closes.
        idle: Duration,
    },
}

/// The device `task` renders on in `slot`, and the GPU the slot is pinned to.
fn slot_device<R: Renderer>(
    shared: &Shared<R>,
    slot: u32,
    task: &pb::TaskAssignment,
) -> (Device, Option<String>) {
    let plan = shared
        .plans
        .lock()
        .unwrap()
        .iter()
        .find(|p| p.slot == slot)
        .cloned();
    let asked = Device::from_name(&task.device);
    // A declared GPU (tests) renders on the CPU unless the device was forced.
    let device = match &plan {
        Some(p) if p.declared => Device::Cpu,
        _ => asked,
    };
    (device, plan.and_then(|p| p.uuid))
}

/// Lets `renderer` start what each planned slot will need (a spare
/// Blender) before its first task; a renderer that has it already does
/// nothing.
fn prepare_slots<R: Renderer>(renderer: &R, planned: &[SlotPlan]) {
    for p in planned {
        let device = if p.declared { Device::Cpu } else { p.device };
        renderer.prepare(p.slot, device, p.uuid.as_deref());
    }
    if planned.is_empty() {
        renderer.prepare(0, Device::Cpu, None);
    }
}

/// Runs a worker that renders with its Blender runtimes in `mode`. The
/// worker makes itself non-dumpable first, so Blender cannot read its memory.
pub async fn run_blender(
    config: WorkerConfig,
    mode: RenderMode,
    shutdown: watch::Receiver<bool>,
) -> Result<(), Error> {
    let renderer = start_blender(&config, mode)?;
    run(config, renderer, shutdown).await
}

/// The Blender sessions of a worker configured as `config` says, each
/// planned slot's spare Blender starting at once (see
/// [`SessionRenderer`](crate::session::SessionRenderer)); [`run`] then runs
/// the worker with them, its access to the coordinator set by then.
/// `tessera render` starts them before its own coordinator and while it
/// reads the scene, so that Blender boots meanwhile. The process makes
/// itself non-dumpable first, so Blender cannot read its memory.
pub fn start_blender(
    config: &WorkerConfig,
    mode: RenderMode,
) -> Result<crate::session::SessionRenderer, Error> {
    let (idle, reuse) = match mode {
        RenderMode::FreshProcess => (Duration::from_secs(60), false),
        RenderMode::Sessions { idle } => (idle, true),
    };
    if let Err(e) = crate::isolation::hide_worker_memory() {
        tracing::warn!("cannot hide the worker's memory from Blender: {e}");
    }
    let renderer = crate::session::SessionRenderer::new(crate::session::SessionConfig {
        runtimes: config.runtimes.clone(),
        dir: config.cache.join("blender"),
        idle,
        reuse,
        spare: config.spare_blender,
        spare_scene_python: config.spare_scene_python,
        #[cfg(feature = "test-hooks")]
        fail_first_render: config.fail_first_render,
    })?;
    prepare_slots(&renderer, &config.slots);
    Ok(renderer)
}

mod ahead;
mod carry;
mod renew;
mod report;
mod stamps;
use report::{gpu_messages, memory_bytes, send_telemetry, slot_info};
