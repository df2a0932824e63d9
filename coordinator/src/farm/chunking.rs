//! Sizing the tasks of a job submitted without `--chunk`
//! ([`Job::auto_chunked`]), so that a lease of tiny frames carries about
//! [`TARGET_MS`] of work instead of paying the farm's per-task cost on
//! every frame.
//!
//! Such a job's frames start as queued runs of [`SPAN`] frames. A lease
//! carves its chunk off the front of the run it picks: the leased task
//! keeps the run's index with the first frames, and the rest becomes a new
//! queued task appended to the job (the job's task count grows by one in
//! the same stored change). Only a run that was never granted is carved, so
//! no lease, attempt or result can name what changes. The ready queue is
//! ordered by first frame, so the rest is leased next and frames go out in
//! order.
//!
//! How many frames a lease takes ([`frames_per_lease`]): one while nothing
//! of the job is measured; then enough for [`TARGET_MS`] at the job's mean
//! slot-time per finished frame (from its tasks' attempts, so a restart
//! keeps it; it includes what the farm costs a task, so it shrinks as the
//! chunks grow, and they grow with it); never more than half an equal
//! share of the ready frames among the slots that render or wait for the
//! job (all of them for a job's only slot); at least one. Half a share is
//! the "factoring" rule of loop scheduling: chunks shrink as the job's end
//! nears, down to single frames, so slots that started at different times
//! or drew slower frames still end within about a frame of each other. With
//! a whole share, one slot's last chunk of three frames ran 0.13 s past the
//! other's end on a 12-frame, 2.2 s job (`scripts/phases.py`). A lease's
//! TTL is honoured as for any task: its holder renews it while it renders.

use super::*;

/// Frames in each queued run of an auto-chunked job as submitted: the most
/// one lease takes, and the most a carve rewrites.
pub(super) const SPAN: u32 = 256;

/// Slot-time a lease of an auto-chunked job aims at, ms.
pub(super) const TARGET_MS: u64 = 2_000;

/// How many frames a lease takes, given the job's measured slot-time per
/// frame (None before a frame is done), its ready frames and the slots
/// that share them (the asking one included).
pub(super) fn frames_per_lease(frame_ms: Option<u64>, ready: usize, slots: usize) -> usize {
    let wanted = frame_ms.map_or(1, |ms| TARGET_MS.div_ceil(ms.max(1)) as usize);
    let share = match slots {
        0 | 1 => ready,
        n => ready / (2 * n),
    };
    wanted.min(share).max(1)
}

/// Job `id`'s mean slot-time per finished frame, ms (None before one is done).
fn frame_ms(st: &State, id: JobId) -> Option<u64> {
    let index = st.schedule.job(id)?;
    let frames = index.counts().frames_done;
    (frames > 0).then(|| index.usage().done_ms / u64::from(frames))
}

/// The distinct slots other than `slot` of `worker` that hold a lease of
/// job `id` (a slot leasing ahead holds two).
pub(super) fn other_slots(st: &State, id: JobId, worker: &WorkerId, slot: u32) -> usize {
    st.schedule
        .job(id)
        .map_or(0, |index| index.other_slots(worker, slot))
}

/// For a lease of task `index` of `job` by `slot` of `worker`: when the
/// lease should take fewer frames than the task holds, the task to lease
/// (the run's first frames, under its index) and the rest (a new queued
/// task, appended). None when the task is leased whole.
pub(super) fn carve(
    st: &State,
    job: &Job,
    index: u32,
    worker: &WorkerId,
    slot: u32,
) -> Option<(Task, Task)> {
    if !job.auto_chunked() {
        return None;
    }
    let list = &st.tasks[&job.id];
    let task = &list[index as usize];
    if task.grants > 0 || task.tile.is_some() || task.frames.len() < 2 {
        return None;
    }
    let ready = st.schedule.job(job.id)?.ready_units(job);
    // Counted only up to the ready frames: past them every lease takes one
    // frame however many more wait, and at the tail of a job thousands of
    // slots may be parked.
    let idle = st.schedule.waiting_up_to(job, &st.workers, ready);
    let slots = 1 + idle + other_slots(st, job.id, worker, slot);
    let take = frames_per_lease(frame_ms(st, job.id), ready, slots);
    if take >= task.frames.len() {
        return None;
    }
    let mut head = Task::clone(task);
    let rest = Task::new(job.id, list.len() as u32, head.frames.split_off(take));
    Some((head, rest))
}

#[cfg(test)]
mod tests {
    use super::super::tests::{fixture, output, sub, until_parked, worker, Fixture};
    use super::*;

    /// Leases `w`'s next task, renders it at `frame_ms` a frame on the
    /// fixture's clock and completes it; returns its frames.
    fn render(f: &Fixture, farm: &Farm, w: &WorkerId, frame_ms: u64) -> Option<Vec<u32>> {
        let a = farm.try_lease(w, &HashSet::new()).unwrap()?;
        f.clock.advance(frame_ms * a.frames.len() as u64);
        let outs = a.frames.iter().map(|&fr| output(f, fr)).collect();
        assert_eq!(farm.complete(a.lease, outs).unwrap(), Completion::Recorded);
        Some(a.frames)
    }

    #[test]
    fn a_lease_takes_one_frame_until_one_is_measured() {
        assert_eq!(frames_per_lease(None, 100, 1), 1);
        assert_eq!(frames_per_lease(None, 0, 0), 1);
    }

    #[test]
    fn a_lease_carries_about_the_target_of_work() {
        assert_eq!(frames_per_lease(Some(100), 1000, 2), 20);
        assert_eq!(frames_per_lease(Some(300), 1000, 2), 7);
        // Frames longer than the target go one a lease.
        assert_eq!(frames_per_lease(Some(5_000), 1000, 2), 1);
        // Instant frames: as many as half a share allows.
        assert_eq!(frames_per_lease(Some(0), 1000, 4), 125);
        // A job's only slot takes the target whatever is left.
        assert_eq!(frames_per_lease(Some(100), 30, 1), 20);
    }

    #[test]
    fn the_last_frames_spread_over_the_slots() {
        // Half a share each: chunks shrink to one frame towards the end.
        assert_eq!(frames_per_lease(Some(10), 12, 2), 3);
        assert_eq!(frames_per_lease(Some(10), 8, 2), 2);
        assert_eq!(frames_per_lease(Some(10), 5, 2), 1);
        assert_eq!(frames_per_lease(Some(10), 3, 4), 1);
    }

    #[test]
    fn leases_of_a_job_without_chunk_grow_to_the_target_and_render_every_frame_once() {
        let f = fixture();
        let job = f.farm.submit(sub(f.scene, "1-100", 0)).unwrap();
        let w = worker(&f.farm, "a");
        let mut leased = Vec::new();
        while let Some(frames) = render(&f, &f.farm, &w, 100) {
            leased.push(frames);
        }
        let sizes: Vec<usize> = leased.iter().map(Vec::len).collect();
        // One frame until one is measured, then 2 s of 100 ms frames.
        assert_eq!(sizes, vec![1, 20, 20, 20, 20, 19]);
        assert_eq!(leased.concat(), (1..=100).collect::<Vec<u32>>());
        let snap = f.farm.job(job).unwrap();
        assert_eq!(snap.job.state, JobState::Done);
        assert_eq!(snap.job.task_count, 6);
        assert_eq!(snap.counts.done, 6);
        assert_eq!(snap.counts.frames_done, 100);
        let frames: Vec<u32> = snap.outputs.iter().map(|o| o.frame).collect();
        assert_eq!(frames, (1..=100).collect::<Vec<u32>>());
    }

    #[test]
    fn an_explicit_chunk_is_kept_as_given() {
        let f = fixture();
        f.farm.submit(sub(f.scene, "1-6", 1)).unwrap();
        let w = worker(&f.farm, "a");
        while let Some(frames) = render(&f, &f.farm, &w, 10) {
            assert_eq!(frames.len(), 1);
        }
    }

    #[test]
    fn a_job_that_asks_for_verification_keeps_one_frame_a_task() {
        let f = fixture();
        let job = f
            .farm
            .submit(Submission {
                verify: 0.5,
                ..sub(f.scene, "1-4", 0)
            })
            .unwrap();
        let snap = f.farm.job(job).unwrap();
        assert_eq!(snap.job.chunk, 1);
        assert_eq!(snap.tasks.len(), 4);
    }

    #[test]
    fn a_slot_takes_at_most_its_share_of_the_ready_frames() {
        let f = fixture();
        f.farm.submit(sub(f.scene, "1-12", 0)).unwrap();
        let (a, b) = (worker(&f.farm, "a"), worker(&f.farm, "b"));
        let first = f.farm.try_lease(&a, &HashSet::new()).unwrap().unwrap();
        let held = f.farm.try_lease(&b, &HashSet::new()).unwrap().unwrap();
        assert_eq!((first.frames, held.frames), (vec![1], vec![2]));
        f.clock.advance(10);
        f.farm.complete(first.lease, vec![output(&f, 1)]).unwrap();
        // 10 frames ready, b renders: a takes half its share of them, not
        // the 200 that 2 s of 10 ms frames would be.
        assert_eq!(render(&f, &f.farm, &a, 10), Some(vec![3, 4]));
    }

    #[test]
    fn carved_tasks_survive_a_restart() {
        let f = fixture();
        let job = f.farm.submit(sub(f.scene, "1-300", 0)).unwrap();
        let w = worker(&f.farm, "a");
        let mut leased = vec![render(&f, &f.farm, &w, 100).unwrap()];
        leased.push(render(&f, &f.farm, &w, 100).unwrap());
        let held = f.farm.try_lease(&w, &HashSet::new()).unwrap().unwrap();
        let before = f.farm.job(job).unwrap();
        let again = f.reopen();
        let after = again.job(job).unwrap();
        assert_eq!(after.tasks, before.tasks);
        assert_eq!(after.job.task_count, before.job.task_count);
        // The holder finishes after the restart, and the rest goes on.
        let outs = held.frames.iter().map(|&fr| output(&f, fr)).collect();
        again.complete(held.lease, outs).unwrap();
        leased.push(held.frames);
        while let Some(frames) = render(&f, &again, &w, 100) {
            leased.push(frames);
        }
        assert_eq!(leased.concat(), (1..=300).collect::<Vec<u32>>());
        let snap = again.job(job).unwrap();
        assert_eq!(snap.job.state, JobState::Done);
        assert_eq!(snap.counts.frames_done, 300);
    }

    #[tokio::test]
    async fn every_parked_slot_is_woken_for_a_job_without_chunk() {
        let f = Arc::new(fixture());
        let mut calls = Vec::new();
        for name in ["a", "b", "c"] {
            let w = worker(&f.farm, name);
            let f = f.clone();
            calls.push(tokio::spawn(async move {
                f.farm
                    .lease(&w, &HashSet::new(), None, 0, Duration::from_secs(20))
                    .await
            }));
        }
        until_parked(&f.farm, 3).await;
        f.farm.submit(sub(f.scene, "1-10", 0)).unwrap();
        let mut frames = Vec::new();
        for call in calls {
            let got = tokio::time::timeout(Duration::from_secs(5), call)
                .await
                .expect("a parked slot was left waiting although frames were ready")
                .unwrap()
                .unwrap();
            frames.extend(got.task.expect("a task").frames);
        }
        frames.sort_unstable();
        assert_eq!(frames, vec![1, 2, 3]);
    }
}
