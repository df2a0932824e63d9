//! Tests of the paths by which a job could end wrong or never end: shared
//! tiles, failed stitches, stitches skipped by a cancel, workers all blocked,
//! failures only one machine has, and a store that fails to write.

use std::collections::HashSet;
use std::sync::Arc;

use super::*;
use crate::blobs::MemoryBlobStore;
use crate::clock::ManualClock;
use crate::store::MemoryStore;

struct Fixture {
    farm: Farm,
    clock: Arc<ManualClock>,
    store: Arc<MemoryStore>,
    blobs: Arc<MemoryBlobStore>,
    scene: Digest,
}

fn fixture() -> Fixture {
    let clock = Arc::new(ManualClock::at(1_000_000));
    let store = Arc::new(MemoryStore::default());
    let blobs = Arc::new(MemoryBlobStore::default());
    let bytes = b"BLENDER-v304 scene ... ENDB\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0";
    let scene = Digest::of(bytes);
    blobs.put(scene, bytes).unwrap();
    let config = Config {
        lease_ttl_ms: 1000,
        max_frames: 1000,
        max_attempts: 3,
        max_upload: 1 << 20,
        max_tiles: 16,
        health: HealthLimits::default(),
        block_after: 2,
        auth: true,
        max_message: 4 << 20,
        blob_grace_ms: 2000,
        ..Config::default()
    };
    let farm = Farm::open(store.clone(), blobs.clone(), clock.clone(), config).unwrap();
    Fixture {
        farm,
        clock,
        store,
        blobs,
        scene,
    }
}

fn submission(scene: Digest, frames: &str, tiles: &str) -> Submission {
    Submission {
        after: Vec::new(),
        max_cost: None,
        capacity: Default::default(),
        scene,
        scene_name: "s.blend".into(),
        frames: frames.into(),
        chunk: 1,
        priority: 0,
        max_attempts: 0,
        tiles: tiles.into(),
        overscan: Some(0),
        scene_info: Some(SceneInfo {
            width: 4,
            height: 2,
            file_format: "PNG".into(),
            fps: 0.0,
        }),
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

fn worker(farm: &Farm, name: &str) -> WorkerId {
    farm.register(Registration {
        blender_version: "Blender 3.4.1".into(),
        name: name.into(),
        slots: 1,
        ..Default::default()
    })
    .unwrap()
    .0
}

/// A `w`x`h` RGBA PNG filled with one colour.
fn png(w: u32, h: u32, rgba: [u8; 4]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, w, h);
    enc.set_color(png::ColorType::Rgba);
    enc.set_depth(png::BitDepth::Eight);
    let mut writer = enc.write_header().unwrap();
    let data: Vec<u8> = (0..w * h).flat_map(|_| rgba).collect();
    writer.write_image_data(&data).unwrap();
    drop(writer);
    out
}

/// Uploads `bytes` and names them as the output of `frame`.
fn put(f: &Fixture, frame: u32, bytes: &[u8]) -> FrameOutput {
    let digest = Digest::of(bytes);
    f.blobs.put(digest, bytes).unwrap();
    FrameOutput {
        frame,
        digest,
        ext: "png".into(),
        size: bytes.len() as u64,
        pass: String::new(),
    }
}

/// A 2x2 tile for a 4x2 frame split 2x1: the same transparent bytes for
/// every tile, as an empty corner of a scene renders.
fn empty_tile(f: &Fixture, frame: u32) -> FrameOutput {
    put(f, frame, &png(2, 2, [0, 0, 0, 0]))
}

/// Leases and completes every queued task with `tile(frame)`.
fn render_all(f: &Fixture, w: &WorkerId, tile: impl Fn(&Fixture, u32) -> FrameOutput) {
    while let Some(a) = f.farm.try_lease(w, &HashSet::new()).unwrap() {
        let out = tile(f, a.frames[0]);
        f.farm.complete(a.lease, vec![out]).unwrap();
    }
}

#[test]
fn a_tile_shared_by_two_frames_is_kept_until_no_frame_needs_it() {
    let f = fixture();
    let job = f.farm.submit(submission(f.scene, "1-2", "2x1")).unwrap();
    let w = worker(&f.farm, "a");
    // Frame 1's two tiles, and the first of frame 2's: all the same bytes.
    let mut leases = Vec::new();
    while let Some(a) = f.farm.try_lease(&w, &HashSet::new()).unwrap() {
        leases.push(a);
    }
    assert_eq!(leases.len(), 4);
    let shared = empty_tile(&f, 1).digest;
    for a in &leases[..3] {
        let out = empty_tile(&f, a.frames[0]);
        f.farm.complete(a.lease, vec![out]).unwrap();
    }
    assert_eq!(
        f.farm.job(job).unwrap().job.stitched.len(),
        1,
        "frame 1 is stitched"
    );
    // Frame 2's last worker uploads the same bytes again (or finds them
    // present), then takes its time before naming them in its result.
    f.farm.touch_blobs_blocking(&[shared]);
    f.clock.advance(1500);
    f.farm.collect_garbage();
    assert!(
        f.blobs.contains(&shared),
        "a blob touched within the grace is kept"
    );
    f.clock.advance(1500);
    // Frame 2's third tile still references it: no grace needed.
    f.farm.collect_garbage();
    assert!(f.blobs.contains(&shared), "a referenced tile is kept");
    let last = empty_tile(&f, 2);
    f.farm.complete(leases[3].lease, vec![last]).unwrap();
    let snap = f.farm.job(job).unwrap();
    assert_eq!(snap.job.state, JobState::Done);
    // Both frames stitched: the tile is garbage, collected after the grace.
    f.farm.collect_garbage();
    assert!(f.blobs.contains(&shared), "kept for the grace period");
    f.clock.advance(2001);
    assert_eq!(f.farm.collect_garbage(), 1);
    assert!(!f.blobs.contains(&shared));
    for o in &snap.outputs {
        assert!(
            f.blobs.contains(&o.digest),
            "stitched frame {} is kept",
            o.frame
        );
    }
}

#[test]
fn a_result_naming_a_collected_blob_is_refused_as_not_found_not_invalid() {
    let f = fixture();
    f.farm.submit(submission(f.scene, "1-2", "2x1")).unwrap();
    let w = worker(&f.farm, "a");
    let mut leases = Vec::new();
    while let Some(a) = f.farm.try_lease(&w, &HashSet::new()).unwrap() {
        leases.push(a);
    }
    for a in &leases[..2] {
        let out = empty_tile(&f, a.frames[0]);
        f.farm.complete(a.lease, vec![out]).unwrap();
    }
    f.clock.advance(2001);
    f.farm.collect_garbage();
    let gone = empty_tile(&f, 2);
    f.blobs.remove(&gone.digest).unwrap();
    let err = f.farm.complete(leases[2].lease, vec![gone]).unwrap_err();
    assert!(matches!(err, Error::NotFound(_)), "{err}");
    assert!(err.to_string().contains("upload it again"), "{err}");
}

#[test]
fn a_stitch_that_cannot_read_its_tiles_keeps_them_and_tries_again() {
    let f = fixture();
    let job = f.farm.submit(submission(f.scene, "1", "2x1")).unwrap();
    let w = worker(&f.farm, "a");
    f.blobs.fail_next_reads(1);
    render_all(&f, &w, |f, fr| put(f, fr, &png(2, 2, [9, 9, 9, 255])));
    let snap = f.farm.job(job).unwrap();
    assert_eq!(
        snap.job.state,
        JobState::Running,
        "not failed by one read error"
    );
    assert!(
        snap.waiting
            .as_deref()
            .unwrap_or("")
            .contains("could not be stitched 1 time"),
        "{:?}",
        snap.waiting
    );
    let tile = Digest::of(&png(2, 2, [9, 9, 9, 255]));
    f.clock.advance(10_000);
    f.farm.collect_garbage();
    assert!(f.blobs.contains(&tile), "a failed stitch deletes no tile");
    assert_eq!(f.farm.stitch_pending(), 1);
    let snap = f.farm.job(job).unwrap();
    assert_eq!(snap.job.state, JobState::Done, "{}", snap.job.message);
}

#[test]
fn a_stitch_that_never_reads_its_tiles_fails_the_job_with_the_reason() {
    let f = fixture();
    let job = f.farm.submit(submission(f.scene, "1", "2x1")).unwrap();
    let w = worker(&f.farm, "a");
    f.blobs.fail_next_reads(100);
    render_all(&f, &w, |f, fr| put(f, fr, &png(2, 2, [1, 2, 3, 255])));
    for _ in 0..10 {
        f.clock.advance(60_000);
        f.farm.stitch_pending();
    }
    let snap = f.farm.job(job).unwrap();
    assert_eq!(snap.job.state, JobState::Failed);
    assert!(
        snap.job.message.contains("could not be read 5 times"),
        "{}",
        snap.job.message
    );
    f.blobs.fail_next_reads(0);
    // The tiles were kept: a retry stitches the frame without re-rendering.
    f.farm.retry(job).unwrap();
    f.farm.stitch_pending();
    assert_eq!(f.farm.job(job).unwrap().job.state, JobState::Done);
}

#[test]
fn a_tile_that_cannot_be_stitched_is_rendered_again() {
    let f = fixture();
    let job = f.farm.submit(submission(f.scene, "1", "2x1")).unwrap();
    let w = worker(&f.farm, "a");
    let a = f.farm.try_lease(&w, &HashSet::new()).unwrap().unwrap();
    let b = f.farm.try_lease(&w, &HashSet::new()).unwrap().unwrap();
    let good = put(&f, 1, &png(2, 2, [5, 5, 5, 255]));
    f.farm.complete(a.lease, vec![good.clone()]).unwrap();
    let corrupt = put(&f, 1, b"\x89PNG\r\n\x1a\n not really");
    f.farm.complete(b.lease, vec![corrupt]).unwrap();
    let snap = f.farm.job(job).unwrap();
    assert_eq!(snap.job.state, JobState::Running);
    let again = &snap.tasks[b.lease.task as usize];
    assert_eq!(
        again.state,
        TaskState::Queued,
        "the bad tile goes back to the queue"
    );
    assert_eq!(again.failures, 1, "and is charged an attempt");
    assert!(
        again.message.contains("rendered again"),
        "{}",
        again.message
    );
    assert!(f.blobs.contains(&good.digest), "the good tile is kept");
    render_all(&f, &w, |f, fr| put(f, fr, &png(2, 2, [6, 6, 6, 255])));
    assert_eq!(f.farm.job(job).unwrap().job.state, JobState::Done);
}

#[test]
fn a_stitch_skipped_by_a_cancel_happens_after_a_retry() {
    let f = fixture();
    let job = f.farm.submit(submission(f.scene, "1", "2x1")).unwrap();
    let w = worker(&f.farm, "a");
    // Every tile arrives, but the stitch cannot read them yet...
    f.blobs.fail_next_reads(1);
    render_all(&f, &w, |f, fr| put(f, fr, &png(2, 2, [7, 7, 7, 255])));
    // ...and the job is canceled before it is tried again.
    f.farm.cancel(job).unwrap();
    f.clock.advance(10_000);
    assert_eq!(f.farm.stitch_pending(), 0, "a canceled job is not stitched");
    f.farm.retry(job).unwrap();
    assert_eq!(f.farm.stitch_pending(), 1);
    let snap = f.farm.job(job).unwrap();
    assert_eq!(snap.job.state, JobState::Done, "{}", snap.job.message);
}

#[test]
fn a_restart_stitches_frames_whose_tiles_all_arrived() {
    let f = fixture();
    let job = f.farm.submit(submission(f.scene, "1", "2x1")).unwrap();
    let w = worker(&f.farm, "a");
    f.blobs.fail_next_reads(1);
    render_all(&f, &w, |f, fr| put(f, fr, &png(2, 2, [8, 8, 8, 255])));
    assert_eq!(f.farm.job(job).unwrap().job.state, JobState::Running);
    let again = Farm::open(
        f.store.clone(),
        f.blobs.clone(),
        f.clock.clone(),
        f.farm.config().clone(),
    )
    .unwrap();
    again.recover_stitching().unwrap();
    assert_eq!(again.job(job).unwrap().job.state, JobState::Done);
}

#[test]
fn when_every_worker_is_blocked_the_job_says_so_and_goes_on_then_ends() {
    let f = fixture();
    let mut s = submission(f.scene, "1-6", "");
    s.scene_info = None;
    s.max_attempts = 4;
    let job = f.farm.submit(s).unwrap();
    let (a, b) = (worker(&f.farm, "a"), worker(&f.farm, "b"));
    // Each fails the job twice (block_after = 2): both are blocked.
    for w in [&a, &a, &b, &b] {
        let l = f.farm.try_lease(w, &HashSet::new()).unwrap().unwrap();
        f.farm
            .fail(l.lease, "Error: boom", "", FailureScope::Transient)
            .unwrap();
    }
    let snap = f.farm.job(job).unwrap();
    let why = snap.waiting.unwrap_or_default();
    assert!(
        why.contains("every available worker has failed this job"),
        "{why}"
    );
    // It goes on rather than waiting silently...
    let mut rounds = 0;
    while let Some(l) = f.farm.try_lease(&a, &HashSet::new()).unwrap() {
        f.farm
            .fail(l.lease, "Error: boom", "", FailureScope::Transient)
            .unwrap();
        rounds += 1;
        assert!(rounds < 100, "the job must end");
    }
    // ...until a task runs out of attempts and the job fails, saying why.
    let snap = f.farm.job(job).unwrap();
    assert_eq!(snap.job.state, JobState::Failed);
    assert!(
        snap.job.message.contains("failed 4 times"),
        "{}",
        snap.job.message
    );
}

#[test]
fn a_failure_only_one_machine_has_needs_a_second_worker_to_agree() {
    let f = fixture();
    let mut s = submission(f.scene, "1", "");
    s.scene_info = None;
    let job = f.farm.submit(s).unwrap();
    let (a, b) = (worker(&f.farm, "a"), worker(&f.farm, "b"));
    let l = f.farm.try_lease(&a, &HashSet::new()).unwrap().unwrap();
    let out = f
        .farm
        .fail(l.lease, "out of memory", "", FailureScope::Machine)
        .unwrap();
    assert_eq!(
        out,
        FailOutcome::Retry,
        "one worker's word does not fail the job"
    );
    assert!(
        f.farm.try_lease(&a, &HashSet::new()).unwrap().is_none(),
        "not back to the same machine"
    );
    let l = f.farm.try_lease(&b, &HashSet::new()).unwrap().unwrap();
    f.farm
        .fail(l.lease, "out of memory", "", FailureScope::Machine)
        .unwrap();
    let snap = f.farm.job(job).unwrap();
    assert_eq!(snap.job.state, JobState::Failed);
    assert!(
        snap.job.message.contains("two workers"),
        "{}",
        snap.job.message
    );
}

#[test]
fn a_failure_only_one_machine_has_fails_the_job_when_no_other_could_take_it() {
    let f = fixture();
    let mut s = submission(f.scene, "1", "");
    s.scene_info = None;
    let job = f.farm.submit(s).unwrap();
    let a = worker(&f.farm, "a");
    let l = f.farm.try_lease(&a, &HashSet::new()).unwrap().unwrap();
    f.farm
        .fail(
            l.lease,
            "cannot read /mnt/assets",
            "",
            FailureScope::Machine,
        )
        .unwrap();
    let snap = f.farm.job(job).unwrap();
    assert_eq!(snap.job.state, JobState::Failed);
    assert!(
        snap.job.message.contains("only worker"),
        "{}",
        snap.job.message
    );
}

#[test]
fn a_failure_no_worker_can_fix_fails_the_job_at_once() {
    let f = fixture();
    let mut s = submission(f.scene, "1-3", "");
    s.scene_info = None;
    let job = f.farm.submit(s).unwrap();
    let (a, _b) = (worker(&f.farm, "a"), worker(&f.farm, "b"));
    let l = f.farm.try_lease(&a, &HashSet::new()).unwrap().unwrap();
    let why = "this worker's Blender was built without OpenImageDenoise: turn off denoising, or add workers whose Blender has it";
    f.farm
        .fail(
            l.lease,
            why,
            "Error: Build without OpenImageDenoiser",
            FailureScope::Everywhere,
        )
        .unwrap();
    let snap = f.farm.job(job).unwrap();
    assert_eq!(snap.job.state, JobState::Failed);
    assert!(
        snap.job.message.contains("turn off denoising"),
        "{}",
        snap.job.message
    );
    assert!(
        snap.tasks.iter().all(|t| t.failures <= 1),
        "no other attempt was burnt"
    );
    assert!(f.farm.try_lease(&a, &HashSet::new()).unwrap().is_none());
}

#[test]
fn a_result_refused_for_good_is_invalid_so_the_worker_fails_it() {
    let f = fixture();
    let mut s = submission(f.scene, "1", "");
    s.scene_info = None;
    f.farm.submit(s).unwrap();
    let a = worker(&f.farm, "a");
    let l = f.farm.try_lease(&a, &HashSet::new()).unwrap().unwrap();
    let mut wrong = put(&f, 7, b"frame 7");
    let err = f.farm.complete(l.lease, vec![wrong.clone()]).unwrap_err();
    assert!(matches!(err, Error::Invalid(_)), "{err}");
    wrong.frame = 1;
    wrong.pass = "../../etc/passwd".into();
    let err = f.farm.complete(l.lease, vec![wrong]).unwrap_err();
    assert!(matches!(err, Error::Invalid(_)), "{err}");
}

#[test]
fn extra_passes_are_kept_with_their_frame() {
    let f = fixture();
    let mut s = submission(f.scene, "1", "");
    s.scene_info = None;
    let job = f.farm.submit(s).unwrap();
    let a = worker(&f.farm, "a");
    let l = f.farm.try_lease(&a, &HashSet::new()).unwrap().unwrap();
    let frame = put(&f, 1, b"frame 1");
    let mut pass = put(&f, 1, b"depth 1");
    pass.pass = "depth/Image0001.png".into();
    f.farm.complete(l.lease, vec![frame, pass.clone()]).unwrap();
    let snap = f.farm.job(job).unwrap();
    assert_eq!(snap.job.state, JobState::Done);
    assert!(snap.outputs.contains(&pass));
}

#[test]
fn a_write_that_failed_spends_its_job_id_and_stores_nothing() {
    let f = fixture();
    let mut s = submission(f.scene, "1", "");
    s.scene_info = None;
    f.store.fail_next_writes(1);
    let err = f.farm.submit(s.clone()).unwrap_err();
    assert!(matches!(err, Error::Store(_)), "{err}");
    let second = f.farm.submit(s.clone()).unwrap();
    assert_eq!(
        second,
        JobId(2),
        "the id of the unacknowledged job is not reused"
    );
    assert!(f.farm.job(JobId(1)).is_err());
    let again = Farm::open(
        f.store.clone(),
        f.blobs.clone(),
        f.clock.clone(),
        f.farm.config().clone(),
    )
    .unwrap();
    assert!(
        again.job(JobId(1)).is_err(),
        "nothing unacknowledged was stored"
    );
    assert_eq!(again.submit(s).unwrap(), JobId(3));
}

#[test]
fn a_job_goes_only_to_workers_whose_blender_has_what_it_needs() {
    let f = fixture();
    let mut s = submission(f.scene, "1", "");
    s.scene_info = None;
    s.features = vec!["openimagedenoise".into()];
    let job = f.farm.submit(s.clone()).unwrap();
    let plain = worker(&f.farm, "plain");
    assert!(f.farm.try_lease(&plain, &HashSet::new()).unwrap().is_none());
    let why = f.farm.job(job).unwrap().waiting.unwrap_or_default();
    assert!(why.contains("a Blender with OpenImageDenoise"), "{why}");
    let (denoiser, _) = f
        .farm
        .register(Registration {
            blender_version: "Blender 3.4.1".into(),
            name: "oidn".into(),
            slots: 1,
            features: vec!["openimagedenoise".into()],
            ..Default::default()
        })
        .unwrap();
    assert!(f
        .farm
        .try_lease(&denoiser, &HashSet::new())
        .unwrap()
        .is_some());
    s.features = vec!["raytracing-magic".into()];
    let err = f.farm.submit(s).unwrap_err();
    assert!(err.to_string().contains("not a Blender feature"), "{err}");
}

#[test]
fn a_tiled_frame_rendered_again_is_stitched_from_its_new_tiles_only() {
    let f = fixture();
    let job = f.farm.submit(submission(f.scene, "1-2", "2x1")).unwrap();
    let w = worker(&f.farm, "a");
    render_all(&f, &w, |f, fr| put(f, fr, &png(2, 2, [10, 10, 10, 255])));
    let before = f.farm.job(job).unwrap();
    assert_eq!(before.job.state, JobState::Done);
    let digest = |s: &JobSnapshot, frame: u32| {
        s.outputs
            .iter()
            .find(|o| o.frame == frame)
            .map(|o| o.digest)
    };
    let (old1, old2) = (digest(&before, 1), digest(&before, 2));
    let (_, frames) = f.farm.retry_frames(job, "2").unwrap();
    assert_eq!(frames, vec![2]);
    let snap = f.farm.job(job).unwrap();
    assert_eq!(snap.job.state, JobState::Running);
    assert_eq!(
        digest(&snap, 2),
        None,
        "the old image of frame 2 is no longer delivered"
    );
    assert_eq!(digest(&snap, 1), old1);
    // Across a restart the old stitched record of frame 2 does not come back.
    let again = Farm::open(
        f.store.clone(),
        f.blobs.clone(),
        f.clock.clone(),
        f.farm.config().clone(),
    )
    .unwrap();
    assert_eq!(digest(&again.job(job).unwrap(), 2), None);
    while let Some(a) = again.try_lease(&w, &HashSet::new()).unwrap() {
        assert_eq!(a.frames, vec![2], "only frame 2's tiles render again");
        let out = put(&f, 2, &png(2, 2, [20, 20, 20, 255]));
        again.complete(a.lease, vec![out]).unwrap();
    }
    let after = again.job(job).unwrap();
    assert_eq!(after.job.state, JobState::Done, "{}", after.job.message);
    assert_eq!(digest(&after, 1), old1);
    assert!(digest(&after, 2).is_some() && digest(&after, 2) != old2);
}

/// Issue 21 part 8: a task that failed on one machine while another worker
/// could take it, after that worker left, is leasable by no one: the job
/// says why instead of `waiting: ""`, and the first machine, restarted,
/// gets another chance and finishes it.
#[test]
fn a_task_no_available_worker_may_take_says_why_until_a_restart() {
    let f = fixture();
    let mut s = submission(f.scene, "1", "");
    s.scene_info = None;
    let job = f.farm.submit(s).unwrap();
    let (a, b) = (worker(&f.farm, "a"), worker(&f.farm, "b"));
    let l = f.farm.try_lease(&a, &HashSet::new()).unwrap().unwrap();
    let out = f
        .farm
        .fail(l.lease, "cannot write the cache", "", FailureScope::Machine)
        .unwrap();
    assert_eq!(out, FailOutcome::Retry, "b could take it");
    // b goes away; a keeps asking for work and gets none.
    f.clock.advance(3 * f.farm.config().lease_ttl_ms);
    assert!(f.farm.try_lease(&a, &HashSet::new()).unwrap().is_none());
    let snap = f.farm.job(job).unwrap();
    assert_eq!(snap.job.state, JobState::Running);
    let why = snap.waiting.unwrap_or_default();
    assert!(
        why.contains("failed on the machine of every available worker") && why.contains(&a.0),
        "a runnable task nobody may take must say why: {why:?}"
    );
    // a's machine, restarted (registering under its id), is tried again.
    let again = f
        .farm
        .register(Registration {
            blender_version: "Blender 3.4.1".into(),
            name: "a".into(),
            slots: 1,
            previous: Some(a.clone()),
            ..Default::default()
        })
        .unwrap()
        .0;
    assert_eq!(again, a);
    let l = f.farm.try_lease(&a, &HashSet::new()).unwrap();
    assert!(l.is_some(), "the restarted worker gets the task");
    let _ = b;
}

/// Issue 21 part 8: a task that failed on the only worker able to take it
/// goes back to that worker, however many other workers are online that
/// cannot take it (an online worker without the job's tag).
#[test]
fn a_task_failed_on_the_only_capable_worker_goes_back_to_it() {
    let f = fixture();
    let mut s = submission(f.scene, "1", "");
    s.scene_info = None;
    s.tags = vec!["big-memory".into()];
    let job = f.farm.submit(s).unwrap();
    let a = f
        .farm
        .register(Registration {
            blender_version: "Blender 3.4.1".into(),
            name: "a".into(),
            slots: 1,
            tags: vec!["big-memory".into()],
            ..Default::default()
        })
        .unwrap()
        .0;
    let _b = worker(&f.farm, "b");
    let l = f.farm.try_lease(&a, &HashSet::new()).unwrap().unwrap();
    let out = f
        .farm
        .fail(l.lease, "Blender crashed", "", FailureScope::Transient)
        .unwrap();
    assert_eq!(out, FailOutcome::Retry);
    assert!(
        f.farm.try_lease(&a, &HashSet::new()).unwrap().is_some(),
        "the task waits for b, which cannot take it: {:?}",
        f.farm.job(job).unwrap().waiting
    );
}
