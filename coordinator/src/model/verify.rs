//! Verifiable frames: which tasks are rendered twice, and what the results
//! of several workers for one task settle.
//!
//! Workers strip Blender's volatile stamps from their images (render time,
//! date, the scene's path) and send them as [`FrameStats`], so one task
//! rendered by two workers of one Blender build and device kind gives
//! byte-identical files, and so equal digests. A sampled task is rendered
//! again on a different worker and the digests compared:
//!
//! ```text
//!  result 1 ─▶ held, task queued for a different worker
//!  result 2 ─┬─ same digests ─▶ done (delivered)
//!            └─ different ───▶ held, task queued for a third worker
//!  result 3 ─┬─ agrees with one ─▶ done with the agreed result; the odd
//!            │                     worker is suspect
//!            └─ agrees with none ─▶ another worker, up to MAX_RENDERS,
//!                                   then the task fails
//! ```
//!
//! The choice of tasks is a pure function of a seed, the job and the task
//! index, so it is the same after a restart and in a test.

use serde::{Deserialize, Serialize};

use crate::model::ids::JobId;
use crate::model::ids::WorkerId;
use crate::model::output::FrameOutput;

/// The coordinator's default share of an untrusted worker's tasks that are
/// verified (`tessera coordinator --verify-untrusted`): one in twenty, enough
/// that a worker corrupting every frame is caught within its first few dozen
/// tasks, for 5 % more render time.
pub const DEFAULT_VERIFY_UNTRUSTED: f64 = 0.05;

/// Seed of the choice of tasks unless the coordinator is given another.
pub const DEFAULT_SEED: u64 = 0x7e55_e4a0_f00d_2026;

/// Most renders of one task while no two agree; the task then fails.
pub const MAX_RENDERS: usize = 5;

/// What Blender stamped into one rendered frame (or tile), moved out of the
/// image by the worker. Zero where Blender said nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrameStats {
    /// The frame.
    pub frame: u32,
    /// Wall time of the render, ms.
    #[serde(default)]
    pub render_ms: u64,
    /// Cycles' scene synchronisation time, ms.
    #[serde(default)]
    pub sync_ms: u64,
    /// Samples per pixel.
    #[serde(default)]
    pub samples: u32,
    /// Peak memory, bytes.
    #[serde(default)]
    pub memory_peak_bytes: u64,
}

/// One worker's result for a task under verification.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    /// Who rendered it.
    pub worker: WorkerId,
    /// Its Blender build (a verifier must have the same).
    pub blender: String,
    /// Its outputs.
    pub outputs: Vec<FrameOutput>,
    /// Its render statistics.
    #[serde(default)]
    pub stats: Vec<FrameStats>,
}

/// A task's verification: results held until two workers agree, then who
/// agreed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Verification {
    /// Results held while no two agree.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub candidates: Vec<Candidate>,
    /// Once settled: the workers whose results agreed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agreed: Vec<WorkerId>,
    /// Workers whose results disagreed with the agreed one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub odd: Vec<WorkerId>,
}

impl Verification {
    /// Whether two workers have agreed.
    pub fn settled(&self) -> bool {
        !self.agreed.is_empty()
    }

    /// Whether `worker` rendered a result that is still held.
    pub fn rendered_by(&self, worker: &WorkerId) -> bool {
        self.candidates.iter().any(|c| &c.worker == worker)
    }

    /// Whether the results held disagree (a third worker is needed).
    pub fn disputed(&self) -> bool {
        self.candidates.len() >= 2
    }
}

/// What the results held for a task settle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// One result: another worker must render it.
    NeedMore,
    /// Results `agreeing` hold the same digests; the others (`odd`) differ.
    Agreed {
        /// Indexes of the candidates that agree (two or more).
        agreeing: Vec<usize>,
        /// Indexes of the candidates that differ from them.
        odd: Vec<usize>,
    },
    /// No two results agree: another worker must render it.
    Disputed,
    /// [`MAX_RENDERS`] results and no two agree: give up.
    Unsettled,
}

/// Which digests a result holds, in a fixed order: (frame, pass, digest).
fn fingerprint(outputs: &[FrameOutput]) -> Vec<(u32, &str, crate::digest::Digest)> {
    let mut v: Vec<_> = outputs
        .iter()
        .map(|o| (o.frame, o.pass.as_str(), o.digest))
        .collect();
    v.sort();
    v
}

/// Settles the results held for a task: the first two results that agree
/// win, and every result that differs from them is odd.
pub fn resolve(candidates: &[Candidate]) -> Resolution {
    let prints: Vec<_> = candidates.iter().map(|c| fingerprint(&c.outputs)).collect();
    for i in 0..prints.len() {
        let agreeing: Vec<usize> = (0..prints.len())
            .filter(|&j| prints[j] == prints[i])
            .collect();
        if agreeing.len() >= 2 {
            let odd = (0..prints.len())
                .filter(|j| !agreeing.contains(j))
                .collect();
            return Resolution::Agreed { agreeing, odd };
        }
    }
    match candidates.len() {
        0 | 1 => Resolution::NeedMore,
        n if n >= MAX_RENDERS => Resolution::Unsettled,
        _ => Resolution::Disputed,
    }
}

/// A number in [0, 1) drawn from the seed, the job, the task and a purpose.
fn draw(seed: u64, purpose: &str, job: JobId, task: u32) -> f64 {
    let mut h = blake3::Hasher::new();
    h.update(&seed.to_le_bytes());
    h.update(purpose.as_bytes());
    h.update(&job.0.to_le_bytes());
    h.update(&task.to_le_bytes());
    let b = h.finalize();
    let n = u64::from_le_bytes(b.as_bytes()[..8].try_into().expect("8 bytes"));
    (n >> 11) as f64 / (1u64 << 53) as f64
}

/// Whether task `task` of `job` (of `tasks` in all) is verified at
/// `fraction` of its job's tasks (`submit --verify`): each task with
/// probability `fraction`, drawn from `seed`, the job and the task, plus one
/// task of every job (so a job asking for verification gets at least one).
pub fn sampled(seed: u64, job: JobId, task: u32, tasks: u32, fraction: f64) -> bool {
    if fraction <= 0.0 || fraction.is_nan() || tasks == 0 {
        return false;
    }
    let anchor = (draw(seed, "anchor", job, 0) * f64::from(tasks)) as u32;
    task == anchor.min(tasks - 1) || draw(seed, "job", job, task) < fraction
}

/// Whether a task an untrusted worker rendered is verified at the
/// coordinator's `fraction` (`--verify-untrusted`): drawn like [`sampled`],
/// without the one task per job.
pub fn sampled_untrusted(seed: u64, job: JobId, task: u32, fraction: f64) -> bool {
    fraction > 0.0 && draw(seed, "untrusted", job, task) < fraction
}

/// Why a worker is suspect: it was caught on `job`, and it takes no more
/// tasks of jobs whose requirement class is `class`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Suspicion {
    /// The job it was caught on.
    pub job: JobId,
    /// The task.
    pub task: u32,
    /// The requirement class of that job ([`crate::model::hardware::Requirements::describe`]).
    pub class: String,
    /// What it did, for `tessera workers`.
    pub reason: String,
}

/// Checks a fraction of tasks given by a client (`verify`): 0 to 1.
pub fn check_fraction(field: &str, v: f64) -> Result<f64, crate::error::Error> {
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(crate::error::Error::invalid(format!(
            "{field} {v} is not a fraction of tasks; use a number from 0 to 1, e.g. 0.05"
        )))
    }
}

#[cfg(test)]
mod tests;
