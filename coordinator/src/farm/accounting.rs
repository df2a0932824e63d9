//! Accounting: every attempt that ends is recorded on its task with its
//! slot-time and cost (see [`crate::model::usage`]), in the same unit of work as
//! the change that ends it.

use super::*;
use crate::model::usage::{Attempt, AttemptEnd};

/// At most this many attempts are kept per task (a task retried without
/// end keeps its newest); the job's totals then leave out the oldest.
const MAX_ATTEMPTS_KEPT: usize = 64;

/// How attempts that are ending now ended, when their new state alone
/// does not say (an expired lease, a preemption): marked by the change that
/// ends them, read once by [`Farm::account`].
#[derive(Debug, Default)]
pub(super) struct Endings(HashMap<(JobId, u32), AttemptEnd>);

impl Farm {
    /// Records the attempts that `changed` ends: a task that was leased
    /// and no longer is under the same grant. How it ended comes from
    /// `State::endings` when set (an expired lease, a preemption), else from
    /// its new state. Priced by the holder: its price per hour shared
    /// equally among its slots.
    pub(super) fn account(&self, st: &mut State, changed: &mut [Task], now: u64) {
        for t in changed.iter_mut() {
            let marked = st.endings.0.remove(&(t.job, t.index));
            let Some(old) = st.tasks.get(&t.job).and_then(|l| l.get(t.index as usize)) else {
                continue;
            };
            let TaskState::Leased {
                worker,
                grant,
                since_ms,
                slot,
                ..
            } = &old.state
            else {
                continue;
            };
            if matches!(&t.state, TaskState::Leased { grant: g, .. } if g == grant) {
                continue;
            }
            // Another grant's late result may be the one recorded (its
            // attempt is marked done by `Task::complete`): this one is not.
            let late = t
                .attempts
                .iter()
                .zip(&old.attempts)
                .any(|(a, before)| a.end == AttemptEnd::Done && before.end != AttemptEnd::Done);
            let inferred = match &t.state {
                TaskState::Done { .. } if late => AttemptEnd::Canceled,
                TaskState::Done { .. } => AttemptEnd::Done,
                _ if t.failures > old.failures => AttemptEnd::Failed,
                TaskState::Canceled | TaskState::Failed { .. } => AttemptEnd::Canceled,
                _ => AttemptEnd::Released,
            };
            let end = marked.unwrap_or(inferred);
            let (gpu, price_per_hour) = st.workers.get(worker).map_or((false, 0.0), |w| {
                (
                    w.slot_cap(*slot).device != Device::Cpu,
                    w.price_per_hour / f64::from(w.slots.max(1)),
                )
            });
            let attempt = Attempt {
                worker: worker.clone(),
                grant: *grant,
                ms: now.saturating_sub(*since_ms),
                gpu,
                price_per_hour,
                end,
            };
            if end == AttemptEnd::Preempted {
                self.count_stat(|s| s.preemptions += 1);
            }
            t.attempts.push(attempt);
            if t.attempts.len() > MAX_ATTEMPTS_KEPT {
                let drop = t.attempts.len() - MAX_ATTEMPTS_KEPT;
                t.attempts.drain(..drop);
            }
        }
    }

    /// Marks how the attempt of task `(job, index)` that is ending now
    /// ended, when its new state alone does not say.
    pub(super) fn ending(st: &mut State, job: JobId, index: u32, end: AttemptEnd) {
        st.endings.0.insert((job, index), end);
    }
}
