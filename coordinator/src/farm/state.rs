//! The farm's state in memory and the indexes that keep every scheduling
//! step cheap: per job a ready queue and counts by state, the leases each
//! worker holds, a deadline heap for lease expiry, blob reference counts and
//! the stitch queue. Everything here is derived from the durable records; a
//! restart (or a failed write) rebuilds it with [`State::recover`].

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::*;

/// Lease calls parked until a task they can take becomes ready.
#[derive(Debug)]
pub(super) struct Waiter {
    pub(super) worker: WorkerId,
    pub(super) slot: u32,
    pub(super) warm: Option<JobId>,
    pub(super) notify: Arc<Notify>,
}

/// The per-job indexes.
#[derive(Debug, Default)]
pub(super) struct JobIndex {
    /// Queued tasks, by index.
    pub(super) ready: BTreeSet<u32>,
    /// Leased tasks, by index.
    pub(super) leased: BTreeSet<u32>,
    /// Tasks by state.
    pub(super) counts: TaskCounts,
    /// Slot-time and cost of every ended attempt of its tasks.
    pub(super) usage: crate::model::usage::Usage,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) jobs: BTreeMap<JobId, Job>,
    pub(super) tasks: BTreeMap<JobId, Vec<Task>>,
    pub(super) workers: BTreeMap<WorkerId, WorkerRecord>,
    pub(super) next_job: u64,
    pub(super) next_worker: u64,
    pub(super) health: HashMap<WorkerId, Health>,
    pub(super) users: BTreeMap<String, UserRecord>,
    /// Which blobs records reference, which none does, which were touched,
    /// which are being collected (see `gc`).
    pub(super) blobs: gc::BlobLedger,
    /// Frames of open tiled jobs whose tiles are all done but that are not
    /// stitched yet: the stitch queue (derived from the records, so a crash
    /// loses nothing).
    pub(super) to_stitch: BTreeSet<(JobId, u32)>,
    /// Done jobs whose preview video is wanted and not made yet: the preview
    /// queue (derived from the records, like the stitch queue).
    pub(super) to_preview: BTreeSet<JobId>,
    /// The entries of each job's file set, by file-set blob.
    pub(super) file_sets: HashMap<Digest, Arc<[Digest]>>,
    /// Stitch attempts of a frame that could not read its tiles, and when
    /// the next may run (ms).
    pub(super) stitch_errors: HashMap<(JobId, u32), (u32, u64)>,
    /// Who possesses which blob, and who holds which grant (see `access`).
    pub(super) access: access::AccessState,
    /// Changes, for watchers (`WatchJob`, the dashboard's event stream).
    pub(super) events: Option<tokio::sync::broadcast::Sender<FarmEvent>>,
    /// Ready queues and counts of every job.
    pub(super) index: HashMap<JobId, JobIndex>,
    /// Jobs that may have tasks to lease (open, not paused, with a ready
    /// task), by priority (highest first), then id.
    pub(super) runnable: BTreeSet<(Reverse<i32>, JobId)>,
    /// The leases each worker holds.
    pub(super) held: HashMap<WorkerId, BTreeSet<(JobId, u32)>>,
    /// When each lease runs out: checked against the task when popped,
    /// since renewals only move the task's own deadline.
    pub(super) deadlines: BinaryHeap<Reverse<(u64, JobId, u32)>>,
    /// Parked lease calls, oldest first.
    pub(super) waiters: BTreeMap<u64, Waiter>,
    /// The key of the next parked lease call.
    pub(super) next_waiter: u64,
    /// Where new records go to be written (see `txn`).
    pub(super) commits: Option<std::sync::mpsc::Sender<txn::Entry>>,
    /// Summaries of archived jobs (their records left the store's hot trees).
    pub(super) archived: BTreeMap<JobId, Arc<ArchivedSummary>>,
    /// The jobs that wait for each job (`--after`), derived from the jobs.
    pub(super) dependents: HashMap<JobId, BTreeSet<JobId>>,
    /// Changes the farm owes jobs (a cancel because a job they waited for
    /// failed, a pause at their budget), made by `Farm::react`.
    pub(super) reactions: BTreeMap<JobId, pipeline::Reaction>,
    /// How attempts that are ending now ended, when their new state alone
    /// does not say (an expired lease, a preemption); read by `save`.
    pub(super) ending: HashMap<(JobId, u32), crate::model::usage::AttemptEnd>,
}

impl State {
    /// Reads everything `store` holds and derives the indexes.
    pub(super) fn recover(
        store: &dyn MetaStore,
        blobs: &dyn BlobStore,
        now: u64,
        lease_ttl_ms: u64,
    ) -> Result<State, Error> {
        let snap = store.load()?;
        let mut st = State {
            next_job: snap
                .jobs
                .keys()
                .chain(snap.archived.keys())
                .max()
                .map_or(1, |id| id.0 + 1)
                .max(snap.next_job),
            next_worker: snap.workers.len() as u64 + 1,
            jobs: snap.jobs,
            workers: snap.workers,
            users: snap.users,
            access: access::AccessState::from_grants(snap.grants),
            ..Default::default()
        };
        for (id, a) in snap.archived {
            for d in &a.blobs {
                st.blobs.add(*d);
            }
            st.archived.insert(id, Arc::new(a.summary));
        }
        let mut tasks = snap.tasks;
        for task in tasks.values_mut().flatten() {
            if let TaskState::Leased { expires_ms, .. } = &mut task.state {
                *expires_ms = (*expires_ms).max(now + lease_ttl_ms);
            }
        }
        let jobs: Vec<Job> = st.jobs.values().cloned().collect();
        st.jobs.clear();
        for job in jobs {
            if let Some(d) = job.file_set {
                if let std::collections::hash_map::Entry::Vacant(e) = st.file_sets.entry(d) {
                    match blobs
                        .read(&d)
                        .and_then(|b| crate::model::fileset::check(&b, &job.scene))
                    {
                        Ok((_, info)) => {
                            e.insert(info.blobs.into());
                        }
                        Err(err) => {
                            tracing::error!(job = %job.id, "cannot read the job's file set {d}: {err}")
                        }
                    }
                }
            }
            let id = job.id;
            let mut job = job;
            let mut list = submit::initial_tasks(&job)?;
            for t in tasks.remove(&id).unwrap_or_default() {
                let i = t.index as usize;
                if i < list.len() {
                    list[i] = t;
                } else {
                    tracing::error!(job = %id, task = i, "a stored task lies outside its job; ignored");
                }
            }
            // A frame queued to render again (`retry --frames`) keeps its old
            // stitched record until it is stitched anew: it counts only while
            // every tile of it is done.
            if job.is_tiled() && !job.stitched.is_empty() {
                let open: HashSet<u32> = list
                    .iter()
                    .filter(|t| !t.is_done())
                    .map(|t| t.frames[0])
                    .collect();
                if job.stitched.iter().any(|o| open.contains(&o.frame)) {
                    let keep = job
                        .stitched
                        .iter()
                        .filter(|o| !open.contains(&o.frame))
                        .cloned()
                        .collect();
                    job.stitched = Arc::new(keep);
                }
            }
            st.install(job, list, now);
            // Tiles of stitched frames that a crash kept from being collected.
            for t in st.tasks[&id].iter().filter(|t| t.tile.is_some()) {
                if let TaskState::Done { outputs } = &t.state {
                    for o in outputs {
                        st.blobs.note_unreferenced(o.digest, now);
                    }
                }
            }
        }
        Ok(st)
    }

    /// Tells watchers about a change (dropped when nobody listens).
    pub(super) fn announce(&self, event: FarmEvent) {
        if let Some(tx) = &self.events {
            let _ = tx.send(event);
        }
    }

    /// Installs a job's record and its changed tasks (on their way to the
    /// store), keeping every index current: blob references, ready queues,
    /// counts, held leases, deadlines, the stitch queue; and wakes parked
    /// lease calls that can take the tasks that became ready. Costs
    /// O(changed tasks · log n), plus the tiles of newly stitched frames.
    pub(super) fn install(&mut self, job: Job, changed: Vec<Task>, now: u64) {
        let id = job.id;
        let old_job = self.jobs.remove(&id);
        let was_runnable = old_job.as_ref().map(|j| (Reverse(j.priority), j.id));
        if let Some(key) = was_runnable {
            self.runnable.remove(&key);
        }
        let mut added: Vec<Digest> = Vec::new();
        let mut released: Vec<Digest> = Vec::new();
        let mut newly_stitched: Vec<u32> = Vec::new();
        match &old_job {
            None => added.extend(refs::job_refs(&job, self.files_of(&job))),
            Some(old) if !Arc::ptr_eq(&old.stitched, &job.stitched) => {
                let before: HashSet<(u32, &str)> = old
                    .stitched
                    .iter()
                    .map(|o| (o.frame, o.pass.as_str()))
                    .collect();
                let after: HashSet<(u32, &str)> = job
                    .stitched
                    .iter()
                    .map(|o| (o.frame, o.pass.as_str()))
                    .collect();
                for o in job.stitched.iter() {
                    if !before.contains(&(o.frame, o.pass.as_str())) {
                        added.push(o.digest);
                        newly_stitched.push(o.frame);
                    }
                }
                // Frames rendered again (`retry --frames`) let go of their old image.
                for o in old.stitched.iter() {
                    if !after.contains(&(o.frame, o.pass.as_str())) {
                        released.push(o.digest);
                    }
                }
            }
            Some(_) => {}
        }
        // A preview made (or made again) references its video instead.
        if let Some(old) = &old_job {
            let (was, now) = (old.preview.digest(), job.preview.digest());
            if was != now {
                added.extend(now);
                released.extend(was);
            }
        }
        let list = self.tasks.entry(id).or_default();
        let index = self.index.entry(id).or_default();
        let mut changed_idx: HashSet<u32> = HashSet::new();
        let mut frames_touched: BTreeSet<u32> = BTreeSet::new();
        let mut newly_ready = 0usize;
        for t in changed {
            let i = t.index as usize;
            changed_idx.insert(t.index);
            if job.is_tiled() {
                frames_touched.insert(t.frames[0]);
            }
            let old = list.get(i);
            if let Some(old) = old {
                let oj = old_job.as_ref().unwrap_or(&job);
                released.extend(refs::task_refs(old, oj));
                index_task(index, &mut self.held, old, job.is_tiled(), false);
            }
            added.extend(refs::task_refs(&t, &job));
            if t.state == TaskState::Queued && old.is_none_or(|o| o.state != TaskState::Queued) {
                newly_ready += 1;
            }
            if let TaskState::Leased { expires_ms, .. } = t.state {
                self.deadlines.push(Reverse((expires_ms, id, t.index)));
            }
            index_task(index, &mut self.held, &t, job.is_tiled(), true);
            match list.get_mut(i) {
                Some(slot) => *slot = t,
                None => list.push(t),
            }
        }
        // Tiles of newly stitched frames stop referencing their blobs.
        if let Some(old) = &old_job {
            for &frame in &newly_stitched {
                for t in frame_tasks(list, frame) {
                    if !changed_idx.contains(&t.index) {
                        released.extend(refs::task_refs(t, old));
                    }
                }
                frames_touched.insert(frame);
            }
        }
        for d in added {
            self.blobs.add(d);
        }
        for d in released {
            self.blobs.release(d, now);
        }
        let became_final =
            job.state.is_final() && !old_job.as_ref().is_some_and(|o| o.state.is_final());
        let reopened =
            !job.state.is_final() && old_job.as_ref().is_some_and(|o| o.state.is_final());
        let resumed = job.state != JobState::Paused
            && old_job
                .as_ref()
                .is_some_and(|o| o.state == JobState::Paused);
        let held_back = self.held_back(&job);
        let index = &self.index[&id];
        let runnable = !job.state.is_final()
            && job.state != JobState::Paused
            && !index.ready.is_empty()
            && !held_back;
        if runnable {
            self.runnable.insert((Reverse(job.priority), id));
        }
        if resumed {
            newly_ready = index.ready.len();
        }
        self.note_pipeline(&job, old_job.as_ref());
        if job.preview.is_due(job.state == JobState::Done) {
            self.to_preview.insert(id);
        } else {
            self.to_preview.remove(&id);
        }
        let new_state = old_job
            .as_ref()
            .is_none_or(|o| o.state != job.state)
            .then_some(job.state);
        self.jobs.insert(id, job);
        // Jobs that wait for this one see its new state.
        if let Some(state) = new_state {
            self.dependency_changed(id, Some(state));
        }
        if became_final {
            let keys: Vec<(JobId, u32)> = self
                .to_stitch
                .range((id, 0)..=(id, u32::MAX))
                .copied()
                .collect();
            for k in keys {
                self.to_stitch.remove(&k);
            }
        } else if reopened || old_job.is_none() {
            self.queue_ready_frames(id, None);
        } else if !frames_touched.is_empty() {
            self.queue_ready_frames(id, Some(&frames_touched));
        }
        if newly_ready > 0 && runnable {
            self.wake(id, newly_ready);
        }
        if became_final {
            self.wake_warm(id);
        }
        self.announce(FarmEvent::Job(id));
    }

    /// Takes job `id` out of memory entirely (archive or delete): its tasks'
    /// and its own blob references go, unless `keep` lists them again.
    pub(super) fn remove_job(&mut self, id: JobId, now: u64) -> Option<(Job, Vec<Task>)> {
        let job = self.jobs.remove(&id)?;
        let tasks = self.tasks.remove(&id).unwrap_or_default();
        self.index.remove(&id);
        self.to_preview.remove(&id);
        self.runnable.remove(&(Reverse(job.priority), id));
        let mut released: Vec<Digest> = refs::job_refs(&job, self.files_of(&job)).collect();
        for t in &tasks {
            released.extend(refs::task_refs(t, &job));
            if let Some(h) = t.holder() {
                if let Some(set) = self.held.get_mut(h) {
                    set.remove(&(id, t.index));
                }
            }
        }
        for d in released {
            self.blobs.release(d, now);
        }
        // A file set can hold a million entries: its lists go with the
        // last job that uses it.
        let shared = job
            .file_set
            .filter(|d| self.jobs.values().any(|j| j.file_set == Some(*d)));
        let unused = job.file_set.filter(|_| shared.is_none());
        if let Some(d) = &unused {
            self.file_sets.remove(d);
        }
        self.access.forget_job(&job.owner, unused.as_ref());
        let keys: Vec<(JobId, u32)> = self
            .to_stitch
            .range((id, 0)..=(id, u32::MAX))
            .copied()
            .collect();
        for k in keys {
            self.to_stitch.remove(&k);
        }
        self.announce(FarmEvent::Job(id));
        Some((job, tasks))
    }

    /// Wakes up to `n` parked lease calls whose slot can render job `id`.
    pub(super) fn wake(&mut self, id: JobId, mut n: usize) {
        let Some(job) = self.jobs.get(&id) else {
            return;
        };
        let mut woken = Vec::new();
        for (key, w) in &self.waiters {
            if n == 0 {
                break;
            }
            let fits = self.workers.get(&w.worker).is_some_and(|r| {
                job.requirements.runtime_for(&r.runtimes).is_some()
                    && job.requirements.satisfied_by(&r.slot_cap(w.slot), &r.tags)
            });
            if fits {
                w.notify.notify_one();
                woken.push(*key);
                n -= 1;
            }
        }
        for k in woken {
            self.waiters.remove(&k);
        }
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

    /// The entries of `job`'s file set (none without one).
    pub(super) fn files_of(&self, job: &Job) -> &[Digest] {
        job.file_set
            .and_then(|d| self.file_sets.get(&d))
            .map_or(&[], |f| f)
    }

    /// Puts the frames of job `id` (or only `frames`) whose tiles are all
    /// done, and that are not stitched, in the stitch queue, and takes out
    /// those that are not.
    fn queue_ready_frames(&mut self, id: JobId, frames: Option<&BTreeSet<u32>>) {
        let job = &self.jobs[&id];
        if !job.is_tiled() {
            return;
        }
        let tasks = &self.tasks[&id];
        let mut state: BTreeMap<u32, bool> = BTreeMap::new();
        match frames {
            None => {
                for t in tasks {
                    *state.entry(t.frames[0]).or_insert(true) &= t.is_done();
                }
            }
            Some(frames) => {
                for &f in frames {
                    let all = frame_tasks(tasks, f).all(Task::is_done);
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
                self.to_stitch.insert((id, frame));
            } else {
                self.to_stitch.remove(&(id, frame));
            }
        }
    }

    /// The tasks of job `id`'s tiled `frame`.
    pub(super) fn tiles_of(&self, id: JobId, frame: u32) -> impl Iterator<Item = &Task> {
        frame_tasks(self.tasks.get(&id).map_or(&[], |t| t.as_slice()), frame)
    }
}

/// The tasks of a tiled job's `frame`: tasks are made frame by frame, in
/// frame order, so they are one run found by binary search.
fn frame_tasks(tasks: &[Task], frame: u32) -> impl Iterator<Item = &Task> {
    let start = tasks.partition_point(|t| t.frames[0] < frame);
    tasks[start..]
        .iter()
        .take_while(move |t| t.frames[0] == frame)
}

/// Puts `t` in its job's indexes (`add`), or takes it out.
fn index_task(
    index: &mut JobIndex,
    held: &mut HashMap<WorkerId, BTreeSet<(JobId, u32)>>,
    t: &Task,
    tiled: bool,
    add: bool,
) {
    let step = |n: &mut u32, by: u32| {
        *n = if add { *n + by } else { *n - by };
    };
    let c = &mut index.counts;
    match &t.state {
        TaskState::Queued => {
            step(&mut c.queued, 1);
            if add {
                index.ready.insert(t.index);
            } else {
                index.ready.remove(&t.index);
            }
        }
        TaskState::Leased { worker, .. } => {
            step(&mut c.leased, 1);
            let mine = held.entry(worker.clone()).or_default();
            if add {
                index.leased.insert(t.index);
                mine.insert((t.job, t.index));
            } else {
                index.leased.remove(&t.index);
                mine.remove(&(t.job, t.index));
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
        index.usage.count(a, add);
    }
}
