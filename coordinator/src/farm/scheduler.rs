//! Choosing the next task for a slot: priority, fair share, warm sessions,
//! requirements, and workers blocked for a job. Works on the indexes
//! (`State::runnable` and each job's ready queue), so a choice costs
//! O(runnable jobs + log n), never a scan of the tasks.

use super::*;

/// Who asks for work: a slot of a worker.
pub(super) struct Asker<'a> {
    pub(super) worker: &'a WorkerId,
    pub(super) cached: &'a HashSet<Digest>,
    pub(super) warm: Option<JobId>,
    pub(super) slot: &'a SlotCap,
    pub(super) tags: &'a [String],
    /// Whether a worker takes work now (online, not drained).
    pub(super) available: &'a dyn Fn(&WorkerRecord) -> bool,
    /// The Blenders the worker offers.
    pub(super) runtimes: &'a [crate::model::runtime::Runtime],
    /// How the worker's capacity is bought.
    pub(super) capacity: crate::model::usage::Capacity,
}

/// Whether any slot of `w` can render `job`.
pub(super) fn capable(job: &Job, w: &WorkerRecord) -> bool {
    job.capacity.accepts(w.capacity)
        && job.requirements.runtime_for(&w.runtimes).is_some()
        && (0..w.slots).any(|s| job.requirements.satisfied_by(&w.slot_cap(s), &w.tags))
}

/// Whether `worker` may take tasks of `job` despite its failures there: when
/// it is not blocked for the job, or when every available worker that could
/// serve the job is blocked and this one has failed it least. The job then
/// goes on instead of waiting silently; every failure still charges an
/// attempt, so it ends.
fn may_serve(
    st: &State,
    job: &Job,
    worker: &WorkerId,
    block_after: u32,
    available: &dyn Fn(&WorkerRecord) -> bool,
) -> bool {
    let fails = |w: &WorkerId| job.failures_by_worker.get(&w.0).copied().unwrap_or(0);
    if fails(worker) < block_after {
        return true;
    }
    let mut least = u32::MAX;
    for w in st
        .workers
        .values()
        .filter(|w| available(w) && capable(job, w))
    {
        if fails(&w.id) < block_after {
            return false;
        }
        least = least.min(fails(&w.id));
    }
    fails(worker) <= least
}

/// The first ready task of `job` that `worker` may take: not one that failed
/// on its machine, nor one it failed unless as many workers have failed it
/// as `takers` counts (the available workers that could take it: counting
/// others, which never will, would leave it waiting for ever).
pub(super) fn first_ready(
    st: &State,
    job: JobId,
    worker: &WorkerId,
    takers: &dyn Fn() -> usize,
) -> Option<u32> {
    let tasks = &st.tasks[&job];
    let mut takers_n = None;
    st.schedule
        .job(job)
        .into_iter()
        .flat_map(|i| i.ready())
        .find(|&i| {
            let t = &tasks[i as usize];
            if t.machine_failed_on.contains(worker) {
                return false;
            }
            if t.verify.is_some()
                && !st
                    .workers
                    .get(worker)
                    .is_some_and(|w| verification::may_take(&st.jobs[&job], t, w))
            {
                return false;
            }
            if !t.failed_on.contains(worker) {
                return true;
            }
            let n = *takers_n.get_or_insert_with(takers);
            t.failed_on.len() >= n.max(1)
        })
}

/// Chooses the next task for the asking slot. Among the runnable jobs of the
/// highest priority that the slot can serve: the job the slot holds warm,
/// while fair share allows (no other job of that priority runs more than one
/// task fewer); else the job with the fewest running tasks (fair share), then
/// one whose scene the worker has cached, then the oldest.
pub(super) fn pick(st: &State, asker: &Asker<'_>, block_after: u32) -> Option<(JobId, u32)> {
    let Asker {
        worker,
        cached,
        warm,
        slot,
        tags,
        available,
        runtimes,
        capacity,
    } = *asker;
    let mut group: Option<i32> = None;
    // (running, not cached, id, task)
    let mut best: Option<(u32, bool, JobId, u32)> = None;
    let mut warm_choice: Option<(u32, u32)> = None;
    for (priority, id) in st.schedule.runnable() {
        if group.is_some_and(|g| g != priority) {
            break;
        }
        let job = &st.jobs[&id];
        if !job.requirements.satisfied_by(slot, tags)
            || job.requirements.runtime_for(runtimes).is_none()
            || !job.capacity.accepts(capacity)
            || !may_serve(st, job, worker, block_after, available)
            || verification::barred(job, st.workers.get(worker))
        {
            continue;
        }
        let takers = || {
            st.workers
                .values()
                .filter(|w| available(w) && capable(job, w))
                .count()
        };
        let Some(task) = first_ready(st, id, worker, &takers) else {
            continue;
        };
        group = Some(priority);
        let running = st.schedule.job(id).map_or(0, |i| i.counts().leased);
        if Some(id) == warm {
            warm_choice = Some((running, task));
        }
        let key = (running, !cached.contains(&job.scene), id, task);
        if best.is_none_or(|b| key < b) {
            best = Some(key);
        }
    }
    let (least, _, id, task) = best?;
    match (warm, warm_choice) {
        // Keep the warm session unless another job is starved.
        (Some(warm), Some((running, task))) if least + 1 >= running => Some((warm, task)),
        _ => Some((id, task)),
    }
}
