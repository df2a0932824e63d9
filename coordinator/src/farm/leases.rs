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
        let started = std::time::Instant::now();
        let leased = self.lease_locked(&mut self.lock(), worker, cached, warm, slot, false)?;
        match leased {
            Some((a, ticket)) => {
                ticket.wait()?;
                self.lease_served(started);
                Ok(Some(a))
            }
            None => Ok(None),
        }
    }

    /// Leases a task ahead for a slot of `worker` that is still rendering,
    /// so that it starts the task as soon as its render ends: at once, never
    /// parked, and only when [`Farm::spare`] says no idle slot is denied it.
    /// A slot holds at most one task ahead. Answers no ended jobs: the
    /// slot's next plain lease call brings them.
    pub async fn lease_ahead(
        &self,
        worker: &WorkerId,
        cached: &HashSet<Digest>,
        warm: Option<JobId>,
        slot: u32,
    ) -> Result<LeaseOutcome, Error> {
        if let Some(why) = self.stopped() {
            return Err(Error::NotActive(format!(
                "this coordinator stepped down: {why}; use the active coordinator"
            )));
        }
        let started = std::time::Instant::now();
        let leased = self.lease_locked(&mut self.lock(), worker, cached, warm, slot, true)?;
        let task = match leased {
            Some((assignment, ticket)) => {
                ticket.stored().await?;
                self.lease_served(started);
                Some(assignment)
            }
            None => None,
        };
        Ok(LeaseOutcome {
            task,
            ended: Vec::new(),
        })
    }

    /// Whether job `id` has a ready task to spare for `slot` of `worker`,
    /// which is busy rendering: the slot holds no other task ahead (it
    /// holds at most three leases: one it reports, one it renders, one
    /// ahead), and
    /// after the grant the job keeps a ready task for every parked lease
    /// call (an idle slot) that could render it and for every other slot
    /// now rendering it. Idle slots so always come first, and the last
    /// tasks of a job go to whichever slot frees first, as without leasing
    /// ahead, instead of queueing behind one slot's render.
    fn spare(st: &State, id: JobId, worker: &WorkerId, slot: u32) -> bool {
        let (Some(job), Some(index)) = (st.jobs.get(&id), st.schedule.job(id)) else {
            return false;
        };
        // The cheap counts first: at a job's tail, with thousands of slots
        // parked, counting the idle ones for every ask would cost a pass
        // over them each.
        let ready = index.ready_units(job);
        let others = chunking::other_slots(st, id, worker, slot);
        if ready <= others {
            return false;
        }
        let mine = st.schedule.held_by(worker).map_or(0, |held| {
            held.iter()
                .filter(|&&(j, t)| {
                    matches!(
                        st.tasks.get(&j).and_then(|l| l.get(t as usize)),
                        Some(t) if matches!(t.state, TaskState::Leased { slot: s, .. } if s == slot)
                    )
                })
                .count()
        });
        if mine > 2 {
            return false;
        }
        // Idle slots come first: counted only up to what there is to spare.
        let idle = st.schedule.waiting_up_to(job, &st.workers, ready - others);
        ready > idle + others
    }

    /// Leases the best task for a slot under the lock (`ahead`: for a slot
    /// still rendering, see [`Farm::lease_ahead`]); the assignment holds
    /// once the ticket says the lease is stored.
    fn lease_locked(
        &self,
        st: &mut State,
        worker: &WorkerId,
        cached: &HashSet<Digest>,
        warm: Option<JobId>,
        slot: u32,
        ahead: bool,
    ) -> Result<Option<(Assignment, Ticket)>, Error> {
        let now = self.clock.now_ms();
        Self::touch(st, worker, now)?;
        if st.health.get(worker).is_some_and(|h| h.drain.is_some()) {
            return Ok(None);
        }
        let record = &st.workers[worker];
        let cap = record.slot_cap(slot);
        let tags = record.tags.clone();
        let runtimes = record.runtimes.clone();
        let capacity = record.capacity;
        let available = |w: &WorkerRecord| self.available(st, w, now);
        let Some((job_id, index)) = pick(
            st,
            &Asker {
                worker,
                cached,
                warm,
                slot: &cap,
                tags: &tags,
                available: &available,
                runtimes: &runtimes,
                capacity,
            },
            self.config.block_after,
        ) else {
            return Ok(None);
        };
        if ahead && !Self::spare(st, job_id, worker, slot) {
            return Ok(None);
        }
        let mut job = st.jobs[&job_id].clone();
        // A job sized by the farm gives this lease the first frames of the
        // run, and keeps the rest queued as a task of its own.
        let (mut task, rest) = match chunking::carve(st, &job, index, worker, slot) {
            Some((head, rest)) => {
                job.task_count = rest.index + 1;
                (head, Some(rest))
            }
            None => (Task::clone(&st.tasks[&job_id][index as usize]), None),
        };
        let lease = task.lease(worker, now, self.config.lease_ttl_ms)?;
        if let TaskState::Leased { slot: s, .. } = &mut task.state {
            *s = slot;
        }
        job.start()?;
        // One line a task, with the fields a worker's log of it has too
        // (job, task, lease), so `--log-format json` logs join on them.
        tracing::info!(job = %lease.job, task = lease.task, lease = %lease, worker = %worker, frames = ?task.frames, ahead, "task leased");
        self.count_stat(|s| s.leases_granted += 1);
        let assignment = Assignment {
            lease,
            scene: job.scene,
            scene_name: job.scene_name.clone(),
            frames: task.frames.clone(),
            attempt: task.failures + 1,
            ttl_ms: self.config.lease_ttl_ms,
            tile: task.tile.map(|t| AssignedTile {
                rendered: t.rendered,
                frame: (job.width, job.height),
                border: tiles::blender_border(t.rendered, job.width, job.height),
            }),
            device: job.requirements.device_for(&cap),
            file_set: job.file_set,
            blender: job.requirements.runtime_for(&runtimes).map(|r| r.version),
            max_pixels: self.config.max_pixels,
            scene_python: job.requirements.scene_python(),
        };
        let changed = std::iter::once(task).chain(rest).collect();
        let ticket = self.save(st, job, changed, Vec::new());
        Self::note_grant(st, lease, worker);
        Ok(Some((assignment, ticket)))
    }

    /// Leases a task for a slot of `worker`, waiting up to `wait` for one to
    /// become ready. Returns early, without a task, when the job the slot
    /// holds warm has ended, so that the worker closes that session at once.
    /// A parked call is woken only for a task its slot can render (one call
    /// per ready task), never all at once. A zero `wait` tries once and is
    /// never parked (the lease a worker asks for with a result).
    pub async fn lease(
        &self,
        worker: &WorkerId,
        cached: &HashSet<Digest>,
        warm: Option<JobId>,
        slot: u32,
        wait: Duration,
    ) -> Result<LeaseOutcome, Error> {
        let deadline = tokio::time::Instant::now() + wait;
        let notify = Arc::new(Notify::new());
        // The key of this call's entry among the parked ones, while listed:
        // a woken call unparks under the lock of its next try.
        let mut key: Option<u64> = None;
        loop {
            if let Some(why) = self.stopped() {
                return Err(Error::NotActive(format!(
                    "this coordinator stepped down: {why}; use the active coordinator"
                )));
            }
            // Timed from here: the first try, or the try after a wake-up
            // for a ready task, so a parked call's idle wait is not counted.
            let started = std::time::Instant::now();
            let (leased, ended) = {
                let mut st = self.lock();
                if let Some(k) = key.take() {
                    st.schedule.unpark(k);
                }
                let ended: Vec<JobId> = warm
                    .filter(|j| st.jobs.get(j).is_none_or(|job| job.state.is_final()))
                    .into_iter()
                    .collect();
                let leased = self.lease_locked(&mut st, worker, cached, warm, slot, false)?;
                // A call that may not wait (zero `wait`) is never parked.
                if leased.is_none() && ended.is_empty() && !wait.is_zero() {
                    key = Some(st.schedule.park(schedule::Waiter {
                        worker: worker.clone(),
                        slot,
                        warm,
                        notify: notify.clone(),
                        woken: false,
                    }));
                }
                (leased, ended)
            };
            if let Some((assignment, ticket)) = leased {
                ticket.stored().await?;
                self.lease_served(started);
                return Ok(LeaseOutcome {
                    task: Some(assignment),
                    ended,
                });
            }
            if !ended.is_empty() || key.is_none() {
                return Ok(LeaseOutcome { task: None, ended });
            }
            let woken = tokio::time::timeout_at(deadline, notify.notified()).await;
            if woken.is_err() {
                if let Some(k) = key.take() {
                    self.lock().schedule.unpark(k);
                }
                return Ok(LeaseOutcome {
                    task: None,
                    ended: Vec::new(),
                });
            }
        }
    }

    /// Counts a granted lease that took from `started` until it was stored.
    pub fn lease_served(&self, started: std::time::Instant) {
        let took = started.elapsed().as_secs_f64();
        self.count_stat(|s| s.lease_latency.observe(took));
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
        Ok((Task::clone(task), job.clone()))
    }

    /// Why `lease` is no longer the current grant of its task, in words
    /// that tell its worker to drop the task; `None` while it is current.
    /// A job or task that is gone is "not found"; every other reason (the
    /// job was cancelled, paused or failed, the task is done, its lease
    /// expired and it was queued or served again) is a conflict.
    pub(super) fn stale_reason(st: &State, lease: LeaseId) -> Option<Error> {
        let (j, t) = (lease.job, lease.task);
        let Some(job) = st.jobs.get(&j) else {
            return Some(Error::NotFound(format!(
                "job {j} of lease {lease} (it was deleted or archived); drop this task"
            )));
        };
        let Some(task) = st.tasks.get(&j).and_then(|l| l.get(t as usize)) else {
            return Some(Error::NotFound(format!(
                "task {j}.{t} of lease {lease}; drop this task"
            )));
        };
        let why = match (&task.state, job.state) {
            (TaskState::Leased { grant, .. }, _) if *grant == lease.grant => return None,
            (_, JobState::Canceled) | (TaskState::Canceled, _) => {
                format!("job {j} was cancelled; drop this task (lease {lease})")
            }
            (TaskState::Done { .. }, _) => format!(
                "task {j}.{t} was already completed; this result is not needed; drop this task (lease {lease})"
            ),
            (_, JobState::Failed) | (TaskState::Failed { .. }, _) => {
                format!("job {j} failed; drop this task (lease {lease})")
            }
            (TaskState::Leased { grant, .. }, _) => format!(
                "lease {lease} expired and task {j}.{t} was served again (grant {grant}); drop this task"
            ),
            (TaskState::Queued, JobState::Paused) => format!(
                "job {j} was paused and its task went back to the queue; drop this task (lease {lease})"
            ),
            (TaskState::Queued, _) => format!(
                "lease {lease} expired (not renewed within the lease TTL) and its task went back to the queue; drop this task"
            ),
        };
        Some(Error::Conflict(why))
    }

    /// Why `lease` is no longer current (see [`Farm::stale_reason`]), or
    /// an empty string while it is: the words a renewal that says "stop"
    /// carries (tests read them; [`Farm::renew_all`] words its own).
    #[cfg(test)]
    pub(crate) fn why_stale(&self, lease: LeaseId) -> String {
        Self::stale_reason(&self.lock(), lease).map_or_else(String::new, |e| e.to_string())
    }

    /// `e`, or when it says only that `lease` was lost, the true reason.
    pub(super) fn explain_lost(st: &State, lease: LeaseId, e: Error) -> Error {
        match e {
            Error::LeaseLost(_) => Self::stale_reason(st, lease).unwrap_or(e),
            e => e,
        }
    }

    /// Saves a change to a job and its tasks, counting a worker's success
    /// or failure in its record.
    pub(super) fn apply(
        &self,
        st: &mut State,
        changed: Vec<Task>,
        job: Job,
        worker: Option<(&WorkerId, bool)>,
    ) -> Ticket {
        let mut extra = Vec::new();
        if let Some((w, ok)) = worker {
            if let Some(r) = st.workers.get_mut(w) {
                if ok {
                    r.tasks_done += 1;
                } else {
                    r.tasks_failed += 1;
                }
                extra.push(Owned::Worker(r.clone()));
            }
        }
        self.save(st, job, changed, extra)
    }

    /// Renews `lease` and records its progress, without the access check
    /// [`Farm::renew_all`] makes: the tests' shorthand for one renewal.
    /// Whether the holder should keep going (false when the lease was lost
    /// or the job ended).
    #[cfg(test)]
    pub(crate) fn progress(&self, lease: LeaseId, frames_done: u32, samples: (u32, u32)) -> bool {
        self.renew(&Renewal {
            lease,
            frames_done,
            samples,
            waiting: false,
        })
    }

    /// [`Farm::progress`] for a task leased ahead that waits for its slot.
    #[cfg(test)]
    pub(crate) fn renew_waiting(&self, lease: LeaseId) -> bool {
        self.renew(&Renewal {
            lease,
            frames_done: 0,
            samples: (0, 0),
            waiting: true,
        })
    }

    #[cfg(test)]
    fn renew(&self, r: &Renewal) -> bool {
        let (now, ttl) = (self.clock.now_ms(), self.config.lease_ttl_ms);
        Self::renew_locked(&mut self.lock(), now, ttl, r)
    }

    /// Leases the task `ask` asks for under the lock taken for the result
    /// it came with (see [`Farm::complete_begin_asking`]); `None` when it
    /// cannot be leased here (the coordinator stepped down, a worker it
    /// does not know): the caller then leases with a call of its own.
    pub(super) fn lease_with_result(&self, st: &mut State, ask: &NextAsk) -> Option<NextLease> {
        self.stopped().is_none().then_some(())?;
        let started = std::time::Instant::now();
        let ended = if ask.ahead {
            Vec::new()
        } else {
            ask.warm
                .filter(|j| st.jobs.get(j).is_none_or(|job| job.state.is_final()))
                .into_iter()
                .collect()
        };
        match self.lease_locked(st, &ask.worker, &ask.cached, ask.warm, ask.slot, ask.ahead) {
            Ok(task) => Some(NextLease {
                task,
                ended,
                started,
            }),
            Err(e) => {
                tracing::debug!(worker = %ask.worker, "no lease with the result: {e}");
                None
            }
        }
    }

    /// Counts a lease granted in a Complete's answer (asked for with a
    /// result) instead of by a Lease call, for metrics.
    pub fn lease_carried(&self) {
        self.count_stat(|s| s.leases_with_results += 1);
    }

    /// Counts a renewal call of `leases` leases: a Renew call (`together`)
    /// or a Progress call, for metrics.
    pub fn renewals_asked(&self, together: bool, leases: usize) {
        self.count_stat(|s| {
            if together {
                s.renew_calls += 1;
            } else {
                s.progress_calls += 1;
            }
            s.leases_renewed += leases as u64;
        });
    }

    /// Renews each of `leases` for `who` under one take of the lock (a
    /// worker's Renew call, or a Progress call's one lease). For each:
    /// [`Farm::check_lease`]'s refusal, or whether its holder should go on
    /// and, when not, why (the job was cancelled, the lease expired, ...,
    /// as [`Farm::stale_reason`] words it).
    pub fn renew_all(
        &self,
        who: &Identity,
        leases: &[Renewal],
    ) -> Vec<Result<(bool, String), Error>> {
        let now = self.clock.now_ms();
        let ttl = self.config.lease_ttl_ms;
        let mut st = self.lock();
        leases
            .iter()
            .map(|r| {
                Self::lease_checked(&st, who, r.lease)?;
                if Self::renew_locked(&mut st, now, ttl, r) {
                    return Ok((true, String::new()));
                }
                let why =
                    Self::stale_reason(&st, r.lease).map_or_else(String::new, |e| e.to_string());
                Ok((false, why))
            })
            .collect()
    }

    /// Renews `r.lease` under the lock and records its progress; whether
    /// it still holds. A renewal of a task that waits for its slot
    /// (`r.waiting`, see [`Farm::lease_ahead`]) restarts the attempt's
    /// slot-time from now, so that an attempt counts from the last such
    /// renewal, when its slot was about to start it, not from the grant.
    /// (Kept in memory like every renewal: after a restart, an attempt
    /// counts from its grant.)
    fn renew_locked(st: &mut State, now: u64, ttl: u64, r: &Renewal) -> bool {
        let State {
            tasks,
            workers,
            schedule,
            ..
        } = st;
        let Some(task) = tasks
            .get_mut(&r.lease.job)
            .and_then(|t| t.get_mut(r.lease.task as usize))
        else {
            return false;
        };
        if let Some(w) = task.holder().and_then(|h| workers.get_mut(h)) {
            w.last_seen_ms = now;
        }
        // In place (a renewal is not stored); a copy only while a view
        // holds the record.
        let task = Arc::make_mut(task);
        let before = schedule::progress(task);
        let held = task.renew(r.lease.grant, r.frames_done, now, ttl).is_ok();
        if held {
            (task.samples_done, task.samples_total) = r.samples;
            if let (true, TaskState::Leased { since_ms, .. }) = (r.waiting, &mut task.state) {
                *since_ms = now;
            }
            // The job's index sums its leased tasks' progress.
            if let Some(index) = schedule.job_mut(r.lease.job) {
                index.progressed(before, schedule::progress(task));
            }
        }
        held
    }

    /// Whether `w` takes work now: online and not drained.
    pub(super) fn available(&self, st: &State, w: &WorkerRecord, now: u64) -> bool {
        self.online(w, now) && st.health.get(&w.id).is_none_or(|h| h.drain.is_none())
    }

    /// Gives a task back without charging an attempt: its worker shuts
    /// down, or was `preempted` (SIGTERM on spot capacity or scale-in),
    /// which is counted and priced on its own.
    pub fn release(&self, lease: LeaseId, preempted: bool) -> Result<(), Error> {
        self.release_saying(lease, preempted, "")
    }

    /// [`Farm::release`] with the worker's reason for giving the task back
    /// (its cache is full), kept among the job's warnings when not empty.
    pub fn release_saying(
        &self,
        lease: LeaseId,
        preempted: bool,
        reason: &str,
    ) -> Result<(), Error> {
        let ticket = {
            let mut st = self.lock();
            let (mut task, mut job) = Self::find(&st, lease)?;
            task.release(lease.grant)
                .map_err(|e| Self::explain_lost(&st, lease, e))?;
            if !reason.is_empty() {
                tracing::warn!(lease = %lease, "task given back: {reason}");
                job.add_warnings(&[reason.to_string()]);
            }
            if preempted {
                Self::ending(
                    &mut st,
                    lease.job,
                    lease.task,
                    crate::model::usage::AttemptEnd::Preempted,
                );
            }
            self.apply(&mut st, vec![task], job, None)
        };
        ticket.wait()?;
        tracing::info!(lease = %lease, preempted, "task released");
        Ok(())
    }

    /// Puts every task whose lease has run out back in the queue. Pops the
    /// deadline heap: O(expired · log n); a renewed lease is pushed back
    /// with its new deadline.
    pub fn expire_leases(&self) -> Result<usize, Error> {
        let now = self.clock.now_ms();
        let mut tickets = Vec::new();
        let mut n = 0;
        {
            let mut st = self.lock();
            let mut by_job: BTreeMap<JobId, Vec<Task>> = BTreeMap::new();
            let mut seen: HashSet<(JobId, u32)> = HashSet::new();
            while let Some((job, index)) = st.schedule.next_due(now) {
                let Some(task) = st.tasks.get(&job).and_then(|t| t.get(index as usize)) else {
                    continue;
                };
                let TaskState::Leased { expires_ms, .. } = task.state else {
                    continue;
                };
                if expires_ms > now {
                    // Renewed since: its new deadline goes in the heap.
                    st.schedule.extend(expires_ms, job, index);
                    continue;
                }
                if !seen.insert((job, index)) {
                    continue;
                }
                let mut t = Task::clone(task);
                let holder = task.holder().cloned();
                if t.expire(now) {
                    Self::ending(
                        &mut st,
                        job,
                        index,
                        crate::model::usage::AttemptEnd::Expired,
                    );
                    tracing::warn!(job = %t.job, task = t.index, holder = ?holder, "lease expired; task back in the queue");
                    by_job.entry(job).or_default().push(t);
                }
            }
            for (id, changed) in by_job {
                n += changed.len();
                let job = st.jobs[&id].clone();
                tickets.push(self.save(&mut st, job, changed, Vec::new()));
            }
        }
        for t in tickets {
            t.wait()?;
        }
        if n > 0 {
            self.count_stat(|s| s.leases_expired += n as u64);
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    //! Leasing ahead: fairness to idle slots, and an attempt's slot-time.

    use super::super::tests::{fixture, output, sub, until_parked, worker};
    use super::*;

    /// A lease asked ahead answers at once, and takes a task only when
    /// every idle slot and every other slot rendering the job keeps one.
    #[tokio::test]
    async fn a_lease_ahead_takes_only_a_task_no_idle_slot_needs() {
        let f = Arc::new(fixture());
        let (a, b) = (worker(&f.farm, "a"), worker(&f.farm, "b"));
        let none = HashSet::new();
        let first = f.farm.submit(sub(f.scene, "1", 1)).unwrap();
        let running = f.farm.try_lease(&a, &none).unwrap().unwrap();

        // An empty queue: nothing, at once, and the call is not parked.
        let got = f.farm.lease_ahead(&a, &none, Some(first), 0).await;
        assert!(got.unwrap().task.is_none());
        assert_eq!(f.farm.lock().schedule.parked(), 0);

        // b is idle, parked; one task arrives and wakes it. Until b takes
        // it, a's lease ahead must not (the test runs on one thread: b's
        // call tries again only when this one yields).
        let idle = {
            let (f, b) = (f.clone(), b.clone());
            tokio::spawn(async move {
                f.farm
                    .lease(&b, &HashSet::new(), None, 0, Duration::from_secs(10))
                    .await
            })
        };
        until_parked(&f.farm, 1).await;
        let second = f.farm.submit(sub(f.scene, "1", 1)).unwrap();
        let got = f.farm.lease_ahead(&a, &none, Some(first), 0).await;
        assert!(got.unwrap().task.is_none(), "b, idle, comes first");
        let b_task = idle.await.unwrap().unwrap().task.expect("b's task");
        assert_eq!(b_task.lease.job, second);

        // Four tasks, no idle slot: a takes one ahead; then, as when it
        // renders that one while it reports the one before, another; then
        // no more, as a slot holds at most three leases.
        let third = f.farm.submit(sub(f.scene, "1-4", 1)).unwrap();
        for _ in 0..2 {
            let ahead = f.farm.lease_ahead(&a, &none, Some(first), 0).await;
            let ahead = ahead.unwrap().task.expect("a task to spare");
            assert_eq!(ahead.lease.job, third);
        }
        let again = f.farm.lease_ahead(&a, &none, Some(first), 0).await;
        assert!(again.unwrap().task.is_none(), "a slot holds one task ahead");
        // b may take one too: one is left for a's slot, which renders the job next.
        let b_ahead = f.farm.lease_ahead(&b, &none, Some(second), 0).await;
        assert!(b_ahead.unwrap().task.is_some());
        // The last one goes to whichever slot frees first.
        f.farm.complete(running.lease, vec![output(&f, 1)]).unwrap();
        let c = worker(&f.farm, "c");
        let c_task = f.farm.try_lease(&c, &none).unwrap().unwrap();
        assert_eq!(c_task.lease.job, third);
        let tail = f.farm.lease_ahead(&c, &none, Some(third), 0).await;
        assert!(tail.unwrap().task.is_none(), "the queue is empty");
    }

    /// The slots on a job come from its index, each once however many of
    /// its leases it holds (no pass over the job's leases: with thousands
    /// of slots leasing ahead, that pass made every lease ahead cost a
    /// millisecond under the lock), and a slot leaves when its last ends.
    #[tokio::test]
    async fn a_slot_holding_two_leases_of_a_job_counts_once() {
        let f = fixture();
        let (a, b) = (worker(&f.farm, "a"), worker(&f.farm, "b"));
        let none = HashSet::new();
        let job = f.farm.submit(sub(f.scene, "1-6", 1)).unwrap();
        let others = |w: &WorkerId| chunking::other_slots(&f.farm.lock(), job, w, 0);
        let first = f.farm.try_lease(&a, &none).unwrap().unwrap();
        let ahead = f.farm.lease_ahead(&a, &none, Some(job), 0).await;
        let ahead = ahead.unwrap().task.expect("a task ahead");
        assert_eq!(others(&b), 1, "a's slot holds two leases and counts once");
        assert_eq!(others(&a), 0);
        f.farm.try_lease(&b, &none).unwrap().unwrap();
        assert_eq!(others(&a), 1);
        assert_eq!(others(&b), 1);
        f.farm.complete(first.lease, vec![output(&f, 1)]).unwrap();
        assert_eq!(others(&b), 1, "a's slot still holds its task ahead");
        f.farm.complete(ahead.lease, vec![output(&f, 2)]).unwrap();
        assert_eq!(others(&b), 0, "a's slot holds nothing of the job now");
    }

    /// A job's view sums its running tasks' progress from its index, which
    /// follows renewals (edits in place) and the changes that end leases.
    #[tokio::test]
    async fn a_jobs_view_sums_the_progress_its_renewals_report() {
        let f = fixture();
        let (a, b) = (worker(&f.farm, "a"), worker(&f.farm, "b"));
        let none = HashSet::new();
        let job = f.farm.submit(sub(f.scene, "1-4", 1)).unwrap();
        let first = f.farm.try_lease(&a, &none).unwrap().unwrap();
        let second = f.farm.try_lease(&b, &none).unwrap().unwrap();
        let renew = |lease: LeaseId, frames_done, samples| {
            f.farm.renew(&Renewal {
                lease,
                frames_done,
                samples,
                waiting: false,
            })
        };
        let running = || {
            let c = f.farm.job_page(job, Page::SUMMARY).unwrap().counts;
            (c.running_frames_done, c.samples_done, c.samples_total)
        };
        assert!(renew(first.lease, 0, (3, 8)));
        assert!(renew(second.lease, 0, (5, 8)));
        assert_eq!(running(), (0, 8, 16));
        assert!(renew(first.lease, 1, (8, 8)));
        assert_eq!(running(), (1, 13, 16));
        f.farm.complete(first.lease, vec![output(&f, 1)]).unwrap();
        assert_eq!(running(), (0, 5, 8), "only the second task runs");
    }

    /// The tail of a job: with one ready task and another slot rendering
    /// the job, nothing goes ahead.
    #[tokio::test]
    async fn the_last_task_of_a_job_is_not_leased_ahead_while_another_slot_renders_it() {
        let f = fixture();
        let (a, b) = (worker(&f.farm, "a"), worker(&f.farm, "b"));
        let none = HashSet::new();
        let job = f.farm.submit(sub(f.scene, "1-3", 1)).unwrap();
        f.farm.try_lease(&a, &none).unwrap().unwrap();
        f.farm.try_lease(&b, &none).unwrap().unwrap();
        let got = f.farm.lease_ahead(&a, &none, Some(job), 0).await;
        assert!(got.unwrap().task.is_none(), "b's slot needs the last task");
        // Alone on the job, a slot may take its last task ahead.
        let solo = f.farm.submit(sub(f.scene, "1-2", 1)).unwrap();
        let c = worker(&f.farm, "c");
        let first = f.farm.try_lease(&c, &none).unwrap().unwrap();
        assert_eq!(first.lease.job, solo);
        let got = f.farm.lease_ahead(&c, &none, Some(solo), 0).await;
        assert_eq!(got.unwrap().task.expect("the last task").lease.job, solo);
    }

    /// A task leased ahead is kept by renewals while it waits, and its
    /// attempt counts from the last one, not from the grant.
    #[tokio::test]
    async fn a_waiting_renewal_keeps_the_lease_and_restarts_the_attempts_clock() {
        let f = fixture();
        let a = worker(&f.farm, "a");
        let none = HashSet::new();
        let job = f.farm.submit(sub(f.scene, "1-2", 1)).unwrap();
        let running = f.farm.try_lease(&a, &none).unwrap().unwrap();
        let ahead = f.farm.lease_ahead(&a, &none, Some(job), 0).await;
        let ahead = ahead.unwrap().task.expect("a task ahead");
        for _ in 0..10 {
            f.clock.advance(600);
            assert!(f.farm.progress(running.lease, 0, (0, 0)));
            assert!(f.farm.renew_waiting(ahead.lease));
        }
        assert_eq!(f.farm.expire_leases().unwrap(), 0, "both leases held");
        f.farm.complete(running.lease, vec![output(&f, 1)]).unwrap();
        f.clock.advance(400);
        assert!(f.farm.progress(ahead.lease, 0, (0, 0)));
        f.farm.complete(ahead.lease, vec![output(&f, 2)]).unwrap();
        let snap = f.farm.job(job).unwrap();
        let ms = |i: usize| snap.tasks[i].attempts.last().unwrap().ms;
        assert_eq!(ms(0), 6000, "the first task ran from its grant");
        assert_eq!(ms(1), 400, "the second from its last waiting renewal");
    }
}
