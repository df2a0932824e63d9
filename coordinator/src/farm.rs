//! The coordinator's domain layer: jobs, tasks, leases and workers, with
//! every change stored before it is acknowledged. This file holds the
//! public types and opening a farm; the submodules hold one idea each:
//!
//! - `state`: the state in memory and its indexes (ready queues, counts,
//!   held leases, deadlines, blob references, the stitch queue);
//! - `txn`: the unit of work and group commit;
//! - `submit`: accepting jobs;
//! - `scheduler`: which task a slot gets (priority, fair share, warm
//!   sessions, requirements, blocked workers);
//! - `leases`: leasing with long-poll, renewals, releases and expiry;
//! - `results`: completions and failures and what they do to a job;
//! - `jobs` and `views`: commands on jobs and what users see of them,
//!   archive and delete;
//! - `workers`: the registry, telemetry and health;
//! - `stitching`: the stitch queue; `gc`: blob collection;
//! - `previews`: the preview queue and preview outcomes;
//! - `users` and `access`: tokens, and who may do what; `stats`: counters.
//!
//! Lease renewals are not written (they would cost a disk flush each);
//! instead, a restart gives every lease a fresh TTL so its holder has time
//! to reconnect and renew it.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::sync::Notify;

use crate::auth::{self, Identity, Role, UserRecord};
use crate::blobs::BlobStore;
use crate::clock::Clock;
use crate::digest::Digest;
use crate::error::Error;
use crate::model::frames::FrameSet;
use crate::model::hardware::{Device, Gpu, Health, HealthLimits, Requirements, SlotCap};
use crate::model::job::{Job, JobId, JobState};
use crate::model::task::{
    Completion, FailOutcome, FailureScope, FrameOutput, LeaseId, Task, TaskState, TileTask,
};
use crate::model::tiles::{self, Grid, Rect};
use crate::model::worker::{WorkerId, WorkerRecord};
use crate::store::{ArchivedSummary, MetaStore};

pub use lock::lock_held;
use lock::Locked;
use scheduler::{capable, pick, Asker};
use state::State;
use txn::Owned;

mod access;
mod accounting;
mod autoscale;
mod chunking;
pub mod dry_run;
mod gc;
mod jobs;
mod leases;
mod lock;
mod pipeline;
pub mod preview_runner;
mod previews;
pub mod refs;
mod results;
mod schedule;
mod scheduler;
mod state;
mod stats;
mod stitching;
mod submit;
#[cfg(test)]
mod trust_tests;
mod txn;
mod users;
mod verification;
#[cfg(test)]
mod verification_tests;
mod views;
mod workers;

pub use crate::model::task::TaskCounts;
pub use autoscale::DesiredSlots;
pub use pipeline::JobUpdate;
pub use previews::PreviewWork;
pub use results::PendingResult;
pub use stats::{Latency, Stats, DURATION_BUCKETS, LATENCY_BUCKETS};
pub use txn::{Carried, Ticket};
pub use views::{FrameTiles, JobSnapshot, Page};

/// Limits and timings of a coordinator.
#[derive(Debug, Clone)]
pub struct Config {
    /// How long a lease lives without renewal.
    pub lease_ttl_ms: u64,
    /// Most frames in one job.
    pub max_frames: u64,
    /// Default failures a task may have before its job fails.
    pub max_attempts: u32,
    /// Largest upload accepted, in bytes.
    pub max_upload: u64,
    /// Most tiles in one frame.
    pub max_tiles: u32,
    /// When a worker's GPUs drain it.
    pub health: HealthLimits,
    /// Failed attempts after which a worker is blocked for a job.
    pub block_after: u32,
    /// Whether requests need a token: always on in `tessera` (its embedded
    /// `render` farm included); off only for a library user that embeds a
    /// farm no other process can reach.
    pub auth: bool,
    /// Largest gRPC message accepted, in bytes (blobs travel in 1 MiB chunks).
    pub max_message: usize,
    /// How long a blob nothing references is kept after anyone last touched
    /// it, in ms, before it is deleted (a result naming it may be on its way).
    pub blob_grace_ms: u64,
    /// The largest frame (and so tile) accepted, checked at submit and
    /// before stitching.
    pub max_pixels: crate::imaging::limits::PixelLimit,
    /// Most workers of one token online at once.
    pub max_workers_per_token: u32,
    /// Most slots (and GPUs) one worker may offer.
    pub max_slots: u32,
    /// Finished jobs are archived this long after they end (`--keep-days`);
    /// None keeps them live.
    pub keep_ms: Option<u64>,
    /// How soon the queued work should be done, for the autoscaling signal
    /// `tessera_desired_slots` (`--target-drain-minutes`).
    pub target_drain_ms: u64,
    /// The fraction of an untrusted worker's tasks verified (`--verify-untrusted`).
    pub verify_untrusted: f64,
    /// Seed of the choice of verified tasks.
    pub verify_seed: u64,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            lease_ttl_ms: 30_000,
            max_frames: 1_000_000,
            max_attempts: 3,
            max_upload: 8 << 30,
            max_tiles: 256,
            health: HealthLimits::default(),
            block_after: 3,
            auth: true,
            max_message: 4 << 20,
            blob_grace_ms: 60_000,
            max_pixels: crate::imaging::limits::PixelLimit::default(),
            max_workers_per_token: 1024,
            max_slots: 256,
            keep_ms: None,
            target_drain_ms: 30 * 60_000,
            verify_untrusted: crate::model::verify::DEFAULT_VERIFY_UNTRUSTED,
            verify_seed: crate::model::verify::DEFAULT_SEED,
        }
    }
}

/// A job as submitted.
#[derive(Debug, Clone)]
pub struct Submission {
    /// The scene blob, uploaded beforehand.
    pub scene: Digest,
    /// The scene's file name, for display.
    pub scene_name: String,
    /// Frame set syntax.
    pub frames: String,
    /// Frames per task (0 = 1).
    pub chunk: u32,
    /// Higher runs first.
    pub priority: i32,
    /// Failures a task may have (0 = the coordinator's default).
    pub max_attempts: u32,
    /// Tile grid syntax (`CxR`); empty means whole frames.
    pub tiles: String,
    /// Overscan margin of tiles (None = 16 px).
    pub overscan: Option<u32>,
    /// What the submitter read from the scene.
    pub scene_info: Option<SceneInfo>,
    /// Required device: any, cpu, cuda or optix.
    pub device: String,
    /// Least GPU memory, GiB.
    pub min_vram_gb: f64,
    /// Tags a worker must carry.
    pub tags: Vec<String>,
    /// Who submits it.
    pub owner: String,
    /// The job's file set blob (uploaded beforehand, like its entries).
    pub file_set: Option<Digest>,
    /// Blender features the scene needs.
    pub features: Vec<String>,
    /// The Blender versions that may render it (`--blender 4.5`, `>=4.2`);
    /// empty: the version that saved the scene or newer, within its major.
    pub blender: String,
    /// Jobs that must be done before it starts (`--after`).
    pub after: Vec<u64>,
    /// The most it may cost (`--max-cost`).
    pub max_cost: Option<f64>,
    /// Which worker capacity it accepts (`--capacity`).
    pub capacity: crate::model::usage::CapacityPref,
    /// Make a preview video when the job is done (`submit --preview`).
    pub preview: bool,
    /// The fraction of tasks rendered twice and compared (0..1).
    pub verify: f64,
}

/// Facts about a scene read with Blender by the submitter.
#[derive(Debug, Clone, PartialEq)]
pub struct SceneInfo {
    /// Output width in pixels, percentage applied.
    pub width: u32,
    /// Output height in pixels.
    pub height: u32,
    /// Blender's file format name (`PNG`, `OPEN_EXR`, ...).
    pub file_format: String,
    /// Frames per second (fps / fps_base); 0 when not read.
    pub fps: f64,
}

/// Overscan used when a submission names none.
pub const DEFAULT_OVERSCAN: u32 = 16;

/// A tile to render, as sent to a worker.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AssignedTile {
    /// The region to render (tile plus overscan).
    pub rendered: Rect,
    /// The frame's size.
    pub frame: (u32, u32),
    /// Blender's border fractions for `rendered`: min x, max x, min y, max y.
    pub border: (f64, f64, f64, f64),
}

/// One lease's renewal, as a worker asks it (see [`Farm::renew_all`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Renewal {
    /// The lease.
    pub lease: LeaseId,
    /// Frames of its task done so far.
    pub frames_done: u32,
    /// Samples of the frame (or tile) rendering now: done, of.
    pub samples: (u32, u32),
    /// Its task was leased ahead and waits for its slot: its slot-time
    /// starts from the last such renewal (see [`Farm::lease_ahead`]).
    pub waiting: bool,
}

/// What a lease request asks for: a Lease call's, or the slot's next
/// lease asked for with its result (see [`Farm::complete_begin_asking`]).
#[derive(Debug, Clone)]
pub struct NextAsk {
    /// The worker, whose token reported the result.
    pub worker: WorkerId,
    /// Scenes it holds in its cache.
    pub cached: HashSet<Digest>,
    /// The job its slot holds warm.
    pub warm: Option<JobId>,
    /// The slot.
    pub slot: u32,
    /// For a slot still rendering (see [`Farm::lease_ahead`]).
    pub ahead: bool,
}

/// A lease granted with a result: the task (once its ticket says it is
/// stored), and jobs that ended, as a lease call answers.
#[must_use = "a lease holds once its ticket says it is stored"]
pub struct NextLease {
    /// The task leased, if one was ready, and its ticket.
    pub task: Option<(Assignment, Ticket)>,
    /// Jobs that have ended, whose warm sessions the worker should close.
    pub ended: Vec<JobId>,
    /// When the lease was computed, for [`Farm::lease_served`] once stored.
    pub started: std::time::Instant,
}

/// The answer to a lease call.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseOutcome {
    /// The task leased, if one was ready.
    pub task: Option<Assignment>,
    /// Jobs that have ended, whose warm sessions the worker should close.
    pub ended: Vec<JobId>,
}

/// What a worker is told to do.
#[derive(Debug, Clone, PartialEq)]
pub struct Assignment {
    /// The grant.
    pub lease: LeaseId,
    /// The scene blob.
    pub scene: Digest,
    /// The scene's file name.
    pub scene_name: String,
    /// Frames to render.
    pub frames: Vec<u32>,
    /// 1 for the first attempt.
    pub attempt: u32,
    /// Lease TTL.
    pub ttl_ms: u64,
    /// For a tile task: the region.
    pub tile: Option<AssignedTile>,
    /// The Cycles device to render with.
    pub device: Device,
    /// The job's file set blob, when it has one.
    pub file_set: Option<Digest>,
    /// The version of the worker's Blender to render it with.
    pub blender: Option<crate::model::runtime::Version>,
    /// The coordinator's `--max-pixels`, for the worker to check the
    /// scene's real output size against.
    pub max_pixels: crate::imaging::limits::PixelLimit,
    /// Run the scene's stored Python (the job's `scene-python` feature).
    pub scene_python: bool,
}

/// What a worker says about itself when it registers.
#[derive(Debug, Clone, Default)]
pub struct Registration {
    /// Display name.
    pub name: String,
    /// Render slots.
    pub slots: u32,
    /// Device kind.
    pub device: String,
    /// Blender version line.
    pub blender_version: String,
    /// CPU cores.
    pub cpu_cores: u32,
    /// The id it had before, if it is coming back.
    pub previous: Option<WorkerId>,
    /// Its GPUs.
    pub gpus: Vec<Gpu>,
    /// What each slot renders with.
    pub slot_caps: Vec<SlotCap>,
    /// Its tags.
    pub tags: Vec<String>,
    /// System memory, bytes.
    pub memory_bytes: u64,
    /// What its hardware probe noted.
    pub notes: Vec<String>,
    /// What its Blender offers.
    pub features: Vec<String>,
    /// Every Blender it offers (empty: one, described by `blender_version`
    /// and `features`).
    pub runtimes: Vec<crate::model::runtime::Runtime>,
    /// The user whose token registers it (set from the token, never from
    /// the message).
    pub owner: String,
    /// What the whole machine costs per hour (`--price-per-hour`).
    pub price_per_hour: f64,
    /// How its capacity is bought (`--capacity`).
    pub capacity: crate::model::usage::Capacity,
    /// Not the operator's machine (`worker --untrusted`).
    pub untrusted: bool,
}

/// A worker as shown to users.
#[derive(Debug, Clone)]
pub struct WorkerSnapshot {
    /// The record.
    pub record: WorkerRecord,
    /// Whether it has been in touch within two lease TTLs.
    pub online: bool,
    /// Tasks it holds now.
    pub running: u32,
    /// Which tasks those are: (job, task index).
    pub in_hand: Vec<(JobId, u32)>,
    /// Why it takes no new work, while draining.
    pub drain: Option<String>,
}

/// A change someone may be watching for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FarmEvent {
    /// A job or one of its tasks changed.
    Job(JobId),
    /// A job ended (done, failed or canceled): its watchers hear at once.
    JobEnded(JobId),
    /// A worker registered, reported telemetry or changed its health.
    Worker(WorkerId),
}

/// The coordinator's domain service.
pub struct Farm {
    state: Arc<Mutex<State>>,
    stats: Arc<Mutex<Stats>>,
    /// Token hashes and who holds them: authentication takes no state lock.
    tokens: RwLock<HashMap<String, Identity>>,
    store: Arc<dyn MetaStore>,
    blobs: Arc<dyn BlobStore>,
    clock: Arc<dyn Clock>,
    config: Config,
    /// Blob collection passes, seen from outside the lock (see `gc`).
    passes: gc::Passes,
    /// Results' blobs made durable in groups before their change is queued.
    result_sync: txn::ResultSync,
    /// Set when this farm stops serving (its coordinator stepped down):
    /// the words parked and later calls are refused with.
    stopped: std::sync::OnceLock<String>,
}

impl Farm {
    /// Opens the farm on `store`, recovering everything it holds.
    pub fn open(
        store: Arc<dyn MetaStore>,
        blobs: Arc<dyn BlobStore>,
        clock: Arc<dyn Clock>,
        config: Config,
    ) -> Result<Self, Error> {
        let now = clock.now_ms();
        let started = std::time::Instant::now();
        let store = lock::checked_store(store);
        let blobs = lock::checked_blobs(blobs);
        let mut state = State::recover(&*store, &*blobs, now, config.lease_ttl_ms, HashMap::new())?;
        state.events = Some(tokio::sync::broadcast::channel(1024).0);
        let open = state.jobs.values().filter(|j| !j.state.is_final()).count();
        tracing::info!(
            jobs = state.jobs.len(),
            open,
            archived = state.archived.len(),
            workers = state.workers.len(),
            ms = started.elapsed().as_millis() as u64,
            "recovered state"
        );
        let tokens = state
            .users
            .values()
            .map(|u| {
                (
                    u.token_hash.clone(),
                    Identity {
                        name: u.name.clone(),
                        role: u.role,
                    },
                )
            })
            .collect();
        let state = Arc::new(Mutex::new(state));
        let stats = Arc::new(Mutex::new(Stats::default()));
        let commits = txn::Committer {
            state: Arc::downgrade(&state),
            store: store.clone(),
            blobs: blobs.clone(),
            clock: clock.clone(),
            lease_ttl_ms: config.lease_ttl_ms,
            stats: stats.clone(),
        }
        .start();
        state.lock().unwrap_or_else(|e| e.into_inner()).commits = Some(commits);
        let result_sync = txn::ResultSync::start(blobs.clone(), stats.clone());
        Ok(Self {
            state,
            stats,
            tokens: RwLock::new(tokens),
            store,
            blobs,
            passes: gc::Passes::default(),
            result_sync,
            clock,
            config,
            stopped: std::sync::OnceLock::new(),
        })
    }

    /// Stops serving as the active coordinator's farm (it stepped down,
    /// see [`crate::ha`]): parked lease calls are refused with `why` at
    /// once, and job event streams end (clients then reopen them elsewhere).
    pub fn stop_serving(&self, why: String) {
        let _ = self.stopped.set(why);
        let mut st = self.lock();
        st.schedule.wake_all();
        // Dropping the sender ends every stream that listens to it.
        st.events = Some(tokio::sync::broadcast::channel(1024).0);
    }

    /// Why this farm stopped serving, once it did.
    pub(crate) fn stopped(&self) -> Option<&str> {
        self.stopped.get().map(String::as_str)
    }

    /// Whether the metadata store answers, for a store on another machine.
    pub fn store_health(&self) -> Option<crate::health::StoreHealth> {
        self.store.health()
    }

    /// Whether the blob store answers, for a store on another machine.
    pub fn blobs_health(&self) -> Option<crate::health::StoreHealth> {
        self.blobs.health()
    }

    /// What the farm depends on that does not answer now, one line each
    /// (`blobs: S3 … unreachable since … (why)`); empty when all answer.
    pub fn outages(&self) -> Vec<String> {
        [self.store_health(), self.blobs_health()]
            .into_iter()
            .flatten()
            .filter(|h| !h.up())
            .map(|h| h.line())
            .collect()
    }

    /// Changes from now on. A receiver that falls behind gets
    /// `Lagged` and should re-read what it shows.
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<FarmEvent> {
        self.lock()
            .events
            .as_ref()
            .expect("a farm always has an event channel")
            .subscribe()
    }

    /// Counters since start, for metrics.
    pub fn stats(&self) -> Stats {
        self.stats.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The coordinator's limits.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Stores the files a result carries (each checked against its digest;
    /// none is stored when one is refused), then waits until they and every
    /// blob stored before the call (a result's uploads) are durable, sharing
    /// one sync with every result that asks meanwhile. Call it before
    /// reporting a result: its change then commits without waiting for blob
    /// syncs, and neither do the leases that share its commit.
    pub async fn results_durable(&self, carried: Vec<Carried>) -> Result<(), Error> {
        if !carried.is_empty() {
            // A result naming them follows at once: keep them from the
            // collector, and wait out a pass deleting one of them, as
            // PutBlob does.
            self.touch_blobs(&Carried::digests(&carried)).await;
        }
        match self.result_sync.request(carried) {
            Ok(ticket) => ticket.stored().await,
            Err(carried) if carried.is_empty() => Ok(()),
            // Durable on write (S3): stored off the runtime, then done.
            Err(carried) => {
                let blobs = self.blobs.clone();
                tokio::task::spawn_blocking(move || txn::store_carried(&*blobs, &carried))
                    .await
                    .map_err(|e| Error::Internal(format!("storing a result's files: {e}")))?
            }
        }
    }

    /// The blob store.
    pub fn blobs(&self) -> &Arc<dyn BlobStore> {
        &self.blobs
    }

    /// The farm's lock: the only way into its state. Nothing does I/O while
    /// holding it (see ARCHITECTURE.md); debug builds check every blob-store
    /// call against [`lock_held`].
    fn lock(&self) -> Locked<'_> {
        Locked::new(match self.state.lock() {
            Ok(st) => st,
            Err(poisoned) => {
                // A panic while holding the lock may have left a change half
                // made in memory (reference counts, indexes); the store is
                // the truth, so memory is rebuilt from it before anyone
                // reads it, as after a failed write.
                let mut st = poisoned.into_inner();
                self.state.clear_poison();
                self.rebuild_after_panic(&mut st);
                st
            }
        })
    }

    fn count_stat(&self, f: impl FnOnce(&mut Stats)) {
        f(&mut self.stats.lock().unwrap_or_else(|e| e.into_inner()));
    }
}

#[cfg(test)]
mod pipeline_tests;
#[cfg(test)]
mod runtime_tests;
#[cfg(test)]
mod scale_tests;
#[cfg(test)]
mod tests;
