//! Results: a completed task, a failed attempt, and what each does to its
//! job (done, retried elsewhere, failed with the reason).

use super::*;

/// A result recorded in memory and on its way to the store.
#[must_use = "a result counts once its ticket says it is stored"]
pub struct PendingResult {
    /// Whether it was recorded or a duplicate.
    pub completion: Completion,
    /// Wait for it before acknowledging the result.
    pub ticket: Ticket,
    /// A tiled frame whose last tile this was: stitch it once stored.
    pub stitch: Option<(JobId, u32)>,
}

impl Farm {
    /// Records a task's result. Every output blob must already be stored.
    pub fn complete(&self, lease: LeaseId, outputs: Vec<FrameOutput>) -> Result<Completion, Error> {
        self.complete_with_stats(lease, outputs, Vec::new(), Vec::new())
    }

    /// Records a task's result with what Blender stamped into its frames and
    /// the worker's warnings for the job.
    pub fn complete_with_stats(
        &self,
        lease: LeaseId,
        outputs: Vec<FrameOutput>,
        stats: Vec<crate::model::verify::FrameStats>,
        warnings: Vec<String>,
    ) -> Result<Completion, Error> {
        let pending = self.complete_begin_with_stats(lease, outputs, stats, warnings)?;
        pending.ticket.wait()?;
        if let Some((job, frame)) = pending.stitch {
            self.stitch_ready(job, frame);
        }
        Ok(pending.completion)
    }

    /// Stitches a frame whose last tile was just stored. The result is
    /// recorded already; a stitch that fails now is retried from the stitch
    /// queue, so the worker is not told its result failed.
    pub fn stitch_ready(&self, job: JobId, frame: u32) {
        if let Err(e) = self.stitch_frame(job, frame) {
            tracing::warn!(%job, frame, "stitch deferred: {e}");
        }
    }

    /// Records a task's result in memory and queues it for the store, under
    /// the lock and without waiting: the caller waits for the ticket (on a
    /// thread, or in async code without blocking), then stitches.
    pub fn complete_begin(
        &self,
        lease: LeaseId,
        outputs: Vec<FrameOutput>,
    ) -> Result<PendingResult, Error> {
        self.complete_begin_with_stats(lease, outputs, Vec::new(), Vec::new())
    }

    /// [`Farm::complete_begin`] with the frames' render statistics and the
    /// worker's warnings (kept with the job, see [`Job::add_warnings`]). A
    /// result of a task sampled for verification is held until a second
    /// worker agrees ([`crate::model::verify`]).
    pub fn complete_begin_with_stats(
        &self,
        lease: LeaseId,
        outputs: Vec<FrameOutput>,
        stats: Vec<crate::model::verify::FrameStats>,
        warnings: Vec<String>,
    ) -> Result<PendingResult, Error> {
        self.complete_begin_asking(lease, outputs, stats, warnings, None)
            .map(|(pending, _)| pending)
    }

    /// [`Farm::complete_begin_with_stats`] that also leases the reporting
    /// slot's next task (`next`, asked with the result) under the same take
    /// of the lock, right after the result is recorded, so that the two
    /// changes share a commit. The lease is `None` when it was not granted
    /// here (a duplicate result, one held for verification, a worker or a
    /// coordinator that cannot lease now): the caller then leases with a
    /// call of its own, which says why where there is a reason.
    pub fn complete_begin_asking(
        &self,
        lease: LeaseId,
        outputs: Vec<FrameOutput>,
        stats: Vec<crate::model::verify::FrameStats>,
        warnings: Vec<String>,
        next: Option<&NextAsk>,
    ) -> Result<(PendingResult, Option<NextLease>), Error> {
        for o in &outputs {
            check_output(o)?;
        }
        tracing::info!(job = %lease.job, task = lease.task, lease = %lease, outputs = outputs.len(), "task result received");
        let now = self.clock.now_ms();
        // First without the lock: a blob store that does not answer costs
        // this call its retries, not every other call waiting on the lock.
        if let Some(h) = self.blobs_health().filter(|h| !h.up()) {
            return Err(Error::StoreUnavailable(format!(
                "{}; the result is kept by its worker and reported again",
                h.line()
            )));
        }
        // Every blob is checked without the lock; under it, no collection
        // pass may have started or ended since (else the check runs again),
        // and none may be deleting one of them now: so none was deleted
        // between the check and the record that references it.
        let mut st = loop {
            let epoch = self.passes.epoch();
            for o in &outputs {
                // A blob store that does not answer is not a missing blob:
                // the worker keeps the result and reports it again.
                if self.blobs.try_size(&o.digest)?.is_none() {
                    return Err(missing_output(o));
                }
            }
            let st = self.lock();
            if let Some(o) = outputs.iter().find(|o| st.blobs.is_collecting(&o.digest)) {
                return Err(missing_output(o));
            }
            if self.passes.epoch() == epoch {
                break st;
            }
        };
        let (ready, ticket, leased) = {
            let (mut task, mut job) = Self::find(&st, lease)?;
            let holder = task.holder().cloned();
            let since = match task.state {
                TaskState::Leased { since_ms, .. } if since_ms > 0 => Some(since_ms),
                _ => None,
            };
            let current =
                matches!(task.state, TaskState::Leased { grant, .. } if grant == lease.grant);
            let (outputs, extra) =
                match self.verify_result(&mut st, lease, &mut task, &job, outputs, stats)? {
                    verification::Step::Deliver(outputs, extra) => (outputs, extra),
                    verification::Step::Answer(pending) => return Ok((pending, None)),
                    verification::Step::Unsettled(why) => {
                        drop(st);
                        self.fail(lease, &why, "", FailureScope::Everywhere)?;
                        return Ok((
                            PendingResult {
                                completion: Completion::Recorded,
                                ticket: Ticket::none(),
                                stitch: None,
                            },
                            None,
                        ));
                    }
                };
            let completion = task
                .complete(lease.grant, outputs)
                .map_err(|e| Self::explain_lost(&st, lease, e))?;
            if completion == Completion::Recorded && !current {
                // Another grant's result came first: the holder's render is wasted.
                Self::ending(
                    &mut st,
                    lease.job,
                    lease.task,
                    crate::model::usage::AttemptEnd::Canceled,
                );
            }
            if let (Completion::Recorded, Some(since)) = (completion, since) {
                let secs = now.saturating_sub(since) as f64 / 1000.0;
                self.count_stat(|stats| {
                    if let Some(b) = DURATION_BUCKETS.iter().position(|&b| secs <= b) {
                        stats.duration_buckets[b] += 1;
                    }
                    stats.duration_sum += secs;
                    stats.duration_count += 1;
                });
            }
            if completion == Completion::Duplicate {
                tracing::info!(lease = %lease, "duplicate result ignored");
                return Ok((
                    PendingResult {
                        completion,
                        ticket: Ticket::none(),
                        stitch: None,
                    },
                    None,
                ));
            }
            tracing::debug!(lease = %lease, "task done");
            // Stored with the result's own write of the job record.
            if job.add_warnings(&warnings) {
                tracing::info!(job = %job.id, "job warning: {}", warnings.join("; "));
            }
            let frame = task.frames[0];
            let was_done = st.tasks[&lease.job][task.index as usize].is_done();
            let done =
                st.schedule.job(lease.job).map_or(0, |i| i.counts().done) + u32::from(!was_done);
            if !job.is_tiled() && !job.state.is_final() && done == job.task_count {
                job.finish(now)?;
                tracing::info!(job = %job.id, "job done");
            }
            let ticket = self.store_result(&mut st, task, job, holder.as_ref(), extra);
            let leased = next.and_then(|ask| self.lease_with_result(&mut st, ask));
            (
                st.finishing.wants_stitch(lease.job, frame).then_some(frame),
                ticket,
                leased,
            )
        };
        Ok((
            PendingResult {
                completion: Completion::Recorded,
                ticket,
                stitch: ready.map(|frame| (lease.job, frame)),
            },
            leased,
        ))
    }

    /// Records a failed attempt; the task is retried elsewhere or, out of
    /// attempts, fails its job. The reporter's `scope` decides how far its
    /// word goes: a failure no worker can fix fails the job now; one only this
    /// machine has fails it only when a second worker agrees or when no other
    /// worker could take the task.
    pub fn fail(
        &self,
        lease: LeaseId,
        reason: &str,
        log_tail: &str,
        scope: FailureScope,
    ) -> Result<FailOutcome, Error> {
        let reason: String = reason.chars().take(2000).collect();
        let tail: String = {
            let chars: Vec<char> = log_tail.chars().collect();
            chars[chars.len().saturating_sub(8000)..].iter().collect()
        };
        let message = if tail.trim().is_empty() {
            reason.clone()
        } else {
            format!("{reason}\n--- blender log (tail) ---\n{}", tail.trim_end())
        };
        let now = self.clock.now_ms();
        let mut st = self.lock();
        let (mut task, mut job) = Self::find(&st, lease)?;
        let holder = task.holder().cloned();
        // Why this one failure ends the job, when it does.
        let mut final_word = match scope {
            FailureScope::Everywhere => Some("cannot be rendered anywhere"),
            _ => None,
        };
        if let (FailureScope::Machine, Some(h)) = (scope, &holder) {
            let agreed = task.machine_failed_on.iter().any(|w| w != h);
            if !task.machine_failed_on.contains(h) {
                task.machine_failed_on.push(h.clone());
            }
            let someone_else = st.workers.values().any(|w| {
                &w.id != h
                    && !task.machine_failed_on.contains(&w.id)
                    && self.available(&st, w, now)
                    && capable(&job, w)
                    && job
                        .failures_by_worker
                        .get(&w.id.0)
                        .is_none_or(|n| *n < self.config.block_after)
            });
            if agreed {
                final_word = Some("failed the same way on two workers");
            } else if !someone_else {
                final_word = Some("failed on the only worker that could take them");
            }
        }
        let max = if final_word.is_some() {
            1
        } else {
            job.max_attempts
        };
        if let Some(h) = &holder {
            let n = job.failures_by_worker.entry(h.0.clone()).or_default();
            *n += 1;
            if *n == self.config.block_after {
                tracing::warn!(job = %job.id, worker = %h, "worker blocked for this job after {n} failures");
            }
        }
        let outcome = task
            .fail(lease.grant, message.clone(), max)
            .map_err(|e| Self::explain_lost(&st, lease, e))?;
        self.count_stat(|s| s.attempts_failed += 1);
        let mut changed = Vec::new();
        if outcome == FailOutcome::Failed && !job.state.is_final() {
            let what = match final_word {
                Some(why) => format!("frames {:?} {why}: {}", task.frames, message),
                None => format!(
                    "frames {:?} failed {} times; last error: {}",
                    task.frames, task.failures, message
                ),
            };
            job.fail(what, now)?;
            changed = Self::canceled_siblings(&st, lease.job, task.index);
            tracing::warn!(job = %job.id, "job failed: {reason}");
        } else {
            tracing::warn!(lease = %lease, "task failed, will retry: {reason}");
        }
        changed.push(task);
        let ticket = self.apply(&mut st, changed, job, holder.as_ref().map(|h| (h, false)));
        drop(st);
        ticket.wait()?;
        Ok(outcome)
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

/// A result names a blob the store does not hold (never uploaded, or
/// collected): the worker uploads it again, then reports the result.
fn missing_output(o: &FrameOutput) -> Error {
    Error::NotFound(format!(
        "blob {} of frame {} (it was not uploaded, or was collected); upload it again, then report the result",
        o.digest, o.frame
    ))
}
