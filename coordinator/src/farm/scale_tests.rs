//! Tests of the indexes and group commit: a failed write, commits shared by
//! concurrent changes, expiry by the deadline heap, waking one parked lease
//! call per ready task, archive and delete.

use super::tests::{fixture, output, sub, until, until_parked, worker};
use super::*;

fn lease_and_complete(f: &super::tests::Fixture, w: &WorkerId) -> Option<JobId> {
    let a = f.farm.try_lease(w, &HashSet::new()).unwrap()?;
    let outs = a.frames.iter().map(|&fr| output(f, fr)).collect();
    f.farm.complete(a.lease, outs).unwrap();
    Some(a.lease.job)
}

#[test]
fn a_failed_write_fails_its_change_and_memory_again_matches_the_store() {
    let f = fixture();
    let job = f.farm.submit(sub(f.scene, "1-2", 1)).unwrap();
    let w = worker(&f.farm, "a");
    f.store.fail_next_writes(1);
    let err = f.farm.try_lease(&w, &HashSet::new()).unwrap_err();
    assert!(matches!(err, Error::Store(_)), "{err}");
    let snap = f.farm.job(job).unwrap();
    assert_eq!(
        snap.counts.queued, 2,
        "the lease was not stored, so it is not held"
    );
    assert_eq!(snap.job.state, JobState::Queued);
    // And the farm goes on.
    assert_eq!(lease_and_complete(&f, &w), Some(job));
    assert_eq!(lease_and_complete(&f, &w), Some(job));
    assert_eq!(f.farm.job(job).unwrap().job.state, JobState::Done);
}

#[test]
fn concurrent_completions_share_flushes_and_all_are_stored() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(crate::store::SledStore::open(&dir.path().join("db")).unwrap());
    let blobs = Arc::new(crate::blobs::MemoryBlobStore::default());
    let bytes = b"BLENDER-v304 scene ... ENDB\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0";
    let scene = Digest::of(bytes);
    blobs.put(scene, bytes).unwrap();
    let clock = Arc::new(crate::clock::ManualClock::at(1_000_000));
    let farm = Arc::new(
        Farm::open(
            store.clone(),
            blobs.clone(),
            clock.clone(),
            super::tests::config(),
        )
        .unwrap(),
    );
    let job = farm.submit(sub(scene, "1-320", 1)).unwrap();
    let before = farm.stats();
    let threads: Vec<_> = (0..16)
        .map(|i| {
            let farm = farm.clone();
            let blobs = blobs.clone();
            std::thread::spawn(move || {
                let w = worker(&farm, &format!("w{i}"));
                while let Some(a) = farm.try_lease(&w, &HashSet::new()).unwrap() {
                    let bytes = format!("frame {}", a.frames[0]);
                    let digest = Digest::of(bytes.as_bytes());
                    blobs.put(digest, bytes.as_bytes()).unwrap();
                    let out = FrameOutput {
                        frame: a.frames[0],
                        digest,
                        ext: "png".into(),
                        size: bytes.len() as u64,
                        pass: String::new(),
                    };
                    farm.complete(a.lease, vec![out]).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let after = farm.stats();
    let commits = after.commits - before.commits;
    let changes = after.committed_changes - before.committed_changes;
    assert!(
        changes >= 640,
        "every lease and completion was written: {changes}"
    );
    assert!(
        commits < changes,
        "concurrent changes share flushes: {changes} changes in {commits} commits"
    );
    drop(farm);
    // Everything acknowledged is on disk.
    let again = Farm::open(store, blobs, clock, super::tests::config()).unwrap();
    let snap = again.job(job).unwrap();
    assert_eq!(snap.counts.done, 320);
    assert_eq!(snap.job.state, JobState::Done);
}

#[test]
fn a_lease_expires_by_its_deadline_and_a_renewal_defers_it() {
    let f = fixture();
    let job = f.farm.submit(sub(f.scene, "1", 1)).unwrap();
    let w = worker(&f.farm, "a");
    let a = f.farm.try_lease(&w, &HashSet::new()).unwrap().unwrap();
    // TTL is 1 s in the test config.
    f.clock.advance(800);
    assert!(f.farm.progress(a.lease, 0, (1, 4)));
    f.clock.advance(800);
    assert_eq!(f.farm.expire_leases().unwrap(), 0, "renewed at 0.8 s");
    assert_eq!(f.farm.job(job).unwrap().counts.leased, 1);
    f.clock.advance(300);
    assert_eq!(f.farm.expire_leases().unwrap(), 1);
    let snap = f.farm.job(job).unwrap();
    assert_eq!((snap.counts.leased, snap.counts.queued), (0, 1));
    assert_eq!(
        f.farm.expire_leases().unwrap(),
        0,
        "each lease expires once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_task_wakes_one_parked_lease_call_not_all() {
    let f = Arc::new(fixture());
    let workers: Vec<WorkerId> = (0..3).map(|i| worker(&f.farm, &format!("w{i}"))).collect();
    let mut calls = Vec::new();
    for w in workers {
        let f = f.clone();
        calls.push(tokio::spawn(async move {
            f.farm
                .lease(&w, &HashSet::new(), None, 0, Duration::from_secs(3))
                .await
                .unwrap()
        }));
    }
    until_parked(&f.farm, 3).await;
    let job = f.farm.submit(sub(f.scene, "1", 1)).unwrap();
    // Waking happens as the task becomes ready; once it is leased, whoever
    // was going to be woken has been.
    until("the task to be leased", || {
        f.farm.job(job).unwrap().counts.leased > 0
    })
    .await;
    assert_eq!(
        f.farm.lock().schedule.parked(),
        2,
        "one call was woken for the one task; two still wait"
    );
    let mut got = 0;
    for c in calls {
        if c.await.unwrap().task.is_some() {
            got += 1;
        }
    }
    assert_eq!(got, 1);
}

#[test]
fn an_archived_job_keeps_its_summary_and_frames_and_a_deleted_one_frees_them() {
    let f = fixture();
    let job = f.farm.submit(sub(f.scene, "1-3", 1)).unwrap();
    let w = worker(&f.farm, "a");
    while lease_and_complete(&f, &w).is_some() {}
    let outputs = f.farm.job(job).unwrap().outputs;
    assert_eq!(outputs.len(), 3);
    let running = f.farm.submit(sub(f.scene, "1", 1)).unwrap();
    assert!(matches!(f.farm.archive(running), Err(Error::Conflict(_))));
    f.farm.archive(job).unwrap();
    assert!(
        f.farm.jobs().iter().all(|j| j.job.id != job),
        "out of the live jobs"
    );
    let who = Identity::local();
    let (live, _) = f.farm.job_list(&who, 0, 10, false);
    assert!(live.iter().all(|j| j.job.id != job));
    let (all, _) = f.farm.job_list(&who, 0, 10, true);
    let listed = all
        .iter()
        .find(|j| j.job.id == job)
        .expect("listed as archived");
    assert!(listed.archived);
    assert_eq!(listed.counts.frames_done, 3);
    // Its frames stay fetchable, and are not collected.
    let page = f.farm.job_page(job, Page::ALL).unwrap();
    assert_eq!(page.outputs, outputs);
    f.clock.advance(3_600_000);
    f.farm.collect_garbage();
    assert!(outputs.iter().all(|o| f.blobs.contains(&o.digest)));
    // A restart keeps it archived.
    let again = f.reopen();
    assert!(again.job_page(job, Page::SUMMARY).unwrap().archived);
    again.collect_garbage();
    assert!(outputs.iter().all(|o| f.blobs.contains(&o.digest)));
    // Deleting it frees its frames after the grace period.
    again.delete(job).unwrap();
    assert!(matches!(
        again.job_page(job, Page::SUMMARY),
        Err(Error::NotFound(_))
    ));
    f.clock.advance(3_600_000);
    again.collect_garbage();
    assert!(outputs.iter().all(|o| !f.blobs.contains(&o.digest)));
    assert!(
        f.blobs.contains(&f.scene),
        "the scene is still used by another job"
    );
    // Its id is never handed out again.
    let next = again.submit(sub(f.scene, "1", 1)).unwrap();
    assert!(next.0 > running.0);
}

#[test]
fn untouched_tasks_are_rebuilt_from_their_job_and_stored_ones_laid_over_them() {
    let f = fixture();
    let whole = f.farm.submit(sub(f.scene, "1-1000x3,2000", 4)).unwrap();
    let mut tiled = sub(f.scene, "5-9", 1);
    tiled.tiles = "3x2".into();
    tiled.overscan = Some(7);
    tiled.scene_info = Some(SceneInfo {
        width: 97,
        height: 61,
        file_format: "PNG".into(),
        fps: 0.0,
    });
    let tiled = f.farm.submit(tiled).unwrap();
    let w = worker(&f.farm, "a");
    for _ in 0..3 {
        lease_and_complete(&f, &w);
    }
    let held = f.farm.try_lease(&w, &HashSet::new()).unwrap().unwrap();
    let before = (f.farm.job(whole).unwrap(), f.farm.job(tiled).unwrap());
    let again = f.reopen();
    for b in [before.0, before.1] {
        let a = again.job(b.job.id).unwrap();
        let strip = |t: &[Arc<Task>]| -> Vec<Task> {
            t.iter()
                .map(|t| Task::clone(t))
                .map(|mut t| {
                    // A restart gives leases a fresh TTL.
                    if let TaskState::Leased { expires_ms, .. } = &mut t.state {
                        *expires_ms = 0;
                    }
                    t
                })
                .collect()
        };
        assert_eq!(strip(&a.tasks), strip(&b.tasks), "job {}", b.job.id);
        assert_eq!(a.counts, b.counts);
        assert_eq!(a.job, b.job);
    }
    assert!(
        again.progress(held.lease, 0, (0, 0)),
        "the lease is still held"
    );
}

#[test]
fn an_acknowledged_result_is_under_its_address_on_disk_with_its_record() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(crate::store::SledStore::open(&dir.path().join("db")).unwrap());
    let blobs =
        Arc::new(crate::blobs::FsBlobStore::open(&dir.path().join("blobs"), 1 << 20).unwrap());
    let bytes = b"BLENDER-v304 scene ... ENDB\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0";
    let scene = Digest::of(bytes);
    blobs.put(scene, bytes).unwrap();
    let clock = Arc::new(crate::clock::ManualClock::at(1_000_000));
    let farm = Farm::open(store, blobs.clone(), clock, super::tests::config()).unwrap();
    let job = farm.submit(sub(scene, "1-2", 1)).unwrap();
    assert!(
        blobs.path(&scene).is_file(),
        "the scene went to disk with the job's record"
    );
    let w = worker(&farm, "a");
    let a = farm.try_lease(&w, &HashSet::new()).unwrap().unwrap();
    let frame = b"a rendered frame".to_vec();
    let digest = Digest::of(&frame);
    blobs.put(digest, &frame).unwrap();
    assert!(
        !blobs.path(&digest).exists(),
        "an upload waits for the group commit"
    );
    // A change naming no waiting blob (a lease) is stored without syncing
    // anyone's upload: it never waits for a results' sync.
    let b = farm
        .try_lease(&worker(&farm, "b"), &HashSet::new())
        .unwrap()
        .unwrap();
    assert!(
        !blobs.path(&digest).exists(),
        "a lease's commit leaves the upload waiting"
    );
    let out = |frame: u32, digest: Digest, size: usize| FrameOutput {
        frame,
        digest,
        ext: "png".into(),
        size: size as u64,
        pass: String::new(),
    };
    farm.complete(a.lease, vec![out(1, digest, frame.len())])
        .unwrap();
    assert_eq!(
        std::fs::read(blobs.path(&digest)).unwrap(),
        frame,
        "acknowledged: the result's bytes are in place"
    );
    let second = b"another rendered frame".to_vec();
    let d2 = Digest::of(&second);
    blobs.put(d2, &second).unwrap();
    farm.complete(b.lease, vec![out(2, d2, second.len())])
        .unwrap();
    assert_eq!(farm.job(job).unwrap().job.state, JobState::Done);
    assert_eq!(std::fs::read(blobs.path(&d2)).unwrap(), second);
}
