//! Jobs and their lifecycle.
//!
//! ```text
//!  Queued ──first lease──▶ Running ──all tasks done──▶ Done
//!    │  ▲                    │  └──a task out of attempts──▶ Failed ──retry──▶ Running
//!    │  └─resume── Paused ◀─pause                                             ▲
//!    └───────cancel──────────┴──────────cancel──────────────▶ Canceled ──retry─┘
//! ```

pub use crate::model::ids::JobId;
use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::error::Error;
use crate::model::hardware::Requirements;
use crate::model::output::FrameOutput;
use crate::model::tiles::Grid;

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobState {
    /// Submitted; no task leased yet.
    Queued,
    /// At least one task has been leased.
    Running,
    /// Every task is done.
    Done,
    /// A task ran out of attempts.
    Failed,
    /// A user cancelled it.
    Canceled,
    /// A user paused it: no task is leased until it is resumed.
    Paused,
}

impl JobState {
    /// Whether the job has ended for good.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Done | Self::Failed | Self::Canceled)
    }

    /// Lowercase name for messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Done => "done",
            Self::Failed => "failed",
            Self::Canceled => "canceled",
            Self::Paused => "paused",
        }
    }
}

/// A render job: one scene, a set of frames, split into tasks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// Its id.
    pub id: JobId,
    /// The scene blob.
    pub scene: Digest,
    /// The scene's file name, for display only.
    pub scene_name: String,
    /// The frame set in compact form.
    pub frames: String,
    /// How many frames the set holds.
    pub frame_count: u32,
    /// Frames per task; 0 when the farm sizes its tasks itself (submitted
    /// without `--chunk`, see [`Job::auto_chunked`]).
    pub chunk: u32,
    /// Higher runs first.
    pub priority: i32,
    /// Failures a task may have before the job fails.
    pub max_attempts: u32,
    /// Number of tasks.
    pub task_count: u32,
    /// Its state.
    pub state: JobState,
    /// Why it failed, when it did.
    pub message: String,
    /// Submission time (ms since the epoch).
    pub created_ms: u64,
    /// When it ended, if it did.
    pub finished_ms: Option<u64>,
    /// The tile grid; 1x1 renders whole frames.
    #[serde(default = "whole")]
    pub grid: Grid,
    /// Overscan margin of tiles, in pixels.
    #[serde(default)]
    pub overscan: u32,
    /// Frame size in pixels (known for tiled jobs; 0 otherwise).
    #[serde(default)]
    pub width: u32,
    /// Frame height in pixels.
    #[serde(default)]
    pub height: u32,
    /// Frames assembled from their tiles, by frame number. Stored as one
    /// record per frame ([`crate::store::Record::Stitched`]), not inside the
    /// job's record, so a stitch writes one frame, not all of them; read
    /// here from records written before that.
    /// Shared, so that copying a job (every lease and result does) costs
    /// nothing for its frames.
    #[serde(default, skip_serializing, deserialize_with = "shared_frames")]
    pub stitched: std::sync::Arc<Vec<FrameOutput>>,
    /// What a slot needs to render it.
    #[serde(default)]
    pub requirements: Requirements,
    /// Failed attempts per worker; a worker that fails too often is blocked.
    #[serde(default)]
    pub failures_by_worker: std::collections::BTreeMap<String, u32>,
    /// The user who submitted it.
    #[serde(default)]
    pub owner: String,
    /// Its file set blob, when the scene needs more files than itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_set: Option<Digest>,
    /// Files the scene needs that were not submitted (`--allow-missing`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing_files: Vec<String>,
    /// Jobs that must be done before this one starts (`--after`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<JobId>,
    /// The most it may cost (`--max-cost`): it pauses when reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost: Option<f64>,
    /// Which worker capacity it accepts (`--capacity`).
    #[serde(default)]
    pub capacity: crate::model::usage::CapacityPref,
    /// Whether a task was ever leased: jobs it waits for hold it only until then.
    #[serde(default)]
    pub started: bool,
    /// The scene's frame rate and the job's preview video, when one is
    /// wanted (see [`crate::model::preview`]).
    #[serde(default)]
    pub preview: crate::model::preview::Preview,
    /// The fraction of its tasks rendered twice and compared (`--verify`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub verify: f64,
    /// What workers reported about how its frames were rendered (stored
    /// Python that did not run), once each, at most [`MAX_WARNINGS`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// Most warnings a job keeps: every worker reports its own, every task.
pub const MAX_WARNINGS: usize = 20;

/// Longest warning kept, in characters.
const MAX_WARNING_CHARS: usize = 1000;

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

fn whole() -> Grid {
    Grid::WHOLE
}

impl Job {
    /// Adds workers' warnings: new ones only, cut to a sane length, while
    /// fewer than [`MAX_WARNINGS`] are kept. Returns whether any was added.
    pub fn add_warnings(&mut self, warnings: &[String]) -> bool {
        let mut added = false;
        for w in warnings {
            let w: String = w.trim().chars().take(MAX_WARNING_CHARS).collect();
            if w.is_empty() || self.warnings.len() >= MAX_WARNINGS || self.warnings.contains(&w) {
                continue;
            }
            self.warnings.push(w);
            added = true;
        }
        added
    }

    /// Whether frames are split into tiles.
    pub fn is_tiled(&self) -> bool {
        self.grid.count() > 1
    }

    /// Whether the farm sizes this job's tasks from its measured frame
    /// time (submitted without `--chunk`): a lease carves its frames off
    /// the front of a queued run of frames. Not for tiles, nor for a job
    /// that asks for `--verify`, whose sample of tasks must stay put.
    pub fn auto_chunked(&self) -> bool {
        self.chunk == 0 && !self.is_tiled() && self.verify <= 0.0
    }

    /// Queued -> Running, on the first lease. A no-op when already running.
    pub fn start(&mut self) -> Result<(), Error> {
        match self.state {
            JobState::Queued | JobState::Running => {
                self.state = JobState::Running;
                self.started = true;
                Ok(())
            }
            s => Err(self.illegal("start", s)),
        }
    }

    /// Queued|Running -> Done.
    pub fn finish(&mut self, now_ms: u64) -> Result<(), Error> {
        self.end(JobState::Done, String::new(), now_ms)
    }

    /// Queued|Running -> Failed, with the reason.
    pub fn fail(&mut self, reason: String, now_ms: u64) -> Result<(), Error> {
        self.end(JobState::Failed, reason, now_ms)
    }

    /// Queued|Running|Paused -> Canceled.
    pub fn cancel(&mut self, now_ms: u64) -> Result<(), Error> {
        self.end(JobState::Canceled, "canceled by user".into(), now_ms)
    }

    /// Queued|Running -> Paused.
    pub fn pause(&mut self) -> Result<(), Error> {
        match self.state {
            JobState::Queued | JobState::Running => {
                self.state = JobState::Paused;
                Ok(())
            }
            s => Err(self.illegal("paused", s)),
        }
    }

    /// Paused -> Running.
    pub fn resume(&mut self) -> Result<(), Error> {
        match self.state {
            JobState::Paused => {
                self.state = if self.started {
                    JobState::Running
                } else {
                    JobState::Queued
                };
                self.message.clear();
                Ok(())
            }
            s => Err(Error::Conflict(format!(
                "job {} is {}, not paused; nothing to resume",
                self.id,
                s.name()
            ))),
        }
    }

    /// Failed|Canceled -> Running, to render what is left again.
    pub fn retry(&mut self) -> Result<(), Error> {
        match self.state {
            JobState::Failed | JobState::Canceled => self.reopen(),
            s => Err(Error::Conflict(format!(
                "job {} is {}; only failed or canceled jobs can be retried",
                self.id,
                s.name()
            ))),
        }
    }

    /// Any state -> Running, to render some of its frames again
    /// (`retry --frames`); a paused job stays paused.
    pub fn rerun(&mut self) -> Result<(), Error> {
        match self.state {
            JobState::Paused | JobState::Queued | JobState::Running => Ok(()),
            JobState::Done | JobState::Failed | JobState::Canceled => self.reopen(),
        }
    }

    fn reopen(&mut self) -> Result<(), Error> {
        self.state = JobState::Running;
        self.message.clear();
        self.finished_ms = None;
        self.failures_by_worker.clear();
        // Its frames change: a preview asked for is made again when it ends.
        self.preview.reset();
        Ok(())
    }

    fn end(&mut self, to: JobState, message: String, now_ms: u64) -> Result<(), Error> {
        if self.state.is_final() {
            return Err(self.illegal(to.name(), self.state));
        }
        self.state = to;
        self.message = message;
        self.finished_ms = Some(now_ms);
        Ok(())
    }

    fn illegal(&self, action: &str, from: JobState) -> Error {
        Error::Conflict(format!(
            "job {} is already {}; cannot mark it {action}",
            self.id,
            from.name()
        ))
    }
}

/// Reads stitched frames kept inside an older job record.
fn shared_frames<'de, D>(d: D) -> Result<std::sync::Arc<Vec<FrameOutput>>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    Vec::<FrameOutput>::deserialize(d).map(std::sync::Arc::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> Job {
        Job {
            id: JobId(1),
            scene: Digest::of(b"s"),
            scene_name: "s.blend".into(),
            frames: "1-3".into(),
            frame_count: 3,
            chunk: 1,
            priority: 0,
            max_attempts: 3,
            task_count: 3,
            state: JobState::Queued,
            message: String::new(),
            created_ms: 0,
            finished_ms: None,
            grid: Grid::WHOLE,
            overscan: 0,
            width: 0,
            height: 0,
            stitched: Default::default(),
            requirements: Requirements::default(),
            failures_by_worker: Default::default(),
            owner: String::new(),
            file_set: None,
            missing_files: Vec::new(),
            after: Vec::new(),
            max_cost: None,
            capacity: Default::default(),
            started: false,
            preview: Default::default(),
            verify: 0.0,
            warnings: Vec::new(),
        }
    }

    #[test]
    fn warnings_are_kept_once_and_bounded() {
        let mut j = job();
        assert!(j.add_warnings(&["driver `a` skipped".into(), " driver `a` skipped ".into()]));
        assert!(!j.add_warnings(&["driver `a` skipped".into(), String::new()]));
        assert_eq!(j.warnings, ["driver `a` skipped"]);
        let many: Vec<String> = (0..50).map(|i| format!("w{i}")).collect();
        j.add_warnings(&many);
        assert_eq!(j.warnings.len(), MAX_WARNINGS);
        j.warnings.clear();
        j.add_warnings(&["x".repeat(5000)]);
        assert_eq!(j.warnings[0].len(), MAX_WARNING_CHARS);
        // Older records have none; the field is left out when empty.
        let text = serde_json::to_string(&job()).unwrap();
        assert!(!text.contains("warnings"), "{text}");
        let back: Job = serde_json::from_str(&text).unwrap();
        assert!(back.warnings.is_empty());
        j.warnings = vec!["kept".into()];
        let back: Job = serde_json::from_str(&serde_json::to_string(&j).unwrap()).unwrap();
        assert_eq!(back.warnings, ["kept"]);
    }

    #[test]
    fn legal_transitions() {
        let mut j = job();
        j.start().unwrap();
        j.start().unwrap();
        assert_eq!(j.state, JobState::Running);
        j.finish(5).unwrap();
        assert_eq!((j.state, j.finished_ms), (JobState::Done, Some(5)));
    }

    #[test]
    fn a_final_job_cannot_change() {
        let mut j = job();
        j.cancel(1).unwrap();
        assert!(matches!(j.start(), Err(Error::Conflict(_))));
        assert!(matches!(j.finish(2), Err(Error::Conflict(_))));
        let err = j.cancel(3).unwrap_err().to_string();
        assert!(err.contains("already canceled"), "{err}");
    }
}
