//! Jobs as users see and change them: snapshots, why a job waits, and
//! pause, resume, retry and cancel.

use super::*;

impl Farm {
    /// One job with all its tasks and outputs.
    pub fn job(&self, id: JobId) -> Result<JobSnapshot, Error> {
        self.job_page(id, Page::ALL)
    }

    /// One job's summary with a page of its tasks and outputs.
    pub fn job_page(&self, id: JobId, page: Page) -> Result<JobSnapshot, Error> {
        let st = self.lock();
        let job = st
            .jobs
            .get(&id)
            .ok_or_else(|| Error::NotFound(format!("job {id}")))?;
        Ok(views::snapshot(
            job,
            st.tasks.get(&id).map_or(&[], |t| t.as_slice()),
            page,
            self.waiting(&st, job),
        ))
    }

    /// Summaries of up to `limit` jobs with ids above `after` that `who` may
    /// see, oldest first, and the `after` of the next page (None at the end).
    pub fn job_list(
        &self,
        who: &Identity,
        after: u64,
        limit: usize,
    ) -> (Vec<JobSnapshot>, Option<u64>) {
        let st = self.lock();
        let mut out = Vec::new();
        let mut next = None;
        for job in st
            .jobs
            .range(JobId(after.saturating_add(1))..)
            .map(|(_, j)| j)
            .filter(|j| who.may_see(&j.owner))
        {
            if out.len() == limit {
                next = out.last().map(|s: &JobSnapshot| s.job.id.0);
                break;
            }
            out.push(views::snapshot(
                job,
                st.tasks.get(&job.id).map_or(&[], |t| t.as_slice()),
                Page::SUMMARY,
                self.waiting(&st, job),
            ));
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
        let now = self.clock.now_ms();
        let usable: Vec<&WorkerRecord> = st
            .workers
            .values()
            .filter(|w| self.available(st, w, now) && capable(job, w))
            .collect();
        if usable.is_empty() {
            return Some(format!(
                "waiting: no available worker with {}",
                job.requirements.describe()
            ));
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
        let stalled = st
            .stitch_errors
            .iter()
            .find(|((j, _), _)| *j == job.id)
            .map(|((_, f), (n, _))| (*f, *n));
        stalled.map(|(frame, n)| {
            format!("frame {frame} could not be stitched {n} time(s) (its tiles could not be read); trying again")
        })
    }

    /// Every job, oldest first.
    pub fn jobs(&self) -> Vec<JobSnapshot> {
        let st = self.lock();
        st.jobs
            .values()
            .map(|job| {
                views::snapshot(
                    job,
                    st.tasks.get(&job.id).map_or(&[], |t| t.as_slice()),
                    Page::ALL,
                    self.waiting(&st, job),
                )
            })
            .collect()
    }

    /// Fails with "not found" unless `who` may see job `id` (another user's
    /// job is indistinguishable from a missing one).
    pub fn check_owner(&self, id: JobId, who: &Identity) -> Result<(), Error> {
        let st = self.lock();
        match st.jobs.get(&id) {
            Some(job) if who.may_see(&job.owner) => Ok(()),
            _ => Err(Error::NotFound(format!("job {id}"))),
        }
    }

    /// Applies a change to a job and its tasks, durably, then wakes lease calls.
    pub(super) fn change(
        &self,
        id: JobId,
        f: impl FnOnce(&mut Job, &mut [Task]) -> Result<(), Error>,
    ) -> Result<JobSnapshot, Error> {
        let mut st = self.lock();
        let mut job = st
            .jobs
            .get(&id)
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("job {id}")))?;
        let mut tasks = st.tasks.get(&id).cloned().unwrap_or_default();
        f(&mut job, &mut tasks)?;
        let mut records: Vec<Record<'_>> = tasks.iter().map(Record::Task).collect();
        records.push(Record::Job(&job));
        self.store.write(&records)?;
        st.install(job.clone(), tasks.clone(), self.clock.now_ms());
        let waiting = self.waiting(&st, &job);
        drop(st);
        self.queued.notify_waiters();
        Ok(views::snapshot(&job, &tasks, Page::SUMMARY, waiting))
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
        Ok(snap)
    }
}

impl Farm {
    /// Takes a finished job out of the scheduler's memory, keeping its summary.
    pub fn archive(&self, id: JobId) -> Result<JobSnapshot, Error> {
        Err(Error::Conflict(format!("job {id} cannot be archived yet")))
    }

    /// Forgets a finished job and frees its blobs.
    pub fn delete(&self, id: JobId) -> Result<(), Error> {
        Err(Error::Conflict(format!("job {id} cannot be deleted yet")))
    }
}
