//! Choosing the next task for a slot: priority, sticky sessions, fair share,
//! requirements, and workers blocked for a job.

use super::*;

/// Chooses the next task for `worker`: priority first; among equal priority
/// the job whose Blender session the slot holds warm (sticky sessions), then
/// the job with the fewest running tasks (fair share), then the one whose
/// scene the worker has cached, then the oldest. A task that failed on this
/// worker goes to another unless every online worker has failed it.
/// Who asks for work: a slot of a worker.
pub(super) struct Asker<'a> {
    pub(super) worker: &'a WorkerId,
    pub(super) cached: &'a HashSet<Digest>,
    pub(super) warm: Option<JobId>,
    pub(super) slot: &'a SlotCap,
    pub(super) tags: &'a [String],
    /// Whether a worker takes work now (online, not drained).
    pub(super) available: &'a dyn Fn(&WorkerRecord) -> bool,
    /// What the worker's Blender offers.
    pub(super) features: &'a [String],
}

/// Whether any slot of `w` can render `job`.
pub(super) fn capable(job: &Job, w: &WorkerRecord) -> bool {
    job.requirements.features_met(&w.features)
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

pub(super) fn pick(
    st: &State,
    asker: &Asker<'_>,
    online: usize,
    block_after: u32,
) -> Option<(JobId, usize)> {
    let Asker {
        worker,
        cached,
        warm,
        slot,
        tags,
        available,
        features,
    } = *asker;
    let mut candidates: Vec<(&Job, usize)> = st
        .jobs
        .values()
        .filter(|j| {
            !j.state.is_final()
                && j.state != JobState::Paused
                && j.requirements.satisfied_by(slot, tags)
                && j.requirements.features_met(features)
        })
        .filter(|j| may_serve(st, j, worker, block_after, available))
        .map(|j| {
            let running = st.tasks[&j.id]
                .iter()
                .filter(|t| t.holder().is_some())
                .count();
            (j, running)
        })
        .collect();
    candidates.sort_by_key(|(j, running)| {
        (
            std::cmp::Reverse(j.priority),
            Some(j.id) != warm,
            *running,
            !cached.contains(&j.scene),
            j.id,
        )
    });
    for (job, _) in candidates {
        let found = st.tasks[&job.id].iter().position(|t| {
            t.state == TaskState::Queued
                && !t.machine_failed_on.contains(worker)
                && (!t.failed_on.contains(worker) || t.failed_on.len() >= online.max(1))
        });
        if let Some(i) = found {
            return Some((job.id, i));
        }
    }
    None
}
