//! Results, the stitch queue and blob collection.
//!
//! A completed tile makes its frame ready once every tile of the frame is
//! done; the frame then sits in the stitch queue (`Finishing`,
//! derived from the records) until it is stitched, so no path (a cancel
//! during a stitch, a retry after one, a crash, a failed read) can leave a
//! job running forever. A failed stitch never deletes tiles: a tile that
//! cannot be used is rendered again, a read error is retried with backoff,
//! and only an error no re-render can fix fails the job. Tiles are deleted by
//! [`Farm::collect_garbage`] once no record references them and nobody has
//! touched them for a grace period.

use super::state::Change;
use super::*;

/// Read failures of one frame's tiles before its job fails.
const MAX_STITCH_TRIES: u32 = 5;

/// The first delay before a stitch that could not read its tiles is tried again.
const STITCH_BACKOFF_MS: u64 = 1000;

/// A frame's tiles as read for stitching.
struct Parts {
    width: u32,
    height: u32,
    /// (tile, rendered region, blob, task index)
    tiles: Vec<(Rect, Rect, Digest, u32)>,
}

/// What is left to finish once tasks are done: the stitch queue (frames of
/// open tiled jobs whose tiles are all done but that are not stitched yet),
/// stitch attempts that could not read their tiles, and the preview queue
/// (done jobs whose preview video is wanted and not made yet). The queues
/// are derived from the records ([`Finishing::apply`]), so a crash loses
/// nothing.
#[derive(Debug, Default)]
pub(super) struct Finishing {
    to_stitch: BTreeSet<(JobId, u32)>,
    /// Failed stitch attempts of a frame, and when the next may run (ms).
    stitch_errors: HashMap<(JobId, u32), (u32, u64)>,
    to_preview: BTreeSet<JobId>,
}

impl Finishing {
    /// Whether `frame` of job `id` waits to be stitched.
    pub(super) fn wants_stitch(&self, id: JobId, frame: u32) -> bool {
        self.to_stitch.contains(&(id, frame))
    }

    /// The frames to stitch now: queued, past their backoff.
    fn due(&self, now: u64) -> Vec<(JobId, u32)> {
        self.to_stitch
            .iter()
            .filter(|k| {
                self.stitch_errors
                    .get(k)
                    .is_none_or(|(_, not_before)| *not_before <= now)
            })
            .copied()
            .collect()
    }

    /// The first frame of job `id` that could not be stitched, and how
    /// many times it failed.
    pub(super) fn stalled(&self, id: JobId) -> Option<(u32, u32)> {
        self.stitch_errors
            .iter()
            .find(|((j, _), _)| *j == id)
            .map(|((_, f), (n, _))| (*f, *n))
    }

    /// Puts off the next attempt at `frame` until `not_before(tries)`;
    /// `spend` counts this failure against its tries. Returns the tries
    /// spent.
    fn put_off(
        &mut self,
        id: JobId,
        frame: u32,
        spend: bool,
        not_before: impl FnOnce(u32) -> u64,
    ) -> u32 {
        let entry = self.stitch_errors.entry((id, frame)).or_insert((0, 0));
        entry.0 += u32::from(spend);
        entry.1 = not_before(entry.0);
        entry.0
    }

    /// Forgets the failures of `frame` (stitched, or given up).
    fn settled(&mut self, id: JobId, frame: u32) {
        self.stitch_errors.remove(&(id, frame));
    }

    /// Jobs whose preview is due, oldest first.
    pub(super) fn previews(&self) -> impl Iterator<Item = JobId> + '_ {
        self.to_preview.iter().copied()
    }

    /// Takes a job's change in: its preview is due or not, and the frames
    /// it touched are queued for stitching when all their tiles are done.
    pub(super) fn apply(&mut self, change: &Change<'_>) {
        let (job, id) = (change.job, change.job.id);
        if job.preview.is_due(job.state == JobState::Done) {
            self.to_preview.insert(id);
        } else {
            self.to_preview.remove(&id);
        }
        if change.became_final {
            self.unqueue(id);
        } else if change.reopened || change.old_job.is_none() {
            self.queue_ready_frames(job, change.list, None);
        } else if !change.frames_touched.is_empty() {
            self.queue_ready_frames(job, change.list, Some(&change.frames_touched));
        }
    }

    /// Forgets job `id` (archived or deleted).
    pub(super) fn forget(&mut self, id: JobId) {
        self.to_preview.remove(&id);
        self.unqueue(id);
    }

    fn unqueue(&mut self, id: JobId) {
        let keys: Vec<(JobId, u32)> = self
            .to_stitch
            .range((id, 0)..=(id, u32::MAX))
            .copied()
            .collect();
        for k in keys {
            self.to_stitch.remove(&k);
        }
    }

    /// Puts the frames of `job` (or only `frames`) whose tiles are all
    /// done, and that are not stitched, in the stitch queue, and takes out
    /// those that are not.
    fn queue_ready_frames(
        &mut self,
        job: &Job,
        tasks: &[Arc<Task>],
        frames: Option<&BTreeSet<u32>>,
    ) {
        if !job.is_tiled() {
            return;
        }
        let mut state: BTreeMap<u32, bool> = BTreeMap::new();
        match frames {
            None => {
                for t in tasks {
                    *state.entry(t.frames[0]).or_insert(true) &= t.is_done();
                }
            }
            Some(frames) => {
                for &f in frames {
                    let all = state::frame_tasks(tasks, f).all(Task::is_done);
                    state.insert(f, all);
                }
            }
        }
        let open = !job.state.is_final();
        for (frame, all_done) in state {
            // Stitched frames are kept sorted by frame.
            let is_stitched = job
                .stitched
                .binary_search_by_key(&frame, |o| o.frame)
                .is_ok();
            if open && all_done && !is_stitched {
                self.to_stitch.insert((job.id, frame));
            } else {
                self.to_stitch.remove(&(job.id, frame));
            }
        }
    }
}

impl Farm {
    /// Stitches every frame in the stitch queue whose backoff has passed;
    /// returns how many were tried. The coordinator calls this at start and
    /// on every tick of its reaper.
    pub fn stitch_pending(&self) -> usize {
        let now = self.clock.now_ms();
        let due: Vec<(JobId, u32)> = { self.lock().finishing.due(now) };
        for &(job, frame) in &due {
            if let Err(e) = self.stitch_frame(job, frame) {
                tracing::warn!(%job, frame, "stitch deferred: {e}");
            }
        }
        due.len()
    }

    /// Stitches frames whose tiles all arrived before a crash cut stitching short.
    pub fn recover_stitching(&self) -> Result<(), Error> {
        let n = self.stitch_pending();
        if n > 0 {
            tracing::info!(
                frames = n,
                "stitched frames left over from before the restart"
            );
        }
        Ok(())
    }

    /// Assembles `frame` of a tiled job from its tiles, stores it, and ends the
    /// job when it was the last frame. A frame not in the stitch queue (already
    /// stitched, its job ended, a tile re-rendering) is left alone.
    pub fn stitch_frame(&self, id: JobId, frame: u32) -> Result<(), Error> {
        let Some(parts) = self.parts(id, frame)? else {
            return Ok(());
        };
        let started = std::time::Instant::now();
        let images: Result<Vec<Vec<u8>>, (u32, Error)> = parts
            .tiles
            .iter()
            .map(|(_, _, d, task)| self.blobs.read(d).map_err(|e| (*task, e)))
            .collect();
        let images = match images {
            Ok(images) => images,
            Err((task, e)) => return self.stitch_read_failed(id, frame, task, e),
        };
        let pieces: Vec<crate::imaging::stitch::TilePiece<'_>> = parts
            .tiles
            .iter()
            .zip(&images)
            .map(
                |((inner, rendered, _, _), bytes)| crate::imaging::stitch::TilePiece {
                    inner: *inner,
                    rendered: *rendered,
                    bytes,
                },
            )
            .collect();
        let (bytes, ext) = match crate::imaging::stitch::stitch_within(
            self.config.max_pixels,
            parts.width,
            parts.height,
            &pieces,
        ) {
            Ok(ok) => ok,
            Err(e) => return self.stitch_refused(id, frame, &parts, e),
        };
        let digest = Digest::of(&bytes);
        // The same bytes may be garbage a pass is deleting: wait for it, and
        // keep them from the next pass until the frame names them.
        self.touch_blobs_blocking(&[digest]);
        self.blobs.put(digest, &bytes)?;
        let out = FrameOutput {
            frame,
            digest,
            ext: ext.to_string(),
            size: bytes.len() as u64,
            pass: String::new(),
        };
        let now = self.clock.now_ms();
        let mut st = self.lock();
        if !st.finishing.wants_stitch(id, frame) {
            // Canceled, paused into a retry, or stitched by someone else
            // meanwhile; the new blob is unreferenced and will be collected.
            st.blobs.note_unreferenced(digest, now);
            return Ok(());
        }
        let mut job = st.jobs[&id].clone();
        let record = Owned::Stitched(id, out.clone());
        // Copies the frame list once (the state's job still shares it).
        let frames = std::sync::Arc::make_mut(&mut job.stitched);
        let at = frames.partition_point(|o| o.frame < out.frame);
        frames.insert(at, out);
        if job.stitched.len() as u32 >= job.frame_count {
            job.finish(now)?;
            tracing::info!(job = %id, "job done");
        }
        tracing::info!(job = %id, frame, tiles = parts.tiles.len(), ms = started.elapsed().as_millis() as u64, "frame stitched");
        st.finishing.settled(id, frame);
        // The frame now references its own blob; its tiles' references go,
        // and the collector deletes them after the grace period.
        let ticket = self.save(&mut st, job, Vec::new(), vec![record]);
        drop(st);
        ticket.wait()
    }

    /// The tiles of a queued frame, or None when it is not queued.
    fn parts(&self, id: JobId, frame: u32) -> Result<Option<Parts>, Error> {
        let st = self.lock();
        if !st.finishing.wants_stitch(id, frame) {
            return Ok(None);
        }
        let job = st
            .jobs
            .get(&id)
            .ok_or_else(|| Error::NotFound(format!("job {id}")))?;
        let tiles = st
            .tiles_of(id, frame)
            .filter_map(|t| match (&t.state, t.tile) {
                (TaskState::Done { outputs }, Some(tile)) => {
                    Some((tile.inner, tile.rendered, outputs.first()?.digest, t.index))
                }
                _ => None,
            })
            .collect();
        Ok(Some(Parts {
            width: job.width,
            height: job.height,
            tiles,
        }))
    }

    /// A tile could not be read: a lost blob is rendered again; any other
    /// read error is retried with backoff, and fails the job when it persists.
    fn stitch_read_failed(&self, id: JobId, frame: u32, task: u32, e: Error) -> Result<(), Error> {
        if let Error::NotFound(_) = e {
            return self.rerender_tile(id, frame, task, format!("its tile blob was lost ({e})"));
        }
        let now = self.clock.now_ms();
        let mut st = self.lock();
        if let Error::Unavailable(_) = e {
            // The blob store does not answer (`status` says so under
            // outages): the frame waits for it, however long, without
            // spending its tries.
            st.finishing
                .put_off(id, frame, false, |_| now + STITCH_BACKOFF_MS * 4);
            tracing::warn!(job = %id, frame, "cannot read a tile to stitch; waiting for the blob store: {e}");
            return Ok(());
        }
        let tries = st.finishing.put_off(id, frame, true, |tries| {
            now + (STITCH_BACKOFF_MS << (tries - 1).min(10))
        });
        tracing::warn!(job = %id, frame, tries, "cannot read a tile to stitch: {e}");
        if tries < MAX_STITCH_TRIES {
            return Ok(());
        }
        st.finishing.settled(id, frame);
        let reason = format!(
            "frame {frame} could not be stitched: its tiles could not be read {tries} times ({e}); check the coordinator's --data volume, then `tessera retry {id}`"
        );
        let ticket = self.fail_job_locked(&mut st, id, reason, now)?;
        drop(st);
        ticket.wait()
    }

    /// The stitcher refused the tiles: a bad tile is rendered again; an error
    /// no re-render can fix fails the job (its tiles are kept for a retry).
    fn stitch_refused(
        &self,
        id: JobId,
        frame: u32,
        parts: &Parts,
        e: crate::imaging::stitch::StitchError,
    ) -> Result<(), Error> {
        tracing::error!(job = %id, frame, "cannot stitch: {e}");
        let bad = e
            .tile()
            .and_then(|r| parts.tiles.iter().find(|(inner, ..)| *inner == r));
        if let Some((_, _, _, task)) = bad {
            return self.rerender_tile(id, frame, *task, e.to_string());
        }
        let now = self.clock.now_ms();
        let mut st = self.lock();
        let reason = format!("frame {frame} could not be stitched from its tiles: {e}");
        let ticket = self.fail_job_locked(&mut st, id, reason, now)?;
        drop(st);
        ticket.wait()
    }

    /// Sends a done tile back to the queue (charging an attempt), or fails the
    /// job when the tile is out of attempts.
    fn rerender_tile(&self, id: JobId, frame: u32, task: u32, why: String) -> Result<(), Error> {
        let now = self.clock.now_ms();
        let mut st = self.lock();
        if !st.finishing.wants_stitch(id, frame) {
            return Ok(());
        }
        let mut job = st.jobs[&id].clone();
        let mut t = Task::clone(&st.tasks[&id][task as usize]);
        let reason = format!("tile {task} of frame {frame} is rendered again: {why}");
        tracing::warn!(job = %id, "{reason}");
        let mut changed = Vec::new();
        if t.rerender(reason.clone(), job.max_attempts)? == FailOutcome::Failed {
            job.fail(
                format!("frame {frame} could not be stitched: {reason}, out of attempts"),
                now,
            )?;
            changed = Self::canceled_siblings(&st, id, t.index);
        }
        changed.push(t);
        let ticket = self.apply(&mut st, changed, job, None);
        drop(st);
        ticket.wait()
    }

    /// Fails job `id` with `reason`, canceling its unfinished tasks.
    pub(super) fn fail_job_locked(
        &self,
        st: &mut State,
        id: JobId,
        reason: String,
        now: u64,
    ) -> Result<Ticket, Error> {
        let mut job = st.jobs[&id].clone();
        if job.state.is_final() {
            return Ok(Ticket::none());
        }
        tracing::warn!(job = %id, "job failed: {reason}");
        job.fail(reason, now)?;
        let changed = Self::canceled_siblings(st, id, u32::MAX);
        Ok(self.apply(st, changed, job, None))
    }

    /// Canceled copies of the unfinished tasks of job `id`, but `except`.
    pub(super) fn canceled_siblings(st: &State, id: JobId, except: u32) -> Vec<Task> {
        st.tasks[&id]
            .iter()
            .filter(|t| t.index != except && !t.is_done())
            .map(|t| Task::clone(t))
            .map(|mut t| {
                t.cancel();
                t
            })
            .collect()
    }
}
