//! Unit tests of verification in the farm: results held until a second
//! worker agrees, a mismatch settled by a third, the odd worker suspect.

use super::tests::{fixture, output, sub, worker, Fixture};
use super::*;

/// A result whose frames hold `tag` instead of the true bytes.
fn bad_output(f: &Fixture, frame: u32, tag: &str) -> FrameOutput {
    let bytes = format!("png {frame} {tag}");
    let digest = Digest::of(bytes.as_bytes());
    f.blobs.put(digest, bytes.as_bytes()).unwrap();
    FrameOutput {
        digest,
        size: bytes.len() as u64,
        ..output(f, frame)
    }
}

fn verified(f: &Fixture, frames: &str, fraction: f64) -> JobId {
    f.farm
        .submit(Submission {
            verify: fraction,
            ..sub(f.scene, frames, 1)
        })
        .unwrap()
}

fn lease(f: &Fixture, w: &WorkerId) -> Option<Assignment> {
    f.farm.try_lease(w, &HashSet::new()).unwrap()
}

fn suspect(f: &Fixture, w: &WorkerId) -> Vec<crate::model::verify::Suspicion> {
    let all = f.farm.workers();
    let rec = all.iter().find(|s| &s.record.id == w).unwrap();
    rec.record.suspect.clone()
}

#[test]
fn a_sampled_result_waits_for_a_different_worker_to_agree() {
    let f = fixture();
    let job = verified(&f, "1", 1.0);
    let (a, b) = (worker(&f.farm, "a"), worker(&f.farm, "b"));
    let first = lease(&f, &a).unwrap();
    let stats = vec![crate::model::verify::FrameStats {
        frame: 1,
        render_ms: 1500,
        samples: 8,
        ..Default::default()
    }];
    assert_eq!(
        f.farm
            .complete_with_stats(first.lease, vec![output(&f, 1)], stats.clone(), Vec::new())
            .unwrap(),
        Completion::Recorded
    );
    let snap = f.farm.job(job).unwrap();
    assert_eq!(snap.job.state, JobState::Running, "not delivered yet");
    assert!(snap.outputs.is_empty());
    // The same worker never verifies itself; a second result of it is ignored.
    assert!(lease(&f, &a).is_none());
    assert_eq!(
        f.farm.complete(first.lease, vec![output(&f, 1)]).unwrap(),
        Completion::Duplicate
    );
    let second = lease(&f, &b).unwrap();
    assert_eq!(second.lease.task, first.lease.task);
    f.farm.complete(second.lease, vec![output(&f, 1)]).unwrap();
    let snap = f.farm.job(job).unwrap();
    assert_eq!(snap.job.state, JobState::Done);
    assert_eq!(snap.outputs, vec![output(&f, 1)]);
    let v = snap.tasks[0].verify.as_ref().unwrap();
    assert_eq!(v.agreed, vec![a.clone(), b.clone()]);
    assert_eq!(snap.tasks[0].stats, stats, "the first result's stats");
    let counts = f.farm.stats();
    assert_eq!((counts.verify_checks, counts.verify_mismatches), (1, 0));
    assert!(suspect(&f, &a).is_empty() && suspect(&f, &b).is_empty());
}

#[test]
fn a_mismatch_goes_to_a_third_worker_and_the_odd_one_is_suspect() {
    let f = fixture();
    let job = verified(&f, "1-2", 1.0);
    let (a, bad, c) = (
        worker(&f.farm, "a"),
        worker(&f.farm, "bad"),
        worker(&f.farm, "c"),
    );
    // Task 0: a, then bad (differs), then c agrees with a.
    let l = lease(&f, &a).unwrap();
    f.farm.complete(l.lease, vec![output(&f, 1)]).unwrap();
    let l = lease(&f, &bad).unwrap();
    assert_eq!(l.lease.task, 0);
    f.farm
        .complete(l.lease, vec![bad_output(&f, 1, "corrupt")])
        .unwrap();
    let counts = f.farm.stats();
    assert_eq!((counts.verify_checks, counts.verify_mismatches), (1, 1));
    assert_eq!(f.farm.job(job).unwrap().tasks[0].state, TaskState::Queued);
    // Neither a nor bad may render task 0 again; c does.
    let l = lease(&f, &c).unwrap();
    assert_eq!(l.lease.task, 0);
    f.farm.complete(l.lease, vec![output(&f, 1)]).unwrap();
    let snap = f.farm.job(job).unwrap();
    assert_eq!(
        snap.tasks[0].state,
        TaskState::Done {
            outputs: vec![output(&f, 1)]
        },
        "the agreed frame, never the odd one"
    );
    let v = snap.tasks[0].verify.as_ref().unwrap();
    assert_eq!(
        (v.agreed.clone(), v.odd.clone()),
        (vec![a.clone(), c.clone()], vec![bad.clone()])
    );
    let s = suspect(&f, &bad);
    assert_eq!((s.len(), s[0].job, s[0].task), (1, job, 0));
    let counts = f.farm.stats();
    assert_eq!((counts.verify_checks, counts.verify_mismatches), (2, 1));
    // The suspect gets no more tasks of this job, nor of another job of its class.
    assert!(lease(&f, &bad).is_none());
    let other = f.farm.submit(sub(f.scene, "5", 1)).unwrap();
    assert!(lease(&f, &bad).is_none());
    // Trusted workers finish both jobs.
    while let Some(l) = lease(&f, &a).or_else(|| lease(&f, &c)) {
        let outs = l.frames.iter().map(|&fr| output(&f, fr)).collect();
        f.farm.complete(l.lease, outs).unwrap();
    }
    assert_eq!(f.farm.job(job).unwrap().job.state, JobState::Done);
    assert_eq!(f.farm.job(other).unwrap().job.state, JobState::Done);
    // Suspicion is durable, and survives the worker registering again.
    let again = f.reopen();
    let rec = again
        .workers()
        .into_iter()
        .find(|w| w.record.id == bad)
        .unwrap();
    assert_eq!(rec.record.suspect.len(), 1);
    let (back, _) = again
        .register(Registration {
            blender_version: "Blender 3.4.1".into(),
            name: "bad".into(),
            slots: 1,
            previous: Some(bad.clone()),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(back, bad);
    let rec = again.workers().into_iter().find(|w| w.record.id == bad);
    assert_eq!(rec.unwrap().record.suspect.len(), 1);
    // A restarted process registers under a new id: same owner and name,
    // same suspicion. Another name starts clean.
    let (fresh, _) = again
        .register(Registration {
            blender_version: "Blender 3.4.1".into(),
            name: "bad".into(),
            slots: 1,
            ..Default::default()
        })
        .unwrap();
    assert_ne!(fresh, bad);
    let rec = again.workers().into_iter().find(|w| w.record.id == fresh);
    assert_eq!(rec.unwrap().record.suspect.len(), 1);
    let other = worker(&again, "good");
    let rec = again.workers().into_iter().find(|w| w.record.id == other);
    assert!(rec.unwrap().record.suspect.is_empty());
}

#[test]
fn held_results_survive_a_restart_and_keep_their_blobs() {
    let f = fixture();
    let job = verified(&f, "1", 1.0);
    let (a, b) = (worker(&f.farm, "a"), worker(&f.farm, "b"));
    let l = lease(&f, &a).unwrap();
    let out = output(&f, 1);
    f.farm.complete(l.lease, vec![out.clone()]).unwrap();
    let again = f.reopen();
    let held = again.job(job).unwrap().tasks[0].verify.clone().unwrap();
    assert_eq!(held.candidates.len(), 1);
    assert_eq!(held.candidates[0].worker, a);
    assert!(
        again.lock().blobs.count(&out.digest) > 0,
        "a held result's blob is referenced"
    );
    assert!(again.try_lease(&a, &HashSet::new()).unwrap().is_none());
    let l = again.try_lease(&b, &HashSet::new()).unwrap().unwrap();
    again.complete(l.lease, vec![out]).unwrap();
    assert_eq!(again.job(job).unwrap().job.state, JobState::Done);
}

#[test]
fn a_lone_worker_says_why_the_job_waits() {
    let f = fixture();
    let job = verified(&f, "1", 0.5);
    let a = worker(&f.farm, "a");
    let l = lease(&f, &a).unwrap();
    f.farm.complete(l.lease, vec![output(&f, 1)]).unwrap();
    let waiting = f.farm.job(job).unwrap().waiting.unwrap_or_default();
    assert!(
        waiting.contains("awaits verification") && waiting.contains("start another worker"),
        "{waiting}"
    );
    // A second worker clears it.
    let b = worker(&f.farm, "b");
    assert!(f.farm.job(job).unwrap().waiting.is_none());
    let l = lease(&f, &b).unwrap();
    f.farm.complete(l.lease, vec![output(&f, 1)]).unwrap();
    assert_eq!(f.farm.job(job).unwrap().job.state, JobState::Done);
}

#[test]
fn untrusted_workers_are_verified_at_the_coordinators_fraction() {
    let f = fixture();
    // 1.0 for the test: every task an untrusted worker renders.
    let farm = Farm::open(
        f.store.clone(),
        f.blobs.clone(),
        f.clock.clone(),
        Config {
            verify_untrusted: 1.0,
            ..f.farm.config().clone()
        },
    )
    .unwrap();
    let job = farm.submit(sub(f.scene, "1-2", 1)).unwrap();
    let rented = farm
        .register(Registration {
            blender_version: "Blender 3.4.1".into(),
            name: "rented".into(),
            slots: 1,
            untrusted: true,
            ..Default::default()
        })
        .unwrap()
        .0;
    let own = worker(&farm, "own");
    let l = farm.try_lease(&rented, &HashSet::new()).unwrap().unwrap();
    farm.complete(l.lease, vec![output(&f, l.frames[0])])
        .unwrap();
    assert!(!farm.job(job).unwrap().tasks[l.lease.task as usize].is_done());
    // The trusted worker verifies it, and its own result of the other task
    // is delivered at once (the job asked for no verification).
    while let Some(m) = farm.try_lease(&own, &HashSet::new()).unwrap() {
        farm.complete(m.lease, vec![output(&f, m.frames[0])])
            .unwrap();
    }
    let snap = farm.job(job).unwrap();
    assert_eq!(snap.job.state, JobState::Done);
    let checked = snap.tasks[l.lease.task as usize].verify.clone().unwrap();
    assert_eq!(checked.agreed, vec![rented, own]);
    let other = &snap.tasks[1 - l.lease.task as usize];
    assert!(other.is_done() && other.verify.is_none());
}

#[test]
fn records_from_before_verification_still_read() {
    // Written as older builds wrote them: no stats, verify, untrusted or suspect.
    let task = serde_json::to_string(&Task::new(JobId(1), 0, vec![1])).unwrap();
    assert!(
        !task.contains("stats") && !task.contains("verify"),
        "{task}"
    );
    let back: Task = serde_json::from_str(&task).unwrap();
    assert!(back.stats.is_empty() && back.verify.is_none());
    let f = fixture();
    let w = worker(&f.farm, "a");
    let rec = f
        .farm
        .workers()
        .into_iter()
        .find(|s| s.record.id == w)
        .unwrap();
    let mut v = serde_json::to_value(&rec.record).unwrap();
    let o = v.as_object_mut().unwrap();
    o.remove("untrusted");
    o.remove("suspect");
    let back: WorkerRecord = serde_json::from_value(v).unwrap();
    assert!(!back.untrusted && back.suspect.is_empty());
}
