//! Results, the stitch queue and blob collection.
//!
//! A completed tile makes its frame ready once every tile of the frame is
//! done; the frame then sits in the stitch queue ([`State::to_stitch`],
//! derived from the records) until it is stitched, so no path (a cancel
//! during a stitch, a retry after one, a crash, a failed read) can leave a
//! job running forever. A failed stitch never deletes tiles: a tile that
//! cannot be used is rendered again, a read error is retried with backoff,
//! and only an error no re-render can fix fails the job. Tiles are deleted by
//! [`Farm::collect_garbage`] once no record references them and nobody has
//! touched them for a grace period.

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

impl Farm {
    /// Records a task's result. Every output blob must already be stored.
    pub fn complete(&self, lease: LeaseId, outputs: Vec<FrameOutput>) -> Result<Completion, Error> {
        for o in &outputs {
            check_output(o)?;
        }
        let now = self.clock.now_ms();
        let ready = {
            let mut st = self.lock();
            // Checked under the lock, so the collector cannot delete a blob
            // between this check and the record that references it.
            for o in &outputs {
                if !self.blobs.contains(&o.digest) {
                    return Err(Error::NotFound(format!(
                        "blob {} of frame {} (it was not uploaded, or was collected); upload it again, then report the result",
                        o.digest, o.frame
                    )));
                }
            }
            let (mut task, mut job) = Self::find(&st, lease)?;
            let holder = task.holder().cloned();
            let since = match task.state {
                TaskState::Leased { since_ms, .. } if since_ms > 0 => Some(since_ms),
                _ => None,
            };
            let completion = task.complete(lease.grant, outputs)?;
            if let (Completion::Recorded, Some(since)) = (completion, since) {
                let secs = now.saturating_sub(since) as f64 / 1000.0;
                let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(b) = DURATION_BUCKETS.iter().position(|&b| secs <= b) {
                    stats.duration_buckets[b] += 1;
                }
                stats.duration_sum += secs;
                stats.duration_count += 1;
            }
            if completion == Completion::Duplicate {
                tracing::info!(lease = %lease, "duplicate result ignored");
                return Ok(completion);
            }
            tracing::info!(lease = %lease, "task done");
            let frame = task.frames[0];
            if !job.is_tiled()
                && !job.state.is_final()
                && st.tasks[&lease.job]
                    .iter()
                    .all(|t| t.index == task.index || t.is_done())
            {
                job.finish(now)?;
                tracing::info!(job = %job.id, "job done");
            }
            self.apply(&mut st, vec![task], job, holder.as_ref().map(|h| (h, true)))?;
            st.to_stitch.contains(&(lease.job, frame)).then_some(frame)
        };
        if let Some(frame) = ready {
            // The result is recorded; a stitch that fails now is retried from
            // the stitch queue, so the worker is not told its result failed.
            if let Err(e) = self.stitch_frame(lease.job, frame) {
                tracing::warn!(job = %lease.job, frame, "stitch deferred: {e}");
            }
        }
        Ok(Completion::Recorded)
    }

    /// Stitches every frame in the stitch queue whose backoff has passed;
    /// returns how many were tried. The coordinator calls this at start and
    /// on every tick of its reaper.
    pub fn stitch_pending(&self) -> usize {
        let now = self.clock.now_ms();
        let due: Vec<(JobId, u32)> = {
            let st = self.lock();
            st.to_stitch
                .iter()
                .filter(|k| {
                    st.stitch_errors
                        .get(k)
                        .is_none_or(|(_, not_before)| *not_before <= now)
                })
                .copied()
                .collect()
        };
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
        let pieces: Vec<crate::stitch::TilePiece<'_>> = parts
            .tiles
            .iter()
            .zip(&images)
            .map(
                |((inner, rendered, _, _), bytes)| crate::stitch::TilePiece {
                    inner: *inner,
                    rendered: *rendered,
                    bytes,
                },
            )
            .collect();
        let (bytes, ext) = match crate::stitch::stitch_within(
            self.config.max_pixels,
            parts.width,
            parts.height,
            &pieces,
        ) {
            Ok(ok) => ok,
            Err(e) => return self.stitch_refused(id, frame, &parts, e),
        };
        let digest = Digest::of(&bytes);
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
        if !st.to_stitch.contains(&(id, frame)) {
            // Canceled, paused into a retry, or stitched by someone else
            // meanwhile; the new blob is unreferenced and will be collected.
            st.garbage.entry(digest).or_insert(now);
            return Ok(());
        }
        let mut job = st.jobs[&id].clone();
        job.stitched.push(out);
        job.stitched.sort_by_key(|o| o.frame);
        if job.stitched.len() as u32 >= job.frame_count {
            job.finish(now)?;
            tracing::info!(job = %id, "job done");
        }
        self.store.write(&[Record::Job(&job)])?;
        tracing::info!(job = %id, frame, tiles = parts.tiles.len(), ms = started.elapsed().as_millis() as u64, "frame stitched");
        st.stitch_errors.remove(&(id, frame));
        // The frame now references its own blob; its tiles' references go,
        // and the collector deletes them after the grace period.
        st.install(job, Vec::new(), now);
        Ok(())
    }

    /// The tiles of a queued frame, or None when it is not queued.
    fn parts(&self, id: JobId, frame: u32) -> Result<Option<Parts>, Error> {
        let st = self.lock();
        if !st.to_stitch.contains(&(id, frame)) {
            return Ok(None);
        }
        let job = st
            .jobs
            .get(&id)
            .ok_or_else(|| Error::NotFound(format!("job {id}")))?;
        let tiles = st.tasks[&id]
            .iter()
            .filter(|t| t.frames[0] == frame)
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
        let entry = st.stitch_errors.entry((id, frame)).or_insert((0, 0));
        entry.0 += 1;
        let tries = entry.0;
        entry.1 = now + (STITCH_BACKOFF_MS << (tries - 1).min(10));
        tracing::warn!(job = %id, frame, tries, "cannot read a tile to stitch: {e}");
        if tries < MAX_STITCH_TRIES {
            return Ok(());
        }
        st.stitch_errors.remove(&(id, frame));
        let reason = format!(
            "frame {frame} could not be stitched: its tiles could not be read {tries} times ({e}); check the coordinator's --data volume, then `tessera retry {id}`"
        );
        self.fail_job_locked(&mut st, id, reason, now)
    }

    /// The stitcher refused the tiles: a bad tile is rendered again; an error
    /// no re-render can fix fails the job (its tiles are kept for a retry).
    fn stitch_refused(
        &self,
        id: JobId,
        frame: u32,
        parts: &Parts,
        e: crate::stitch::StitchError,
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
        self.fail_job_locked(&mut st, id, reason, now)
    }

    /// Sends a done tile back to the queue (charging an attempt), or fails the
    /// job when the tile is out of attempts.
    fn rerender_tile(&self, id: JobId, frame: u32, task: u32, why: String) -> Result<(), Error> {
        let now = self.clock.now_ms();
        let mut st = self.lock();
        if !st.to_stitch.contains(&(id, frame)) {
            return Ok(());
        }
        let mut job = st.jobs[&id].clone();
        let mut t = st.tasks[&id][task as usize].clone();
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
        self.apply(&mut st, changed, job, None)?;
        drop(st);
        self.queued.notify_waiters();
        Ok(())
    }

    /// Fails job `id` with `reason`, canceling its unfinished tasks.
    pub(super) fn fail_job_locked(
        &self,
        st: &mut State,
        id: JobId,
        reason: String,
        now: u64,
    ) -> Result<(), Error> {
        let mut job = st.jobs[&id].clone();
        if job.state.is_final() {
            return Ok(());
        }
        tracing::warn!(job = %id, "job failed: {reason}");
        job.fail(reason, now)?;
        let changed = Self::canceled_siblings(st, id, u32::MAX);
        self.apply(st, changed, job, None)?;
        self.queued.notify_waiters();
        Ok(())
    }

    /// Canceled copies of the unfinished tasks of job `id`, but `except`.
    pub(super) fn canceled_siblings(st: &State, id: JobId, except: u32) -> Vec<Task> {
        st.tasks[&id]
            .iter()
            .filter(|t| t.index != except && !t.is_done())
            .cloned()
            .map(|mut t| {
                t.cancel();
                t
            })
            .collect()
    }

    /// Notes that a client or worker uploaded or asked about these blobs: the
    /// collector leaves them alone for a grace period, since a result naming
    /// them may be on its way.
    pub fn touch_blobs(&self, digests: &[Digest]) {
        let now = self.clock.now_ms();
        let mut st = self.lock();
        for d in digests {
            st.touched.insert(*d, now);
        }
    }

    /// How long an unreferenced, untouched blob is kept.
    fn grace_ms(&self) -> u64 {
        self.config.blob_grace_ms
    }

    /// Deletes blobs that no record references, once nobody has touched them
    /// for the grace period; returns how many were deleted.
    pub fn collect_garbage(&self) -> usize {
        let now = self.clock.now_ms();
        let grace = self.grace_ms();
        let mut st = self.lock();
        st.touched.retain(|_, t| *t + grace > now);
        let due: Vec<Digest> = st
            .garbage
            .iter()
            .filter(|(_, since)| **since + grace <= now)
            .map(|(d, _)| *d)
            .collect();
        let mut deleted = 0;
        for d in due {
            if st.refs.count(&d) > 0 {
                st.garbage.remove(&d);
            } else if !st.touched.contains_key(&d) {
                // Under the lock: `complete` checks blobs under it too.
                match self.blobs.remove(&d) {
                    Ok(()) => {
                        st.garbage.remove(&d);
                        deleted += 1;
                    }
                    Err(e) => tracing::warn!("cannot remove blob {d}: {e}"),
                }
            }
        }
        if deleted > 0 {
            tracing::debug!(deleted, "unreferenced blobs collected");
        }
        deleted
    }
}

/// Refuses an output whose extension is not a plain file extension (pass
/// names are checked by [`Task::complete`], with the task's frames).
fn check_output(o: &FrameOutput) -> Result<(), Error> {
    if o.ext.is_empty() || o.ext.len() > 8 || !o.ext.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(Error::invalid(format!(
            "`{}` is not a file extension",
            o.ext
        )));
    }
    Ok(())
}
