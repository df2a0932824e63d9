//! Unit tests of the pipeline features: dependencies, frame reruns,
//! accounting and budgets, capacity classes, and the autoscaling signal.

use super::tests::{fixture, output, sub, worker, Fixture};
use super::*;
use crate::model::usage::{AttemptEnd, Capacity, CapacityPref};

fn priced(farm: &Farm, name: &str, price: f64, capacity: Capacity) -> WorkerId {
    farm.register(Registration {
        blender_version: "Blender 3.4.1".into(),
        name: name.into(),
        slots: 1,
        price_per_hour: price,
        capacity,
        ..Default::default()
    })
    .unwrap()
    .0
}

fn after(f: &Fixture, frames: &str, deps: &[JobId]) -> JobId {
    let mut s = sub(f.scene, frames, 1);
    s.after = deps.iter().map(|d| d.0).collect();
    f.farm.submit(s).unwrap()
}

/// Renders every task `w` can lease now, `ms` each.
fn render_all(f: &Fixture, w: &WorkerId, ms: u64) -> usize {
    let mut n = 0;
    while let Some(a) = f.farm.try_lease(w, &HashSet::new()).unwrap() {
        f.clock.advance(ms);
        let outs = a.frames.iter().map(|&fr| output(f, fr)).collect();
        f.farm.complete(a.lease, outs).unwrap();
        n += 1;
    }
    n
}

#[test]
fn a_job_waits_for_the_jobs_it_names_and_a_broken_chain_cancels_with_the_reason() {
    let f = fixture();
    let w = worker(&f.farm, "a");
    let a = f.farm.submit(sub(f.scene, "1-2", 1)).unwrap();
    let b = after(&f, "1", &[a]);
    let c = after(&f, "1", &[b]);
    let snap = f.farm.job(b).unwrap();
    assert_eq!(snap.waiting_for, Some(a));
    assert!(snap
        .waiting
        .unwrap()
        .contains(&format!("waiting for job {a}")));
    // Only a's tasks are leased while b and c wait.
    let first = f.farm.try_lease(&w, &HashSet::new()).unwrap().unwrap();
    assert_eq!(first.lease.job, a);
    f.farm.complete(first.lease, vec![output(&f, 1)]).unwrap();
    assert_eq!(
        render_all(&f, &w, 10),
        3,
        "a's last task, then b's, then c's"
    );
    for j in [a, b, c] {
        assert_eq!(f.farm.job(j).unwrap().job.state, JobState::Done);
    }

    // A chain broken in the middle: e waits for d, f2 for e; cancelling e
    // cancels f2 with a reason naming e, and d goes on.
    let d = f.farm.submit(sub(f.scene, "1", 1)).unwrap();
    let e = after(&f, "1", &[d]);
    let g = after(&f, "1", &[e]);
    f.farm.cancel(e).unwrap();
    let gj = f.farm.job(g).unwrap().job;
    assert_eq!(gj.state, JobState::Canceled);
    assert!(
        gj.message.contains(&format!("job {e}")) && gj.message.contains("canceled"),
        "{}",
        gj.message
    );
    assert_eq!(f.farm.job(d).unwrap().job.state, JobState::Queued);
    // A job after a canceled one is refused with the way out.
    let mut s = sub(f.scene, "1", 1);
    s.after = vec![e.0];
    let err = f.farm.submit(s).unwrap_err().to_string();
    assert!(
        err.contains("retry job") && err.contains("--after"),
        "{err}"
    );
    // A failed dependency cancels too, found again after a restart.
    let h = after(&f, "1", &[d]);
    let again = f.reopen();
    assert_eq!(again.job(h).unwrap().waiting_for, Some(d));
}

#[test]
fn dependencies_survive_a_restart_and_cycles_are_refused() {
    let f = fixture();
    let a = f.farm.submit(sub(f.scene, "1", 1)).unwrap();
    let b = after(&f, "1", &[a]);
    let c = after(&f, "1", &[b]);
    let err = f
        .farm
        .update(
            a,
            None,
            JobUpdate {
                after: Some(vec![c]),
                max_cost: None,
            },
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cycle") && err.contains(&format!("job {a} waits for job {c}")),
        "{err}"
    );
    let err = f
        .farm
        .update(
            a,
            None,
            JobUpdate {
                after: Some(vec![a]),
                max_cost: None,
            },
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("cycle"), "{err}");
    let err = f.farm.submit({
        let mut s = sub(f.scene, "1", 1);
        s.after = vec![999];
        s
    });
    assert!(err.unwrap_err().to_string().contains("does not exist"));
    // Across a restart b still waits for a.
    let again = f.reopen();
    let w = worker(&again, "w");
    let l = again.try_lease(&w, &HashSet::new()).unwrap().unwrap();
    assert_eq!(l.lease.job, a);
    assert!(
        again.try_lease(&w, &HashSet::new()).unwrap().is_none(),
        "b and c wait"
    );
    // Deleting a job that another waits for is refused.
    again.complete(l.lease, vec![output(&f, 1)]).unwrap();
    let l = again.try_lease(&w, &HashSet::new()).unwrap().unwrap();
    assert_eq!(l.lease.job, b);
    again.complete(l.lease, vec![output(&f, 1)]).unwrap();
    let err = again.delete(b).unwrap_err().to_string();
    assert!(
        err.contains(&format!("job(s) {c} wait for job {b}")),
        "{err}"
    );
}

#[test]
fn retry_frames_renders_only_those_frames_again() {
    let f = fixture();
    let w = worker(&f.farm, "a");
    let job = f.farm.submit(sub(f.scene, "1-30", 1)).unwrap();
    render_all(&f, &w, 5);
    assert_eq!(f.farm.job(job).unwrap().job.state, JobState::Done);
    let (snap, frames) = f.farm.retry_frames(job, "10-20").unwrap();
    assert_eq!(frames, (10..=20).collect::<Vec<_>>());
    assert_eq!(snap.job.state, JobState::Running);
    assert_eq!((snap.counts.queued, snap.counts.done), (11, 19));
    let mut seen = Vec::new();
    while let Some(a) = f.farm.try_lease(&w, &HashSet::new()).unwrap() {
        seen.extend(a.frames.clone());
        let outs = a.frames.iter().map(|&fr| output(&f, fr)).collect();
        f.farm.complete(a.lease, outs).unwrap();
    }
    assert_eq!(seen, (10..=20).collect::<Vec<_>>());
    assert_eq!(f.farm.job(job).unwrap().job.state, JobState::Done);
    let err = f.farm.retry_frames(job, "40").unwrap_err().to_string();
    assert!(err.contains("not in job"), "{err}");
}

#[test]
fn every_attempt_is_priced_by_its_worker_and_failed_ones_are_marked() {
    let f = fixture();
    // 3.60 per hour: one ms costs 0.000001.
    let w = priced(&f.farm, "gpu-box", 3.6, Capacity::OnDemand);
    let job = f.farm.submit(sub(f.scene, "1-3", 1)).unwrap();
    let l = f.farm.try_lease(&w, &HashSet::new()).unwrap().unwrap();
    f.clock.advance(400);
    f.farm
        .fail(l.lease, "Error: boom", "", FailureScope::Transient)
        .unwrap();
    let l = f.farm.try_lease(&w, &HashSet::new()).unwrap().unwrap();
    f.clock.advance(250);
    f.farm.release(l.lease, true).unwrap();
    render_all(&f, &w, 700);
    let snap = f.farm.job(job).unwrap();
    assert_eq!(snap.job.state, JobState::Done);
    let attempts: Vec<&crate::model::usage::Attempt> =
        snap.tasks.iter().flat_map(|t| &t.attempts).collect();
    let ends: Vec<AttemptEnd> = attempts.iter().map(|a| a.end).collect();
    assert_eq!(ends.iter().filter(|e| **e == AttemptEnd::Failed).count(), 1);
    assert_eq!(
        ends.iter().filter(|e| **e == AttemptEnd::Preempted).count(),
        1
    );
    assert_eq!(ends.iter().filter(|e| **e == AttemptEnd::Done).count(), 3);
    let total_ms: u64 = attempts.iter().map(|a| a.ms).sum();
    assert_eq!(total_ms, 400 + 250 + 3 * 700);
    let u = snap.usage;
    assert!(
        (u.cost - total_ms as f64 * 0.000001).abs() < 1e-9,
        "{}",
        u.cost
    );
    assert!((u.failed_cost - 400.0 * 0.000001).abs() < 1e-9);
    assert!((u.preempted_cost - 250.0 * 0.000001).abs() < 1e-9);
    assert_eq!(u.cpu_ms, total_ms);
    assert_eq!(f.farm.stats().preemptions, 1);
    // The sums are rebuilt from the tasks after a restart.
    assert_eq!(f.reopen().job(job).unwrap().usage, u);
}

#[test]
fn a_job_pauses_at_its_budget_and_says_why() {
    let f = fixture();
    let w = priced(&f.farm, "box", 3600.0, Capacity::OnDemand); // 1.0 per second
    let mut s = sub(f.scene, "1-10", 1);
    s.max_cost = Some(2.5);
    let job = f.farm.submit(s).unwrap();
    for _ in 0..3 {
        let l = f.farm.try_lease(&w, &HashSet::new()).unwrap().unwrap();
        f.clock.advance(1000);
        f.farm
            .complete(l.lease, vec![output(&f, l.frames[0])])
            .unwrap();
    }
    // Over budget: nothing more is leased, and the farm pauses it.
    assert!(f.farm.try_lease(&w, &HashSet::new()).unwrap().is_none());
    assert_eq!(f.farm.react(), 1);
    let j = f.farm.job(job).unwrap().job;
    assert_eq!(j.state, JobState::Paused);
    assert!(
        j.message.contains("budget of 2.50 is spent (3.00)") && j.message.contains("--max-cost"),
        "{}",
        j.message
    );
    f.farm
        .update(
            job,
            None,
            JobUpdate {
                after: None,
                max_cost: Some(Some(100.0)),
            },
        )
        .unwrap();
    f.farm.resume(job).unwrap();
    assert!(f.farm.try_lease(&w, &HashSet::new()).unwrap().is_some());
}

#[test]
fn spot_workers_serve_only_jobs_that_accept_spot() {
    let f = fixture();
    let spot = priced(&f.farm, "spot", 0.5, Capacity::Spot);
    let mut s = sub(f.scene, "1", 1);
    s.capacity = CapacityPref::OnDemandOnly;
    let strict = f.farm.submit(s).unwrap();
    assert!(f.farm.try_lease(&spot, &HashSet::new()).unwrap().is_none());
    let waiting = f.farm.job(strict).unwrap().waiting.unwrap();
    assert!(waiting.contains("no available worker"), "{waiting}");
    let any = f.farm.submit(sub(f.scene, "1", 1)).unwrap();
    let l = f.farm.try_lease(&spot, &HashSet::new()).unwrap().unwrap();
    assert_eq!(l.lease.job, any);
    let od = priced(&f.farm, "od", 2.0, Capacity::OnDemand);
    assert_eq!(
        f.farm
            .try_lease(&od, &HashSet::new())
            .unwrap()
            .unwrap()
            .lease
            .job,
        strict
    );
}

#[test]
fn desired_slots_follow_the_queue_and_the_mean_task_time() {
    let f = fixture();
    let w = worker(&f.farm, "a");
    // 100 tasks; 10 rendered at 60 s each: 90 left x 60 s over 30 minutes = 3 slots.
    let job = f.farm.submit(sub(f.scene, "1-100", 1)).unwrap();
    let before = f.farm.desired_slots();
    assert_eq!(before.len(), 1);
    assert_eq!(
        before[0].slots, 100,
        "until a task finished, one slot per task"
    );
    for _ in 0..10 {
        let l = f.farm.try_lease(&w, &HashSet::new()).unwrap().unwrap();
        f.clock.advance(60_000);
        f.farm
            .complete(l.lease, vec![output(&f, l.frames[0])])
            .unwrap();
    }
    let d = &f.farm.desired_slots()[0];
    assert_eq!((d.queued, d.running, d.slots), (90, 0, 3));
    assert_eq!(d.device, "any");
    assert!((d.mean_task_s - 60.0).abs() < 1e-9);
    // A running task is work left too; with a 20-minute target: 90 x 60 s / 1200 s = 4.5 -> 5.
    f.farm.try_lease(&w, &HashSet::new()).unwrap().unwrap();
    let d = &f.farm.desired_slots()[0];
    assert_eq!((d.queued, d.running, d.slots), (89, 1, 3));
    let mut cfg = f.farm.config().clone();
    cfg.target_drain_ms = 20 * 60_000;
    let shorter = Farm::open(f.store.clone(), f.blobs.clone(), f.clock.clone(), cfg).unwrap();
    assert_eq!(shorter.desired_slots()[0].slots, 5);
    // A paused job asks for nothing.
    f.farm.pause(job).unwrap();
    assert_eq!(f.farm.desired_slots()[0].slots, 0);
}
