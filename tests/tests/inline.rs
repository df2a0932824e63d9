//! Results carried inside Complete: a small result's bytes travel in
//! `FrameOutput.data` instead of a PutBlob call first. The coordinator
//! stores them byte for byte (durably once acknowledged), refuses bytes that
//! are not what the output claims or are over its limit, and only for a
//! lease's holder, storing nothing then; a real worker sends small frames
//! this way, and larger ones by PutBlob.

use std::path::Path;
use std::time::Duration;

use tessera_proto as pb;
use tessera_tests::load::setup::{put_blob, submit, worker_tokens};
use tessera_tests::load::{blobs, connect, work, Target};
use tessera_tests::*;
use tonic::Code;

/// Asserts a call failed with `code` and a message containing each of `want`.
fn refused<T: std::fmt::Debug>(r: Result<T, tonic::Status>, code: Code, want: &[&str]) {
    let err = r.expect_err("the call should be refused");
    assert_eq!(err.code(), code, "{err:?}");
    for w in want {
        assert!(
            err.message().contains(w),
            "expected `{w}` in: {}",
            err.message()
        );
    }
}

/// A PNG-named output of `frame` whose bytes travel inline.
fn inline(frame: u32, pass: &str, bytes: &[u8]) -> pb::FrameOutput {
    pb::FrameOutput {
        frame,
        digest: blake3::hash(bytes).to_hex().to_string(),
        ext: "png".into(),
        size: bytes.len() as u64,
        pass: pass.into(),
        data: Some(bytes.to_vec()),
    }
}

/// Bytes no other test makes, `len` long.
fn unique(tag: &str, len: usize) -> Vec<u8> {
    let mut b = format!("inline result {tag} {:?}\n", std::time::SystemTime::now()).into_bytes();
    b.resize(len, b'x');
    b
}

/// Whether any file in the blob store under `data` (under its address or
/// waiting in `tmp/`) holds `bytes`, or is named by their digest.
fn stored(data: &Path, bytes: &[u8]) -> bool {
    let d = blake3::hash(bytes).to_hex().to_string();
    let blobs = data.join("blobs");
    if blobs.join(&d[..2]).join(&d[2..]).exists() {
        return true;
    }
    std::fs::read_dir(blobs.join("tmp"))
        .into_iter()
        .flatten()
        .any(|e| std::fs::read(e.unwrap().path()).is_ok_and(|b| b == bytes))
}

/// One CPU slot's registration as `name`.
fn info(name: &str) -> pb::WorkerInfo {
    pb::WorkerInfo {
        name: name.into(),
        slots: 1,
        device: "cpu".into(),
        blender_version: "Blender 3.4.1".into(),
        ..Default::default()
    }
}

/// Work clients for two workers with tokens of their own.
fn two_workers(
    rt: &tokio::runtime::Runtime,
    target: &Target,
) -> [pb::work_client::WorkClient<tessera_tests::load::Conn>; 2] {
    let tokens = rt.block_on(worker_tokens(target, 2)).unwrap();
    [0, 1].map(|i| work(connect(&target.url, &tokens[i]).unwrap()))
}

#[test]
fn inline_results_are_stored_exactly_and_bad_ones_store_nothing() {
    let scene = std::fs::read(scene(&["--kind", "still", "--frames", "1"])).unwrap();
    let dir = scratch();
    let data = dir.path().join("data");
    let mut coord = Coordinator::start(&data, "127.0.0.1:0", &[]);
    let target = Target {
        url: coord.url.clone(),
        admin_token: coord.admin_token(),
        metrics: None,
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    // Connections are made lazily, on the runtime.
    let _in_rt = rt.enter();
    let minute = Duration::from_secs(60);
    let [holder, stranger] = two_workers(&rt, &target);
    let (frame, pass, empty) = (unique("frame", 100_000), unique("pass", 3_000), Vec::new());
    let (job, lease, max) = rt.block_on(async {
        let digest = put_blob(&target.url, &target.admin_token, scene)
            .await
            .unwrap();
        let (job, _) = submit(&target, &digest, 1, minute).await.unwrap();
        let registered = holder
            .clone()
            .register(info("holder"))
            .await
            .unwrap()
            .into_inner();
        stranger.clone().register(info("stranger")).await.unwrap();
        assert_eq!(registered.inline_result_max, 256 << 10);
        assert!(registered.inline_complete_max >= registered.inline_result_max);
        let task = holder
            .clone()
            .lease(pb::LeaseRequest {
                worker_id: registered.worker_id,
                wait_ms: 10_000,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .task
            .expect("the job's task");
        (job, task.lease_id, registered.inline_result_max)
    });
    let complete = |client: &pb::work_client::WorkClient<_>, outputs: Vec<pb::FrameOutput>| {
        let mut client = client.clone();
        let lease = lease.clone();
        rt.block_on(async move {
            client
                .complete(pb::CompleteRequest {
                    lease_id: lease,
                    outputs,
                    ..Default::default()
                })
                .await
        })
    };

    // Bytes that do not hash to the claimed digest.
    let mut wrong = inline(1, "", &frame);
    wrong.digest = blake3::hash(b"another frame").to_hex().to_string();
    refused(
        complete(&holder, vec![wrong]),
        Code::InvalidArgument,
        &["frame 1", "not to the claimed digest", "blake3"],
    );
    // Bytes that are not the claimed size.
    let mut short = inline(1, "", &frame);
    short.size += 1;
    refused(
        complete(&holder, vec![short]),
        Code::InvalidArgument,
        &["frame 1", "claims size"],
    );
    // A file over the limit (it should have gone by PutBlob).
    let big = unique("big", max as usize + 1);
    refused(
        complete(&holder, vec![inline(1, "", &big)]),
        Code::InvalidArgument,
        &["frame 1", "PutBlob"],
    );
    // Good bytes from a token that does not hold the lease.
    refused(
        complete(&stranger, vec![inline(1, "", &frame)]),
        Code::PermissionDenied,
        &["not registered with this token"],
    );
    // A good pass beside a bad frame: all or nothing.
    let mut wrong = inline(1, "", &frame);
    wrong.digest = blake3::hash(b"another frame").to_hex().to_string();
    refused(
        complete(&holder, vec![inline(1, "Image0001.png", &pass), wrong]),
        Code::InvalidArgument,
        &["frame 1"],
    );
    for (what, bytes) in [("frame", &frame), ("pass", &pass), ("big", &big)] {
        assert!(!stored(&data, bytes), "a refused {what} was stored");
    }

    // The holder's good result, an empty pass file included: acknowledged,
    // then whole under its address even after a SIGKILL.
    let answer = complete(
        &holder,
        vec![
            inline(1, "", &frame),
            inline(1, "Image0001.png", &pass),
            inline(1, "Empty0001.png", &empty),
        ],
    )
    .unwrap()
    .into_inner();
    assert!(!answer.duplicate);
    coord.proc.kill9();
    let coord = Coordinator::start(&data, &coord.addr, &[]);
    let blobs_dir = data.join("blobs");
    for bytes in [&frame, &pass, &empty] {
        let d = blake3::hash(bytes).to_hex().to_string();
        let on_disk = std::fs::read(blobs_dir.join(&d[..2]).join(&d[2..]));
        assert!(
            matches!(&on_disk, Ok(b) if b == bytes),
            "blob {d} is not whole on disk after the restart\n{}",
            coord.proc.log()
        );
    }
    // The job is done and its frame and passes fetch byte for byte.
    let out = dir.path().join("out");
    cli_ok(
        &coord.url,
        &["fetch", &job.to_string(), "-o", out.to_str().unwrap()],
    );
    assert_eq!(std::fs::read(out.join("frame_0001.png")).unwrap(), frame);
    assert_eq!(
        std::fs::read(out.join("passes/Image0001.png")).unwrap(),
        pass
    );
    assert_eq!(
        std::fs::read(out.join("passes/Empty0001.png")).unwrap(),
        empty
    );
    // And the blob service serves the same bytes.
    let mut blobs = blobs(connect(&coord.url, &target.admin_token).unwrap());
    let served = rt.block_on(async {
        let mut stream = blobs
            .get_blob(pb::GetBlobRequest {
                digest: blake3::hash(&frame).to_hex().to_string(),
            })
            .await
            .unwrap()
            .into_inner();
        let mut got = Vec::new();
        while let Some(chunk) = stream.message().await.unwrap() {
            got.extend_from_slice(&chunk.data);
        }
        got
    });
    assert_eq!(served, frame);
}

#[test]
fn a_worker_sends_small_frames_inline_and_large_ones_by_put_blob() {
    let dir = scratch();
    let small = scene(&["--kind", "anim", "--frames", "3"]);
    // The coordinator's debug log names every blob PutBlob stores (the
    // gRPC adapter) and every result stored inline (the results' sync
    // thread, in the farm's commit module).
    let coord = Coordinator::start_env(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &[],
        &[(
            "RUST_LOG",
            "info,tessera_coordinator::adapters::grpc=debug,tessera_coordinator::farm::txn=debug"
                .to_string(),
        )],
    );
    let w = worker(&coord.url, dir.path(), "a");
    let out = dir.path().join("out");
    submit_wait(&coord.url, &small, "1-3", &out);
    let expected: Vec<String> = (1..=3).map(|f| format!("frame_{f:04}.png")).collect();
    assert_eq!(frames_of(&out), expected);
    let refs = dir.path().join("refs");
    reference(&small, 1, 3, &refs);
    assert_matches_reference(&out, &refs, 1..=3);

    let log = coord.proc.log();
    let uploaded: Vec<&str> = log.lines().filter(|l| l.contains("blob stored")).collect();
    assert!(
        !uploaded.is_empty(),
        "the scene's PutBlob is not in the coordinator's debug log:\n{log}"
    );
    for f in 1..=3 {
        let bytes = std::fs::read(out.join(format!("frame_{f:04}.png"))).unwrap();
        assert!(
            bytes.len() <= 256 << 10,
            "frame {f} is too big to go inline"
        );
        let d = blake3::hash(&bytes).to_hex().to_string();
        assert!(
            log.lines()
                .any(|l| l.contains(&format!("frame {f} stored inline")) && l.contains(&d)),
            "frame {f} ({d}) was not stored inline:\n{log}\nworker:\n{}",
            w.log()
        );
        assert!(
            !uploaded.iter().any(|l| l.contains(&d)),
            "frame {f} ({d}) was uploaded with PutBlob:\n{log}"
        );
    }

    // A frame over the limit goes by PutBlob, as before.
    let large = scene(&[
        "--kind", "still", "--frames", "1", "--width", "512", "--height", "384", "--format",
        "PNG16",
    ]);
    let out = dir.path().join("out-large");
    submit_wait(&coord.url, &large, "1", &out);
    let bytes = std::fs::read(out.join("frame_0001.png")).unwrap();
    assert!(
        bytes.len() > 256 << 10,
        "the large frame has only {} bytes; render a larger one",
        bytes.len()
    );
    let d = blake3::hash(&bytes).to_hex().to_string();
    let log = coord.proc.log();
    assert!(
        log.lines()
            .any(|l| l.contains("blob stored") && l.contains(&d)),
        "the large frame ({d}) was not uploaded with PutBlob:\n{log}"
    );
    assert!(
        !log.lines()
            .any(|l| l.contains("stored inline") && l.contains(&d)),
        "the large frame ({d}) went inline:\n{log}"
    );
}

/// A Complete may ask for its slot's next lease (`CompleteRequest.next`):
/// the answer carries the next task, leased as a Lease call would lease it;
/// a request in another worker's name is left out of the answer while the
/// result still counts; a refused Complete grants nothing.
#[test]
fn a_complete_brings_its_slots_next_lease_when_asked() {
    let scene = std::fs::read(scene(&["--kind", "still", "--frames", "1"])).unwrap();
    let dir = scratch();
    let coord = Coordinator::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let target = Target {
        url: coord.url.clone(),
        admin_token: coord.admin_token(),
        metrics: None,
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _in_rt = rt.enter();
    let [client, other] = two_workers(&rt, &target);
    let (job, holder, stranger) = rt.block_on(async {
        let digest = put_blob(&target.url, &target.admin_token, scene)
            .await
            .unwrap();
        let (job, _) = submit(&target, &digest, 4, Duration::from_secs(60))
            .await
            .unwrap();
        let holder = client.clone().register(info("holder")).await.unwrap();
        let stranger = other.clone().register(info("stranger")).await.unwrap();
        (
            job,
            holder.into_inner().worker_id,
            stranger.into_inner().worker_id,
        )
    });
    let next_for = |worker: &str| pb::LeaseRequest {
        worker_id: worker.to_string(),
        slot: 0,
        ..Default::default()
    };
    let complete = |task: &pb::TaskAssignment, bytes: &[u8], next: Option<pb::LeaseRequest>| {
        let mut client = client.clone();
        let req = pb::CompleteRequest {
            lease_id: task.lease_id.clone(),
            outputs: vec![inline(task.frames[0], "", bytes)],
            next,
            ..Default::default()
        };
        rt.block_on(async move { client.complete(req).await })
    };
    let first = rt
        .block_on(client.clone().lease(pb::LeaseRequest {
            wait_ms: 10_000,
            ..next_for(&holder)
        }))
        .unwrap()
        .into_inner()
        .task
        .expect("the job's first task");

    // The result, and the next task in the same answer.
    let answer = complete(&first, &unique("first", 500), Some(next_for(&holder)))
        .unwrap()
        .into_inner();
    assert!(!answer.duplicate);
    let second = answer
        .next
        .expect("an answer to the lease request")
        .task
        .expect("the next task");
    assert_eq!((second.job_id, second.frames.clone()), (job, vec![2]));
    assert_ne!(second.lease_id, first.lease_id);

    // Without `next`, no lease in the answer.
    let third = {
        let answer = complete(&second, &unique("second", 500), None).unwrap();
        assert!(answer.get_ref().next.is_none());
        rt.block_on(client.clone().lease(pb::LeaseRequest {
            wait_ms: 10_000,
            ..next_for(&holder)
        }))
        .unwrap()
        .into_inner()
        .task
        .expect("the third task")
    };

    // A refused result (bytes that are not the claimed digest) leases
    // nothing: the fourth task is still there for a Lease call.
    let mut wrong = inline(3, "", &unique("third", 500));
    wrong.digest = blake3::hash(b"another frame").to_hex().to_string();
    let refused_call = rt.block_on(client.clone().complete(pb::CompleteRequest {
        lease_id: third.lease_id.clone(),
        outputs: vec![wrong],
        next: Some(next_for(&holder)),
        ..Default::default()
    }));
    refused(refused_call, Code::InvalidArgument, &["frame 3"]);

    // A request in another worker's name is left out; the result counts.
    let answer = complete(&third, &unique("third", 500), Some(next_for(&stranger))).unwrap();
    assert!(!answer.get_ref().duplicate);
    assert!(answer.get_ref().next.is_none(), "{answer:?}");
    let fourth = rt
        .block_on(client.clone().lease(pb::LeaseRequest {
            wait_ms: 10_000,
            ..next_for(&holder)
        }))
        .unwrap()
        .into_inner()
        .task
        .expect("the fourth task, not leased by the refused calls");
    assert_eq!(fourth.frames, [4]);

    // The last result asks for a next lease: answered, with no task.
    let answer = complete(&fourth, &unique("fourth", 500), Some(next_for(&holder)))
        .unwrap()
        .into_inner();
    assert_eq!(answer.next.expect("answered").task, None);
    let view = cli_ok(&coord.url, &["status", &job.to_string()]);
    assert!(view.contains("done"), "{view}");
}
