//! Checking a job without submitting it (`POST /api/v1/jobs/check`): every
//! check of [`Farm::submit`] and [`Farm::check_submission`] except that the
//! scene and file set blobs exist (nothing is uploaded yet), and how many
//! online workers could render it. Nothing is created.
//!
//! It repeats submit's checks in the same order; a change to what submit
//! accepts belongs here too (the unit tests in `api` compare the two).

use super::*;

/// What a job would be, were it submitted now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobCheck {
    /// Tasks it would split into.
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
        if let Some(info) = &sub.scene_info {
            self.config
                .max_pixels
                .check(
                    "the scene's output",
                    u64::from(info.width),
                    u64::from(info.height),
                )
                .map_err(|e| Error::Invalid(e.to_string()))?;
        }
        let frames = FrameSet::parse(&sub.frames, self.config.max_frames)
            .map_err(|e| Error::Invalid(e.to_string()))?;
        if sub.max_attempts > 100 {
            return Err(Error::invalid(
                "max attempts is over 100; use a smaller number",
            ));
        }
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
        let tasks = if grid.count() > 1 {
            let info = sub.scene_info.as_ref().filter(|i| i.width > 0 && i.height > 0).ok_or_else(|| {
                Error::invalid("a tiled job needs the scene's resolution; send scene_info with width and height (the add-on and `tessera submit` read it with Blender)")
            })?;
            if !matches!(info.file_format.as_str(), "PNG" | "OPEN_EXR") {
                return Err(Error::invalid(format!(
                    "the scene's output format is {}, which cannot be stitched from tiles; set Output Properties > File Format to PNG or OpenEXR, or submit without tiles",
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
            total
        } else {
            (frames.len() as u64).div_ceil(u64::from(sub.chunk.max(1)))
        };
        let requirements = Requirements::parse(&sub.device, sub.min_vram_gb, &sub.tags)?
            .with_features(&sub.features)?;
        let job = Job {
            id: JobId(0),
            scene: sub.scene,
            scene_name: sub.scene_name.clone(),
            frames: frames.to_string(),
            frame_count: frames.len() as u32,
            chunk: sub.chunk.max(1),
            priority: sub.priority,
            max_attempts: sub.max_attempts,
            task_count: tasks.min(u64::from(u32::MAX)) as u32,
            state: JobState::Queued,
            message: String::new(),
            created_ms: self.clock.now_ms(),
            finished_ms: None,
            grid,
            overscan,
            width: 0,
            height: 0,
            stitched: Vec::new(),
            requirements,
            failures_by_worker: Default::default(),
            owner: sub.owner.clone(),
            file_set: None,
            missing_files: Vec::new(),
        };
        let now = self.clock.now_ms();
        let st = self.lock();
        let workers = st
            .workers
            .values()
            .filter(|w| self.available(&st, w, now) && capable(&job, w))
            .count() as u32;
        Ok(JobCheck {
            tasks,
            frames: frames.len() as u64,
            workers,
            waiting: self.waiting(&st, &job).unwrap_or_default(),
        })
    }
}
