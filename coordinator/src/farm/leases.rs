//! Leases: granting tasks to slots, renewals, failures with their scope,
//! releases and expiry.

use super::*;

impl Farm {
    /// Leases the best task for `worker` now, if any.
    pub fn try_lease(
        &self,
        worker: &WorkerId,
        cached: &HashSet<Digest>,
    ) -> Result<Option<Assignment>, Error> {
        self.try_lease_warm(worker, cached, None, 0)
    }

    /// Leases the best task for a slot that holds `warm`'s Blender session.
    pub fn try_lease_warm(
        &self,
        worker: &WorkerId,
        cached: &HashSet<Digest>,
        warm: Option<JobId>,
        slot: u32,
    ) -> Result<Option<Assignment>, Error> {
        let now = self.clock.now_ms();
        let mut st = self.lock();
        Self::touch(&mut st, worker, now)?;
        if st.health.get(worker).is_some_and(|h| h.drain.is_some()) {
            return Ok(None);
        }
        let online = st.workers.values().filter(|w| self.online(w, now)).count();
        let record = &st.workers[worker];
        let cap = record.slot_cap(slot);
        let tags = record.tags.clone();
        let features = record.features.clone();
        let available = |w: &WorkerRecord| self.available(&st, w, now);
        let Some((job_id, index)) = pick(
            &st,
            &Asker {
                worker,
                cached,
                warm,
                slot: &cap,
                tags: &tags,
                available: &available,
                features: &features,
            },
            online,
            self.config.block_after,
        ) else {
            return Ok(None);
        };
        let State { jobs, tasks, .. } = &mut *st;
        let job = jobs.get_mut(&job_id).expect("picked job exists");
        let task = &mut tasks.get_mut(&job_id).expect("picked job has tasks")[index];
        let mut new_task = task.clone();
        let lease = new_task.lease(worker, now, self.config.lease_ttl_ms)?;
        let mut new_job = job.clone();
        new_job.start()?;
        self.store
            .write(&[Record::Task(&new_task), Record::Job(&new_job)])?;
        tracing::info!(lease = %lease, worker = %worker, frames = ?new_task.frames, "task leased");
        self.stats
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .leases_granted += 1;
        let assignment = Assignment {
            lease,
            scene: job.scene,
            scene_name: job.scene_name.clone(),
            frames: new_task.frames.clone(),
            attempt: new_task.failures + 1,
            ttl_ms: self.config.lease_ttl_ms,
            tile: new_task.tile.map(|t| AssignedTile {
                rendered: t.rendered,
                frame: (job.width, job.height),
                border: tiles::blender_border(t.rendered, job.width, job.height),
            }),
            device: job.requirements.device_for(&cap),
            file_set: job.file_set,
        };
        *task = new_task;
        *job = new_job;
        Self::note_grant(&mut st, lease, worker);
        Ok(Some(assignment))
    }

    /// Leases a task for a slot of `worker`, waiting up to `wait` for one to
    /// become ready. Returns early, without a task, when the job the slot
    /// holds warm has ended, so that the worker closes that session at once.
    pub async fn lease(
        &self,
        worker: &WorkerId,
        cached: &HashSet<Digest>,
        warm: Option<JobId>,
        slot: u32,
        wait: Duration,
    ) -> Result<LeaseOutcome, Error> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = self.queued.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let ended: Vec<JobId> = warm
                .filter(|j| {
                    self.lock()
                        .jobs
                        .get(j)
                        .is_none_or(|job| job.state.is_final())
                })
                .into_iter()
                .collect();
            let task = self.try_lease_warm(worker, cached, warm, slot)?;
            if task.is_some() || !ended.is_empty() {
                return Ok(LeaseOutcome { task, ended });
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Ok(LeaseOutcome { task: None, ended });
            }
        }
    }

    /// Copies of the task named by `lease` and of its job, for a change to
    /// be computed on before it is written.
    pub(super) fn find(st: &State, lease: LeaseId) -> Result<(Task, Job), Error> {
        let job = st
            .jobs
            .get(&lease.job)
            .ok_or_else(|| Error::NotFound(format!("job {}", lease.job)))?;
        let task = st
            .tasks
            .get(&lease.job)
            .and_then(|t| t.get(lease.task as usize))
            .ok_or_else(|| Error::NotFound(format!("task {}.{}", lease.job, lease.task)))?;
        Ok((task.clone(), job.clone()))
    }

    /// Writes changed records, then installs them in memory.
    pub(super) fn apply(
        &self,
        st: &mut State,
        changed: Vec<Task>,
        job: Job,
        worker: Option<(&WorkerId, bool)>,
    ) -> Result<(), Error> {
        let worker_rec = worker.and_then(|(w, ok)| {
            st.workers.get(w).cloned().map(|mut r| {
                if ok {
                    r.tasks_done += 1;
                } else {
                    r.tasks_failed += 1;
                }
                r
            })
        });
        let mut records: Vec<Record<'_>> = changed.iter().map(Record::Task).collect();
        if let Some(r) = worker_rec.as_ref() {
            records.push(Record::Worker(r));
        }
        records.push(Record::Job(&job));
        self.store.write(&records)?;
        st.install(job, changed, self.clock.now_ms());
        if let Some(r) = worker_rec {
            st.workers.insert(r.id.clone(), r);
        }
        Ok(())
    }

    /// Renews a lease and records progress. Returns whether the holder should
    /// keep going (false when the lease was lost or the job ended).
    pub fn progress(
        &self,
        lease: LeaseId,
        frames_done: u32,
        samples: (u32, u32),
    ) -> Result<bool, Error> {
        let now = self.clock.now_ms();
        let mut st = self.lock();
        let ttl = self.config.lease_ttl_ms;
        let State { tasks, workers, .. } = &mut *st;
        let Some(task) = tasks
            .get_mut(&lease.job)
            .and_then(|t| t.get_mut(lease.task as usize))
        else {
            return Ok(false);
        };
        if let Some(w) = task.holder().and_then(|h| workers.get_mut(h)) {
            w.last_seen_ms = now;
        }
        let held = task.renew(lease.grant, frames_done, now, ttl).is_ok();
        if held {
            (task.samples_done, task.samples_total) = samples;
        }
        Ok(held)
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
        let outcome = task.fail(lease.grant, message.clone(), max)?;
        self.stats
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .attempts_failed += 1;
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
        self.apply(&mut st, changed, job, holder.as_ref().map(|h| (h, false)))?;
        drop(st);
        self.queued.notify_waiters();
        Ok(outcome)
    }

    /// Whether `w` takes work now: online and not drained.
    pub(super) fn available(&self, st: &State, w: &WorkerRecord, now: u64) -> bool {
        self.online(w, now) && st.health.get(&w.id).is_none_or(|h| h.drain.is_none())
    }

    /// Gives a task back without charging an attempt (worker shutting down).
    pub fn release(&self, lease: LeaseId) -> Result<(), Error> {
        let mut st = self.lock();
        let (mut task, job) = Self::find(&st, lease)?;
        task.release(lease.grant)?;
        self.apply(&mut st, vec![task], job, None)?;
        drop(st);
        tracing::info!(lease = %lease, "task released");
        self.queued.notify_waiters();
        Ok(())
    }

    /// Puts every task whose lease has run out back in the queue.
    pub fn expire_leases(&self) -> Result<usize, Error> {
        let now = self.clock.now_ms();
        let mut st = self.lock();
        let mut expired: Vec<Task> = Vec::new();
        for task in st.tasks.values().flatten() {
            let mut t = task.clone();
            if t.expire(now) {
                tracing::warn!(job = %t.job, task = t.index, holder = ?task.holder(), "lease expired; task back in the queue");
                expired.push(t);
            }
        }
        if expired.is_empty() {
            return Ok(0);
        }
        let records: Vec<Record<'_>> = expired.iter().map(Record::Task).collect();
        self.store.write(&records)?;
        let n = expired.len();
        self.stats
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .leases_expired += n as u64;
        for t in expired {
            let (job, i) = (t.job, t.index as usize);
            st.tasks.get_mut(&job).expect("job exists")[i] = t;
        }
        drop(st);
        self.queued.notify_waiters();
        Ok(n)
    }
}
