//! What users see of jobs: summaries with counts, and pages of tasks and
//! outputs, so that a view of a million-task job stays small.

use super::*;

/// Which part of a job's tasks and outputs a view includes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Page {
    /// First task index.
    pub task_from: u32,
    /// Most tasks (0: none).
    pub task_limit: u32,
    /// First output position (outputs are ordered by frame, then pass).
    pub output_from: u32,
    /// Most outputs (0: none).
    pub output_limit: u32,
}

impl Page {
    /// The largest page a caller may ask for.
    pub const MAX: u32 = 10_000;

    /// The summary alone.
    pub const SUMMARY: Page = Page {
        task_from: 0,
        task_limit: 0,
        output_from: 0,
        output_limit: 0,
    };

    /// Everything (for the coordinator's own use and tests; never for a
    /// remote caller).
    pub const ALL: Page = Page {
        task_from: 0,
        task_limit: u32::MAX,
        output_from: 0,
        output_limit: u32::MAX,
    };

    /// The page with its limits capped at [`Page::MAX`].
    pub fn capped(self) -> Page {
        Page {
            task_limit: self.task_limit.min(Self::MAX),
            output_limit: self.output_limit.min(Self::MAX),
            ..self
        }
    }
}

/// Tile completion of one frame of a tiled job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameTiles {
    /// The frame.
    pub frame: u32,
    /// Tiles done.
    pub done: u32,
    /// Tiles in all.
    pub total: u32,
    /// Whether the frame is stitched.
    pub stitched: bool,
}

/// A job as shown to users: its record, counts, and the page asked for.
#[derive(Debug, Clone)]
pub struct JobSnapshot {
    /// The job.
    pub job: Job,
    /// The page of its tasks, by index: shared with the farm's records (a
    /// view of a thousand tasks copies a thousand pointers under the lock;
    /// a change replaces a record, never edits one a view holds).
    pub tasks: Vec<Arc<Task>>,
    /// The page of its outputs.
    pub outputs: Vec<FrameOutput>,
    /// Tile completion of the frames whose tasks are in the page.
    pub frame_tiles: Vec<FrameTiles>,
    /// Its tasks by state.
    pub counts: TaskCounts,
    /// Why it is not running, when no online worker can serve it.
    pub waiting: Option<String>,
    /// Whether only its summary is kept.
    pub archived: bool,
    /// Slot-time and cost of its tasks' attempts.
    pub usage: crate::model::usage::Usage,
    /// The job it waits for (`--after`), while it does.
    pub waiting_for: Option<JobId>,
}

/// The view of `job` (whose tasks are `tasks`, indexed by `index`) with
/// `page`: counts come from the index; only the page is copied.
pub(super) fn snapshot(
    job: &Job,
    tasks: &[Arc<Task>],
    index: Option<&schedule::JobIndex>,
    page: Page,
    waiting: Option<String>,
) -> JobSnapshot {
    let from = (page.task_from as usize).min(tasks.len());
    let to = from
        .saturating_add(page.task_limit as usize)
        .min(tasks.len());
    let paged = &tasks[from..to];
    // The leased tasks' progress is summed by the index as it changes.
    let mut counts = index.map(|i| i.counts()).unwrap_or_default();
    #[cfg(debug_assertions)]
    if let Some(i) = index {
        let mut sums = (0, 0, 0);
        for &t in i.leased() {
            let p = schedule::progress(&tasks[t as usize]);
            sums.0 += p.0;
            sums.1 += u64::from(p.1);
            sums.2 += u64::from(p.2);
        }
        let kept = (
            counts.running_frames_done,
            counts.samples_done,
            counts.samples_total,
        );
        assert_eq!(
            kept, sums,
            "job {}: the index's progress sums drifted",
            job.id
        );
    }
    if job.is_tiled() {
        counts.outputs = job.stitched.len() as u32;
        counts.frames_done = job.stitched.iter().filter(|o| o.pass.is_empty()).count() as u32;
    }
    let outputs: Vec<FrameOutput> = if page.output_limit == 0 {
        Vec::new()
    } else if job.is_tiled() {
        job.stitched
            .iter()
            .skip(page.output_from as usize)
            .take(page.output_limit as usize)
            .cloned()
            .collect()
    } else {
        tasks
            .iter()
            .filter_map(|t| match &t.state {
                TaskState::Done { outputs } => Some(outputs),
                _ => None,
            })
            .flatten()
            .skip(page.output_from as usize)
            .take(page.output_limit as usize)
            .cloned()
            .collect()
    };
    let mut frame_tiles: Vec<FrameTiles> = Vec::new();
    if job.is_tiled() && !paged.is_empty() {
        let per_frame = job.grid.count() as usize;
        let first = from / per_frame * per_frame;
        let last = to.div_ceil(per_frame) * per_frame;
        for frame in tasks[first..last.min(tasks.len())].chunks(per_frame) {
            let f = frame[0].frames[0];
            frame_tiles.push(FrameTiles {
                frame: f,
                done: frame.iter().filter(|t| t.is_done()).count() as u32,
                total: frame.len() as u32,
                stitched: job.stitched.binary_search_by_key(&f, |o| o.frame).is_ok(),
            });
        }
    }
    JobSnapshot {
        job: job.clone(),
        tasks: paged.to_vec(),
        outputs,
        frame_tiles,
        counts,
        waiting,
        archived: false,
        usage: index.map(|i| i.usage()).unwrap_or_default(),
        waiting_for: None,
    }
}

/// The view of an archived job: its summary, and the page of `outputs`
/// (read from the store when the page asks for any).
pub(super) fn archived(a: &ArchivedSummary, outputs: &[FrameOutput], page: Page) -> JobSnapshot {
    JobSnapshot {
        job: a.job.clone(),
        tasks: Vec::new(),
        outputs: outputs
            .iter()
            .skip(page.output_from as usize)
            .take(page.output_limit as usize)
            .cloned()
            .collect(),
        frame_tiles: Vec::new(),
        counts: a.counts,
        waiting: None,
        archived: true,
        usage: a.usage,
        waiting_for: None,
    }
}
