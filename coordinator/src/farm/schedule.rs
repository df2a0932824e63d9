//! The schedule: what can be leased and who is waiting. Per job a ready
//! queue and counts by state; the jobs that may have tasks to lease, by
//! priority; the leases each worker holds; a deadline heap for lease
//! expiry; and the lease calls parked until a task they can take is ready.
//! All of it is derived from the task records: [`Schedule::index_change`] takes
//! each installed change, and nothing else changes the indexes.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::state::Change;
use super::*;
use crate::model::usage::Usage;

/// A lease call parked until a task it can take becomes ready.
#[derive(Debug)]
pub(super) struct Waiter {
    pub(super) worker: WorkerId,
    pub(super) slot: u32,
    pub(super) warm: Option<JobId>,
    /// Shared with the parked call: the call is alive while it holds its
    /// clone (a call whose client went away drops it).
    pub(super) notify: Arc<Notify>,
    /// Woken for a ready task and about to try again: still idle, so still
    /// counted by [`Schedule::waiting_up_to`], until the call unparks itself.
    pub(super) woken: bool,
}

impl Waiter {
    /// Whether the parked call still waits (its future was not dropped).
    fn alive(&self) -> bool {
        Arc::strong_count(&self.notify) > 1
    }
}

/// One job's indexes.
/// A leased task's progress: frames done, samples done, samples in all.
pub(super) type Progress = (u32, u32, u32);

/// `t`'s progress, as its holder last reported it.
pub(super) fn progress(t: &Task) -> Progress {
    (t.frames_done, t.samples_done, t.samples_total)
}

#[derive(Debug, Default)]
pub(super) struct JobIndex {
    /// Queued tasks, by first frame, then index: the order they are
    /// leased in (the index order, except that a run of frames carved by a
    /// lease keeps its place; see `chunking`).
    ready: BTreeSet<(u32, u32)>,
    /// Frames of the queued tasks.
    ready_frames: usize,
    /// Leased tasks, by index.
    leased: BTreeSet<u32>,
    /// The slots holding its leases, with how many each holds (one it
    /// reports, one it renders, one ahead): a lease asked ahead counts the
    /// other slots on the job without a pass over its leases.
    slots: HashMap<(WorkerId, u32), u32>,
    /// Tasks by state.
    counts: TaskCounts,
    /// Slot-time and cost of every ended attempt of its tasks.
    usage: Usage,
}

impl JobIndex {
    /// Queued tasks, in the order they are leased in (see `ready`).
    pub(super) fn ready(&self) -> impl ExactSizeIterator<Item = u32> + '_ {
        self.ready.iter().map(|&(_, i)| i)
    }

    /// How many slots the queued tasks can serve at once: one a task, or
    /// one a frame for a job whose leases carve their frames
    /// ([`Job::auto_chunked`]).
    pub(super) fn ready_units(&self, job: &Job) -> usize {
        if job.auto_chunked() {
            self.ready_frames
        } else {
            self.ready.len()
        }
    }

    /// Leased tasks, by index.
    pub(super) fn leased(&self) -> &BTreeSet<u32> {
        &self.leased
    }

    /// The slots holding a lease of the job, `slot` of `worker` left out.
    pub(super) fn other_slots(&self, worker: &WorkerId, slot: u32) -> usize {
        // No key (a copy of the worker's id) is built for an empty map.
        let own = !self.slots.is_empty() && self.slots.contains_key(&(worker.clone(), slot));
        self.slots.len() - usize::from(own)
    }

    /// Tasks by state, with the progress of the leased ones.
    pub(super) fn counts(&self) -> TaskCounts {
        self.counts
    }

    /// A leased task's progress moved from `before` to `after` (frames
    /// done, samples done, samples in all): a renewal, or a lease that
    /// begins (from nothing) or ends (to nothing).
    pub(super) fn progressed(&mut self, before: Progress, after: Progress) {
        let c = &mut self.counts;
        c.running_frames_done = (c.running_frames_done + after.0).saturating_sub(before.0);
        c.samples_done = (c.samples_done + u64::from(after.1)).saturating_sub(u64::from(before.1));
        c.samples_total =
            (c.samples_total + u64::from(after.2)).saturating_sub(u64::from(before.2));
    }

    /// Slot-time and cost of every ended attempt of its tasks.
    pub(super) fn usage(&self) -> Usage {
        self.usage
    }

    /// Puts `t` in the indexes (`add`), or takes it out; `held` follows.
    fn index(
        &mut self,
        held: &mut HashMap<WorkerId, BTreeSet<(JobId, u32)>>,
        t: &Task,
        tiled: bool,
        add: bool,
    ) {
        let step = |n: &mut u32, by: u32| {
            *n = if add { *n + by } else { *n - by };
        };
        let c = &mut self.counts;
        match &t.state {
            TaskState::Queued => {
                step(&mut c.queued, 1);
                let key = (t.frames.first().copied().unwrap_or(0), t.index);
                if add {
                    self.ready.insert(key);
                    self.ready_frames += t.frames.len();
                } else {
                    self.ready.remove(&key);
                    self.ready_frames -= t.frames.len();
                }
            }
            TaskState::Leased { worker, slot, .. } => {
                step(&mut c.leased, 1);
                // Its progress, so that a view sums no leases.
                let (none, p) = ((0, 0, 0), progress(t));
                if add {
                    self.progressed(none, p);
                } else {
                    self.progressed(p, none);
                }
                let mine = held.entry(worker.clone()).or_default();
                let on_slot = self.slots.entry((worker.clone(), *slot)).or_default();
                if add {
                    self.leased.insert(t.index);
                    mine.insert((t.job, t.index));
                    *on_slot += 1;
                } else {
                    self.leased.remove(&t.index);
                    mine.remove(&(t.job, t.index));
                    *on_slot = on_slot.saturating_sub(1);
                    if *on_slot == 0 {
                        self.slots.remove(&(worker.clone(), *slot));
                    }
                }
            }
            TaskState::Done { outputs } => {
                step(&mut c.done, 1);
                if !tiled {
                    step(&mut c.outputs, outputs.len() as u32);
                    let frames = outputs.iter().filter(|o| o.pass.is_empty()).count();
                    step(&mut c.frames_done, frames as u32);
                }
            }
            TaskState::Failed { .. } => step(&mut c.failed, 1),
            TaskState::Canceled => step(&mut c.canceled, 1),
        }
        for a in &t.attempts {
            self.usage.count(a, add);
        }
    }
}

/// The schedule's indexes (see the module doc).
#[derive(Debug, Default)]
pub(super) struct Schedule {
    /// Ready queues and counts of every job.
    index: HashMap<JobId, JobIndex>,
    /// Jobs that may have tasks to lease (open, not paused, not held back,
    /// with a ready task), by priority (highest first), then id.
    runnable: BTreeSet<(Reverse<i32>, JobId)>,
    /// The leases each worker holds.
    held: HashMap<WorkerId, BTreeSet<(JobId, u32)>>,
    /// When each lease runs out: checked against the task when popped,
    /// since renewals only move the task's own deadline.
    deadlines: BinaryHeap<Reverse<(u64, JobId, u32)>>,
    /// Parked lease calls, oldest first.
    waiters: BTreeMap<u64, Waiter>,
    /// The key of the next parked lease call.
    next_waiter: u64,
}

impl Schedule {
    /// The indexes of job `id`.
    pub(super) fn job(&self, id: JobId) -> Option<&JobIndex> {
        self.index.get(&id)
    }

    /// Job `id`'s index, to follow a renewal's progress.
    pub(super) fn job_mut(&mut self, id: JobId) -> Option<&mut JobIndex> {
        self.index.get_mut(&id)
    }

    /// The runnable jobs, highest priority first, then by id.
    pub(super) fn runnable(&self) -> impl Iterator<Item = (i32, JobId)> + '_ {
        self.runnable.iter().map(|&(Reverse(p), id)| (p, id))
    }

    /// The leases `worker` holds.
    pub(super) fn held_by(&self, worker: &WorkerId) -> Option<&BTreeSet<(JobId, u32)>> {
        self.held.get(worker)
    }

    /// Parks a lease call; returns its key.
    pub(super) fn park(&mut self, waiter: Waiter) -> u64 {
        let key = self.next_waiter;
        self.next_waiter += 1;
        self.waiters.insert(key, waiter);
        key
    }

    /// How many lease calls are parked.
    #[cfg(test)]
    pub(super) fn parked(&self) -> usize {
        self.waiters.values().filter(|w| !w.woken).count()
    }

    /// Forgets a parked call (it was woken or gave up).
    pub(super) fn unpark(&mut self, key: u64) {
        self.waiters.remove(&key);
    }

    /// Keeps the parked calls of `old` (memory rebuilt from the store does
    /// not know them).
    pub(super) fn keep_waiters(&mut self, old: &mut Schedule) {
        self.waiters = std::mem::take(&mut old.waiters);
        self.next_waiter = old.next_waiter;
    }

    /// Pops the next lease deadline at or before `now`: the task it names
    /// may have been renewed since (see [`Schedule::extend`]).
    pub(super) fn next_due(&mut self, now: u64) -> Option<(JobId, u32)> {
        let &Reverse((at, job, index)) = self.deadlines.peek()?;
        if at > now {
            return None;
        }
        self.deadlines.pop();
        Some((job, index))
    }

    /// A renewed lease's new deadline.
    pub(super) fn extend(&mut self, at: u64, job: JobId, index: u32) {
        self.deadlines.push(Reverse((at, job, index)));
    }

    /// Job `id`, released by what held it back, may be leased now: it is
    /// runnable and its parked callers are woken.
    pub(super) fn release(&mut self, job: &Job, workers: &BTreeMap<WorkerId, WorkerRecord>) {
        let ready = self.index.get(&job.id).map_or(0, |i| i.ready_units(job));
        if ready > 0 {
            self.runnable.insert((Reverse(job.priority), job.id));
            self.wake(job, workers, ready);
        }
    }

    /// Takes a job's change into the indexes (see [`Change`]); returns
    /// how many of its tasks became ready (frames, for a job whose leases
    /// carve them: see [`JobIndex::ready_units`]). [`Schedule::place`] follows.
    pub(super) fn index_change(&mut self, change: &Change<'_>) -> usize {
        let (job, id) = (change.job, change.job.id);
        if let Some(old) = change.old_job {
            self.runnable.remove(&(Reverse(old.priority), id));
        }
        let index = self.index.entry(id).or_default();
        let mut newly_ready = 0usize;
        for (i, old) in change.tasks() {
            let t = &change.list[i as usize];
            if let Some(old) = old {
                index.index(&mut self.held, old, job.is_tiled(), false);
            }
            if t.state == TaskState::Queued && old.is_none_or(|o| o.state != TaskState::Queued) {
                newly_ready += if job.auto_chunked() {
                    t.frames.len()
                } else {
                    1
                };
            }
            if let TaskState::Leased { expires_ms, .. } = t.state {
                self.deadlines.push(Reverse((expires_ms, id, t.index)));
            }
            index.index(&mut self.held, t, job.is_tiled(), true);
        }
        newly_ready
    }

    /// Makes the changed job runnable or not; `held_back` says whether
    /// something other than its tasks keeps it from running (dependencies,
    /// budget). Wakes parked calls that can take the `newly_ready` tasks,
    /// and those that held the job warm when it ended.
    pub(super) fn place(
        &mut self,
        change: &Change<'_>,
        mut newly_ready: usize,
        held_back: bool,
        workers: &BTreeMap<WorkerId, WorkerRecord>,
    ) {
        let (job, id) = (change.job, change.job.id);
        let ready = self.index.get(&id).map_or(0, |i| i.ready_units(job));
        let runnable =
            !job.state.is_final() && job.state != JobState::Paused && ready > 0 && !held_back;
        if runnable {
            self.runnable.insert((Reverse(job.priority), id));
        }
        if change.resumed {
            newly_ready = ready;
        }
        if newly_ready > 0 && runnable {
            self.wake(job, workers, newly_ready);
        }
        if change.became_final {
            self.wake_warm(id);
        }
    }

    /// Takes job `id` out (archived or deleted), with its `tasks`.
    pub(super) fn forget(&mut self, job: &Job, tasks: &[Arc<Task>]) {
        self.index.remove(&job.id);
        self.runnable.remove(&(Reverse(job.priority), job.id));
        for t in tasks {
            if let Some(h) = t.holder() {
                if let Some(set) = self.held.get_mut(h) {
                    set.remove(&(job.id, t.index));
                }
            }
        }
    }

    /// Wakes up to `n` parked lease calls whose slot can render `job`. A
    /// woken call stays listed (as woken) until it unparks itself to try
    /// again, so that a lease asked ahead does not take the task it was
    /// woken for; calls whose client went away are dropped.
    pub(super) fn wake(
        &mut self,
        job: &Job,
        workers: &BTreeMap<WorkerId, WorkerRecord>,
        mut n: usize,
    ) {
        let mut gone = Vec::new();
        for (key, w) in self.waiters.iter_mut() {
            if n == 0 {
                break;
            }
            if !w.alive() {
                gone.push(*key);
            } else if !w.woken && fits(job, workers, w) {
                w.notify.notify_one();
                w.woken = true;
                n -= 1;
            }
        }
        for k in gone {
            self.waiters.remove(&k);
        }
    }

    /// How many parked lease calls (idle slots, woken or not) could render
    /// `job`, by the same test [`Schedule::wake`] wakes them with, counted
    /// up to `most` (the callers need no more, and at a job's tail
    /// thousands may be parked).
    pub(super) fn waiting_up_to(
        &self,
        job: &Job,
        workers: &BTreeMap<WorkerId, WorkerRecord>,
        most: usize,
    ) -> usize {
        self.waiters
            .values()
            .filter(|w| w.alive() && fits(job, workers, w))
            .take(most)
            .count()
    }

    /// Wakes the parked lease calls of slots that hold job `id` warm, so
    /// that they close its session now that it ended.
    pub(super) fn wake_warm(&mut self, id: JobId) {
        self.waiters.retain(|_, w| {
            if w.warm == Some(id) {
                w.notify.notify_one();
                false
            } else {
                true
            }
        });
    }

    /// Wakes every parked lease call (a worker came back into service, or
    /// state was rebuilt).
    pub(super) fn wake_all(&mut self) {
        for w in self.waiters.values() {
            w.notify.notify_one();
        }
        self.waiters.clear();
    }
}

/// Whether the slot of parked call `w` can render `job`.
fn fits(job: &Job, workers: &BTreeMap<WorkerId, WorkerRecord>, w: &Waiter) -> bool {
    workers.get(&w.worker).is_some_and(|r| {
        job.requirements.runtime_for(&r.runtimes).is_some()
            && job.requirements.satisfied_by(&r.slot_cap(w.slot), &r.tags)
    })
}
