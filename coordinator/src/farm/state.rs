//! The farm's state in memory: the records (jobs, tasks, workers, users,
//! archived summaries) and the parts that keep indexes derived from them,
//! each with private fields and a small interface:
//! - the blob ledger (`gc::BlobLedger`): references, garbage, touches, blobs
//!   being collected;
//! - the schedule (`schedule::Schedule`): ready queues, runnable jobs, held
//!   leases, deadlines, parked lease calls;
//! - finishing (`stitching::Finishing`): the stitch and preview queues;
//! - the pipeline (`pipeline::Dependencies`): who waits for which job, and
//!   the changes owed to jobs;
//! - accounting (`accounting::Endings`) and access (`access::AccessState`).
//!
//! Only [`State::install`] changes the derived indexes: it computes one
//! [`Change`] of the records and hands it to each part. A feature that needs
//! an index of its own adds a part and a line there. Everything here is
//! derived from the durable records; a restart (or a failed write) rebuilds
//! it with [`State::recover`].

use super::*;

/// The records and the parts (see the module doc).
#[derive(Default)]
pub(super) struct State {
    pub(super) jobs: BTreeMap<JobId, Job>,
    pub(super) tasks: BTreeMap<JobId, Vec<Arc<Task>>>,
    pub(super) workers: BTreeMap<WorkerId, WorkerRecord>,
    pub(super) next_job: u64,
    pub(super) next_worker: u64,
    pub(super) health: HashMap<WorkerId, Health>,
    pub(super) users: BTreeMap<String, UserRecord>,
    /// Which blobs records reference, which none does, which were touched,
    /// which are being collected (see `gc`).
    pub(super) blobs: gc::BlobLedger,
    /// The stitch queue, the preview queue and stitch failures.
    pub(super) finishing: stitching::Finishing,
    /// The entries of each job's file set, by file-set blob.
    pub(super) file_sets: HashMap<Digest, Arc<[Digest]>>,
    /// Who possesses which blob, and who holds which grant (see `access`).
    pub(super) access: access::AccessState,
    /// Changes, for watchers (`WatchJob`, the dashboard's event stream).
    pub(super) events: Option<tokio::sync::broadcast::Sender<FarmEvent>>,
    /// Ready queues, runnable jobs, held leases, deadlines and parked
    /// lease calls.
    pub(super) schedule: schedule::Schedule,
    /// Where new records go to be written (see `txn`).
    pub(super) commits: Option<std::sync::mpsc::Sender<txn::Entry>>,
    /// Summaries of archived jobs (their records left the store's hot trees).
    pub(super) archived: BTreeMap<JobId, Arc<ArchivedSummary>>,
    /// Who waits for which job, and the changes owed to jobs.
    pub(super) pipeline: pipeline::Dependencies,
    /// How attempts that are ending now ended, when their new state alone
    /// does not say (an expired lease, a preemption); read by `save`.
    pub(super) endings: accounting::Endings,
}

impl State {
    /// Reads everything `store` holds and derives the indexes. File sets
    /// in `known` (those of the memory being rebuilt) are not read again.
    pub(super) fn recover(
        store: &dyn MetaStore,
        blobs: &dyn BlobStore,
        now: u64,
        lease_ttl_ms: u64,
        known: HashMap<Digest, Arc<[Digest]>>,
    ) -> Result<State, Error> {
        let snap = store.load()?;
        let mut st = State {
            file_sets: known,
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
        // Known file sets that no stored job names any more go.
        let named: HashSet<Digest> = jobs.iter().filter_map(|j| j.file_set).collect();
        st.file_sets.retain(|d, _| named.contains(d));
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
            let mut stored = tasks.remove(&id).unwrap_or_default();
            stored.sort_by_key(|t| t.index);
            for t in stored {
                let i = t.index as usize;
                if i < list.len() {
                    list[i] = t;
                } else if i == list.len() && job.auto_chunked() {
                    // The rest of a run a lease carved (see `chunking`).
                    list.push(t);
                } else {
                    tracing::error!(job = %id, task = i, "a stored task lies outside its job; ignored");
                }
            }
            if job.auto_chunked() {
                job.task_count = list.len() as u32;
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
    /// store). Computes one [`Change`] and hands it to each part that keeps
    /// an index derived from the records: the blob ledger, the schedule
    /// (which wakes parked lease calls that can take tasks that became
    /// ready), the stitch and preview queues, and the pipeline. Costs
    /// O(changed tasks · log n), plus the tiles of newly stitched frames.
    pub(super) fn install(&mut self, job: Job, changed: Vec<Task>, now: u64) {
        let id = job.id;
        let old_job = self.jobs.remove(&id);
        let list = self.tasks.entry(id).or_default();
        let before = list.len() as u32;
        let mut replaced = Vec::new();
        for t in changed {
            let i = t.index;
            let t = Arc::new(t);
            match list.get_mut(i as usize) {
                Some(slot) if i < before => replaced.push((i, std::mem::replace(slot, t))),
                // New in this change already: still new.
                Some(slot) => *slot = t,
                None => list.push(t),
            }
        }
        let appended = before..list.len() as u32;
        let change = Change::new(&job, old_job.as_ref(), &self.tasks[&id], replaced, appended);
        let (added, released) = refs::change_refs(&change, self.files_of(&job));
        for d in added {
            self.blobs.add(d);
        }
        for d in released {
            self.blobs.release(d, now);
        }
        let newly_ready = self.schedule.index_change(&change);
        // After the indexes: a budget is checked against the new usage.
        let held_back = self.held_back(&job);
        self.schedule
            .place(&change, newly_ready, held_back, &self.workers);
        self.finishing.apply(&change);
        let new_state = change.new_state();
        drop(change);
        self.note_pipeline(&job, old_job.as_ref());
        self.jobs.insert(id, job);
        // Jobs that wait for this one see its new state.
        if let Some(state) = new_state {
            self.dependency_changed(id, Some(state));
        }
        self.announce(match new_state {
            Some(s) if s.is_final() => FarmEvent::JobEnded(id),
            _ => FarmEvent::Job(id),
        });
    }

    /// Takes job `id` out of memory entirely (archive or delete): its tasks'
    /// and its own blob references go, unless `keep` lists them again.
    pub(super) fn remove_job(&mut self, id: JobId, now: u64) -> Option<(Job, Vec<Arc<Task>>)> {
        let job = self.jobs.remove(&id)?;
        let tasks = self.tasks.remove(&id).unwrap_or_default();
        self.schedule.forget(&job, &tasks);
        self.finishing.forget(id);
        let mut released: Vec<Digest> = refs::job_refs(&job, self.files_of(&job)).collect();
        for t in &tasks {
            released.extend(refs::task_refs(t, &job));
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
        self.announce(FarmEvent::Job(id));
        Some((job, tasks))
    }

    /// The entries of `job`'s file set (none without one).
    pub(super) fn files_of(&self, job: &Job) -> &[Digest] {
        job.file_set
            .and_then(|d| self.file_sets.get(&d))
            .map_or(&[], |f| f)
    }

    /// The tasks of job `id`'s tiled `frame`.
    pub(super) fn tiles_of(&self, id: JobId, frame: u32) -> impl Iterator<Item = &Task> {
        frame_tasks(self.tasks.get(&id).map_or(&[], |t| t.as_slice()), frame)
    }
}

/// The tasks of a tiled job's `frame`: tasks are made frame by frame, in
/// frame order, so they are one run found by binary search.
pub(super) fn frame_tasks(tasks: &[Arc<Task>], frame: u32) -> impl Iterator<Item = &Task> {
    let start = tasks.partition_point(|t| t.frames[0] < frame);
    tasks[start..]
        .iter()
        .map(|t| &**t)
        .take_while(move |t| t.frames[0] == frame)
}

/// One installed change of a job, computed once by [`State::install`] and
/// handed to every part that keeps an index derived from the records.
pub(super) struct Change<'a> {
    /// The job's new record.
    pub(super) job: &'a Job,
    /// The record it replaces (None when the job is new).
    pub(super) old_job: Option<&'a Job>,
    /// The job's tasks after the change.
    pub(super) list: &'a [Arc<Task>],
    /// The changed tasks that replaced a record: each one's index and the
    /// record it replaced. See [`Change::tasks`].
    replaced: Vec<(u32, Arc<Task>)>,
    /// The new tasks, appended to the list: a new job's million tasks are
    /// a range, not a million entries.
    appended: std::ops::Range<u32>,
    /// Frames this change stitched (their tiles let go of their blobs).
    pub(super) newly_stitched: Vec<u32>,
    /// Frames of a tiled job whose tiles or stitched image changed.
    pub(super) frames_touched: BTreeSet<u32>,
    /// The job ended with this change.
    pub(super) became_final: bool,
    /// The job had ended and runs again.
    pub(super) reopened: bool,
    /// The job was paused and is not any more.
    pub(super) resumed: bool,
}

impl<'a> Change<'a> {
    fn new(
        job: &'a Job,
        old_job: Option<&'a Job>,
        list: &'a [Arc<Task>],
        replaced: Vec<(u32, Arc<Task>)>,
        appended: std::ops::Range<u32>,
    ) -> Self {
        let mut newly_stitched = Vec::new();
        if let Some(old) = old_job.filter(|o| !Arc::ptr_eq(&o.stitched, &job.stitched)) {
            let before: HashSet<(u32, &str)> = old
                .stitched
                .iter()
                .map(|o| (o.frame, o.pass.as_str()))
                .collect();
            for o in job.stitched.iter() {
                if !before.contains(&(o.frame, o.pass.as_str())) {
                    newly_stitched.push(o.frame);
                }
            }
        }
        let mut frames_touched: BTreeSet<u32> = BTreeSet::new();
        if job.is_tiled() {
            let changed = replaced.iter().map(|(i, _)| *i).chain(appended.clone());
            frames_touched.extend(changed.map(|i| list[i as usize].frames[0]));
        }
        if old_job.is_some() {
            frames_touched.extend(newly_stitched.iter().copied());
        }
        let was = old_job.map(|o| o.state);
        Change {
            job,
            old_job,
            list,
            replaced,
            appended,
            newly_stitched,
            frames_touched,
            became_final: job.state.is_final() && !was.is_some_and(|s| s.is_final()),
            reopened: !job.state.is_final() && was.is_some_and(|s| s.is_final()),
            resumed: job.state != JobState::Paused && was == Some(JobState::Paused),
        }
    }

    /// The changed tasks: each one's index and the record it replaced
    /// (None when the task is new).
    pub(super) fn tasks(&self) -> impl Iterator<Item = (u32, Option<&Task>)> + '_ {
        let replaced = self.replaced.iter().map(|(i, old)| (*i, Some(&**old)));
        replaced.chain(self.appended.clone().map(|i| (i, None)))
    }

    /// The job's new state, when it changed (or the job is new).
    fn new_state(&self) -> Option<JobState> {
        self.old_job
            .is_none_or(|o| o.state != self.job.state)
            .then_some(self.job.state)
    }
}
