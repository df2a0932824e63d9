//! Frames you can trust, end to end: a render never "succeeds" with a wrong
//! frame, failures no worker can fix fail the job once with the fix, a
//! render writes only into its task's folder, and Blender never sees the
//! worker's secrets.

use std::path::Path;
use std::time::Duration;

use tessera_tests::fake_coordinator::FakeCoordinator;
use tessera_tests::*;

const LONG: Duration = Duration::from_secs(300);

/// Frame files (`frame_*`) directly in `dir`.
fn frame_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("frame_"))
                .collect()
        })
        .unwrap_or_default()
}

fn denoise_scene() -> std::path::PathBuf {
    scene(&[
        "--kind",
        "fail-driver",
        "--fail-mode",
        "denoise",
        "--frames",
        "1",
    ])
}

const DENOISE_FIX: &str = "turn off denoising";

#[test]
fn a_scene_with_denoising_fails_once_with_the_fix_and_writes_no_frame() {
    let scene = denoise_scene();
    let dir = scratch();
    let coord = Coordinator::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let a = worker(&coord.url, dir.path(), "a");
    let b = worker(&coord.url, dir.path(), "b");
    let out = dir.path().join("out");
    // Read from the scene, denoising makes the job wait for a worker whose
    // Blender has OpenImageDenoise, and says so.
    let waiting = submit(&coord.url, &scene, &["--frames", "1"]);
    let st = wait_for(
        &coord.url,
        waiting,
        Duration::from_secs(60),
        "the reason it waits",
        |s| {
            s["waiting"]
                .as_str()
                .unwrap_or("")
                .contains("a Blender with OpenImageDenoise")
        },
    );
    assert_eq!(st["state"], "queued", "{st:#}");
    cli_ok(&coord.url, &["cancel", &waiting.to_string()]);
    // Submitted without what the scene needs, it reaches a worker, whose
    // Blender fails it once for every worker, in Blender's words.
    let submitted = cli(
        &coord.url,
        &[
            "submit",
            scene.to_str().unwrap(),
            "--frames",
            "1",
            "--ignore-scene-features",
            "-o",
            out.to_str().unwrap(),
        ],
    );
    let stderr = String::from_utf8_lossy(&submitted.stderr);
    assert!(!submitted.status.success(), "submit must fail: {stderr}");
    assert!(stderr.contains(DENOISE_FIX), "{stderr}");
    let job: u64 = String::from_utf8_lossy(&submitted.stdout)
        .trim()
        .parse()
        .unwrap();
    let status = status(&coord.url, job);
    assert_eq!(status["state"], "failed", "{status:#}");
    let message = status["message"].as_str().unwrap();
    assert!(
        message.contains("Build without OpenImageDenoiser")
            && message.contains("built without OpenImageDenoise")
            && message.contains(DENOISE_FIX)
            && message.contains("cannot be rendered anywhere"),
        "Blender's words and the fix: {message}"
    );
    assert_eq!(
        status["tasks"][0]["attempts"], 1,
        "one attempt, not one per worker: {status:#}"
    );
    let human = cli_ok(&coord.url, &["status", &job.to_string()]);
    assert!(human.contains(DENOISE_FIX), "{human}");
    assert!(frame_files(&out).is_empty(), "no frame file is written");
    let tried: usize = [&a, &b]
        .iter()
        .filter(|w| w.log().contains("task started"))
        .count();
    assert_eq!(tried, 1, "a:\n{}\nb:\n{}", a.log(), b.log());

    // The same scene with `tessera render`, the embedded farm: its only
    // workers lack the denoiser, so it refuses before rendering anything.
    let local = dir.path().join("local");
    let out = std::process::Command::new(tessera())
        .args(["render", scene.to_str().unwrap(), "--frames", "1"])
        .args(["--workers", "1", "-o", local.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(DENOISE_FIX) && stderr.contains("lacks OpenImageDenoise"),
        "{stderr}"
    );
    assert!(frame_files(&local).is_empty(), "no frame file is written");
}

#[test]
fn a_render_that_fails_once_is_retried_in_a_fresh_blender_and_is_exact() {
    let scene = scene(&["--kind", "anim", "--frames", "3", "--samples", "8"]);
    let dir = scratch();
    let coord = Coordinator::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    // The first session of the slot fails every render it is given, as a
    // GPU driver whose context is lost would: only a fresh Blender succeeds.
    let w = worker_with(
        &coord.url,
        dir.path(),
        "a",
        &["--slots", "1", "--device", "cpu", "--fail-first-render"],
    );
    let out = dir.path().join("out");
    cli_ok(
        &coord.url,
        &[
            "submit",
            scene.to_str().unwrap(),
            "--frames",
            "2",
            "--max-attempts",
            "3",
            "--wait",
            "-o",
            out.to_str().unwrap(),
        ],
    );
    let log = w.log();
    let started = pids_in_log(&log, "Blender session started");
    assert_eq!(started.len(), 2, "a second, fresh Blender:\n{log}");
    assert_ne!(started[0], started[1]);
    assert!(
        log.contains(
            "ending Blender session: its render failed, and a failed session is never reused"
        ),
        "{log}"
    );
    assert!(log.contains("scope=transient"), "{log}");
    let job = status(&coord.url, 1);
    assert_eq!(job["tasks"][0]["attempts"], 1, "{job:#}");
    let refs = dir.path().join("refs");
    reference(&scene, 2, 2, &refs);
    assert_same_pixels(&out.join("frame_0002.png"), &refs.join("ref_0002.png"));
}

#[test]
fn file_output_nodes_write_into_the_task_folder_and_arrive_as_passes() {
    let dir = scratch();
    let outside = dir.path().join("outside");
    let scene = scene(&[
        "--kind",
        "anim",
        "--frames",
        "2",
        "--file-output",
        outside.to_str().unwrap(),
    ]);
    let coord = Coordinator::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let _w = worker(&coord.url, dir.path(), "a");
    let out = dir.path().join("out");
    cli_ok(
        &coord.url,
        &[
            "submit",
            scene.to_str().unwrap(),
            "--frames",
            "1-2",
            "--wait",
            "-o",
            out.to_str().unwrap(),
        ],
    );
    let tiled = dir.path().join("tiled");
    cli_ok(
        &coord.url,
        &[
            "submit",
            scene.to_str().unwrap(),
            "--frames",
            "1",
            "--tiles",
            "2x1",
            "--wait",
            "-o",
            tiled.to_str().unwrap(),
        ],
    );
    assert!(
        !outside.exists(),
        "nothing is written where the scene's File Output node points"
    );
    assert!(!tiled.join("passes").exists(), "tiled jobs keep no passes");
    let fetched = dir.path().join("fetched");
    cli_ok(&coord.url, &["fetch", "1", "-o", fetched.to_str().unwrap()]);

    // A plain render writes the passes where the node points: compare.
    let refs = dir.path().join("refs");
    reference(&scene, 1, 2, &refs);
    for n in 1..=2 {
        let frame = format!("frame_{n:04}.png");
        assert_same_pixels(&out.join(&frame), &refs.join(format!("ref_{n:04}.png")));
        assert_same_pixels(&fetched.join(&frame), &out.join(&frame));
        for pass in [format!("Image{n:04}.png"), format!("aov/alpha_{n:04}.png")] {
            let got = out.join("passes/File Output").join(&pass);
            assert!(got.is_file(), "{} is missing", got.display());
            assert_same_pixels(&got, &outside.join(&pass));
            assert_same_pixels(&fetched.join("passes/File Output").join(&pass), &got);
        }
    }
    assert_same_pixels(&tiled.join("frame_0001.png"), &refs.join("ref_0001.png"));
    let job = status(&coord.url, 1);
    assert_eq!(job["frames_done"], 2, "passes are not frames: {job:#}");
}

#[test]
fn a_texture_outside_the_job_is_not_read_and_fails_the_job_naming_it() {
    let dir = scratch();
    let texture = dir.path().join("assets/wood.png");
    std::fs::create_dir_all(texture.parent().unwrap()).unwrap();
    // Any readable file will do: Blender would happily render it.
    std::fs::copy(root().join("blender/README.md"), &texture).unwrap();
    let scene = scene(&[
        "--kind",
        "still",
        "--frames",
        "1",
        "--external-texture",
        texture.to_str().unwrap(),
    ]);
    let coord = Coordinator::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let _w = worker(&coord.url, dir.path(), "a");
    // The texture is not there when the job is submitted (so it is not in
    // the job's file set), but it is on the worker's disk when it renders.
    let away = texture.with_extension("away");
    std::fs::rename(&texture, &away).unwrap();
    let job = submit(&coord.url, &scene, &["--frames", "1", "--allow-missing"]);
    std::fs::rename(&away, &texture).unwrap();
    let failed = wait_for(&coord.url, job, LONG, "the job to end", |j| {
        j["state"] == "failed" || j["state"] == "done"
    });
    assert_eq!(failed["state"], "failed", "{failed:#}");
    let message = failed["message"].as_str().unwrap();
    assert!(
        message.contains(texture.to_str().unwrap())
            && message.contains("outside the job")
            && message.contains("submit again")
            && message.contains("cannot be rendered anywhere"),
        "{message}"
    );
    assert_eq!(failed["tasks"][0]["attempts"], 1, "{failed:#}");
}

#[test]
fn blender_runs_without_autoexec_and_without_the_workers_secrets() {
    let scene = scene(&[
        "--kind",
        "anim",
        "--width",
        "160",
        "--height",
        "120",
        "--samples",
        "64",
        "--frames",
        "40",
    ]);
    let dir = scratch();
    let coord = Coordinator::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let token = worker_token(&coord.url);
    let token_file = dir.path().join("worker.token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let w = worker_env(
        &coord.url,
        dir.path(),
        "a",
        &["--token-file", token_file.to_str().unwrap()],
        &[
            ("TESSERA_COORDINATOR", coord.url.as_str()),
            ("AWS_SECRET_ACCESS_KEY", "hunter2-aws"),
        ],
    );
    let job = submit(&coord.url, &scene, &["--frames", "1-40"]);
    assert!(
        eventually(LONG, || !pids_in_log(&w.log(), "Blender session started")
            .is_empty()),
        "a session starts:\n{}",
        w.log()
    );
    let pid = pids_in_log(&w.log(), "Blender session started")[0];
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let environ = String::from_utf8_lossy(&environ).replace('\0', "\n");
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    let worker_cmdline = std::fs::read(format!("/proc/{}/cmdline", w.child.id())).unwrap();
    let worker_cmdline = String::from_utf8_lossy(&worker_cmdline).replace('\0', " ");
    cli_ok(&coord.url, &["cancel", &job.to_string()]);
    assert!(environ.contains("PATH="), "{environ}");
    for secret in [token.as_str(), "TESSERA", "hunter2-aws", &coord.url] {
        assert!(
            !environ.contains(secret) && !cmdline.contains(secret),
            "Blender can see {secret:?}:\n{environ}\n{cmdline}"
        );
    }
    assert!(
        environ.contains("TMPDIR=") && environ.contains("cache-a"),
        "Blender's temporary files stay in the cache: {environ}"
    );
    assert!(
        cmdline.contains("--disable-autoexec") && cmdline.contains("--factory-startup"),
        "{cmdline}"
    );
    assert!(
        !worker_cmdline.contains(&token),
        "the token file keeps the token off the worker's command line: {worker_cmdline}"
    );
}

/// A coordinator that predates `Renew` answers it `UNIMPLEMENTED`: the
/// worker renews each lease with a `Progress` call instead, and the task
/// completes as usual.
#[test]
fn a_worker_renews_each_lease_on_its_own_with_a_coordinator_that_predates_renew() {
    // About 2 s of render on one thread: longer than a renewal period (1 s).
    let scene = scene(&[
        "--kind",
        "still",
        "--frames",
        "1",
        "--width",
        "160",
        "--height",
        "120",
        "--samples",
        "256",
    ]);
    let dir = scratch();
    let fake = FakeCoordinator::start(&scene, &[1], |_| Ok(()));
    let w = worker_env(
        &fake.url,
        dir.path(),
        "a",
        &[],
        &[("TESSERA_TOKEN", "tsr_fake")],
    );
    assert!(
        eventually(LONG, || fake.seen(|s| !s.completes.is_empty())),
        "no Complete:\n{}",
        w.log()
    );
    fake.seen(|s| {
        assert_eq!(s.renews, 1, "Renew is tried once, then left: {s:?}");
        assert!(
            !s.progress.is_empty(),
            "the lease was renewed with Progress: {s:?}"
        );
        assert!(s.progress.iter().all(|l| l == "1.0.1"), "{s:?}");
        assert_eq!(s.completes.len(), 1, "{s:?}");
    });
    let log = w.log();
    assert!(
        log.contains("the coordinator predates renewing leases together"),
        "{log}"
    );
    assert!(!log.contains("cannot renew"), "{log}");
}

#[test]
fn a_result_refused_for_good_is_reported_as_a_failure_everywhere() {
    let scene = scene(&["--kind", "still", "--frames", "1"]);
    let dir = scratch();
    let fake = FakeCoordinator::start(&scene, &[1], |_| {
        Err(tonic::Status::invalid_argument(
            "frame 1 is refused for good by this test",
        ))
    });
    let w = worker_env(
        &fake.url,
        dir.path(),
        "a",
        &[],
        &[("TESSERA_TOKEN", "tsr_fake")],
    );
    assert!(
        eventually(LONG, || fake.seen(|s| !s.fails.is_empty())),
        "no Fail after a refused Complete:\n{}",
        w.log()
    );
    // No second attempt at completing, and the failure says why, for good:
    // the slot has moved on to ask for its next task.
    assert!(
        eventually(LONG, || fake.seen(|s| s.leases_after_fail > 0)),
        "no lease asked for after the Fail:\n{}",
        w.log()
    );
    fake.seen(|s| {
        assert_eq!(s.completes.len(), 1, "{s:?}");
        assert_eq!(s.completes[0].outputs.len(), 1);
        assert_eq!(s.fails.len(), 1, "{s:?}");
        let fail = &s.fails[0];
        assert_eq!(fail.scope, tessera_proto::FailureScope::Everywhere as i32);
        assert!(fail.permanent);
        assert!(
            fail.reason.contains("refused for good by this test"),
            "{}",
            fail.reason
        );
    });
}

#[test]
fn a_result_whose_upload_the_coordinator_lost_is_uploaded_again() {
    // A coordinator that restarted between a PutBlob and the commit that
    // makes it durable has lost the blob: it answers the Complete that
    // names it with NotFound. The worker uploads it again and reports again.
    static COMPLETES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let scene = scene(&["--kind", "still", "--frames", "1"]);
    let dir = scratch();
    let fake = FakeCoordinator::start(&scene, &[1], |req| {
        if COMPLETES.fetch_add(1, std::sync::atomic::Ordering::SeqCst) > 0 {
            return Ok(());
        }
        Err(tonic::Status::not_found(format!(
            "blob {} of frame 1 (it was not uploaded, or was collected); upload it again, then report the result",
            req.outputs[0].digest
        )))
    });
    let w = worker_env(
        &fake.url,
        dir.path(),
        "a",
        &[],
        &[("TESSERA_TOKEN", "tsr_fake")],
    );
    assert!(
        eventually(LONG, || fake.seen(|s| s.completes.len() >= 2)),
        "no second Complete after a lost blob:\n{}",
        w.log()
    );
    fake.seen(|s| {
        let frame = &s.completes[0].outputs[0].digest;
        let uploads = s.puts.iter().filter(|d| *d == frame).count();
        assert_eq!(uploads, 2, "the frame was not uploaded again: {s:?}");
        assert_eq!(s.completes.len(), 2, "{s:?}");
        assert_eq!(&s.completes[1].outputs[0].digest, frame);
        assert_eq!(
            s.completes[1].stats, s.completes[0].stats,
            "the report again is the same report"
        );
        assert!(s.fails.is_empty(), "{s:?}");
    });
    assert!(w.log().contains("uploading it again"), "{}", w.log());
}

/// Runs `blender/session.py` on `scene` with its answers on stderr, sends
/// `commands` and returns the answers (progress events left out).
fn session_answers(scene: &Path, commands: &[serde_json::Value]) -> Vec<serde_json::Value> {
    use std::io::Write;
    let mut child = std::process::Command::new(blender())
        .args(["-b", "--factory-startup", "--disable-autoexec"])
        .arg(scene)
        .args(["--python-exit-code", "3", "--python"])
        .arg(root().join("blender/session.py"))
        .args(["--", "--reply-fd", "2"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    for c in commands {
        writeln!(stdin, "{c}").unwrap();
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.starts_with("{\"event\""))
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["event"] != "progress")
        .collect()
}

#[test]
fn after_a_denoiser_failure_blender_fakes_a_frame_that_shows_no_samples() {
    // What a reused failed session does on Debian's Blender, and what gives
    // it away: the second render "succeeds" with no Cycles sample at all.
    let dir = scratch();
    let render = |id: u32, sub: &str| {
        serde_json::json!({"cmd": "render", "id": id, "frame": 1,
            "output_dir": dir.path().join(sub), "threads": 1, "tile": null})
    };
    let answers = session_answers(&denoise_scene(), &[render(1, "a"), render(2, "b")]);
    assert_eq!(answers[0]["event"], "ready", "{answers:?}");
    assert_eq!(answers[1]["event"], "error", "{answers:?}");
    assert!(answers[1]["error"]
        .as_str()
        .unwrap()
        .contains("Build without OpenImageDenoiser"));
    assert_eq!(
        answers[2]["event"], "done",
        "the bogus success: {answers:?}"
    );
    assert_eq!(answers[2]["counted"], true);
    assert!(answers[2]["samples_done"].is_null(), "{answers:?}");
    // A real render reports its samples, and the size the scene renders.
    let still = scene(&["--kind", "still", "--frames", "1", "--percent", "50"]);
    let answers = session_answers(&still, &[render(1, "c")]);
    assert_eq!(answers[1]["event"], "done", "{answers:?}");
    assert_eq!(answers[1]["samples_done"], 8, "{answers:?}");
    assert_eq!(answers[1]["expected"], serde_json::json!([32, 24]));
    assert_eq!(
        (answers[1]["width"].as_u64(), answers[1]["height"].as_u64()),
        (Some(32), Some(24))
    );
}
