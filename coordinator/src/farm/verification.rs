//! Verification in the farm (see [`crate::model::verify`] for the rules): a result
//! of a sampled task is held and the task queued again for a different
//! worker of the same Blender build; it is delivered once two results agree.
//! A worker whose result differs from two agreeing ones is marked suspect
//! and takes no more tasks of that job, nor of any job of the same
//! requirement class (device, GPU memory and tags, as in
//! [`crate::model::hardware::Requirements::describe`]).

use super::*;
use crate::model::verify::{self, Candidate, FrameStats, Resolution, Suspicion, Verification};

/// What verification makes of a result.
enum Verdict {
    /// Record it as the task's result: it was not sampled, or two agreed.
    /// `extra` holds worker records that changed (suspects).
    Deliver {
        outputs: Vec<FrameOutput>,
        stats: Vec<FrameStats>,
        extra: Vec<Owned>,
    },
    /// Held until another worker agrees; the task was queued again.
    Held,
    /// Not counted: a result of an older grant while the task is verified
    /// (who rendered it is not known), or a second result of one worker.
    Ignored,
    /// [`verify::MAX_RENDERS`] results and no two agree: fail the task.
    Unsettled(String),
}

/// What a result does once verification has seen it.
pub(super) enum Step {
    /// Record these outputs (the task's stats are set); store `extra` too.
    Deliver(Vec<FrameOutput>, Vec<Owned>),
    /// Answer the worker with this (held, stored; or ignored).
    Answer(PendingResult),
    /// Fail the task: no two results agree.
    Unsettled(String),
}

impl Farm {
    /// Passes a result through verification: held results are stored here
    /// and answered; a delivered one comes back to be recorded.
    pub(super) fn verify_result(
        &self,
        st: &mut State,
        lease: LeaseId,
        task: &mut Task,
        job: &Job,
        outputs: Vec<FrameOutput>,
        stats: Vec<FrameStats>,
    ) -> Result<Step, Error> {
        let holder = task.holder().cloned();
        Ok(match self.verdict(st, lease, task, job, outputs, stats)? {
            Verdict::Deliver {
                outputs,
                stats,
                extra,
            } => {
                task.stats = stats;
                Step::Deliver(outputs, extra)
            }
            Verdict::Held => {
                // The render is done work even while its result waits for a
                // second worker: its slot-time is charged as such.
                Self::ending(
                    st,
                    lease.job,
                    lease.task,
                    crate::model::usage::AttemptEnd::Done,
                );
                let h = holder.as_ref().map(|h| (h, true));
                let ticket = self.apply(st, vec![task.clone()], job.clone(), h);
                Step::Answer(PendingResult {
                    completion: Completion::Recorded,
                    ticket,
                    stitch: None,
                })
            }
            Verdict::Ignored => Step::Answer(PendingResult {
                completion: Completion::Duplicate,
                ticket: Ticket::none(),
                stitch: None,
            }),
            Verdict::Unsettled(why) => Step::Unsettled(why),
        })
    }

    /// Stores a recorded result as `apply` does, with the worker records
    /// verification changed (suspects).
    pub(super) fn store_result(
        &self,
        st: &mut State,
        task: Task,
        job: Job,
        holder: Option<&WorkerId>,
        mut extra: Vec<Owned>,
    ) -> Ticket {
        if extra.is_empty() {
            return self.apply(st, vec![task], job, holder.map(|h| (h, true)));
        }
        if let Some(r) = holder.and_then(|h| st.workers.get_mut(h)) {
            r.tasks_done += 1;
            extra.push(Owned::Worker(r.clone()));
        }
        self.save(st, job, vec![task], extra)
    }

    /// Whether a result of `task` by `holder` must wait for another worker.
    fn must_verify(&self, st: &State, job: &Job, task: &Task, holder: Option<&WorkerId>) -> bool {
        let seed = self.config.verify_seed;
        let untrusted = holder
            .and_then(|h| st.workers.get(h))
            .is_some_and(|w| w.untrusted);
        task.verify.as_ref().is_some_and(|v| !v.settled())
            || verify::sampled(seed, job.id, task.index, job.task_count, job.verify)
            || (untrusted
                && verify::sampled_untrusted(
                    seed,
                    job.id,
                    task.index,
                    self.config.verify_untrusted,
                ))
    }

    /// Decides what a result of `lease` does; changes `task` (held results,
    /// a queued task) and marks suspects in `st`, which the caller stores.
    fn verdict(
        &self,
        st: &mut State,
        lease: LeaseId,
        task: &mut Task,
        job: &Job,
        outputs: Vec<FrameOutput>,
        stats: Vec<FrameStats>,
    ) -> Result<Verdict, Error> {
        let holder = match &task.state {
            TaskState::Leased { worker, grant, .. } if *grant == lease.grant => {
                Some(worker.clone())
            }
            _ => None,
        };
        if !self.must_verify(st, job, task, holder.as_ref()) {
            return Ok(Verdict::Deliver {
                outputs,
                stats,
                extra: Vec::new(),
            });
        }
        // Checked as the task would record it, without recording it.
        if task.clone().complete(lease.grant, outputs.clone())? == Completion::Duplicate {
            return Ok(Verdict::Ignored);
        }
        let Some(worker) = holder else {
            return Ok(Verdict::Ignored);
        };
        let blender = st
            .workers
            .get(&worker)
            .map(|w| blender_for(job, w))
            .unwrap_or_default();
        let v = task.verify.get_or_insert_with(Verification::default);
        if v.settled() {
            // Rendered again after it was settled (a tile that could not be stitched).
            *v = Verification::default();
        }
        if v.rendered_by(&worker) {
            return Ok(Verdict::Ignored);
        }
        let was_disputed = v.disputed();
        v.candidates.push(Candidate {
            worker: worker.clone(),
            blender,
            outputs,
            stats,
        });
        if v.candidates.len() >= 2 {
            self.count_stat(|s| s.verify_checks += 1);
        }
        match verify::resolve(&v.candidates) {
            Resolution::NeedMore => {
                tracing::info!(lease = %lease, worker = %worker, "result held until a different worker renders the task");
                task.release(lease.grant)?;
                Ok(Verdict::Held)
            }
            Resolution::Disputed => {
                if !was_disputed {
                    self.count_stat(|s| s.verify_mismatches += 1);
                }
                tracing::warn!(lease = %lease, "verification: results of {} workers differ; rendering the task on another worker", v.candidates.len());
                task.release(lease.grant)?;
                Ok(Verdict::Held)
            }
            Resolution::Unsettled => Ok(Verdict::Unsettled(format!(
                "verification: {} workers rendered task {} and no two results agree; the scene may not render the same twice (dither on, a random seed per render) or the workers' Blender builds differ",
                v.candidates.len(),
                task.index
            ))),
            Resolution::Agreed { agreeing, odd } => {
                let winner = v.candidates[agreeing[0]].clone();
                let agreed: Vec<WorkerId> = agreeing
                    .iter()
                    .map(|&i| v.candidates[i].worker.clone())
                    .collect();
                let odd: Vec<WorkerId> = odd.iter().map(|&i| v.candidates[i].worker.clone()).collect();
                *v = Verification {
                    candidates: Vec::new(),
                    agreed: agreed.clone(),
                    odd: odd.clone(),
                };
                let mut extra = Vec::new();
                for w in &odd {
                    extra.extend(mark_suspect(st, w, job, task.index, &agreed));
                }
                tracing::info!(lease = %lease, agreed = ?agreed, "verification passed");
                Ok(Verdict::Deliver {
                    outputs: winner.outputs,
                    stats: winner.stats,
                    extra,
                })
            }
        }
    }

    /// Why a job waits on verification that no available worker can do:
    /// every ready task awaiting a second result is blocked because each
    /// worker that could render it already did (or has another Blender).
    pub(super) fn verify_waiting(
        &self,
        st: &State,
        job: &Job,
        usable: &[&WorkerRecord],
    ) -> Option<String> {
        let index = st.schedule.job(job.id)?;
        if index.counts().leased > 0 {
            return None;
        }
        let tasks = st.tasks.get(&job.id)?;
        let stuck = index.ready().find_map(|i| {
            let t = tasks.get(i as usize)?;
            let v = t.verify.as_ref().filter(|v| !v.candidates.is_empty())?;
            (!usable.iter().any(|w| may_take(job, t, w))).then_some((t, v))
        })?;
        let (t, v) = stuck;
        let by: Vec<String> = v.candidates.iter().map(|c| c.worker.0.clone()).collect();
        Some(format!(
            "waiting: task {} (frames {:?}) awaits verification by a different worker with {}, and none is available (rendered by {}); start another worker, or resubmit without --verify",
            t.index,
            t.frames,
            v.candidates[0].blender,
            by.join(", ")
        ))
    }
}

/// Marks `worker` suspect for `job`'s requirement class; returns its record
/// to store.
fn mark_suspect(
    st: &mut State,
    worker: &WorkerId,
    job: &Job,
    task: u32,
    agreed: &[WorkerId],
) -> Option<Owned> {
    let rec = st.workers.get_mut(worker)?;
    if !rec
        .suspect
        .iter()
        .any(|s| s.job == job.id && s.task == task)
    {
        let names: Vec<&str> = agreed.iter().map(|w| w.0.as_str()).collect();
        rec.suspect.push(Suspicion {
            job: job.id,
            task,
            class: job.requirements.describe(),
            reason: format!(
                "its frames of job {} task {task} differed from those of {} (which agree)",
                job.id,
                names.join(" and ")
            ),
        });
    }
    tracing::warn!(worker = %worker, job = %job.id, task, "worker marked suspect: its result differs from two others");
    Some(Owned::Worker(rec.clone()))
}

/// What a registering worker is suspected of: what its old record was, or,
/// under a new id (its process restarted), what any worker of the same
/// owner (token) and name was, so a restart does not clear a suspicion.
pub(super) fn inherited_suspicion(
    st: &State,
    old: Option<&WorkerRecord>,
    owner: &str,
    name: &str,
) -> Vec<Suspicion> {
    if let Some(o) = old {
        return o.suspect.clone();
    }
    st.workers
        .values()
        .filter(|w| w.owner == owner && w.name == name)
        .flat_map(|w| w.suspect.iter().cloned())
        .collect()
}

/// Whether `w` may render `task` of `job`: a task awaiting verification
/// goes to a worker that has not rendered it, with the same Blender build
/// (the runtime the job renders with there).
pub(super) fn may_take(job: &Job, task: &Task, w: &WorkerRecord) -> bool {
    match &task.verify {
        Some(v) if !v.candidates.is_empty() => {
            !v.rendered_by(&w.id) && v.candidates[0].blender == blender_for(job, w)
        }
        _ => true,
    }
}

/// The Blender build `w` renders `job` with: the version of the runtime the
/// scheduler picks there (its version line when it reported no runtimes).
fn blender_for(job: &Job, w: &WorkerRecord) -> String {
    job.requirements
        .runtime_for(&w.runtimes)
        .map_or_else(|| w.blender_version.clone(), |r| r.version.to_string())
}

/// Whether a suspect worker is kept from `job`: it was caught on this job,
/// or on one of the same requirement class.
pub(super) fn barred(job: &Job, w: Option<&WorkerRecord>) -> bool {
    let Some(w) = w.filter(|w| !w.suspect.is_empty()) else {
        return false;
    };
    let class = job.requirements.describe();
    w.suspect
        .iter()
        .any(|s| s.job == job.id || s.class == class)
}
