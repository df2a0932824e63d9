//! Jobs as users see and change them: snapshots, why a job waits, and
//! pause, resume, retry and cancel.

use super::*;

/// A job in a listing: its id, and its record when live or its summary
/// when archived.
type Listed<'a> = (JobId, Option<&'a Job>, Option<&'a Arc<ArchivedSummary>>);

impl Farm {
    /// One job with all its tasks and outputs.
    pub fn job(&self, id: JobId) -> Result<JobSnapshot, Error> {
        self.job_page(id, Page::ALL)
    }

    /// One job's summary with a page of its tasks and outputs (an archived
    /// job's outputs are read from the store).
    pub fn job_page(&self, id: JobId, page: Page) -> Result<JobSnapshot, Error> {
        let archived = {
            let st = self.lock();
            match st.jobs.get(&id) {
                Some(job) => return Ok(self.view(&st, job, page)),
                None => st.archived.get(&id).cloned(),
            }
        };
        let a = archived.ok_or_else(|| Error::NotFound(format!("job {id}")))?;
        let outputs = if page.output_limit > 0 {
            self.store.archived_outputs(id)?
        } else {
            Vec::new()
        };
        Ok(views::archived(&a, &outputs, page))
    }

    /// The view of `job` with `page`, from the indexes.
    pub(super) fn view(&self, st: &State, job: &Job, page: Page) -> JobSnapshot {
        let tasks = st.tasks.get(&job.id).map_or(&[][..], |t| t.as_slice());
        let index = st.schedule.job(job.id);
        let mut snap = views::snapshot(job, tasks, index, page, self.waiting(st, job));
        snap.waiting_for = st.waiting_for(job);
        snap
    }

    /// Summaries of up to `limit` jobs with ids above `after` that `who` may
    /// see, oldest first, and the `after` of the next page (None at the end).
    /// Archived jobs are listed only with `archived`.
    pub fn job_list(
        &self,
        who: &Identity,
        after: u64,
        limit: usize,
        archived: bool,
    ) -> (Vec<JobSnapshot>, Option<u64>) {
        let st = self.lock();
        let from = JobId(after.saturating_add(1));
        let live = st.jobs.range(from..).map(|(id, j)| (*id, Some(j), None));
        let old = st
            .archived
            .range(from..)
            .filter(|_| archived)
            .map(|(id, a)| (*id, None, Some(a)));
        let mut all: Vec<Listed<'_>> = live.chain(old).collect();
        if archived {
            all.sort_by_key(|e| e.0);
        }
        let mut out = Vec::new();
        let mut next = None;
        for (_, live, old) in all {
            let owner = live.map_or_else(|| &old.expect("one of both").job.owner, |j| &j.owner);
            if !who.may_see(owner) {
                continue;
            }
            if out.len() == limit {
                next = out.last().map(|s: &JobSnapshot| s.job.id.0);
                break;
            }
            out.push(match (live, old) {
                (Some(job), _) => self.view(&st, job, Page::SUMMARY),
                (None, Some(a)) => views::archived(a, &[], Page::SUMMARY),
                _ => unreachable!("a listed job is live or archived"),
            });
        }
        (out, next)
    }

    /// Why an unfinished job is not making progress, when it is not: no
    /// online, healthy worker has a slot that can render it; every such
    /// worker has failed it (it then goes on on the least-failed one); or a
    /// frame waits for its stitch to be tried again.
    pub(super) fn waiting(&self, st: &State, job: &Job) -> Option<String> {
        if job.state.is_final() || job.state == JobState::Paused {
            return None;
        }
        if let Some(d) = st.waiting_for(job) {
            let state = st.jobs.get(&d).map_or("archived", |j| j.state.name());
            return Some(format!(
                "waiting for job {d} ({state}) to be done (--after)"
            ));
        }
        let now = self.clock.now_ms();
        let usable: Vec<&WorkerRecord> = st
            .workers
            .values()
            .filter(|w| self.available(st, w, now) && capable(job, w))
            .collect();
        if usable.is_empty() {
            return Some(self.no_worker_for(st, job, now));
        }
        if let Some(why) = self.verify_waiting(st, job, &usable) {
            return Some(why);
        }
        let fails = |w: &WorkerRecord| job.failures_by_worker.get(&w.id.0).copied().unwrap_or(0);
        if usable.iter().all(|w| fails(w) >= self.config.block_after) {
            let least = usable.iter().min_by_key(|w| fails(w)).expect("not empty");
            let list: Vec<String> = usable
                .iter()
                .map(|w| format!("{} {}x", w.id, fails(w)))
                .collect();
            return Some(format!(
                "every available worker has failed this job ({}); going on on the least-failed one, {}, until a task runs out of attempts; add workers or fix the scene",
                list.join(", "),
                least.id
            ));
        }
        if let Some(why) = self.unleasable(st, job, &usable) {
            return Some(why);
        }
        let stalled = st.finishing.stalled(job.id);
        stalled.map(|(frame, n)| {
            format!("frame {frame} could not be stitched {n} time(s) (its tiles could not be read); trying again")
        })
    }

    /// Every live job with all its tasks, oldest first (for tests; views
    /// for users are paged).
    pub fn jobs(&self) -> Vec<JobSnapshot> {
        let st = self.lock();
        st.jobs
            .values()
            .map(|job| self.view(&st, job, Page::ALL))
            .collect()
    }

    /// Every live job's summary, oldest first (for metrics).
    pub fn job_summaries(&self) -> Vec<JobSnapshot> {
        let st = self.lock();
        st.jobs
            .values()
            .map(|job| self.view(&st, job, Page::SUMMARY))
            .collect()
    }

    /// Fails with "not found" unless `who` may see job `id` (another user's
    /// job is indistinguishable from a missing one).
    pub fn check_owner(&self, id: JobId, who: &Identity) -> Result<(), Error> {
        let st = self.lock();
        let owner = match (st.jobs.get(&id), st.archived.get(&id)) {
            (Some(job), _) => Some(&job.owner),
            (None, Some(a)) => Some(&a.job.owner),
            _ => None,
        };
        match owner {
            Some(owner) if who.may_see(owner) => Ok(()),
            _ => Err(Error::NotFound(format!("job {id}"))),
        }
    }

    /// Applies a change to a job and its tasks, durably. The change sees
    /// (and may change) every task of the job, so it suits commands on a
    /// whole job, not per-task steps.
    pub(super) fn change(
        &self,
        id: JobId,
        f: impl FnOnce(&mut Job, &mut [Task]) -> Result<(), Error>,
    ) -> Result<JobSnapshot, Error> {
        let (ticket, view) = {
            let mut st = self.lock();
            let mut job = st
                .jobs
                .get(&id)
                .cloned()
                .ok_or_else(|| Error::NotFound(format!("job {id}")))?;
            let before = &st.tasks[&id];
            let mut tasks: Vec<Task> = before.iter().map(|t| Task::clone(t)).collect();
            f(&mut job, &mut tasks)?;
            let changed: Vec<Task> = tasks
                .into_iter()
                .zip(before)
                .filter(|(new, old)| new != &***old)
                .map(|(new, _)| new)
                .collect();
            let ticket = self.save(&mut st, job, changed, Vec::new());
            let view = self.view(&st, &st.jobs[&id], Page::SUMMARY);
            (ticket, view)
        };
        ticket.wait()?;
        Ok(view)
    }

    /// Pauses a job: no new leases; running renders stop and their tasks go
    /// back to the queue without charging an attempt.
    pub fn pause(&self, id: JobId) -> Result<JobSnapshot, Error> {
        let snap = self.change(id, |job, tasks| {
            job.pause()?;
            tasks.iter_mut().for_each(Task::requeue);
            Ok(())
        })?;
        tracing::info!(job = %id, "job paused");
        Ok(snap)
    }

    /// Resumes a paused job.
    pub fn resume(&self, id: JobId) -> Result<JobSnapshot, Error> {
        let snap = self.change(id, |job, _| job.resume())?;
        tracing::info!(job = %id, "job resumed");
        Ok(snap)
    }

    /// Re-queues the failed and canceled tasks of a failed or canceled job.
    pub fn retry(&self, id: JobId) -> Result<JobSnapshot, Error> {
        let snap = self.change(id, |job, tasks| {
            job.retry()?;
            tasks.iter_mut().for_each(Task::retry);
            Ok(())
        })?;
        tracing::info!(job = %id, "job retried");
        Ok(snap)
    }

    /// Cancels a job: its queued and running tasks stop.
    pub fn cancel(&self, id: JobId) -> Result<JobSnapshot, Error> {
        let now = self.clock.now_ms();
        // `change` wakes lease calls, so workers holding this job warm hear of it now.
        let snap = self.change(id, |job, tasks| {
            job.cancel(now)?;
            tasks.iter_mut().for_each(Task::cancel);
            Ok(())
        })?;
        tracing::info!(job = %id, "job canceled");
        // Jobs that wait for it are canceled now, not at the next tick.
        self.react();
        Ok(snap)
    }
}

impl Farm {
    /// Takes a finished job out of the scheduler's memory: its summary and
    /// outputs are kept (still listed with `--archived`, fetchable), its
    /// tasks go. Its blobs stay until it is deleted.
    pub fn archive(&self, id: JobId) -> Result<JobSnapshot, Error> {
        let now = self.clock.now_ms();
        let (ticket, view) = {
            let mut st = self.lock();
            let job = st
                .jobs
                .get(&id)
                .ok_or_else(|| match st.archived.contains_key(&id) {
                    true => Error::Conflict(format!("job {id} is archived already")),
                    false => Error::NotFound(format!("job {id}")),
                })?;
            if !job.state.is_final() {
                return Err(Error::Conflict(format!(
                    "job {id} is {}; cancel it or wait for it to end before archiving it",
                    job.state.name()
                )));
            }
            let full = self.view(&st, job, Page::ALL);
            let tasks = &st.tasks[&id];
            let blobs = refs::all_refs(job, st.files_of(job), tasks);
            let mut summary_job = job.clone();
            summary_job.stitched = Default::default();
            let summary = ArchivedSummary {
                job: summary_job,
                counts: full.counts,
                usage: full.usage,
            };
            let record = crate::store::ArchivedJob {
                summary: summary.clone(),
                blobs: blobs.clone(),
                outputs: full.outputs,
            };
            let ticket = self.commit(&st, vec![Owned::Archive(Box::new(record))]);
            st.remove_job(id, now);
            // Its blobs stay referenced while it is archived.
            for d in blobs {
                st.blobs.add(d);
            }
            let summary = Arc::new(summary);
            st.archived.insert(id, summary.clone());
            (ticket, views::archived(&summary, &[], Page::SUMMARY))
        };
        ticket.wait()?;
        self.purge_later(id);
        tracing::info!(job = %id, "job archived");
        Ok(view)
    }

    /// Forgets a finished job, live or archived: its records go and its
    /// blobs are collected once nothing else references them.
    pub fn delete(&self, id: JobId) -> Result<(), Error> {
        let now = self.clock.now_ms();
        // An archived job's references were counted from its stored record:
        // read them before the record goes.
        let archived = self.lock().archived.contains_key(&id);
        let blobs = if archived {
            self.archived_blobs(id)?
        } else {
            Vec::new()
        };
        let ticket = {
            let mut st = self.lock();
            let waiting: Vec<String> = st
                .pipeline
                .waiting_on(id)
                .filter(|d| {
                    st.jobs
                        .get(d)
                        .is_some_and(|j| !j.started && !j.state.is_final())
                })
                .map(|d| d.to_string())
                .collect();
            if !waiting.is_empty() {
                return Err(Error::Conflict(format!(
                    "job(s) {} wait for job {id} (--after); cancel them or let them start before deleting it",
                    waiting.join(", ")
                )));
            }
            if let Some(job) = st.jobs.get(&id) {
                if !job.state.is_final() {
                    return Err(Error::Conflict(format!(
                        "job {id} is {}; cancel it or wait for it to end before deleting it",
                        job.state.name()
                    )));
                }
                let ticket = self.commit(&st, vec![Owned::Delete(id)]);
                st.remove_job(id, now);
                st.dependency_changed(id, None);
                ticket
            } else if archived && st.archived.remove(&id).is_some() {
                let ticket = self.commit(&st, vec![Owned::Delete(id)]);
                for d in blobs {
                    st.blobs.release(d, now);
                }
                st.dependency_changed(id, None);
                st.announce(FarmEvent::Job(id));
                ticket
            } else {
                return Err(Error::NotFound(format!("job {id}")));
            }
        };
        ticket.wait()?;
        gc::return_freed_memory();
        self.purge_later(id);
        self.react();
        tracing::info!(job = %id, "job deleted");
        Ok(())
    }

    /// The blobs an archived job references, as stored.
    fn archived_blobs(&self, id: JobId) -> Result<Vec<Digest>, Error> {
        Ok(self
            .store
            .load_archived(id)?
            .map(|a| a.blobs)
            .unwrap_or_default())
    }

    /// Frees the space of the task records of a job that left the store's
    /// live trees, off the caller's path.
    fn purge_later(&self, id: JobId) {
        let store = self.store.clone();
        std::thread::spawn(move || {
            if let Err(e) = store.purge_tasks(id) {
                tracing::warn!(job = %id, "cannot purge task records: {e}");
            }
        });
    }

    /// Archives finished jobs that ended more than `keep_ms` ago; returns
    /// how many.
    pub fn archive_older_than(&self, keep_ms: u64) -> usize {
        let now = self.clock.now_ms();
        let due: Vec<JobId> = self
            .lock()
            .jobs
            .values()
            .filter(|j| j.finished_ms.is_some_and(|f| f + keep_ms <= now))
            .map(|j| j.id)
            .collect();
        let mut n = 0;
        for id in due {
            match self.archive(id) {
                Ok(_) => n += 1,
                Err(e) => tracing::warn!(job = %id, "cannot archive: {e}"),
            }
        }
        if n > 0 {
            gc::return_freed_memory();
        }
        n
    }
}

impl Farm {
    /// Why no available worker that could render `job` may take any of its
    /// ready tasks, when none may and none of its tasks runs (each failed
    /// on those workers' machines, most often). Without this, such a job
    /// waits with no reason.
    fn unleasable(&self, st: &State, job: &Job, usable: &[&WorkerRecord]) -> Option<String> {
        let index = st.schedule.job(job.id)?;
        if index.ready().next().is_none() || index.counts().leased > 0 {
            return None;
        }
        // `usable` is what the scheduler counts as the task's takers.
        let takers = || usable.len();
        if usable
            .iter()
            .any(|w| scheduler::first_ready(st, job.id, &w.id, &takers).is_some())
        {
            return None;
        }
        let ids: Vec<&str> = usable.iter().map(|w| w.id.0.as_str()).collect();
        let tasks = st.tasks.get(&job.id)?;
        let machine = index.ready().any(|i| {
            tasks
                .get(i as usize)
                .is_some_and(|t| !t.machine_failed_on.is_empty())
        });
        Some(if machine {
            format!(
                "waiting: its ready tasks failed on the machine of every available worker ({}); fix the machine (disk space, permissions, mounts) and restart its worker, which then tries them again, or add a worker",
                ids.join(", ")
            )
        } else {
            format!(
                "waiting: no available worker ({}) may take its ready tasks; add a worker, or retry the job",
                ids.join(", ")
            )
        })
    }

    /// Why no available worker can render `job`: its requirements, and,
    /// when no available worker has a Blender of the version it asks for,
    /// that version and the farm's.
    fn no_worker_for(&self, st: &State, job: &Job, now: u64) -> String {
        let mut what = job.requirements.describe();
        if let Some(req) = job.requirements.blender {
            let available: Vec<&WorkerRecord> = st
                .workers
                .values()
                .filter(|w| self.available(st, w, now))
                .collect();
            let runtimes = available.iter().flat_map(|w| &w.runtimes);
            if !runtimes.clone().any(|r| req.matches(r.version)) {
                what = format!(
                    "{} Blender {req} (the farm's Blenders: {})",
                    if what == "any slot" {
                        "a".to_string()
                    } else {
                        format!("{what} and a")
                    },
                    crate::model::runtime::versions(runtimes)
                );
            }
        }
        format!("waiting: no available worker with {what}")
    }
}
