//! The coordinator's domain layer: jobs, tasks, leases and workers in one place,
//! with every change written to the [`MetaStore`] before it is acknowledged.
//! This file holds the state, its invariants (blob references, the stitch
//! queue) and submit; `jobs`, `leases`, `scheduler`, `stitching`, `users`,
//! `workers` and `access` add the rest of [`Farm`]'s methods.
//!
//! State is held in memory behind one mutex and written through to the store;
//! at start-up it is read back whole. Lease renewals are not written (they
//! would cost a disk flush each); instead, a restart gives every lease a fresh
//! TTL so its holder has time to reconnect and renew it.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::auth::{self, Identity, Role, UserRecord};
use crate::blob_store::BlobStore;
use crate::clock::Clock;
use crate::digest::Digest;
use crate::error::Error;
use crate::frames::FrameSet;
use crate::hardware::{Device, Gpu, Health, HealthLimits, Requirements, SlotCap};
use crate::job::{Job, JobId, JobState};
use crate::refs::{self, BlobRefs};
use crate::store::{MetaStore, Record};
use crate::task::{
    Completion, FailOutcome, FailureScope, FrameOutput, LeaseId, Task, TaskState, TileTask,
};
use crate::tiles::{self, Grid, Rect};
use crate::worker::{WorkerId, WorkerRecord};

use scheduler::{capable, pick, Asker};

mod access;
pub mod dry_run;
mod jobs;
mod leases;
mod scheduler;
mod stitching;
#[cfg(test)]
mod trust_tests;
mod users;
mod views;
mod workers;

pub use views::{FrameTiles, JobSnapshot, Page, TaskCounts};

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
    pub max_pixels: crate::limits::PixelLimit,
    /// Most workers of one token online at once.
    pub max_workers_per_token: u32,
    /// Most slots (and GPUs) one worker may offer.
    pub max_slots: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            lease_ttl_ms: 30_000,
            max_frames: 100_000,
            max_attempts: 3,
            max_upload: 8 << 30,
            max_tiles: 256,
            health: HealthLimits::default(),
            block_after: 3,
            auth: true,
            max_message: 4 << 20,
            blob_grace_ms: 60_000,
            max_pixels: crate::limits::PixelLimit::default(),
            max_workers_per_token: 1024,
            max_slots: 256,
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
}

/// Facts about a scene read with Blender by the submitter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SceneInfo {
    /// Output width in pixels, percentage applied.
    pub width: u32,
    /// Output height in pixels.
    pub height: u32,
    /// Blender's file format name (`PNG`, `OPEN_EXR`, ...).
    pub file_format: String,
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
    /// The user whose token registers it (set from the token, never from
    /// the message).
    pub owner: String,
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
    /// Why it takes no new work, while draining.
    pub drain: Option<String>,
}

/// Upper bounds of the task-duration histogram, in seconds.
pub const DURATION_BUCKETS: [f64; 12] = [
    0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
];

/// Counters kept since the coordinator started (for metrics).
#[derive(Debug, Clone, Default)]
pub struct Stats {
    /// Completed tasks per duration bucket (cumulative counts are derived).
    pub duration_buckets: [u64; DURATION_BUCKETS.len()],
    /// Sum of task durations, seconds.
    pub duration_sum: f64,
    /// Completed tasks timed.
    pub duration_count: u64,
    /// Leases granted.
    pub leases_granted: u64,
    /// Leases that expired.
    pub leases_expired: u64,
    /// Failed attempts reported by workers.
    pub attempts_failed: u64,
}

#[derive(Default)]
struct State {
    jobs: BTreeMap<JobId, Job>,
    tasks: BTreeMap<JobId, Vec<Task>>,
    workers: BTreeMap<WorkerId, WorkerRecord>,
    next_job: u64,
    next_worker: u64,
    health: std::collections::HashMap<WorkerId, Health>,
    users: BTreeMap<String, UserRecord>,
    /// How many records reference each blob (derived from the records).
    refs: BlobRefs,
    /// Blobs that no record references any more, and since when (ms).
    garbage: HashMap<Digest, u64>,
    /// When a client or worker last uploaded or asked about a blob (ms).
    touched: HashMap<Digest, u64>,
    /// Frames of open tiled jobs whose tiles are all done but that are not
    /// stitched yet: the stitch queue (derived from the records, so a crash
    /// loses nothing).
    to_stitch: BTreeSet<(JobId, u32)>,
    /// The entries of each job's file set, by file-set blob.
    file_sets: HashMap<Digest, Arc<[Digest]>>,
    /// Stitch attempts of a frame that could not read its tiles, and when
    /// the next may run (ms).
    stitch_errors: HashMap<(JobId, u32), (u32, u64)>,
    /// Who possesses which blob, and who holds which grant (see `access`).
    access: access::AccessState,
    /// Changes, for watchers (`WatchJob`, the dashboard's event stream).
    events: Option<tokio::sync::broadcast::Sender<FarmEvent>>,
}

/// A change someone may be watching for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FarmEvent {
    /// A job or one of its tasks changed.
    Job(JobId),
    /// A worker registered, reported telemetry or changed its health.
    Worker(WorkerId),
}

impl State {
    /// Tells watchers about a change (dropped when nobody listens).
    fn announce(&self, event: FarmEvent) {
        if let Some(tx) = &self.events {
            let _ = tx.send(event);
        }
    }

    /// Installs a job's record and its changed tasks (written already),
    /// keeping blob references counted and the stitch queue current.
    fn install(&mut self, job: Job, changed: Vec<Task>, now: u64) {
        let id = job.id;
        let old = match self.jobs.get(&id) {
            Some(j) => refs::all_refs(
                j,
                self.files_of(j),
                self.tasks.get(&id).map_or(&[], |t| t.as_slice()),
            ),
            None => Vec::new(),
        };
        let list = self.tasks.entry(id).or_default();
        for t in changed {
            let i = t.index as usize;
            match list.get_mut(i) {
                Some(slot) => *slot = t,
                None => list.push(t),
            }
        }
        self.jobs.insert(id, job);
        let job = &self.jobs[&id];
        for d in refs::all_refs(job, self.files_of(job), &self.tasks[&id]) {
            self.refs.add(d);
        }
        for d in old {
            if self.refs.release(&d) {
                self.garbage.insert(d, now);
            }
        }
        self.queue_ready_frames(id);
        self.announce(FarmEvent::Job(id));
    }

    /// The entries of `job`'s file set (none without one).
    fn files_of(&self, job: &Job) -> &[Digest] {
        job.file_set
            .and_then(|d| self.file_sets.get(&d))
            .map_or(&[], |f| f)
    }

    /// Puts the frames of job `id` whose tiles are all done, and that are not
    /// stitched, in the stitch queue (and takes out those that are not).
    fn queue_ready_frames(&mut self, id: JobId) {
        let job = &self.jobs[&id];
        if !job.is_tiled() {
            return;
        }
        let mut frames: BTreeMap<u32, bool> = BTreeMap::new();
        for t in &self.tasks[&id] {
            *frames.entry(t.frames[0]).or_insert(true) &= t.is_done();
        }
        let open = !job.state.is_final();
        for (frame, all_done) in frames {
            let stitched = job.stitched.iter().any(|o| o.frame == frame);
            if open && all_done && !stitched {
                self.to_stitch.insert((id, frame));
            } else {
                self.to_stitch.remove(&(id, frame));
            }
        }
    }
}

/// The coordinator's domain service.
pub struct Farm {
    state: Mutex<State>,
    stats: Mutex<Stats>,
    store: Arc<dyn MetaStore>,
    blobs: Arc<dyn BlobStore>,
    clock: Arc<dyn Clock>,
    config: Config,
    queued: Notify,
}

impl Farm {
    /// Opens the farm on `store`, recovering everything it holds.
    pub fn open(
        store: Arc<dyn MetaStore>,
        blobs: Arc<dyn BlobStore>,
        clock: Arc<dyn Clock>,
        config: Config,
    ) -> Result<Self, Error> {
        let snap = store.load()?;
        let now = clock.now_ms();
        let mut state = State {
            next_job: snap.jobs.keys().last().map_or(1, |id| id.0 + 1),
            next_worker: snap.workers.len() as u64 + 1,
            jobs: snap.jobs,
            tasks: snap.tasks,
            workers: snap.workers,
            health: Default::default(),
            users: snap.users,
            access: access::AccessState::from_grants(snap.grants),
            events: Some(tokio::sync::broadcast::channel(1024).0),
            ..Default::default()
        };
        for task in state.tasks.values_mut().flatten() {
            if let TaskState::Leased { expires_ms, .. } = &mut task.state {
                *expires_ms = (*expires_ms).max(now + config.lease_ttl_ms);
            }
        }
        let ids: Vec<JobId> = state.jobs.keys().copied().collect();
        for id in ids {
            if let Some(d) = state.jobs[&id].file_set {
                if let std::collections::hash_map::Entry::Vacant(e) = state.file_sets.entry(d) {
                    match blobs
                        .read(&d)
                        .and_then(|b| crate::fileset::check(&b, &state.jobs[&id].scene))
                    {
                        Ok((_, info)) => {
                            e.insert(info.blobs.into());
                        }
                        Err(err) => {
                            tracing::error!(job = %id, "cannot read the job's file set {d}: {err}")
                        }
                    }
                }
            }
            let files = state.jobs[&id]
                .file_set
                .and_then(|d| state.file_sets.get(&d).cloned())
                .unwrap_or_else(|| Arc::from(Vec::new()));
            let tasks = state.tasks.entry(id).or_default();
            for d in refs::all_refs(&state.jobs[&id], &files, tasks) {
                state.refs.add(d);
            }
            // Tiles of stitched frames that a crash kept from being collected.
            for t in tasks.iter().filter(|t| t.tile.is_some()) {
                if let TaskState::Done { outputs } = &t.state {
                    for o in outputs {
                        if state.refs.count(&o.digest) == 0 {
                            state.garbage.insert(o.digest, now);
                        }
                    }
                }
            }
            state.queue_ready_frames(id);
        }
        let open = state.jobs.values().filter(|j| !j.state.is_final()).count();
        tracing::info!(
            jobs = state.jobs.len(),
            open,
            workers = state.workers.len(),
            "recovered state"
        );
        Ok(Self {
            state: Mutex::new(state),
            stats: Mutex::new(Stats::default()),
            store,
            blobs,
            clock,
            config,
            queued: Notify::new(),
        })
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

    /// The blob store.
    pub fn blobs(&self) -> &Arc<dyn BlobStore> {
        &self.blobs
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves state that was never written
        // half-changed in memory only; the store is the truth, so carry on.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Accepts a job: validates it, splits it into tasks and stores it.
    pub fn submit(&self, sub: Submission) -> Result<JobId, Error> {
        let frames = FrameSet::parse(&sub.frames, self.config.max_frames)
            .map_err(|e| Error::Invalid(e.to_string()))?;
        if !self.blobs.contains(&sub.scene) {
            return Err(Error::invalid(format!(
                "scene {} has not been uploaded; upload it before submitting (tessera submit does this)",
                sub.scene
            )));
        }
        let head = self.blobs.read_range(&sub.scene, 0, 12)?;
        let size = self.blobs.size(&sub.scene).unwrap_or(0);
        let tail_at = size.saturating_sub(crate::blendfile::TAIL as u64);
        let tail = self
            .blobs
            .read_range(&sub.scene, tail_at, crate::blendfile::TAIL)?;
        if let Err(e) = crate::blendfile::check_end(&head, &tail) {
            return Err(Error::invalid(format!("scene {} {e}", sub.scene_name)));
        }
        let chunk = if sub.chunk == 0 { 1 } else { sub.chunk };
        let max_attempts = match sub.max_attempts {
            0 => self.config.max_attempts,
            n if n > 100 => {
                return Err(Error::invalid(
                    "max attempts is over 100; use a smaller number",
                ))
            }
            n => n,
        };
        let name: String = sub
            .scene_name
            .chars()
            .filter(|c| !c.is_control())
            .take(200)
            .collect();
        let grid: Grid = match sub.tiles.trim() {
            "" => Grid::WHOLE,
            t => t
                .parse()
                .map_err(|e: tiles::TileError| Error::Invalid(e.to_string()))?,
        };
        let overscan = sub.overscan.unwrap_or(DEFAULT_OVERSCAN);
        if overscan > 4096 {
            return Err(Error::invalid(format!(
                "overscan of {overscan} px is too large; use at most 4096"
            )));
        }
        let (width, height, rects) = if grid.count() > 1 {
            let info = sub.scene_info.as_ref().filter(|i| i.width > 0 && i.height > 0).ok_or_else(|| {
                Error::invalid("a tiled job needs the scene's resolution; submit it with `tessera submit`, which reads it with Blender")
            })?;
            if !matches!(info.file_format.as_str(), "PNG" | "OPEN_EXR") {
                return Err(Error::invalid(format!(
                    "the scene's output format is {}, which cannot be stitched from tiles; set Output Properties > File Format to PNG or OpenEXR, or submit without --tiles",
                    info.file_format
                )));
            }
            let rects = tiles::split(info.width, info.height, grid, self.config.max_tiles)
                .map_err(|e| Error::Invalid(e.to_string()))?;
            let total = rects.len() as u64 * frames.len() as u64;
            if total > self.config.max_frames {
                return Err(Error::invalid(format!(
                    "{} frames of {} tiles make {total} tasks, over the limit of {}; split the frames into several jobs",
                    frames.len(),
                    rects.len(),
                    self.config.max_frames
                )));
            }
            (info.width, info.height, rects)
        } else {
            (0, 0, Vec::new())
        };
        let requirements = Requirements::parse(&sub.device, sub.min_vram_gb, &sub.tags)?
            .with_features(&sub.features)?;
        let file_set = sub
            .file_set
            .map(|d| self.check_file_set(&d, &sub.scene))
            .transpose()?;
        let missing_files = file_set
            .as_ref()
            .map(|i| i.missing.clone())
            .unwrap_or_default();
        let now = self.clock.now_ms();
        let mut st = self.lock();
        let id = JobId(st.next_job);
        let tasks: Vec<Task> = if rects.is_empty() {
            frames
                .chunks(chunk)
                .into_iter()
                .enumerate()
                .map(|(i, f)| Task::new(id, i as u32, f))
                .collect()
        } else {
            let mut tasks = Vec::with_capacity(frames.len() * rects.len());
            for &frame in frames.frames() {
                for (t, rect) in rects.iter().enumerate() {
                    let tile = TileTask {
                        index: t as u32,
                        inner: *rect,
                        rendered: tiles::with_overscan(*rect, overscan, width, height),
                    };
                    tasks.push(Task::new_tile(id, tasks.len() as u32, frame, tile));
                }
            }
            tasks
        };
        let job = Job {
            id,
            scene: sub.scene,
            scene_name: if name.is_empty() {
                "scene.blend".into()
            } else {
                name
            },
            frames: frames.to_string(),
            frame_count: frames.len() as u32,
            chunk: if rects.is_empty() { chunk } else { 1 },
            priority: sub.priority,
            max_attempts,
            task_count: tasks.len() as u32,
            state: JobState::Queued,
            message: String::new(),
            created_ms: now,
            finished_ms: None,
            grid,
            overscan,
            width,
            height,
            stitched: Vec::new(),
            requirements,
            failures_by_worker: Default::default(),
            owner: sub.owner.clone(),
            file_set: sub.file_set,
            missing_files,
        };
        let mut records: Vec<Record<'_>> = tasks.iter().map(Record::Task).collect();
        records.push(Record::Job(&job));
        // The id is spent even if the write fails: a failed write may still
        // have reached the disk in part, and an id is never handed out twice.
        st.next_job += 1;
        self.store.write(&records)?;
        tracing::info!(job = %id, scene = %job.scene_name, frames = %job.frames, tiles = %job.grid, tasks = tasks.len(), "job submitted");
        if let (Some(d), Some(info)) = (sub.file_set, file_set) {
            st.file_sets.insert(d, info.blobs.into());
        }
        st.install(job, tasks, now);
        drop(st);
        self.queued.notify_waiters();
        Ok(id)
    }

    /// Checks a submitted file set: a valid message whose entries are all stored.
    fn check_file_set(
        &self,
        d: &Digest,
        scene: &Digest,
    ) -> Result<crate::fileset::FileSetInfo, Error> {
        let bytes = self.blobs.read(d).map_err(|e| match e {
            Error::NotFound(_) => Error::invalid(format!(
                "file set {d} has not been uploaded; upload it before submitting (tessera submit does this)"
            )),
            other => other,
        })?;
        let (set, info) = crate::fileset::check(&bytes, scene)?;
        let absent: Vec<&str> = set
            .files
            .iter()
            .filter(|f| f.shared.is_empty())
            .zip(&info.blobs)
            .filter(|(_, b)| !self.blobs.contains(b))
            .map(|(f, _)| f.path.as_str())
            .take(10)
            .collect();
        if !absent.is_empty() {
            return Err(Error::invalid(format!(
                "the file set names files that were not uploaded ({}); upload them first (tessera submit does this)",
                absent.join(", ")
            )));
        }
        Ok(info)
    }
}

#[cfg(test)]
mod tests;
