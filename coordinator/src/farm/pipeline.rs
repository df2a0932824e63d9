//! Jobs in a pipeline: dependencies (`--after`), budgets (`--max-cost`),
//! and rendering some frames of a job again (`retry --frames`).
//!
//! A job that names others with `--after` is held until every one of them
//! is done; once one of its tasks was leased it no longer waits. When a job
//! it waits for fails, is cancelled or deleted, the farm cancels it, and its
//! reason names that job. These follow-up changes (and the pause of a job
//! that reached its budget) are noticed while the indexes are updated and
//! made by [`Farm::react`], each one a durable change of its own.

use super::*;
use crate::model::usage::Usage;

/// A change the farm owes a job.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Reaction {
    /// Cancel it, for this reason.
    Cancel(String),
    /// Pause it, for this reason.
    Pause(String),
}

/// The pipeline's part of the state: which jobs wait for each job
/// (`--after`, derived from the jobs) and the changes the farm owes jobs
/// (a cancel because a job they waited for failed, a pause at their
/// budget), made by [`Farm::react`].
#[derive(Debug, Default)]
pub(super) struct Dependencies {
    dependents: HashMap<JobId, BTreeSet<JobId>>,
    reactions: BTreeMap<JobId, Reaction>,
}

impl Dependencies {
    /// The jobs that wait for job `id`.
    pub(super) fn waiting_on(&self, id: JobId) -> impl Iterator<Item = JobId> + '_ {
        self.dependents.get(&id).into_iter().flatten().copied()
    }

    /// Takes every owed change.
    fn take_owed(&mut self) -> BTreeMap<JobId, Reaction> {
        std::mem::take(&mut self.reactions)
    }

    /// Keeps the index current after `job` changed (from `old`).
    fn note(&mut self, job: &Job, old: Option<&Job>) {
        let id = job.id;
        if old.is_none() {
            for d in &job.after {
                self.dependents.entry(*d).or_default().insert(id);
            }
        } else if let Some(old) = old.filter(|o| o.after != job.after) {
            for d in &old.after {
                if let Some(set) = self.dependents.get_mut(d) {
                    set.remove(&id);
                }
            }
            for d in &job.after {
                self.dependents.entry(*d).or_default().insert(id);
            }
        }
    }
}

/// What a job's dependencies say now.
enum Deps {
    /// Every one is done (or there are none).
    Done,
    /// Some are not done yet; the first of them.
    Waiting(JobId),
    /// One ended without being done (or is gone): the reason to cancel.
    Broken(String),
}

impl State {
    /// The state of job `id`, live or archived.
    pub(super) fn job_state(&self, id: JobId) -> Option<JobState> {
        self.jobs
            .get(&id)
            .map(|j| j.state)
            .or_else(|| self.archived.get(&id).map(|a| a.job.state))
    }

    fn deps(&self, job: &Job) -> Deps {
        let mut waiting = None;
        for &d in &job.after {
            match self.job_state(d) {
                Some(JobState::Done) => {}
                Some(s @ (JobState::Failed | JobState::Canceled)) => {
                    return Deps::Broken(format!(
                        "canceled: job {d}, which it waited for (--after), {}",
                        if s == JobState::Failed {
                            "failed"
                        } else {
                            "was canceled"
                        }
                    ))
                }
                Some(_) => {
                    waiting.get_or_insert(d);
                }
                None => {
                    return Deps::Broken(format!(
                        "canceled: job {d}, which it waited for (--after), was deleted"
                    ))
                }
            }
        }
        waiting.map_or(Deps::Done, Deps::Waiting)
    }

    /// The job that `job` still waits for, if any.
    pub(super) fn waiting_for(&self, job: &Job) -> Option<JobId> {
        if job.started || job.state.is_final() {
            return None;
        }
        match self.deps(job) {
            Deps::Waiting(d) => Some(d),
            _ => None,
        }
    }

    /// What its tasks have cost so far.
    pub(super) fn usage(&self, id: JobId) -> Usage {
        self.schedule.job(id).map(|i| i.usage()).unwrap_or_default()
    }

    /// Whether a job may not lease now although it has ready tasks: it
    /// waits for other jobs, or it reached its budget.
    pub(super) fn held_back(&self, job: &Job) -> bool {
        (!job.started && !job.after.is_empty() && !matches!(self.deps(job), Deps::Done))
            || self.over_budget(job)
    }

    fn over_budget(&self, job: &Job) -> bool {
        job.max_cost
            .is_some_and(|max| self.usage(job.id).cost >= max - 1e-9)
    }

    /// Keeps the dependents index and the owed reactions current after
    /// `job` changed (from `old`). Called by `install`, before `job` is
    /// stored in `self.jobs`; `dependency_changed` follows once it is.
    pub(super) fn note_pipeline(&mut self, job: &Job, old: Option<&Job>) {
        let id = job.id;
        self.pipeline.note(job, old);
        // Its own dependencies (checked on every change: on a restart the
        // jobs it waits for were installed before it).
        if !job.state.is_final() && !job.started {
            if let Deps::Broken(reason) = self.deps(job) {
                self.pipeline.reactions.insert(id, Reaction::Cancel(reason));
            }
        }
        if !job.state.is_final() && job.state != JobState::Paused && self.over_budget(job) {
            let spent = self.usage(id).cost;
            self.pipeline.reactions.entry(id).or_insert_with(|| {
                Reaction::Pause(format!(
                    "paused: its budget of {:.2} is spent ({spent:.2}); raise it with `tessera update {id} --max-cost N`, then `tessera resume {id}`",
                    job.max_cost.unwrap_or_default()
                ))
            });
        }
    }

    /// Job `id` is now in `state` (None: gone): what waits for it is
    /// released or canceled.
    pub(super) fn dependency_changed(&mut self, id: JobId, state: Option<JobState>) {
        let waiting: Vec<JobId> = self.pipeline.waiting_on(id).collect();
        for d in waiting {
            let Some(dep) = self.jobs.get(&d) else {
                continue;
            };
            if dep.started || dep.state.is_final() {
                continue;
            }
            match state {
                Some(JobState::Done) => {
                    // Released: lease it now if nothing else holds it back.
                    if dep.state != JobState::Paused && !self.held_back(dep) {
                        self.schedule.release(dep, &self.workers);
                    }
                }
                Some(JobState::Failed) | Some(JobState::Canceled) | None => {
                    let how = match state {
                        Some(JobState::Failed) => "failed",
                        Some(_) => "was canceled",
                        None => "was deleted",
                    };
                    self.pipeline.reactions.insert(
                        d,
                        Reaction::Cancel(format!(
                            "canceled: job {id}, which it waited for (--after), {how}"
                        )),
                    );
                }
                Some(_) => {}
            }
        }
    }

    /// Whether adding `after` to job `id` would make a cycle: the path
    /// that would close it, when it would.
    pub(super) fn cycle(&self, id: JobId, after: &[JobId]) -> Option<Vec<JobId>> {
        // Depth-first from each new dependency along `after` edges.
        fn walk(
            st: &State,
            at: JobId,
            goal: JobId,
            path: &mut Vec<JobId>,
            seen: &mut HashSet<JobId>,
        ) -> bool {
            path.push(at);
            if at == goal {
                return true;
            }
            if seen.insert(at) {
                if let Some(job) = st.jobs.get(&at) {
                    for &next in &job.after {
                        if walk(st, next, goal, path, seen) {
                            return true;
                        }
                    }
                }
            }
            path.pop();
            false
        }
        let mut seen = HashSet::new();
        for &d in after {
            let mut path = vec![id];
            if walk(self, d, id, &mut path, &mut seen) {
                return Some(path);
            }
        }
        None
    }
}

/// What `tessera update` changes.
#[derive(Debug, Clone, Default)]
pub struct JobUpdate {
    /// New dependencies (replacing the old ones), if given.
    pub after: Option<Vec<JobId>>,
    /// A new budget (`Some(None)` removes it), if given.
    pub max_cost: Option<Option<f64>>,
}

impl Farm {
    /// Checks the jobs a submission names with `--after`: each exists (live
    /// or archived) and `who` may see it. Returns them without repeats.
    pub(super) fn check_after(
        &self,
        who: Option<&Identity>,
        after: &[u64],
    ) -> Result<Vec<JobId>, Error> {
        let st = self.lock();
        let mut out: Vec<JobId> = Vec::new();
        for &a in after {
            let id = JobId(a);
            let owner = st
                .jobs
                .get(&id)
                .map(|j| &j.owner)
                .or_else(|| st.archived.get(&id).map(|a| &a.job.owner));
            match owner {
                Some(o) if who.is_none_or(|w| w.may_see(o)) => {}
                _ => {
                    return Err(Error::invalid(format!(
                        "--after names job {a}, which does not exist; `tessera jobs --archived` lists the jobs you can wait for"
                    )))
                }
            }
            if let Some(s @ (JobState::Failed | JobState::Canceled)) = st.job_state(id) {
                return Err(Error::invalid(format!(
                    "job {a} is {}, so a job after it would never run; retry job {a} first, or submit without --after {a}",
                    s.name()
                )));
            }
            if !out.contains(&id) {
                out.push(id);
            }
        }
        if out.len() > 100 {
            return Err(Error::invalid(
                "a job may wait for at most 100 jobs; chain them instead",
            ));
        }
        Ok(out)
    }

    /// Changes a job's dependencies or budget. Dependencies change only
    /// before it starts, and never into a cycle.
    pub fn update(
        &self,
        id: JobId,
        who: Option<&Identity>,
        update: JobUpdate,
    ) -> Result<JobSnapshot, Error> {
        let after = match &update.after {
            Some(a) => {
                let raw: Vec<u64> = a.iter().map(|j| j.0).collect();
                Some(self.check_after(who, &raw)?)
            }
            None => None,
        };
        if let Some(Some(m)) = update.max_cost {
            check_budget(m)?;
        }
        let cycle = after.as_ref().and_then(|a| self.lock().cycle(id, a));
        if let Some(path) = cycle {
            let names: Vec<String> = path.iter().map(|j| format!("job {j}")).collect();
            return Err(Error::invalid(format!(
                "that would make a cycle ({}); a job cannot wait for itself",
                names.join(" waits for ")
            )));
        }
        let snap = self.change(id, |job, _| {
            if let Some(after) = after {
                if job.started || job.state.is_final() {
                    return Err(Error::Conflict(format!(
                        "job {id} has started already; dependencies hold a job only until it starts"
                    )));
                }
                job.after = after;
            }
            if let Some(m) = update.max_cost {
                job.max_cost = m;
            }
            Ok(())
        })?;
        self.react();
        Ok(snap)
    }

    /// Makes the changes the farm owes jobs: cancels jobs whose dependency
    /// failed, pauses jobs at their budget. Returns how many it made.
    pub fn react(&self) -> usize {
        let mut made = 0;
        // Each round may owe more (a chain of dependents); the chain is finite.
        for _ in 0..64 {
            let due: Vec<(JobId, Reaction)> =
                self.lock().pipeline.take_owed().into_iter().collect();
            if due.is_empty() {
                break;
            }
            for (id, r) in due {
                let now = self.clock.now_ms();
                let result = self.change(id, |job, tasks| {
                    match &r {
                        Reaction::Cancel(reason) if !job.state.is_final() && !job.started => {
                            job.cancel(now)?;
                            job.message = reason.clone();
                            tasks.iter_mut().for_each(Task::cancel);
                        }
                        Reaction::Pause(reason)
                            if !job.state.is_final() && job.state != JobState::Paused =>
                        {
                            job.pause()?;
                            job.message = reason.clone();
                            tasks.iter_mut().for_each(Task::requeue);
                        }
                        _ => {}
                    }
                    Ok(())
                });
                match result {
                    Ok(_) => {
                        made += 1;
                        tracing::info!(job = %id, "{}", match &r {
                            Reaction::Cancel(m) | Reaction::Pause(m) => m.as_str(),
                        });
                    }
                    Err(Error::NotFound(_)) => {}
                    Err(e) => tracing::warn!(job = %id, "cannot change the job: {e}"),
                }
            }
        }
        made
    }

    /// Renders the given frames of a job again: the tasks holding them go
    /// back to the queue with a clean slate (a task of several frames
    /// renders all of them), a tiled frame's stitched image is dropped until
    /// its tiles are stitched again, and a finished job runs again.
    /// Returns the frames that will be rendered.
    pub fn retry_frames(&self, id: JobId, frames: &str) -> Result<(JobSnapshot, Vec<u32>), Error> {
        let wanted = FrameSet::parse(frames, self.config.max_frames)
            .map_err(|e| Error::Invalid(format!("--frames: {e}")))?;
        let wanted: BTreeSet<u32> = wanted.frames().iter().copied().collect();
        let mut rendered = BTreeSet::new();
        let snap = self.change(id, |job, tasks| {
            let outside: Vec<u32> = {
                let all: HashSet<u32> = tasks.iter().flat_map(|t| t.frames.iter().copied()).collect();
                wanted.iter().copied().filter(|f| !all.contains(f)).take(5).collect()
            };
            if !outside.is_empty() {
                return Err(Error::invalid(format!(
                    "frame(s) {outside:?} are not in job {id} (its frames are {}); name frames of the job",
                    job.frames
                )));
            }
            let mut any = false;
            for t in tasks.iter_mut() {
                if !t.frames.iter().any(|f| wanted.contains(f)) {
                    continue;
                }
                if matches!(t.state, TaskState::Leased { .. } | TaskState::Queued) {
                    continue;
                }
                t.state = TaskState::Queued;
                t.failures = 0;
                t.failed_on.clear();
                t.machine_failed_on.clear();
                t.frames_done = 0;
                t.message.clear();
                rendered.extend(t.frames.iter().copied());
                any = true;
            }
            if !any {
                return Err(Error::Conflict(format!(
                    "the frames asked for in job {id} are already queued or rendering; nothing to retry"
                )));
            }
            if job.is_tiled() {
                let keep: Vec<FrameOutput> = job
                    .stitched
                    .iter()
                    .filter(|o| !rendered.contains(&o.frame))
                    .cloned()
                    .collect();
                job.stitched = Arc::new(keep);
            }
            job.rerun()
        })?;
        tracing::info!(job = %id, frames = rendered.len(), "frames queued to render again");
        Ok((snap, rendered.into_iter().collect()))
    }
}

/// Checks a budget.
pub(super) fn check_budget(max: f64) -> Result<(), Error> {
    if max.is_finite() && max > 0.0 {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "a budget of {max} is not valid; use --max-cost with a positive amount"
        )))
    }
}
