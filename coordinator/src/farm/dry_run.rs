//! Checking a job without submitting it (`POST /api/v1/jobs/check`): the
//! checks [`Farm::submit`] makes that need no blob (one function, `plan`,
//! serves both), and how many online workers could render it. Nothing is
//! created.

use super::*;

/// What a job would be, were it submitted now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobCheck {
    /// Tasks it would split into: for a job whose tasks the farm sizes
    /// (no `chunk`), the most it could (one a frame); its leases take more
    /// frames each once a frame is measured.
    pub tasks: u64,
    /// Frames it renders.
    pub frames: u64,
    /// Online, healthy workers with a slot that can render it.
    pub workers: u32,
    /// Why it would wait (empty when a worker would take it).
    pub waiting: String,
}

impl Farm {
    /// Checks `sub` as [`Farm::submit`] would, without its blobs, and says
    /// how it would split and which workers could take it.
    pub fn check_job(&self, sub: &Submission) -> Result<JobCheck, Error> {
        let plan = self.plan(sub)?;
        let tasks = plan.task_count();
        let job = Job {
            id: JobId(0),
            scene: sub.scene,
            scene_name: plan.name,
            frames: plan.frames.to_string(),
            frame_count: plan.frames.len() as u32,
            chunk: plan.chunk,
            priority: sub.priority,
            max_attempts: plan.max_attempts,
            task_count: tasks.min(u64::from(u32::MAX)) as u32,
            state: JobState::Queued,
            message: String::new(),
            created_ms: self.clock.now_ms(),
            finished_ms: None,
            grid: plan.grid,
            overscan: plan.overscan,
            width: plan.width,
            height: plan.height,
            stitched: Default::default(),
            requirements: plan.requirements,
            failures_by_worker: Default::default(),
            owner: sub.owner.clone(),
            file_set: None,
            missing_files: Vec::new(),
            after: Vec::new(),
            max_cost: sub.max_cost,
            capacity: sub.capacity,
            started: false,
            preview: Default::default(),
            verify: sub.verify,
            warnings: Vec::new(),
        };
        let now = self.clock.now_ms();
        let st = self.lock();
        let workers = st
            .workers
            .values()
            .filter(|w| self.available(&st, w, now) && capable(&job, w))
            .count() as u32;
        Ok(JobCheck {
            tasks: if job.auto_chunked() {
                plan.frames.len() as u64
            } else {
                tasks
            },
            frames: plan.frames.len() as u64,
            workers,
            waiting: self.waiting(&st, &job).unwrap_or_default(),
        })
    }
}
