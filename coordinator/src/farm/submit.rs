//! Accepting jobs: validating a submission, splitting it into tasks and
//! storing it.

use super::*;

/// A submission checked against every rule that needs no blob: what the
/// job would be.
pub(super) struct Plan {
    pub(super) frames: FrameSet,
    pub(super) chunk: u32,
    pub(super) max_attempts: u32,
    pub(super) name: String,
    pub(super) grid: Grid,
    pub(super) overscan: u32,
    pub(super) width: u32,
    pub(super) height: u32,
    /// The tiles of a tiled job (empty for whole frames).
    pub(super) rects: Vec<Rect>,
    pub(super) requirements: Requirements,
}

impl Plan {
    /// Tasks the job splits into as submitted (for a job the farm sizes,
    /// its runs of [`chunking::SPAN`] frames).
    pub(super) fn task_count(&self) -> u64 {
        if self.rects.is_empty() {
            let per_task = match self.chunk {
                0 => chunking::SPAN,
                n => n,
            };
            (self.frames.len() as u64).div_ceil(u64::from(per_task))
        } else {
            self.frames.len() as u64 * self.rects.len() as u64
        }
    }
}

impl Farm {
    /// Checks `sub` against every rule that needs no blob (submit and the
    /// dry run share it): frames, attempts, tiles, overscan, the output
    /// size and format, requirements.
    pub(super) fn plan(&self, sub: &Submission) -> Result<Plan, Error> {
        self.check_output_size(sub)?;
        let frames = FrameSet::parse(&sub.frames, self.config.max_frames)
            .map_err(|e| Error::Invalid(e.to_string()))?;
        // 0: the farm sizes the tasks (see `chunking`), except for a job
        // whose sample of verified tasks must stay put: one frame a task.
        let chunk = match sub.chunk {
            0 if sub.verify > 0.0 => 1,
            n => n,
        };
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
                Error::invalid("a tiled job needs the scene's resolution; submit it with `tessera submit` or the add-on, which read it with Blender")
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
            (info.width, info.height, rects)
        } else {
            (0, 0, Vec::new())
        };
        let mut requirements = Requirements::parse(&sub.device, sub.min_vram_gb, &sub.tags)?
            .with_features(&sub.features)?;
        if !sub.blender.trim().is_empty() {
            requirements.blender = Some(crate::model::runtime::VersionReq::parse(&sub.blender)?);
        }
        crate::model::preview::scene_fps(sub.scene_info.as_ref().map(|i| i.fps))?;
        Ok(Plan {
            frames,
            chunk,
            max_attempts,
            name,
            grid,
            overscan,
            width,
            height,
            rects,
            requirements,
        })
    }

    /// Refuses a scene whose output is over `--max-pixels`.
    pub(super) fn check_output_size(&self, sub: &Submission) -> Result<(), Error> {
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
        Ok(())
    }

    /// Accepts a job: validates it, splits it into tasks and stores it.
    pub fn submit(&self, sub: Submission) -> Result<JobId, Error> {
        if !self.blobs.contains(&sub.scene) {
            return Err(Error::invalid(format!(
                "scene {} has not been uploaded; upload it before submitting (tessera submit does this)",
                sub.scene
            )));
        }
        let size = self.blobs.size(&sub.scene).unwrap_or(0);
        let head = self.blobs.read_range(
            &sub.scene,
            0,
            crate::blendfile::COMPRESSED_HEAD.min(size as usize),
        )?;
        let tail_at = size.saturating_sub(crate::blendfile::TAIL as u64);
        let tail = self
            .blobs
            .read_range(&sub.scene, tail_at, crate::blendfile::TAIL)?;
        if let Err(e) = crate::blendfile::check_end(&head, &tail) {
            return Err(Error::invalid(format!("scene {} {e}", sub.scene_name)));
        }
        let mut plan = self.plan(&sub)?;
        let saved = crate::blendfile::saved_version(&head).ok();
        self.check_blender(&mut plan.requirements, saved, &sub.scene_name)?;
        let after = self.check_after(None, &sub.after)?;
        if let Some(m) = sub.max_cost {
            pipeline::check_budget(m)?;
        }
        let preview = crate::model::preview::Preview::at_submit(
            sub.preview,
            sub.scene_info.as_ref().map(|i| i.fps),
        )?;
        let file_set = sub
            .file_set
            .map(|d| self.check_file_set(&d, &sub.scene))
            .transpose()?;
        let missing_files = file_set
            .as_ref()
            .map(|i| i.missing.clone())
            .unwrap_or_default();
        let now = self.clock.now_ms();
        // The id is spent even if the submission fails: a failed write may
        // have reached the disk in part, and an id is never handed out twice.
        let id = {
            let mut st = self.lock();
            st.next_job += 1;
            JobId(st.next_job - 1)
        };
        let started = std::time::Instant::now();
        let task_count = plan.task_count() as usize;
        let Plan {
            frames,
            chunk,
            max_attempts,
            name,
            grid,
            overscan,
            width,
            height,
            rects,
            requirements,
        } = plan;
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
            task_count: task_count as u32,
            state: JobState::Queued,
            message: String::new(),
            created_ms: now,
            finished_ms: None,
            grid,
            overscan,
            width,
            height,
            stitched: Default::default(),
            requirements,
            failures_by_worker: Default::default(),
            owner: sub.owner.clone(),
            file_set: sub.file_set,
            missing_files,
            after,
            max_cost: sub.max_cost,
            capacity: sub.capacity,
            started: false,
            preview,
            verify: sub.verify,
            warnings: Vec::new(),
        };
        // A new task is what its job's record says it is: tasks are not
        // written until they change (see `initial_tasks`), so a million
        // frames cost one record.
        let tasks = initial_tasks(&job)?;
        debug_assert_eq!(tasks.len(), task_count);
        let built = started.elapsed();
        let n = tasks.len();
        let ticket = {
            let mut st = self.lock();
            if let (Some(d), Some(info)) = (sub.file_set, file_set) {
                st.file_sets.insert(d, info.blobs.into());
            }
            let ticket = self.commit(&st, vec![Owned::Job(Box::new(job.clone()))]);
            st.install(job, tasks, now);
            ticket
        };
        let installed = started.elapsed();
        ticket.wait()?;
        tracing::info!(
            job = %id,
            tasks = n,
            build_ms = built.as_millis() as u64,
            install_ms = (installed - built).as_millis() as u64,
            "job submitted"
        );
        Ok(id)
    }

    /// Checks a submitted file set: a valid message whose entries are all stored.
    fn check_file_set(
        &self,
        d: &Digest,
        scene: &Digest,
    ) -> Result<crate::model::fileset::FileSetInfo, Error> {
        let bytes = self.blobs.read(d).map_err(|e| match e {
            Error::NotFound(_) => Error::invalid(format!(
                "file set {d} has not been uploaded; upload it before submitting (tessera submit does this)"
            )),
            other => other,
        })?;
        let (set, info) = crate::model::fileset::check(&bytes, scene)?;
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

/// The tasks of `job` as it was submitted, derived from its record alone:
/// its frame set in chunks (runs of [`chunking::SPAN`] frames when the
/// farm sizes the tasks), or each frame's tiles in grid order. The store
/// holds a task's record only once it changed; recovery lays stored records
/// over these, and appends the tasks that leases carved (see `chunking`).
pub(super) fn initial_tasks(job: &Job) -> Result<Vec<Task>, Error> {
    let bad = |what: String| {
        Error::Internal(format!(
            "job {} cannot be rebuilt from its record: {what}; its record is corrupt or this is a bug; report it with the coordinator's log",
            job.id
        ))
    };
    let frames = FrameSet::parse(&job.frames, u64::MAX).map_err(|e| bad(e.to_string()))?;
    if !job.is_tiled() {
        return Ok(frames
            .chunks(match job.auto_chunked() {
                true => chunking::SPAN,
                false => job.chunk.max(1),
            })
            .into_iter()
            .enumerate()
            .map(|(i, f)| Task::new(job.id, i as u32, f))
            .collect());
    }
    let rects =
        tiles::split(job.width, job.height, job.grid, u32::MAX).map_err(|e| bad(e.to_string()))?;
    let mut tasks = Vec::with_capacity(frames.len() * rects.len());
    for &frame in frames.frames() {
        for (t, rect) in rects.iter().enumerate() {
            let tile = TileTask {
                index: t as u32,
                inner: *rect,
                rendered: tiles::with_overscan(*rect, job.overscan, job.width, job.height),
            };
            tasks.push(Task::new_tile(job.id, tasks.len() as u32, frame, tile));
        }
    }
    Ok(tasks)
}

impl Farm {
    /// Gives a job without an explicit `--blender` the version its scene was
    /// saved with (that line or newer within its major), and refuses a scene
    /// saved by a newer Blender than any worker has, naming the versions the
    /// farm has. A farm with no workers yet refuses nothing: the job waits.
    fn check_blender(
        &self,
        req: &mut Requirements,
        saved: Option<(u16, u16)>,
        scene_name: &str,
    ) -> Result<(), Error> {
        let Some((major, minor)) = saved else {
            return Ok(());
        };
        if req.blender.is_none() {
            req.blender = Some(crate::model::runtime::VersionReq::saved_by(major, minor));
        }
        let st = self.lock();
        let runtimes: Vec<&crate::model::runtime::Runtime> =
            st.workers.values().flat_map(|w| &w.runtimes).collect();
        let newest = runtimes
            .iter()
            .map(|r| (r.version.major, r.version.minor))
            .max();
        if newest.is_some_and(|n| n < (major, minor)) {
            return Err(Error::invalid(format!(
                "{scene_name} was saved by Blender {major}.{minor}, newer than every Blender on the farm ({}); add a worker with `tessera worker --blender {major}.{minor}`, or save the scene with one of those",
                crate::model::runtime::versions(runtimes)
            )));
        }
        Ok(())
    }
}
