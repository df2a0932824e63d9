//! Tasks, leases and their lifecycle.
//!
//! ```text
//!            lease                  complete
//!  Queued ─────────▶ Leased{worker} ─────────▶ Done{outputs}
//!    ▲                 │  │  │
//!    │ expire/release  │  │  └─ fail (attempts left) ──▶ Queued
//!    └─────────────────┘  └──── fail (out of attempts) ─▶ Failed
//!  Queued|Leased ── cancel ──▶ Canceled
//!  Done ── rerender (its tile could not be stitched) ──▶ Queued | Failed
//! ```
//!
//! Every grant of a task bumps its lease counter, so a lease id
//! (`job.task.counter`) names exactly one grant: a worker whose lease expired
//! and was given to another can no longer renew or fail it. Its result is still
//! accepted if it arrives before anyone else's, and the task is recorded done
//! once: later results are ignored.

pub use crate::model::output::FrameOutput;
use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::model::ids::JobId;
use crate::model::ids::WorkerId;
use crate::model::tiles::Rect;

/// Names one grant of one task to one worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseId {
    /// The job.
    pub job: JobId,
    /// The task's index in the job.
    pub task: u32,
    /// Which grant of the task.
    pub grant: u32,
}

impl std::fmt::Display for LeaseId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.job, self.task, self.grant)
    }
}

impl std::str::FromStr for LeaseId {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        let bad = || Error::invalid(format!("`{s}` is not a lease id (job.task.grant)"));
        let mut parts = s.split('.');
        let mut next = || parts.next().ok_or_else(bad);
        let job = next()?.parse().map_err(|_| bad())?;
        let task = next()?.parse().map_err(|_| bad())?;
        let grant = next()?.parse().map_err(|_| bad())?;
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(Self {
            job: JobId(job),
            task,
            grant,
        })
    }
}

/// A job's tasks counted by state, and its progress.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskCounts {
    /// Tasks waiting for a slot.
    pub queued: u32,
    /// Tasks held by workers.
    pub leased: u32,
    /// Tasks done.
    pub done: u32,
    /// Tasks out of attempts.
    pub failed: u32,
    /// Tasks canceled.
    pub canceled: u32,
    /// Frames rendered (stitched frames for a tiled job).
    pub frames_done: u32,
    /// Outputs, passes included.
    pub outputs: u32,
    /// Frames finished by running tasks.
    pub running_frames_done: u32,
    /// Cycles samples done and to do by running tasks.
    pub samples_done: u64,
    /// Cycles samples to do by running tasks.
    pub samples_total: u64,
}

/// Where a task is in its life.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskState {
    /// Waiting for a worker.
    Queued,
    /// Held by a worker until `expires_ms` unless renewed.
    Leased {
        /// The holder.
        worker: WorkerId,
        /// Which grant.
        grant: u32,
        /// Deadline, ms since the epoch.
        expires_ms: u64,
        /// When it was granted, ms since the epoch.
        #[serde(default)]
        since_ms: u64,
        /// The holder's slot.
        #[serde(default)]
        slot: u32,
    },
    /// Rendered.
    Done {
        /// One output per frame.
        outputs: Vec<FrameOutput>,
    },
    /// Out of attempts.
    Failed {
        /// The last failure.
        reason: String,
    },
    /// Its job was cancelled or failed.
    Canceled,
}

/// What happened to a result that arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// The task is now done with this result.
    Recorded,
    /// The task was already done; this result was ignored.
    Duplicate,
}

/// Whether an extra output's name may become a file name under a folder:
/// relative, at most 255 bytes and 8 parts, no empty, `.` or `..` part.
fn pass_name_ok(name: &str) -> bool {
    let parts: Vec<&str> = name.split('/').collect();
    !name.is_empty()
        && name.len() <= 255
        && parts.len() <= 8
        && !name.contains(['\\', '\0'])
        && parts.iter().all(|p| {
            !p.is_empty() && !p.chars().all(|c| c == '.') && !p.chars().any(char::is_control)
        })
}

/// Who could render a task that failed, in the reporting worker's judgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailureScope {
    /// A passing fault: retry anywhere, this worker included.
    #[default]
    Transient,
    /// Only this machine has the problem (a missing mount, out of memory):
    /// the job fails for good only when a second worker agrees, or when no
    /// other worker could take the task.
    Machine,
    /// No worker can fix it (the build lacks a feature, a Python error in the
    /// scene, a result refused for good): the job fails now.
    Everywhere,
}

/// What a failure did to the task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailOutcome {
    /// It went back to the queue for another attempt.
    Retry,
    /// It ran out of attempts.
    Failed,
}

/// Which part of a frame a tile task renders.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TileTask {
    /// Index in the frame's grid, row-major from the top-left.
    pub index: u32,
    /// The tile's own pixels.
    pub inner: Rect,
    /// The pixels rendered: the tile plus overscan, clamped to the frame.
    pub rendered: Rect,
}

/// A chunk of frames of one job, or one tile of one frame.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Task {
    /// The job.
    pub job: JobId,
    /// Index within the job.
    pub index: u32,
    /// The frames it renders, ascending.
    pub frames: Vec<u32>,
    /// Its state.
    pub state: TaskState,
    /// Failures so far.
    pub failures: u32,
    /// Grants so far (the last grant's number).
    pub grants: u32,
    /// Workers on which it failed, to retry elsewhere.
    pub failed_on: Vec<WorkerId>,
    /// The last failure's reason and log tail.
    pub message: String,
    /// Frames the holder reported done.
    pub frames_done: u32,
    /// For a tile task: which tile.
    #[serde(default)]
    pub tile: Option<TileTask>,
    /// Samples of the current frame the holder reported done.
    #[serde(default)]
    pub samples_done: u32,
    /// Samples of the current frame in all.
    #[serde(default)]
    pub samples_total: u32,
    /// Workers that reported a failure only their machine has: the task is
    /// never given to them again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub machine_failed_on: Vec<WorkerId>,
    /// Every ended grant with its slot-time and cost (see [`crate::model::usage`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempts: Vec<crate::model::usage::Attempt>,
    /// What Blender stamped into the frames of its result (render time,
    /// samples, memory), kept with the outputs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stats: Vec<crate::model::verify::FrameStats>,
    /// Results held until a second worker agrees (see [`crate::model::verify`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<crate::model::verify::Verification>,
}

impl Task {
    /// A new queued task.
    pub fn new(job: JobId, index: u32, frames: Vec<u32>) -> Self {
        Self {
            job,
            index,
            frames,
            state: TaskState::Queued,
            failures: 0,
            grants: 0,
            failed_on: Vec::new(),
            message: String::new(),
            frames_done: 0,
            tile: None,
            samples_done: 0,
            samples_total: 0,
            machine_failed_on: Vec::new(),
            attempts: Vec::new(),
            stats: Vec::new(),
            verify: None,
        }
    }

    /// A new queued task rendering one tile of `frame`.
    pub fn new_tile(job: JobId, index: u32, frame: u32, tile: TileTask) -> Self {
        Self {
            tile: Some(tile),
            ..Self::new(job, index, vec![frame])
        }
    }

    /// Queued -> Leased: grants the task to `worker` until `now + ttl`.
    pub fn lease(&mut self, worker: &WorkerId, now_ms: u64, ttl_ms: u64) -> Result<LeaseId, Error> {
        if self.state != TaskState::Queued {
            return Err(self.illegal("lease"));
        }
        self.grants += 1;
        self.frames_done = 0;
        (self.samples_done, self.samples_total) = (0, 0);
        self.state = TaskState::Leased {
            worker: worker.clone(),
            grant: self.grants,
            expires_ms: now_ms + ttl_ms,
            since_ms: now_ms,
            slot: 0,
        };
        Ok(self.lease_id(self.grants))
    }

    /// Leased -> Leased with a later deadline, for the current grant only.
    pub fn renew(
        &mut self,
        grant: u32,
        frames_done: u32,
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<(), Error> {
        match &mut self.state {
            TaskState::Leased {
                grant: g,
                expires_ms,
                ..
            } if *g == grant => {
                *expires_ms = now_ms + ttl_ms;
                self.frames_done = frames_done.min(self.frames.len() as u32);
                Ok(())
            }
            _ => Err(Error::LeaseLost(self.lease_id(grant).to_string())),
        }
    }

    /// Queued|Leased -> Done. A result from an older grant is accepted when it
    /// is the first to arrive; a second result is a [`Completion::Duplicate`].
    pub fn complete(&mut self, grant: u32, outputs: Vec<FrameOutput>) -> Result<Completion, Error> {
        if grant == 0 || grant > self.grants {
            return Err(Error::LeaseLost(self.lease_id(grant).to_string()));
        }
        // Extra outputs (passes) ride along with their frame; whole frames only.
        for o in outputs.iter().filter(|o| !o.pass.is_empty()) {
            if self.tile.is_some() || !self.frames.contains(&o.frame) || !pass_name_ok(&o.pass) {
                return Err(Error::invalid(format!(
                    "task {} cannot take extra output `{}` of frame {}: passes need a whole frame of the task and a relative name without `..`",
                    self.lease_id(grant),
                    o.pass,
                    o.frame
                )));
            }
        }
        let mut want: Vec<u32> = outputs
            .iter()
            .filter(|o| o.pass.is_empty())
            .map(|o| o.frame)
            .collect();
        want.sort_unstable();
        if want != self.frames {
            return Err(Error::invalid(format!(
                "task {} renders frames {:?} but the result names frames {:?}",
                self.lease_id(grant),
                self.frames,
                want
            )));
        }
        match self.state {
            TaskState::Queued | TaskState::Leased { .. } => {
                // A late result (its lease expired, or was lost, before it
                // came): the attempt that rendered it is the one that is done.
                let current =
                    matches!(self.state, TaskState::Leased { grant: g, .. } if g == grant);
                if !current {
                    if let Some(a) = self.attempts.iter_mut().rev().find(|a| a.grant == grant) {
                        a.end = crate::model::usage::AttemptEnd::Done;
                    }
                }
                self.state = TaskState::Done { outputs };
                self.frames_done = self.frames.len() as u32;
                Ok(Completion::Recorded)
            }
            TaskState::Done { .. } => Ok(Completion::Duplicate),
            TaskState::Failed { .. } | TaskState::Canceled => {
                Err(Error::LeaseLost(self.lease_id(grant).to_string()))
            }
        }
    }

    /// Leased -> Queued (attempts left) or Failed, for the current grant only.
    pub fn fail(
        &mut self,
        grant: u32,
        reason: String,
        max_attempts: u32,
    ) -> Result<FailOutcome, Error> {
        let worker = match &self.state {
            TaskState::Leased {
                worker, grant: g, ..
            } if *g == grant => worker.clone(),
            _ => return Err(Error::LeaseLost(self.lease_id(grant).to_string())),
        };
        self.failures += 1;
        if !self.failed_on.contains(&worker) {
            self.failed_on.push(worker);
        }
        self.message = reason.clone();
        if self.failures >= max_attempts.max(1) {
            self.state = TaskState::Failed { reason };
            Ok(FailOutcome::Failed)
        } else {
            self.state = TaskState::Queued;
            Ok(FailOutcome::Retry)
        }
    }

    /// Done -> Queued (attempts left) or Failed: its result proved unusable
    /// after it was recorded (a tile that cannot be stitched). Charges an attempt.
    pub fn rerender(&mut self, reason: String, max_attempts: u32) -> Result<FailOutcome, Error> {
        if !self.is_done() {
            return Err(self.illegal("re-render"));
        }
        self.failures += 1;
        self.message = reason.clone();
        self.frames_done = 0;
        if self.failures >= max_attempts.max(1) {
            self.state = TaskState::Failed { reason };
            Ok(FailOutcome::Failed)
        } else {
            self.state = TaskState::Queued;
            Ok(FailOutcome::Retry)
        }
    }

    /// Leased -> Queued when the deadline has passed. Returns whether it expired.
    pub fn expire(&mut self, now_ms: u64) -> bool {
        match self.state {
            TaskState::Leased { expires_ms, .. } if expires_ms <= now_ms => {
                self.state = TaskState::Queued;
                self.frames_done = 0;
                true
            }
            _ => false,
        }
    }

    /// Leased -> Queued at the holder's request (shutdown), without charging an attempt.
    pub fn release(&mut self, grant: u32) -> Result<(), Error> {
        match self.state {
            TaskState::Leased { grant: g, .. } if g == grant => {
                self.state = TaskState::Queued;
                self.frames_done = 0;
                Ok(())
            }
            _ => Err(Error::LeaseLost(self.lease_id(grant).to_string())),
        }
    }

    /// Leased -> Queued, whoever holds it (its job was paused); no attempt is charged.
    pub fn requeue(&mut self) {
        if matches!(self.state, TaskState::Leased { .. }) {
            self.state = TaskState::Queued;
            self.frames_done = 0;
        }
    }

    /// Failed|Canceled -> Queued with a clean slate (its job is retried).
    pub fn retry(&mut self) {
        if matches!(self.state, TaskState::Failed { .. } | TaskState::Canceled) {
            self.state = TaskState::Queued;
            self.failures = 0;
            self.failed_on.clear();
            self.machine_failed_on.clear();
            self.frames_done = 0;
        }
    }

    /// Queued|Leased -> Canceled; finished tasks keep their state.
    pub fn cancel(&mut self) {
        if matches!(self.state, TaskState::Queued | TaskState::Leased { .. }) {
            self.state = TaskState::Canceled;
        }
    }

    /// The holder, while leased.
    pub fn holder(&self) -> Option<&WorkerId> {
        match &self.state {
            TaskState::Leased { worker, .. } => Some(worker),
            _ => None,
        }
    }

    /// Whether the task is done.
    pub fn is_done(&self) -> bool {
        matches!(self.state, TaskState::Done { .. })
    }

    /// The id of grant `grant` of this task.
    pub fn lease_id(&self, grant: u32) -> LeaseId {
        LeaseId {
            job: self.job,
            task: self.index,
            grant,
        }
    }

    fn illegal(&self, action: &str) -> Error {
        Error::Conflict(format!(
            "task {}.{} is {:?}; cannot {action} it",
            self.job,
            self.index,
            self.state_name()
        ))
    }

    /// Lowercase state name.
    pub fn state_name(&self) -> &'static str {
        match self.state {
            TaskState::Queued => "queued",
            TaskState::Leased { .. } => "leased",
            TaskState::Done { .. } => "done",
            TaskState::Failed { .. } => "failed",
            TaskState::Canceled => "canceled",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::Digest;

    fn out(frame: u32) -> FrameOutput {
        FrameOutput {
            frame,
            digest: Digest::of(&frame.to_le_bytes()),
            ext: "png".into(),
            size: 4,
            pass: String::new(),
        }
    }

    fn w(name: &str) -> WorkerId {
        WorkerId(name.into())
    }

    #[test]
    fn lease_renew_complete() {
        let mut t = Task::new(JobId(1), 0, vec![1, 2]);
        let lease = t.lease(&w("a"), 1000, 500).unwrap();
        assert_eq!(lease.to_string(), "1.0.1");
        assert_eq!(lease.to_string().parse::<LeaseId>().unwrap(), lease);
        t.renew(lease.grant, 1, 1400, 500).unwrap();
        assert!(!t.expire(1899));
        assert_eq!(
            t.complete(lease.grant, vec![out(2), out(1)]).unwrap(),
            Completion::Recorded
        );
        assert!(t.is_done());
        assert_eq!(
            t.complete(lease.grant, vec![out(1), out(2)]).unwrap(),
            Completion::Duplicate
        );
    }

    #[test]
    fn passes_ride_with_their_frame_under_safe_names() {
        let pass = |frame: u32, name: &str| FrameOutput {
            pass: name.into(),
            ..out(frame)
        };
        let mut t = Task::new(JobId(1), 0, vec![1]);
        let lease = t.lease(&w("a"), 0, 500).unwrap();
        for bad in [pass(1, "../x.png"), pass(1, "/etc/x"), pass(2, "n/x.png")] {
            assert!(matches!(
                t.complete(lease.grant, vec![out(1), bad]),
                Err(Error::Invalid(_))
            ));
        }
        assert_eq!(
            t.complete(
                lease.grant,
                vec![out(1), pass(1, "File Output/Image0001.png")]
            )
            .unwrap(),
            Completion::Recorded
        );
    }

    #[test]
    fn an_expired_lease_requeues_and_the_old_holder_loses_it() {
        let mut t = Task::new(JobId(1), 0, vec![1]);
        let first = t.lease(&w("a"), 0, 100).unwrap();
        assert!(t.expire(100));
        assert_eq!(t.state, TaskState::Queued);
        let second = t.lease(&w("b"), 100, 100).unwrap();
        assert_ne!(first, second);
        assert!(matches!(
            t.renew(first.grant, 0, 150, 100),
            Err(Error::LeaseLost(_))
        ));
        assert!(matches!(
            t.fail(first.grant, "x".into(), 3),
            Err(Error::LeaseLost(_))
        ));
        // The first holder's result still counts if it arrives first; the
        // second holder's later result is a duplicate, recorded once.
        assert_eq!(
            t.complete(first.grant, vec![out(1)]).unwrap(),
            Completion::Recorded
        );
        assert_eq!(
            t.complete(second.grant, vec![out(1)]).unwrap(),
            Completion::Duplicate
        );
    }

    #[test]
    fn failures_retry_until_out_of_attempts() {
        let mut t = Task::new(JobId(1), 0, vec![1]);
        let l = t.lease(&w("a"), 0, 100).unwrap();
        assert_eq!(
            t.fail(l.grant, "boom".into(), 2).unwrap(),
            FailOutcome::Retry
        );
        assert_eq!(t.failed_on, vec![w("a")]);
        let l = t.lease(&w("b"), 0, 100).unwrap();
        assert_eq!(
            t.fail(l.grant, "boom again".into(), 2).unwrap(),
            FailOutcome::Failed
        );
        assert_eq!(
            t.state,
            TaskState::Failed {
                reason: "boom again".into()
            }
        );
        assert!(matches!(t.lease(&w("c"), 0, 100), Err(Error::Conflict(_))));
    }

    #[test]
    fn results_must_name_the_tasks_frames() {
        let mut t = Task::new(JobId(1), 0, vec![1, 2]);
        let l = t.lease(&w("a"), 0, 100).unwrap();
        assert!(matches!(
            t.complete(l.grant, vec![out(1)]),
            Err(Error::Invalid(_))
        ));
        assert!(matches!(
            t.complete(9, vec![out(1), out(2)]),
            Err(Error::LeaseLost(_))
        ));
    }

    #[test]
    fn release_and_cancel() {
        let mut t = Task::new(JobId(1), 0, vec![1]);
        let l = t.lease(&w("a"), 0, 100).unwrap();
        t.release(l.grant).unwrap();
        assert_eq!(t.failures, 0);
        assert!(matches!(t.release(l.grant), Err(Error::LeaseLost(_))));
        let l = t.lease(&w("a"), 0, 100).unwrap();
        t.cancel();
        assert!(matches!(
            t.complete(l.grant, vec![out(1)]),
            Err(Error::LeaseLost(_))
        ));
    }

    #[test]
    fn bad_lease_ids_are_refused() {
        for bad in ["", "1", "1.2", "1.2.3.4", "a.b.c", "-1.0.0"] {
            assert!(bad.parse::<LeaseId>().is_err(), "{bad}");
        }
    }
}
