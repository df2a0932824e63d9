//! Workers and users stay in their lanes: worker ids and leases bound to the
//! token that registered them, blobs possessed by proof and read by reference.

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

const SCENE: &[u8] = b"BLENDER-v304 scene ... ENDB\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0";

fn config() -> Config {
    Config {
        lease_ttl_ms: 1000,
        max_frames: 1000,
        max_workers_per_token: 2,
        max_slots: 4,
        ..Config::default()
    }
}

/// A farm where alice has uploaded the scene.
fn fixture() -> Fixture {
    let clock = Arc::new(ManualClock::at(1_000_000));
    let store = Arc::new(MemoryStore::default());
    let blobs = Arc::new(MemoryBlobStore::default());
    let farm = Farm::open(store.clone(), blobs.clone(), clock.clone(), config()).unwrap();
    let scene = upload(&farm, &blobs, &user("alice"), SCENE);
    Fixture {
        farm,
        clock,
        store,
        blobs,
        scene,
    }
}

fn ident(name: &str, role: Role) -> Identity {
    Identity {
        name: name.into(),
        role,
    }
}

fn user(name: &str) -> Identity {
    ident(name, Role::User)
}

fn worker_token(name: &str) -> Identity {
    ident(name, Role::Worker)
}

/// Uploads `bytes` as `who` would over gRPC: stored, re-hashed, granted.
fn upload(farm: &Farm, blobs: &MemoryBlobStore, who: &Identity, bytes: &[u8]) -> Digest {
    let d = Digest::of(bytes);
    let stored_before = blobs.put(d, bytes).unwrap();
    farm.record_upload(who, d, stored_before).unwrap();
    d
}

fn register(farm: &Farm, owner: &str, previous: Option<&WorkerId>) -> Result<WorkerId, Error> {
    farm.register(Registration {
        blender_version: "Blender 3.4.1".into(),
        name: owner.into(),
        slots: 1,
        previous: previous.cloned(),
        owner: owner.into(),
        ..Default::default()
    })
    .map(|(id, _)| id)
}

fn submit(f: &Fixture, owner: &str, frames: &str) -> JobId {
    f.farm
        .submit(Submission {
            after: Vec::new(),
            max_cost: None,
            capacity: Default::default(),
            scene: f.scene,
            scene_name: "s.blend".into(),
            frames: frames.into(),
            chunk: 1,
            priority: 0,
            max_attempts: 0,
            tiles: String::new(),
            overscan: None,
            scene_info: None,
            device: String::new(),
            min_vram_gb: 0.0,
            tags: Vec::new(),
            owner: owner.into(),
            file_set: None,
            features: Vec::new(),
            blender: String::new(),
            preview: false,
            verify: 0.0,
        })
        .unwrap()
}

fn denied(r: Result<(), Error>, naming: &str) {
    match r {
        Err(Error::PermissionDenied(m)) => assert!(m.contains(naming), "{m}"),
        other => panic!("expected permission denied naming {naming}, got {other:?}"),
    }
}

#[test]
fn a_worker_token_acts_only_for_its_own_workers_and_leases() {
    let f = fixture();
    let (ours, theirs) = (worker_token("render-01"), worker_token("render-02"));
    let w1 = register(&f.farm, "render-01", None).unwrap();
    let w2 = register(&f.farm, "render-02", None).unwrap();
    submit(&f, "alice", "1-3");

    // Lease and Telemetry name a worker id.
    f.farm.check_worker(&ours, &w1).unwrap();
    denied(f.farm.check_worker(&theirs, &w1), &format!("worker {w1}"));
    // An unknown id passes the check; the call itself says "register again".
    f.farm
        .check_worker(&theirs, &WorkerId("w99".into()))
        .unwrap();

    // Progress, Complete, Fail and Release name a lease: checked against
    // the worker it was granted to.
    let a = f.farm.try_lease(&w1, &HashSet::new()).unwrap().unwrap();
    f.farm.check_lease(&ours, a.lease).unwrap();
    denied(
        f.farm.check_lease(&theirs, a.lease),
        &format!("worker {w1}"),
    );
    // Guessed ids give nothing: the next grant, another task, another job.
    for guess in [
        LeaseId {
            grant: a.lease.grant + 1,
            ..a.lease
        },
        LeaseId {
            task: a.lease.task + 1,
            ..a.lease
        },
        LeaseId {
            job: JobId(99),
            ..a.lease
        },
    ] {
        denied(f.farm.check_lease(&ours, guess), "not granted");
        denied(f.farm.check_lease(&theirs, guess), "not granted");
    }

    // The lease expires and goes to render-02's worker: the first holder may
    // still report its older grant (the first result wins), but neither token
    // may report the other's grant.
    f.clock.advance(1500);
    f.farm.expire_leases().unwrap();
    let b = f.farm.try_lease(&w2, &HashSet::new()).unwrap().unwrap();
    assert_eq!(b.lease.task, a.lease.task);
    f.farm.check_lease(&ours, a.lease).unwrap();
    denied(
        f.farm.check_lease(&theirs, a.lease),
        &format!("worker {w1}"),
    );
    f.farm.check_lease(&theirs, b.lease).unwrap();
    denied(f.farm.check_lease(&ours, b.lease), &format!("worker {w2}"));

    // A registration naming another token's worker gets a fresh id.
    let taken = register(&f.farm, "render-02", Some(&w1)).unwrap();
    assert_ne!(taken, w1);
    assert_eq!(
        f.farm
            .workers()
            .iter()
            .find(|w| w.record.id == w1)
            .unwrap()
            .record
            .owner,
        "render-01"
    );
    // Its own token takes it up again.
    assert_eq!(register(&f.farm, "render-01", Some(&w1)).unwrap(), w1);
    // A worker registered before workers had owners is told to register
    // again, and then gets an id of its own.
    let legacy = register(&f.farm, "", None).unwrap();
    let err = f.farm.check_worker(&ours, &legacy).unwrap_err();
    assert!(matches!(err, Error::NotFound(_)), "{err}");
    assert_ne!(
        register(&f.farm, "render-01", Some(&legacy)).unwrap(),
        legacy
    );
}

#[test]
fn outputs_must_be_blobs_the_reporting_token_uploaded() {
    let f = fixture();
    let ours = worker_token("render-01");
    let w = register(&f.farm, "render-01", None).unwrap();
    submit(&f, "bob", "1");
    let a = f.farm.try_lease(&w, &HashSet::new()).unwrap().unwrap();
    // Alice's scene, stored but never uploaded by this worker, cannot become
    // bob's frame (bob could then read it).
    let stolen = FrameOutput {
        frame: 1,
        digest: f.scene,
        ext: "png".into(),
        size: SCENE.len() as u64,
        pass: String::new(),
    };
    let err = f
        .farm
        .check_complete(&ours, a.lease, std::slice::from_ref(&stolen))
        .unwrap_err();
    assert!(
        err.to_string().contains("did not upload; upload it"),
        "{err}"
    );
    upload(&f.farm, &f.blobs, &ours, SCENE);
    f.farm.check_complete(&ours, a.lease, &[stolen]).unwrap();
}

#[test]
fn registrations_and_slots_are_capped_per_token() {
    let f = fixture();
    let err = f
        .farm
        .register(Registration {
            blender_version: "Blender 3.4.1".into(),
            slots: 5,
            owner: "render-01".into(),
            ..Default::default()
        })
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("5 slots, over the limit of 4 (--max-slots)"),
        "{err}"
    );
    let a = register(&f.farm, "render-01", None).unwrap();
    register(&f.farm, "render-01", None).unwrap();
    let err = register(&f.farm, "render-01", None).unwrap_err();
    assert!(
        err.to_string()
            .contains("already has 2 workers online, the limit (--max-workers-per-token 2)"),
        "{err}"
    );
    // Coming back under its own id is not a new worker; other tokens have
    // their own allowance; workers gone offline no longer count.
    assert_eq!(register(&f.farm, "render-01", Some(&a)).unwrap(), a);
    register(&f.farm, "render-02", None).unwrap();
    f.clock.advance(2001);
    register(&f.farm, "render-01", None).unwrap();
    assert!(f.farm.workers().len() <= 4);
}

#[test]
fn users_read_what_they_uploaded_or_their_jobs_use() {
    let f = fixture();
    let (alice, bob, admin) = (user("alice"), user("bob"), ident("admin", Role::Admin));
    f.farm.check_read(&alice, &f.scene).unwrap();
    f.farm.check_read(&admin, &f.scene).unwrap();
    let err = f.farm.check_read(&bob, &f.scene).unwrap_err();
    // The same answer as for a blob that does not exist.
    assert!(
        matches!(&err, Error::NotFound(m) if *m == format!("blob {}", f.scene)),
        "{err}"
    );

    // Alice's job's frames are hers to read, and not bob's.
    let job = submit(&f, "alice", "1");
    let token = worker_token("render-01");
    let w = register(&f.farm, "render-01", None).unwrap();
    let a = f.farm.try_lease(&w, &HashSet::new()).unwrap().unwrap();
    let frame = upload(&f.farm, &f.blobs, &token, b"frame 1 png");
    let out = FrameOutput {
        frame: 1,
        digest: frame,
        ext: "png".into(),
        size: 11,
        pass: String::new(),
    };
    f.farm
        .check_complete(&token, a.lease, std::slice::from_ref(&out))
        .unwrap();
    f.farm.complete(a.lease, vec![out]).unwrap();
    assert_eq!(f.farm.job(job).unwrap().job.state, JobState::Done);
    f.farm.check_read(&alice, &frame).unwrap();
    assert!(f.farm.check_read(&bob, &frame).is_err());
    // A worker reads no frame: frames are written, not read.
    assert!(f.farm.check_read(&token, &frame).is_err());
}

#[test]
fn a_worker_reads_a_scene_only_while_it_holds_a_lease_of_its_job() {
    let f = fixture();
    let (ours, theirs) = (worker_token("render-01"), worker_token("render-02"));
    let w = register(&f.farm, "render-01", None).unwrap();
    register(&f.farm, "render-02", None).unwrap();
    assert!(f.farm.check_read(&ours, &f.scene).is_err(), "no job yet");
    submit(&f, "alice", "1");
    assert!(f.farm.check_read(&ours, &f.scene).is_err(), "no lease yet");
    let a = f.farm.try_lease(&w, &HashSet::new()).unwrap().unwrap();
    f.farm.check_read(&ours, &f.scene).unwrap();
    assert!(
        f.farm.check_read(&theirs, &f.scene).is_err(),
        "another token's worker holds the lease"
    );
    f.farm.release(a.lease, false).unwrap();
    assert!(f.farm.check_read(&ours, &f.scene).is_err(), "released");
}

#[test]
fn missing_blobs_reveals_nothing_and_uploads_prove_possession() {
    let f = fixture();
    let (alice, bob) = (user("alice"), user("bob"));
    let absent = Digest::of(b"never uploaded");
    assert_eq!(f.farm.missing_for(&alice, &[f.scene, absent]), vec![absent]);
    // Bob is told alice's scene is missing, like any blob he never had.
    assert_eq!(f.farm.missing_for(&bob, &[f.scene]), vec![f.scene]);
    let sub = |owner: &Identity| Submission {
        after: Vec::new(),
        max_cost: None,
        capacity: Default::default(),
        scene: f.scene,
        scene_name: "s.blend".into(),
        frames: "1".into(),
        chunk: 1,
        priority: 0,
        max_attempts: 0,
        tiles: String::new(),
        overscan: None,
        scene_info: None,
        device: String::new(),
        min_vram_gb: 0.0,
        tags: Vec::new(),
        owner: owner.name.clone(),
        file_set: None,
        features: Vec::new(),
        blender: String::new(),
        preview: false,
        verify: 0.0,
    };
    let refused = f.farm.check_submission(&bob, &sub(&bob)).unwrap_err();
    let never = Submission {
        after: Vec::new(),
        max_cost: None,
        capacity: Default::default(),
        scene: absent,
        ..sub(&bob)
    };
    let absent_err = f.farm.check_submission(&bob, &never).unwrap_err();
    assert_eq!(
        refused.to_string().replace(&f.scene.to_hex(), "D"),
        absent_err.to_string().replace(&absent.to_hex(), "D"),
        "another user's scene looks like one never uploaded"
    );
    assert!(refused.to_string().contains("has not been uploaded by you"));
    // Bob uploads the same bytes: stored once, and he is not told that
    // someone else had them.
    let d = Digest::of(SCENE);
    let stored_before = f.blobs.put(d, SCENE).unwrap();
    assert!(stored_before, "the bytes are stored once");
    assert!(!f.farm.record_upload(&bob, d, stored_before).unwrap());
    assert!(f.farm.missing_for(&bob, &[f.scene]).is_empty());
    f.farm.check_submission(&bob, &sub(&bob)).unwrap();
    f.farm.check_read(&bob, &f.scene).unwrap();
    // Uploading again is "already present" for him now.
    assert!(f.farm.record_upload(&bob, d, true).unwrap());

    // Possession is durable.
    let again = Farm::open(f.store.clone(), f.blobs.clone(), f.clock.clone(), config()).unwrap();
    assert!(again.missing_for(&bob, &[f.scene]).is_empty());
    assert_eq!(again.missing_for(&user("carol"), &[f.scene]), vec![f.scene]);
}

/// A file set of `files` (path, bytes) whose scene is `s.blend` = [`SCENE`].
fn file_set(files: &[(&str, &[u8])]) -> Vec<u8> {
    use prost::Message;
    let entry = |path: &str, bytes: &[u8]| tessera_proto::FileEntry {
        path: path.into(),
        digest: Digest::of(bytes).to_hex(),
        size: bytes.len() as u64,
        mode: 0o644,
        shared: String::new(),
    };
    tessera_proto::FileSet {
        scene: "s.blend".into(),
        files: std::iter::once(entry("s.blend", SCENE))
            .chain(files.iter().map(|(p, b)| entry(p, b)))
            .collect(),
        ..Default::default()
    }
    .encode_to_vec()
}

#[test]
fn a_job_names_only_file_sets_and_files_its_submitter_uploaded() {
    let f = fixture();
    let (alice, bob) = (user("alice"), user("bob"));
    let texture = upload(&f.farm, &f.blobs, &alice, b"wood texture");
    let set = upload(
        &f.farm,
        &f.blobs,
        &alice,
        &file_set(&[("tex/wood.png", b"wood texture")]),
    );
    let sub = |owner: &Identity, set: Digest| Submission {
        after: Vec::new(),
        max_cost: None,
        capacity: Default::default(),
        scene: f.scene,
        scene_name: "s.blend".into(),
        frames: "1".into(),
        chunk: 1,
        priority: 0,
        max_attempts: 0,
        tiles: String::new(),
        overscan: None,
        scene_info: None,
        device: String::new(),
        min_vram_gb: 0.0,
        tags: Vec::new(),
        owner: owner.name.clone(),
        file_set: Some(set),
        features: Vec::new(),
        blender: String::new(),
        preview: false,
        verify: 0.0,
    };
    f.farm.check_submission(&alice, &sub(&alice, set)).unwrap();
    // Bob holds the scene (he uploaded it too) but not alice's file set...
    upload(&f.farm, &f.blobs, &bob, SCENE);
    let err = f.farm.check_submission(&bob, &sub(&bob, set)).unwrap_err();
    assert!(
        err.to_string()
            .starts_with(&format!("file set {set} has not been uploaded by you;")),
        "{err}"
    );
    // ...nor, in a set of his own, her texture.
    let his = upload(
        &f.farm,
        &f.blobs,
        &bob,
        &file_set(&[("textures/wood.png", b"wood texture")]),
    );
    assert_ne!(his, set);
    let err = f.farm.check_submission(&bob, &sub(&bob, his)).unwrap_err();
    assert!(
        err.to_string()
            .contains("names files that were not uploaded by you (textures/wood.png)"),
        "{err}"
    );
    upload(&f.farm, &f.blobs, &bob, b"wood texture");
    f.farm.check_submission(&bob, &sub(&bob, his)).unwrap();

    // A worker reads the set and its files only while it holds a lease of the job.
    let job = f.farm.submit(sub(&alice, set)).unwrap();
    let (ours, theirs) = (worker_token("render-01"), worker_token("render-02"));
    let w = register(&f.farm, "render-01", None).unwrap();
    for d in [set, texture, f.scene] {
        assert!(f.farm.check_read(&ours, &d).is_err(), "no lease yet");
    }
    let a = f.farm.try_lease(&w, &HashSet::new()).unwrap().unwrap();
    assert_eq!(a.lease.job, job);
    for d in [set, texture, f.scene] {
        f.farm.check_read(&ours, &d).unwrap();
        assert!(f.farm.check_read(&theirs, &d).is_err());
    }
    assert!(f.farm.check_read(&ours, &Digest::of(b"other")).is_err());
    // Alice reads her job's files; bob only those he uploaded.
    f.farm.check_read(&alice, &texture).unwrap();
    f.farm.check_read(&bob, &texture).unwrap();
    assert!(f.farm.check_read(&bob, &set).is_err());

    // Deleted, the job takes its file set's lists (which can hold a million
    // entries) out of memory with it. (A miss fills alice's cache.)
    assert!(f.farm.check_read(&alice, &Digest::of(b"not hers")).is_err());
    {
        let st = f.farm.lock();
        assert!(st.file_sets.contains_key(&set));
        assert!(st.access.sorted_files.contains_key(&set));
        assert!(st.access.referenced.contains_key("alice"));
    }
    f.farm.cancel(job).unwrap();
    f.farm.delete(job).unwrap();
    let st = f.farm.lock();
    assert!(
        st.file_sets.is_empty(),
        "the deleted job's file set is kept"
    );
    assert!(
        st.access.sorted_files.is_empty(),
        "its sorted entries are kept"
    );
    assert!(
        !st.access.referenced.contains_key("alice"),
        "its owner's referenced blobs are kept"
    );
}

#[test]
fn a_scene_over_the_pixel_limit_is_refused_at_submit() {
    let f = fixture();
    let alice = user("alice");
    let mut s = Submission {
        after: Vec::new(),
        max_cost: None,
        capacity: Default::default(),
        scene: f.scene,
        scene_name: "s.blend".into(),
        frames: "1".into(),
        chunk: 1,
        priority: 0,
        max_attempts: 0,
        tiles: "2x2".into(),
        overscan: None,
        scene_info: Some(SceneInfo {
            width: 20000,
            height: 20000,
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
    };
    let err = f.farm.check_submission(&alice, &s).unwrap_err();
    assert!(
        err.to_string().contains(
            "20000x20000 pixels, over the coordinator's limit of 16384x16384 (--max-pixels)"
        ),
        "{err}"
    );
    s.scene_info = Some(SceneInfo {
        width: 16384,
        height: 16384,
        file_format: "PNG".into(),
        fps: 0.0,
    });
    f.farm.check_submission(&alice, &s).unwrap();
}

#[test]
fn issued_tokens_replace_the_old_one() {
    let f = fixture();
    let first = f.farm.issue_token("local", Role::Admin).unwrap();
    assert_eq!(f.farm.authenticate(Some(&first)).unwrap().name, "local");
    let second = f.farm.issue_token("local", Role::Admin).unwrap();
    assert_ne!(first, second);
    assert!(f.farm.authenticate(Some(&first)).is_err());
    assert!(f.farm.authenticate(Some(&second)).unwrap().is_admin());
}

#[test]
fn holders_of_finished_tasks_are_forgotten() {
    let f = fixture();
    let token = worker_token("render-01");
    let w = register(&f.farm, "render-01", None).unwrap();
    for _ in 0..5 {
        submit(&f, "alice", "1-900");
    }
    let d = upload(&f.farm, &f.blobs, &token, b"a frame");
    for _ in 0..=HOLDERS_BEFORE_PRUNING {
        let a = f.farm.try_lease(&w, &HashSet::new()).unwrap().unwrap();
        let out = FrameOutput {
            frame: a.frames[0],
            digest: d,
            ext: "png".into(),
            size: 7,
            pass: String::new(),
        };
        f.farm
            .check_complete(&token, a.lease, std::slice::from_ref(&out))
            .unwrap();
        f.farm.complete(a.lease, vec![out]).unwrap();
    }
    let last = f.farm.try_lease(&w, &HashSet::new()).unwrap().unwrap();
    let st = f.farm.lock();
    assert!(
        st.access.holders.len() < 10,
        "{} holders kept",
        st.access.holders.len()
    );
    assert_eq!(st.access.holders.get(&last.lease), Some(&w));
}

/// Checks a result as the gRPC handler does, then records it.
fn report(
    farm: &Farm,
    who: &Identity,
    lease: LeaseId,
    out: &FrameOutput,
) -> Result<Completion, Error> {
    farm.check_complete(who, lease, std::slice::from_ref(out))?;
    farm.complete(lease, vec![out.clone()])
}

fn conflict<T: std::fmt::Debug>(r: Result<T, Error>, naming: &str) {
    match r {
        Err(Error::Conflict(m)) => assert!(m.contains(naming), "{m}"),
        other => panic!("expected a conflict naming {naming}, got {other:?}"),
    }
}

#[test]
fn a_stale_lease_is_told_the_true_reason_after_a_failover_too() {
    let f = fixture();
    let (ours, theirs) = (worker_token("render-01"), worker_token("render-02"));
    let w1 = register(&f.farm, "render-01", None).unwrap();
    let w2 = register(&f.farm, "render-02", None).unwrap();
    let frame = upload(&f.farm, &f.blobs, &ours, b"frame one");
    let out = FrameOutput {
        frame: 1,
        digest: frame,
        ext: "png".into(),
        size: 9,
        pass: String::new(),
    };
    let none = HashSet::new();
    // One job is cancelled while render-01 renders it; one lease is current.
    let c = submit(&f, "alice", "1");
    let cancelled = f.farm.try_lease(&w1, &none).unwrap().unwrap().lease;
    assert_eq!(cancelled.job, c);
    f.farm.cancel(c).unwrap();
    submit(&f, "alice", "1");
    let current = f.farm.try_lease(&w1, &none).unwrap().unwrap().lease;
    // Two leases expire; render-02 takes one task again, the other waits.
    submit(&f, "alice", "1");
    submit(&f, "alice", "1");
    let x = f.farm.try_lease(&w1, &none).unwrap().unwrap();
    let y = f.farm.try_lease(&w1, &none).unwrap().unwrap();
    f.clock.advance(1500);
    assert!(f.farm.progress(current, 0, (0, 0)));
    f.farm.expire_leases().unwrap();
    let again = f.farm.try_lease(&w2, &none).unwrap().unwrap();
    let (served_again, queued) = if again.lease.job == x.lease.job {
        (x.lease, y.lease)
    } else {
        (y.lease, x.lease)
    };
    assert_eq!(again.lease.task, served_again.task);

    // A new active coordinator opens the same store: no holders in memory.
    let b = Farm::open(f.store.clone(), f.blobs.clone(), f.clock.clone(), config()).unwrap();
    assert!(b.lock().access.holders.is_empty());
    // The current grant's result is accepted from its holder's token only.
    denied(b.check_lease(&theirs, current), &format!("worker {w1}"));
    assert_eq!(
        report(&b, &ours, current, &out).unwrap(),
        Completion::Recorded
    );
    // A late duplicate is accepted as one.
    assert_eq!(
        report(&b, &ours, current, &out).unwrap(),
        Completion::Duplicate
    );
    // The cancelled job's report says so.
    conflict(
        report(&b, &ours, cancelled, &out),
        &format!("job {c} was cancelled"),
    );
    assert!(
        b.why_stale(cancelled).contains("was cancelled"),
        "{}",
        b.why_stale(cancelled)
    );
    // An expired lease: renewals stop with the reason, a failure is refused
    // with it; the first result of an older grant is still taken.
    assert!(!b.progress(served_again, 0, (0, 0)));
    let why = b.why_stale(served_again);
    assert!(
        why.contains("expired") && why.contains("served again (grant 2)"),
        "{why}"
    );
    conflict(
        b.fail(served_again, "late", "", FailureScope::Transient),
        "served again",
    );
    conflict(
        b.fail(queued, "late", "", FailureScope::Transient),
        "went back to the queue",
    );
    // Another token still cannot report render-01's ended grant.
    denied(
        b.check_lease(&theirs, served_again),
        &format!("worker {w1}"),
    );
    assert_eq!(
        report(&b, &ours, queued, &out).unwrap(),
        Completion::Recorded
    );
    // With no holder on record at all (attempts trimmed), the reason is
    // given instead of "not granted"; ids never granted are still refused.
    for t in b.lock().tasks.get_mut(&c).unwrap() {
        Arc::make_mut(t).attempts.clear();
    }
    b.lock().access.holders.clear();
    conflict(
        b.check_lease(&theirs, cancelled),
        &format!("job {c} was cancelled"),
    );
    denied(
        b.check_lease(
            &ours,
            LeaseId {
                grant: 2,
                ..cancelled
            },
        ),
        "not granted",
    );
}
