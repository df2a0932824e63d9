//! The corpus cases of "workers and users stay in their lanes", straight to
//! the port: another token's workers and leases, guessed lease ids, blob
//! reads by reference, proof of possession, oversized input, and
//! `tessera render`'s own token.

use super::*;

/// Asserts a call failed with `code` and a message containing `want`.
pub fn refused<T: std::fmt::Debug>(r: Result<T, tonic::Status>, code: tonic::Code, want: &str) {
    let err = r.expect_err(want);
    assert_eq!(err.code(), code, "{want}: {err:?}");
    assert!(
        err.message().contains(want),
        "expected `{want}` in: {}",
        err.message()
    );
}

/// Workers and users stay in their lanes: bad input straight to the port.
/// Returns the number of cases.
pub fn lanes(
    rt: &tokio::runtime::Runtime,
    coord: &Coordinator,
    scene_bytes: &[u8],
    alice: &str,
    bob: &str,
) -> usize {
    use tonic::Code;
    let url = coord.url.clone();
    let r1 = add_user(coord, "render-01", "worker");
    let r2 = add_user(coord, "render-02", "worker");
    let scene = blake3::hash(scene_bytes).to_hex().to_string();
    let mut n = 0;
    let channel = rt.block_on(async {
        tonic::transport::Endpoint::from_shared(url.clone())
            .unwrap()
            .connect()
            .await
            .unwrap()
    });
    let mut work = pb::work_client::WorkClient::new(channel.clone());
    let blobs = pb::blobs_client::BlobsClient::new(channel.clone());
    let mut farm = pb::farm_client::FarmClient::new(channel.clone());
    let info = |slots: u32, tag: &str, previous: &str| pb::WorkerInfo {
        name: "lane".into(),
        slots,
        device: "cpu".into(),
        // A Blender that reads the test's scene (its header says 3.4).
        blender_version: "Blender 3.4.1".into(),
        previous_id: previous.into(),
        tags: vec![tag.to_string()],
        ..Default::default()
    };
    let w1 = rt.block_on(async {
        refused(
            work.register(authed(info(9, "lane", ""), &r1)).await,
            Code::InvalidArgument,
            "9 slots, over the limit of 8 (--max-slots)",
        );
        work.register(authed(info(1, "lane", ""), &r1))
            .await
            .unwrap()
            .into_inner()
            .worker_id
    });
    n += 1;
    // A job with a file set that only render-01's worker can take (the
    // harness's worker lacks the tag).
    let manifest = prost::Message::encode_to_vec(&pb::FileSet {
        scene: "s.blend".into(),
        files: vec![pb::FileEntry {
            path: "s.blend".into(),
            digest: scene.clone(),
            size: scene_bytes.len() as u64,
            mode: 0o644,
            shared: String::new(),
        }],
        ..Default::default()
    });
    let file_set = blake3::hash(&manifest).to_hex().to_string();
    let spec = |frames: String| pb::JobSpec {
        scene_digest: scene.clone(),
        scene_name: "s.blend".into(),
        frames,
        ..Default::default()
    };
    let lane_job = rt.block_on(async {
        let chunk = pb::BlobChunk {
            digest: file_set.clone(),
            size: manifest.len() as u64,
            data: manifest.clone(),
        };
        blobs
            .clone()
            .put_blob(authed(tokio_stream::iter(vec![chunk]), alice))
            .await
            .unwrap();
        let mut lane = spec("1".into());
        lane.tags = vec!["lane".into()];
        lane.file_set_digest = file_set.clone();
        farm.submit_job(authed(lane, alice))
            .await
            .unwrap()
            .into_inner()
            .job_id
    });
    rt.block_on(async {
        let lease_req = |worker: &str| pb::LeaseRequest {
            worker_id: worker.into(),
            wait_ms: 10_000,
            ..Default::default()
        };
        // render-02 may not lease for render-01's worker, nor report for it.
        let not_ours = format!("worker {w1}");
        refused(
            work.lease(authed(lease_req(&w1), &r2)).await,
            Code::PermissionDenied,
            &not_ours,
        );
        refused(
            work.telemetry(authed(
                pb::TelemetryRequest {
                    worker_id: w1.clone(),
                    ..Default::default()
                },
                &r2,
            ))
            .await,
            Code::PermissionDenied,
            &not_ours,
        );
        let task = work
            .lease(authed(lease_req(&w1), &r1))
            .await
            .unwrap()
            .into_inner()
            .task
            .expect("the lane job's task");
        assert_eq!(task.job_id, lane_job);
        let lease = task.lease_id.clone();
        refused(
            work.progress(authed(
                pb::ProgressRequest {
                    lease_id: lease.clone(),
                    ..Default::default()
                },
                &r2,
            ))
            .await,
            Code::PermissionDenied,
            &not_ours,
        );
        let output = |digest: &str| pb::FrameOutput {
            frame: 1,
            digest: digest.into(),
            ext: "png".into(),
            size: 1,
            pass: String::new(),
            data: None,
        };
        refused(
            work.complete(authed(
                pb::CompleteRequest {
                    lease_id: lease.clone(),
                    outputs: vec![output(&scene)],
                    ..Default::default()
                },
                &r2,
            ))
            .await,
            Code::PermissionDenied,
            &not_ours,
        );
        refused(
            work.fail(authed(
                pb::FailRequest {
                    lease_id: lease.clone(),
                    reason: "no".into(),
                    ..Default::default()
                },
                &r2,
            ))
            .await,
            Code::PermissionDenied,
            &not_ours,
        );
        refused(
            work.release(authed(
                pb::ReleaseRequest {
                    lease_id: lease.clone(),
                    preempted: false,
                    reason: String::new(),
                },
                &r2,
            ))
            .await,
            Code::PermissionDenied,
            &not_ours,
        );
        // Guessing `job.task.grant` gives nothing, to either token.
        let (head, grant) = lease.rsplit_once('.').unwrap();
        let guessed = format!("{head}.{}", grant.parse::<u32>().unwrap() + 1);
        for token in [&r1, &r2] {
            refused(
                work.release(authed(
                    pb::ReleaseRequest {
                        lease_id: guessed.clone(),
                        preempted: false,
                        reason: String::new(),
                    },
                    token,
                ))
                .await,
                Code::PermissionDenied,
                "was not granted to a worker registered with this token",
            );
        }
        // The holder cannot name a blob it never uploaded (alice's scene) as its frame.
        refused(
            work.complete(authed(
                pb::CompleteRequest {
                    lease_id: lease.clone(),
                    outputs: vec![output(&scene)],
                    ..Default::default()
                },
                &r1,
            ))
            .await,
            Code::InvalidArgument,
            "which this worker's token did not upload",
        );
        // Registering with render-01's worker as previous id gets a fresh id;
        // then render-02 is at its limit of 2 workers.
        let taken = work
            .register(authed(info(1, "x", &w1), &r2))
            .await
            .unwrap()
            .into_inner()
            .worker_id;
        assert_ne!(taken, w1);
        work.register(authed(info(1, "x", ""), &r2)).await.unwrap();
        refused(
            work.register(authed(info(1, "x", ""), &r2)).await,
            Code::InvalidArgument,
            "(--max-workers-per-token 2)",
        );

        // Blob reads by reference: the lease holder's token reads the scene,
        // another worker token and another user do not, and see "not found".
        let read = |token: &str, digest: &str| {
            let mut blobs = blobs.clone();
            let req = authed(
                pb::GetBlobRequest {
                    digest: digest.to_string(),
                },
                token,
            );
            async move {
                match blobs.get_blob(req).await {
                    Ok(s) => s.into_inner().message().await.map(|m| m.is_some()),
                    Err(e) => Err(e),
                }
            }
        };
        assert!(read(&r1, &scene).await.unwrap());
        refused(read(&r2, &scene).await, Code::NotFound, "not found");
        refused(read(bob, &scene).await, Code::NotFound, "not found");
        // The lane job's file set, too.
        assert_eq!(task.file_set_digest, file_set);
        assert!(read(&r1, &file_set).await.unwrap());
        refused(read(&r2, &file_set).await, Code::NotFound, "not found");
        refused(read(bob, &file_set).await, Code::NotFound, "not found");
        // MissingBlobs does not reveal alice's scene to bob...
        let missing = |token: &str| {
            let mut blobs = blobs.clone();
            let req = authed(
                pb::MissingBlobsRequest {
                    digests: vec![scene.clone()],
                },
                token,
            );
            async move { blobs.missing_blobs(req).await.unwrap().into_inner().missing }
        };
        assert_eq!(missing(bob).await, vec![scene.clone()]);
        // ...nor may bob name it in a job.
        refused(
            farm.submit_job(authed(spec("1".into()), bob)).await,
            Code::InvalidArgument,
            "has not been uploaded by you",
        );
        // Uploading the same bytes proves possession: stored once, and bob
        // is not told that someone else had them.
        let chunk = pb::BlobChunk {
            digest: scene.clone(),
            size: scene_bytes.len() as u64,
            data: scene_bytes.to_vec(),
        };
        let put = blobs
            .clone()
            .put_blob(authed(tokio_stream::iter(vec![chunk]), bob))
            .await
            .unwrap()
            .into_inner();
        assert!(!put.already_present);
        assert!(missing(bob).await.is_empty());
        assert!(read(bob, &scene).await.unwrap());
        // Holding the scene, bob still may not name alice's file set.
        let mut theirs = spec("1".into());
        theirs.file_set_digest = file_set.clone();
        refused(
            farm.submit_job(authed(theirs, bob)).await,
            Code::InvalidArgument,
            &format!("file set {file_set} has not been uploaded by you"),
        );

        // 4 MiB of overlapping ranges is refused at once.
        let part = "1-50000,";
        let huge = part.repeat(((4 << 20) - 4096) / part.len());
        let started = std::time::Instant::now();
        refused(
            farm.submit_job(authed(spec(huge), alice)).await,
            Code::InvalidArgument,
            "over the limit of 1000",
        );
        eprintln!("4 MiB frame set refused in {:?}", started.elapsed());
        // A scene over --max-pixels, whatever the client claims of its tiles.
        let mut big = spec("1".into());
        big.tiles = "2x2".into();
        big.scene_info = Some(pb::SceneInfo {
            width: 5000,
            height: 5000,
            file_format: "PNG".into(),
            ..Default::default()
        });
        refused(
            farm.submit_job(authed(big, alice)).await,
            Code::InvalidArgument,
            "over the coordinator's limit of 4096x4096 (--max-pixels)",
        );
        // The holder gives the task back.
        work.release(authed(
            pb::ReleaseRequest {
                lease_id: lease,
                preempted: false,
                reason: String::new(),
            },
            &r1,
        ))
        .await
        .unwrap();
    });
    n += 26;
    cli_ok(&url, &["cancel", &lane_job.to_string()]);
    n
}

/// `tessera render`'s embedded farm answers nobody without its own token.
/// Returns the number of cases.
pub fn render_refuses_strangers(other_token: &str) -> usize {
    use std::io::BufRead;
    let scene = tiny_scene("anim", 4, 2);
    let dir = scratch();
    let out = dir.path().join("out");
    let mut child = std::process::Command::new(tessera())
        .args(["render", scene.to_str().unwrap(), "--workers", "1", "-o"])
        .arg(&out)
        .env_remove("TESSERA_TOKEN")
        .env_remove("TESSERA_COORDINATOR")
        .env("XDG_CONFIG_HOME", dir.path())
        .env("RUST_LOG", "tessera_coordinator=info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = lines
            .next()
            .expect("tessera render logs where it listens")
            .unwrap();
        if let Some(rest) = line.split("addr=Some(").nth(1) {
            break rest.split(')').next().unwrap().to_string();
        }
    };
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");
    let drain = std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut farm = pb::farm_client::FarmClient::new(channel.clone());
        refused(
            farm.list_jobs(pb::ListJobsRequest::default()).await,
            tonic::Code::Unauthenticated,
            "no token given",
        );
        refused(
            farm.list_jobs(authed(pb::ListJobsRequest::default(), other_token))
                .await,
            tonic::Code::Unauthenticated,
            "the token is not valid",
        );
        let mut work = pb::work_client::WorkClient::new(channel);
        refused(
            work.register(pb::WorkerInfo::default()).await,
            tonic::Code::Unauthenticated,
            "no token given",
        );
    });
    let status = child.wait().unwrap();
    let log = drain.join().unwrap();
    assert!(status.success(), "{}", log.join("\n"));
    assert!(out.join("frame_0001.png").is_file() && out.join("frame_0002.png").is_file());
    3
}
