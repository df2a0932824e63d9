//! The autoscaling signal: how many slots each class of work needs to
//! drain its queue within `--target-drain-minutes`.
//!
//! For every open job (not paused, not waiting for another job, not over
//! its budget) the remaining work is its queued and running tasks times
//! its mean task time: the mean slot-time of its successful attempts, else
//! of its class's, else unknown. Summed per requirement class (device kind,
//! least VRAM, tags), `desired = ceil(work / target)`, at least the tasks
//! running now (they hold their slots until done) and at most the tasks
//! left (a task renders on one slot). Until a task of a class has finished
//! its mean is unknown and every remaining task counts as one slot. A job
//! whose tasks the farm sizes (`chunking`) counts its queued frames, each
//! at the job's mean slot-time per finished frame: its queued runs are
//! carved into as many tasks as the slots that take them.

use super::*;

/// What one requirement class needs.
#[derive(Debug, Clone, PartialEq)]
pub struct DesiredSlots {
    /// Device kind: `any`, `cpu`, `cuda` or `optix`.
    pub device: String,
    /// Least GPU memory, GiB.
    pub min_vram_gb: f64,
    /// Tags, comma-separated.
    pub tags: String,
    /// Tasks waiting for a slot (frames, for a job whose tasks the farm sizes).
    pub queued: u64,
    /// Tasks rendering now.
    pub running: u64,
    /// The mean task time used, seconds (0 when unknown).
    pub mean_task_s: f64,
    /// Slots that would drain the class's queue in the target time.
    pub slots: u64,
}

#[derive(Default)]
struct Class {
    queued: u64,
    running: u64,
    /// Work with a known mean, ms.
    known_ms: u128,
    /// Tasks whose mean is unknown.
    unknown: u64,
    done_ms: u64,
    done_attempts: u64,
}

impl Farm {
    /// The slots each requirement class needs now (see the module doc).
    pub fn desired_slots(&self) -> Vec<DesiredSlots> {
        let st = self.lock();
        let key = |job: &Job| {
            let r = &job.requirements;
            (
                r.device.map_or("any", Device::name).to_string(),
                r.min_vram_bytes,
                r.tags.join(","),
            )
        };
        let mut classes: BTreeMap<(String, u64, String), Class> = BTreeMap::new();
        // Class means first, from every live job's finished attempts.
        for job in st.jobs.values() {
            let u = st.usage(job.id);
            let c = classes.entry(key(job)).or_default();
            c.done_ms += u.done_ms;
            c.done_attempts += u.done_attempts;
        }
        for job in st.jobs.values() {
            if job.state.is_final() || job.state == JobState::Paused || st.held_back(job) {
                continue;
            }
            let Some(index) = st.schedule.job(job.id) else {
                continue;
            };
            let (queued, running) = (
                index.ready_units(job) as u64,
                u64::from(index.counts().leased),
            );
            let c = classes.get_mut(&key(job)).expect("every job has a class");
            let mean = index
                .usage()
                .mean_done_ms()
                .or_else(|| (c.done_attempts > 0).then(|| c.done_ms / c.done_attempts));
            // What one queued unit (a task, or a frame) takes.
            let frames = u64::from(index.counts().frames_done);
            let queued_mean = match job.auto_chunked() {
                true => (frames > 0).then(|| index.usage().done_ms / frames),
                false => mean,
            };
            c.queued += queued;
            c.running += running;
            for (n, mean) in [(queued, queued_mean), (running, mean)] {
                match mean {
                    Some(m) => c.known_ms += u128::from(m) * u128::from(n),
                    None => c.unknown += n,
                }
            }
        }
        let target = u128::from(self.config.target_drain_ms.max(1));
        classes
            .into_iter()
            .map(|((device, vram, tags), c)| {
                let left = c.queued + c.running;
                let by_time = c.known_ms.div_ceil(target).min(u128::from(u64::MAX)) as u64;
                let slots = (by_time + c.unknown).max(c.running).min(left);
                DesiredSlots {
                    device,
                    min_vram_gb: vram as f64 / crate::model::hardware::GIB,
                    tags,
                    queued: c.queued,
                    running: c.running,
                    mean_task_s: if c.done_attempts > 0 {
                        c.done_ms as f64 / c.done_attempts as f64 / 1000.0
                    } else {
                        0.0
                    },
                    slots,
                }
            })
            .collect()
    }
}
