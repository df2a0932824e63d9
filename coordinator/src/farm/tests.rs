//! Unit tests of the farm: splitting, leasing, retries, priorities, restarts.

use super::*;
use crate::blobs::MemoryBlobStore;
use crate::clock::ManualClock;
use crate::store::MemoryStore;

pub(super) struct Fixture {
    pub(super) farm: Farm,
    pub(super) clock: Arc<ManualClock>,
    pub(super) store: Arc<MemoryStore>,
    pub(super) blobs: Arc<MemoryBlobStore>,
    pub(super) scene: Digest,
}

pub(super) fn fixture() -> Fixture {
    let clock = Arc::new(ManualClock::at(1_000_000));
    let store = Arc::new(MemoryStore::default());
    let blobs = Arc::new(MemoryBlobStore::default());
    let bytes = b"BLENDER-v304 scene ... ENDB\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0";
    let scene = Digest::of(bytes);
    blobs.put(scene, bytes).unwrap();
    let farm = Farm::open(store.clone(), blobs.clone(), clock.clone(), config()).unwrap();
    Fixture {
        farm,
        clock,
        store,
        blobs,
        scene,
    }
}

impl Fixture {
    /// A second farm on the same store and blobs, as after a restart.
    pub(super) fn reopen(&self) -> Farm {
        Farm::open(
            self.store.clone(),
            self.blobs.clone(),
            self.clock.clone(),
            self.farm.config().clone(),
        )
        .unwrap()
    }
}

pub(super) fn config() -> Config {
    Config {
        target_drain_ms: 30 * 60_000,
        lease_ttl_ms: 1000,
        max_frames: 1000,
        max_attempts: 2,
        max_upload: 1 << 20,
        max_tiles: 16,
        health: HealthLimits::default(),
        block_after: 3,
        auth: true,
        max_message: 4 << 20,
        blob_grace_ms: 60_000,
        max_pixels: crate::imaging::limits::PixelLimit::default(),
        max_workers_per_token: 1024,
        max_slots: 256,
        keep_ms: None,
        ..Config::default()
    }
}

pub(super) fn sub(scene: Digest, frames: &str, chunk: u32) -> Submission {
    Submission {
        after: Vec::new(),
        max_cost: None,
        capacity: Default::default(),
        scene,
        scene_name: "s.blend".into(),
        frames: frames.into(),
        chunk,
        priority: 0,
        max_attempts: 0,
        tiles: String::new(),
        overscan: None,
        scene_info: None,
        device: String::new(),
        min_vram_gb: 0.0,
        tags: Vec::new(),
        owner: "alice".into(),
        file_set: None,
        features: Vec::new(),
        blender: String::new(),
        preview: false,
        verify: 0.0,
    }
}

pub(super) fn worker(farm: &Farm, name: &str) -> WorkerId {
    farm.register(Registration {
        blender_version: "Blender 3.4.1".into(),
        name: name.into(),
        slots: 1,
        ..Default::default()
    })
    .unwrap()
    .0
}

/// Polls `cond` (other tasks change what it reads) until it holds; fails
/// naming `what` after 10 s.
pub(super) async fn until(what: &str, cond: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after 10 s waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits until `n` lease calls are parked, waiting for a task.
pub(super) async fn until_parked(farm: &Farm, n: usize) {
    let what = format!("{n} lease call(s) to park");
    until(&what, || farm.lock().schedule.parked() >= n).await;
}

pub(super) fn output(f: &Fixture, frame: u32) -> FrameOutput {
    let bytes = format!("png {frame}");
    let digest = Digest::of(bytes.as_bytes());
    f.blobs.put(digest, bytes.as_bytes()).unwrap();
    FrameOutput {
        frame,
        digest,
        ext: "png".into(),
        size: bytes.len() as u64,
        pass: String::new(),
    }
}

#[test]
fn a_job_is_split_into_chunks_and_completes() {
    let f = fixture();
    let job = f.farm.submit(sub(f.scene, "1-5", 2)).unwrap();
    let snap = f.farm.job(job).unwrap();
    assert_eq!(
        snap.tasks
            .iter()
            .map(|t| t.frames.clone())
            .collect::<Vec<_>>(),
        vec![vec![1, 2], vec![3, 4], vec![5]]
    );
    let w = worker(&f.farm, "a");
    while let Some(a) = f.farm.try_lease(&w, &HashSet::new()).unwrap() {
        let outs = a.frames.iter().map(|&fr| output(&f, fr)).collect();
        assert_eq!(
            f.farm.complete(a.lease, outs).unwrap(),
            Completion::Recorded
        );
    }
    let snap = f.farm.job(job).unwrap();
    assert_eq!(snap.job.state, JobState::Done);
    assert_eq!(
        snap.outputs.iter().map(|o| o.frame).collect::<Vec<_>>(),
        vec![1, 2, 3, 4, 5]
    );
}

#[test]
fn bad_submissions_are_refused() {
    let f = fixture();
    let err = f.farm.submit(sub(Digest::of(b"nope"), "1", 1)).unwrap_err();
    assert!(err.to_string().contains("has not been uploaded"), "{err}");
    assert!(matches!(
        f.farm.submit(sub(f.scene, "5-1", 1)),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        f.farm.submit(sub(f.scene, "1-5000", 1)),
        Err(Error::Invalid(_))
    ));
    assert!(f.farm.jobs().is_empty());
}

#[test]
fn an_expired_lease_goes_to_another_worker() {
    let f = fixture();
    let job = f.farm.submit(sub(f.scene, "1", 1)).unwrap();
    let a = worker(&f.farm, "a");
    let b = worker(&f.farm, "b");
    let first = f.farm.try_lease(&a, &HashSet::new()).unwrap().unwrap();
    assert!(f.farm.try_lease(&b, &HashSet::new()).unwrap().is_none());
    f.clock.advance(600);
    assert!(
        f.farm.progress(first.lease, 0, (0, 0)),
        "renewal keeps the lease"
    );
    f.clock.advance(600);
    assert_eq!(f.farm.expire_leases().unwrap(), 0);
    f.clock.advance(500);
    assert_eq!(f.farm.expire_leases().unwrap(), 1);
    let second = f.farm.try_lease(&b, &HashSet::new()).unwrap().unwrap();
    assert!(
        !f.farm.progress(first.lease, 0, (0, 0)),
        "the old holder is told to stop"
    );
    let out = output(&f, 1);
    f.farm.complete(second.lease, vec![out.clone()]).unwrap();
    assert_eq!(
        f.farm.complete(first.lease, vec![out]).unwrap(),
        Completion::Duplicate
    );
    assert_eq!(f.farm.job(job).unwrap().job.state, JobState::Done);
}

#[test]
fn failures_retry_on_another_worker_then_fail_the_job() {
    let f = fixture();
    let job = f.farm.submit(sub(f.scene, "1-2", 1)).unwrap();
    let a = worker(&f.farm, "a");
    let b = worker(&f.farm, "b");
    let l = f.farm.try_lease(&a, &HashSet::new()).unwrap().unwrap();
    assert_eq!(
        f.farm
            .fail(l.lease, "Error: boom", "log", FailureScope::Transient)
            .unwrap(),
        FailOutcome::Retry
    );
    // Worker a gets the other task, not the one it failed.
    let next = f.farm.try_lease(&a, &HashSet::new()).unwrap().unwrap();
    assert_ne!(next.lease.task, l.lease.task);
    let retry = f.farm.try_lease(&b, &HashSet::new()).unwrap().unwrap();
    assert_eq!(retry.lease.task, l.lease.task);
    assert_eq!(retry.attempt, 2);
    assert_eq!(
        f.farm
            .fail(
                retry.lease,
                "Error: boom",
                "the tail",
                FailureScope::Transient
            )
            .unwrap(),
        FailOutcome::Failed
    );
    let snap = f.farm.job(job).unwrap();
    assert_eq!(snap.job.state, JobState::Failed);
    assert!(snap.job.message.contains("Error: boom") && snap.job.message.contains("the tail"));
    assert!(
        !f.farm.progress(next.lease, 0, (0, 0)),
        "other tasks of a failed job stop"
    );
}

#[test]
fn priority_then_fair_share() {
    let f = fixture();
    let low = f.farm.submit(sub(f.scene, "1-3", 1)).unwrap();
    let mut high = sub(f.scene, "1-2", 1);
    high.priority = 5;
    let high = f.farm.submit(high).unwrap();
    let other = f.farm.submit(sub(f.scene, "1-3", 1)).unwrap();
    let w = worker(&f.farm, "a");
    let order: Vec<JobId> = (0..6)
        .map(|_| {
            f.farm
                .try_lease(&w, &HashSet::new())
                .unwrap()
                .unwrap()
                .lease
                .job
        })
        .collect();
    assert_eq!(&order[..2], &[high, high]);
    // Equal priority: the two jobs alternate.
    assert_eq!(&order[2..], &[low, other, low, other]);
}

#[test]
fn cancel_stops_running_tasks_and_is_final() {
    let f = fixture();
    let job = f.farm.submit(sub(f.scene, "1-2", 1)).unwrap();
    let w = worker(&f.farm, "a");
    let l = f.farm.try_lease(&w, &HashSet::new()).unwrap().unwrap();
    f.farm.cancel(job).unwrap();
    assert!(!f.farm.progress(l.lease, 0, (0, 0)));
    assert!(matches!(f.farm.cancel(job), Err(Error::Conflict(_))));
    assert!(f.farm.try_lease(&w, &HashSet::new()).unwrap().is_none());
    assert!(matches!(f.farm.cancel(JobId(99)), Err(Error::NotFound(_))));
}

#[test]
fn a_restart_recovers_jobs_tasks_and_leases() {
    let f = fixture();
    let job = f.farm.submit(sub(f.scene, "1-3", 1)).unwrap();
    let w = worker(&f.farm, "a");
    let done = f.farm.try_lease(&w, &HashSet::new()).unwrap().unwrap();
    f.farm.complete(done.lease, vec![output(&f, 1)]).unwrap();
    let held = f.farm.try_lease(&w, &HashSet::new()).unwrap().unwrap();
    let again = Farm::open(f.store.clone(), f.blobs.clone(), f.clock.clone(), config()).unwrap();
    let snap = again.job(job).unwrap();
    assert_eq!(snap.job.state, JobState::Running);
    assert_eq!(snap.outputs.len(), 1);
    assert_eq!(snap.tasks[1].holder(), Some(&w));
    // The holder can still finish its task after the restart.
    again.complete(held.lease, vec![output(&f, 2)]).unwrap();
    let next = again.submit(sub(f.scene, "1", 1)).unwrap();
    assert!(next > job, "job ids are never reused");
}

#[tokio::test]
async fn lease_waits_for_work_to_arrive() {
    let f = Arc::new(fixture());
    let w = worker(&f.farm, "a");
    let f2 = f.clone();
    let waiter = tokio::spawn(async move {
        f2.farm
            .lease(&w, &HashSet::new(), None, 0, Duration::from_secs(10))
            .await
    });
    // Submitted once the call waits, so the task must wake it.
    until_parked(&f.farm, 1).await;
    f.farm.submit(sub(f.scene, "1", 1)).unwrap();
    let got = waiter.await.unwrap().unwrap();
    assert!(got.task.is_some());
}

/// Two equal-priority jobs of 200 tasks share 8 slots in proportion, even
/// though every slot holds the first job warm when the second arrives.
#[test]
fn equal_jobs_share_slots_even_when_every_slot_is_warm_on_one() {
    let f = fixture();
    let big = |f: &Fixture| {
        let mut s = sub(f.scene, "1-200", 1);
        s.frames = "1-200".into();
        s
    };
    let a = f.farm.submit(big(&f)).unwrap();
    let workers: Vec<WorkerId> = (0..8).map(|i| worker(&f.farm, &format!("w{i}"))).collect();
    let none = HashSet::new();
    let mut held: Vec<(usize, Assignment)> = workers
        .iter()
        .enumerate()
        .map(|(i, w)| {
            (
                i,
                f.farm.try_lease_warm(w, &none, None, 0).unwrap().unwrap(),
            )
        })
        .collect();
    assert!(held.iter().all(|(_, l)| l.lease.job == a));
    let b = f.farm.submit(big(&f)).unwrap();
    // Every slot finishes its task and asks again with job `a` warm.
    let mut share_b = Vec::new();
    for _round in 0..6 {
        let mut next = Vec::new();
        for (i, l) in held.drain(..) {
            let outs = l.frames.iter().map(|&fr| output(&f, fr)).collect();
            f.farm.complete(l.lease, outs).unwrap();
            let warm = Some(l.lease.job);
            let got = f
                .farm
                .try_lease_warm(&workers[i], &none, warm, 0)
                .unwrap()
                .unwrap();
            next.push((i, got));
        }
        held = next;
        share_b.push(held.iter().filter(|(_, l)| l.lease.job == b).count());
    }
    assert!(
        share_b.iter().skip(1).all(|&n| (3..=5).contains(&n)),
        "job b's slots per round: {share_b:?} (fair share is 4 of 8)"
    );
}

#[test]
fn a_warm_slot_keeps_its_job_unless_a_higher_priority_one_waits() {
    let f = fixture();
    let a = f.farm.submit(sub(f.scene, "1-3", 1)).unwrap();
    let b = f.farm.submit(sub(f.scene, "1-3", 1)).unwrap();
    let w = worker(&f.farm, "a");
    let none = HashSet::new();
    // One slot: each render ends before the next lease, so fair share
    // (running counts) never outweighs the warm session.
    let got: Vec<JobId> = (0..3)
        .map(|_| {
            let a = f
                .farm
                .try_lease_warm(&w, &none, Some(b), 0)
                .unwrap()
                .unwrap();
            let outs = a.frames.iter().map(|&fr| output(&f, fr)).collect();
            f.farm.complete(a.lease, outs).unwrap();
            a.lease.job
        })
        .collect();
    assert_eq!(got, vec![b, b, b], "sticky to the warm job");
    let mut high = sub(f.scene, "1", 1);
    high.priority = 9;
    let high = f.farm.submit(high).unwrap();
    assert_eq!(
        f.farm
            .try_lease_warm(&w, &none, Some(a), 0)
            .unwrap()
            .unwrap()
            .lease
            .job,
        high
    );
    assert_eq!(
        f.farm
            .try_lease_warm(&w, &none, Some(a), 0)
            .unwrap()
            .unwrap()
            .lease
            .job,
        a
    );
}

#[tokio::test]
async fn cancelling_a_job_wakes_the_slots_that_hold_it_warm() {
    let f = Arc::new(fixture());
    let job = f.farm.submit(sub(f.scene, "1", 1)).unwrap();
    let w = worker(&f.farm, "a");
    f.farm.try_lease(&w, &HashSet::new()).unwrap().unwrap();
    let (f2, w2) = (f.clone(), w.clone());
    let waiter = tokio::spawn(async move {
        f2.farm
            .lease(&w2, &HashSet::new(), Some(job), 0, Duration::from_secs(30))
            .await
    });
    // Cancelled once the call waits, so the cancel must wake it.
    until_parked(&f.farm, 1).await;
    f.farm.cancel(job).unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("woken at once")
        .unwrap()
        .unwrap();
    assert_eq!(got.ended, vec![job]);
    assert!(got.task.is_none());
}

#[test]
fn a_hot_gpu_drains_the_worker_and_requirements_pick_slots() {
    let f = fixture();
    let gpu = |temp| Gpu {
        index: 0,
        name: "RTX 4090".into(),
        memory_bytes: 24 << 30,
        telemetry: Some(crate::model::hardware::Telemetry {
            temperature_c: temp,
            ..Default::default()
        }),
        ..Default::default()
    };
    let (w, _) = f
        .farm
        .register(Registration {
            blender_version: "Blender 3.4.1".into(),
            name: "gpu".into(),
            slots: 1,
            gpus: vec![gpu(60)],
            slot_caps: vec![SlotCap {
                slot: 0,
                device: Device::Optix,
                gpu: Some(0),
                vram_bytes: 24 << 30,
            }],
            ..Default::default()
        })
        .unwrap();
    let mut s = sub(f.scene, "1-2", 1);
    s.device = "optix".into();
    s.min_vram_gb = 24.0;
    let job = f.farm.submit(s).unwrap();
    let mut too_big = sub(f.scene, "1", 1);
    too_big.min_vram_gb = 48.0;
    let waiting = f.farm.submit(too_big).unwrap();
    assert_eq!(
        f.farm.job(waiting).unwrap().waiting.as_deref(),
        Some("waiting: no available worker with 48 GB")
    );
    assert_eq!(f.farm.job(job).unwrap().waiting, None);
    f.farm.telemetry(&w, vec![gpu(95)], Vec::new()).unwrap();
    assert!(
        f.farm.try_lease(&w, &HashSet::new()).unwrap().is_none(),
        "draining"
    );
    assert!(f.farm.workers()[0]
        .drain
        .as_deref()
        .unwrap()
        .contains("95 °C"));
    f.farm.telemetry(&w, vec![gpu(70)], Vec::new()).unwrap();
    let a = f.farm.try_lease(&w, &HashSet::new()).unwrap().unwrap();
    assert_eq!((a.lease.job, a.device), (job, Device::Optix));
    // A slot that turns out to have no usable GPU takes CPU work only.
    let cpu = SlotCap {
        slot: 0,
        ..SlotCap::default()
    };
    f.farm.telemetry(&w, vec![gpu(70)], vec![cpu]).unwrap();
    assert!(f.farm.try_lease(&w, &HashSet::new()).unwrap().is_none());
}

#[test]
fn a_worker_that_keeps_failing_a_job_is_blocked_for_it() {
    let f = fixture();
    let mut s = sub(f.scene, "1-5", 1);
    s.max_attempts = 10;
    let job = f.farm.submit(s).unwrap();
    let other = f.farm.submit(sub(f.scene, "1", 1)).unwrap();
    let w = worker(&f.farm, "a");
    let _idle = worker(&f.farm, "b");
    let mut failed = 0;
    while failed < 3 {
        let a = f.farm.try_lease(&w, &HashSet::new()).unwrap().unwrap();
        if a.lease.job == job {
            f.farm
                .fail(a.lease, "Error: boom", "", FailureScope::Transient)
                .unwrap();
            failed += 1;
        } else {
            f.farm.complete(a.lease, vec![output(&f, 1)]).unwrap();
        }
    }
    // Blocked for `job`, but still serving other jobs.
    if f.farm.job(other).unwrap().job.state != JobState::Done {
        let a = f.farm.try_lease(&w, &HashSet::new()).unwrap().unwrap();
        assert_eq!(a.lease.job, other);
        f.farm.complete(a.lease, vec![output(&f, 1)]).unwrap();
    }
    assert!(f.farm.try_lease(&w, &HashSet::new()).unwrap().is_none());
    assert_eq!(f.farm.job(other).unwrap().job.state, JobState::Done);
    assert_eq!(f.farm.job(job).unwrap().job.failures_by_worker["w1"], 3);
    // A retry gives it a clean slate once the job has ended.
    f.farm.cancel(job).unwrap();
    f.farm.retry(job).unwrap();
    assert!(f.farm.try_lease(&w, &HashSet::new()).unwrap().is_some());
}

#[test]
fn pause_requeues_running_tasks_and_resume_continues() {
    let f = fixture();
    let job = f.farm.submit(sub(f.scene, "1-2", 1)).unwrap();
    let w = worker(&f.farm, "a");
    let l = f.farm.try_lease(&w, &HashSet::new()).unwrap().unwrap();
    let snap = f.farm.pause(job).unwrap();
    assert_eq!(snap.job.state, JobState::Paused);
    assert!(!f.farm.progress(l.lease, 0, (0, 0)), "the render stops");
    assert!(f.farm.try_lease(&w, &HashSet::new()).unwrap().is_none());
    assert!(matches!(f.farm.pause(job), Err(Error::Conflict(_))));
    f.farm.resume(job).unwrap();
    let again = f.farm.try_lease(&w, &HashSet::new()).unwrap().unwrap();
    assert_eq!(again.attempt, 1, "a pause charges no attempt");
    assert!(matches!(f.farm.retry(job), Err(Error::Conflict(_))));
}

#[test]
fn a_panic_under_the_state_lock_rebuilds_the_state_from_the_store() {
    let f = fixture();
    let job = f.farm.submit(sub(f.scene, "1-2", 1)).unwrap();
    let scene = f.scene;
    // A panic halfway through a change: the scene's reference released in
    // memory (as an install would before writing), never stored.
    let farm = &f.farm;
    let now = f.clock.now_ms();
    let panicked = std::thread::scope(|s| {
        s.spawn(|| {
            let mut st = farm.lock();
            st.blobs.release(scene, now);
            st.jobs.get_mut(&job).unwrap().priority = 99;
            panic!("a bug halfway through a change");
        })
        .join()
        .is_err()
    });
    assert!(panicked);
    // Past every grace period, the collector must not free the live scene.
    f.clock.advance(10 * f.farm.config().blob_grace_ms);
    f.farm.collect_garbage();
    assert!(
        f.blobs.contains(&scene),
        "the collector freed a live job's scene after a panic"
    );
    assert_eq!(
        f.farm.lock().jobs[&job].priority,
        0,
        "memory is the store's again"
    );
    // And the farm goes on: the job's tasks lease as before.
    let w = worker(&f.farm, "w");
    assert!(f.farm.try_lease(&w, &HashSet::new()).unwrap().is_some());
}

#[test]
fn renewing_leases_together_answers_each_as_its_own_renewal_would() {
    let f = fixture();
    let owned = |name: &str, owner: &str| {
        f.farm
            .register(Registration {
                blender_version: "Blender 3.4.1".into(),
                name: name.into(),
                slots: 2,
                owner: owner.into(),
                ..Default::default()
            })
            .unwrap()
            .0
    };
    let (mine, theirs) = (owned("a", "w1"), owned("b", "w2"));
    let kept = f.farm.submit(sub(f.scene, "1-2", 1)).unwrap();
    let cancelled = f.farm.submit(sub(f.scene, "1-2", 1)).unwrap();
    let lease_of = |w: &WorkerId, job: JobId| loop {
        let a = f.farm.try_lease(w, &HashSet::new()).unwrap().unwrap();
        if a.lease.job == job {
            break a.lease;
        }
    };
    let running = lease_of(&mine, kept);
    let gone = lease_of(&mine, cancelled);
    let other = lease_of(&theirs, kept);
    f.farm.cancel(cancelled).unwrap();
    let who = Identity {
        name: "w1".into(),
        role: crate::auth::Role::Worker,
    };
    let ask = |lease, waiting| Renewal {
        lease,
        frames_done: 0,
        samples: (3, 8),
        waiting,
    };
    let answers = f.farm.renew_all(
        &who,
        &[ask(running, false), ask(gone, true), ask(other, false)],
    );
    assert_eq!(answers.len(), 3);
    assert_eq!(answers[0].as_ref().unwrap(), &(true, String::new()));
    let (go_on, why) = answers[1].as_ref().unwrap();
    assert!(!go_on);
    assert!(why.contains("was cancelled"), "{why}");
    assert_eq!(
        *why,
        f.farm.why_stale(gone),
        "the words a Progress call gets"
    );
    assert!(
        matches!(&answers[2], Err(Error::PermissionDenied(m)) if m.contains("not registered with this token")),
        "{:?}",
        answers[2]
    );
    // The one held lease took the progress it carried.
    let task = f.farm.lock().tasks[&kept][running.task as usize].clone();
    assert_eq!((task.samples_done, task.samples_total), (3, 8));
}

#[test]
fn a_lease_asked_with_a_result_is_granted_and_stored_in_the_same_commit() {
    let f = fixture();
    let w = worker(&f.farm, "a");
    let job = f.farm.submit(sub(f.scene, "1-3", 1)).unwrap();
    let first = f.farm.try_lease(&w, &HashSet::new()).unwrap().unwrap();
    let ask = NextAsk {
        worker: w.clone(),
        cached: HashSet::new(),
        warm: Some(job),
        slot: 0,
        ahead: false,
    };
    let before = f.farm.stats();
    let report = || {
        f.farm
            .complete_begin_asking(
                first.lease,
                vec![output(&f, 1)],
                Vec::new(),
                Vec::new(),
                Some(&ask),
            )
            .unwrap()
    };
    let (pending, next) = report();
    let next = next.expect("leased with the result");
    let (second, ticket) = next.task.expect("the next task");
    pending.ticket.wait().unwrap();
    ticket.wait().unwrap();
    assert_eq!(second.frames, [2]);
    let after = f.farm.stats();
    assert_eq!(
        (
            after.commits - before.commits,
            after.committed_changes - before.committed_changes
        ),
        (1, 2),
        "the result and the lease share one commit"
    );
    // Both are on disk: a restart finds frame 1 done and frame 2 leased.
    let again = f.reopen();
    let snap = again.job(job).unwrap();
    assert_eq!((snap.counts.done, snap.counts.leased), (1, 1));

    // A duplicate result leases nothing here: the caller asks on its own.
    let (pending, next) = report();
    assert_eq!(pending.completion, Completion::Duplicate);
    assert!(next.is_none());
}
