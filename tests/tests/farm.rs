//! The farm end to end: a real coordinator, real workers, real Blender.

use std::time::Duration;

use tessera_tests::*;

const LONG: Duration = Duration::from_secs(180);

#[test]
fn two_workers_render_every_frame_exactly_and_scenes_upload_once() {
    let dir = scratch();
    let scene = scene(&["--kind", "anim", "--frames", "8"]);
    let coord = Coordinator::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let a = worker(&coord.url, dir.path(), "a");
    let b = worker(&coord.url, dir.path(), "b");
    let out = dir.path().join("out");
    let stderr = submit_wait(&coord.url, &scene, "1-8", &out);
    assert!(stderr.contains("uploaded scene:"), "{stderr}");
    let expected: Vec<String> = (1..=8).map(|f| format!("frame_{f:04}.png")).collect();
    assert_eq!(frames_of(&out), expected);

    let refs = dir.path().join("refs");
    reference(&scene, 1, 8, &refs);
    assert_matches_reference(&out, &refs, 1..=8);

    // Both workers took part, and each fetched the scene at most once.
    let (la, lb) = (a.log(), b.log());
    assert!(
        la.contains("task done") && lb.contains("task done"),
        "a:\n{la}\nb:\n{lb}"
    );
    assert!(la.matches("scene fetched").count() <= 1 && lb.matches("scene fetched").count() <= 1);

    // The same scene again: zero scene bytes travel, no worker fetches it again.
    let again = cli(
        &coord.url,
        &["submit", scene.to_str().unwrap(), "--frames", "3", "--wait"],
    );
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.success(), "{stderr}");
    assert!(stderr.contains("0 bytes uploaded"), "{stderr}");
    assert_eq!(
        a.log().matches("scene fetched").count() + b.log().matches("scene fetched").count(),
        2
    );

    let workers: serde_json::Value =
        serde_json::from_str(&cli_ok(&coord.url, &["workers", "--json"])).unwrap();
    let done: u64 = workers
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["tasks_done"].as_u64().unwrap())
        .sum();
    let jobs: serde_json::Value =
        serde_json::from_str(&cli_ok(&coord.url, &["jobs", "--json"])).unwrap();
    assert!(
        jobs.as_array()
            .unwrap()
            .iter()
            .all(|j| j["state"] == "done"),
        "{jobs:#}"
    );
    // Every task of both jobs was counted once, to the worker that did it
    // (the farm sized the tasks: 9 frames in at most 9 tasks).
    let tasks: u64 = jobs
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["tasks_total"].as_u64().unwrap())
        .sum();
    assert_eq!(done, tasks, "{jobs:#}");
    assert!((2..=9).contains(&tasks), "{jobs:#}");

    // Archived: out of the live list, still listed with --archived, its
    // frames still fetchable; deleted: gone.
    let first_id = jobs[0]["id"].as_u64().unwrap();
    let first = first_id.to_string();
    let archived = cli(&coord.url, &["archive", &first]);
    assert!(archived.status.success(), "{archived:?}");
    let live: serde_json::Value =
        serde_json::from_str(&cli_ok(&coord.url, &["jobs", "--json"])).unwrap();
    assert!(
        live.as_array().unwrap().iter().all(|j| j["id"] != first_id),
        "{live:#}"
    );
    let all: serde_json::Value =
        serde_json::from_str(&cli_ok(&coord.url, &["jobs", "--archived", "--json"])).unwrap();
    let entry = all
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["id"] == first_id)
        .expect("listed with --archived");
    assert_eq!(entry["archived"], true);
    assert_eq!(entry["frames_done"], 8);
    let again_out = dir.path().join("again");
    cli_ok(
        &coord.url,
        &["fetch", &first, "-o", again_out.to_str().unwrap()],
    );
    assert_matches_reference(&again_out, &refs, 1..=8);
    let deleted = cli(&coord.url, &["delete", &first]);
    assert!(deleted.status.success(), "{deleted:?}");
    let gone = cli(&coord.url, &["status", &first]);
    assert!(!gone.status.success());
    assert!(
        String::from_utf8_lossy(&gone.stderr).contains("not found"),
        "{gone:?}"
    );
}

#[test]
fn a_killed_workers_task_runs_on_another_worker() {
    let dir = scratch();
    // Four frames of 128 samples in one task (several seconds here), so that
    // worker a is mid-task when killed: its slot's spare Blender has the
    // scene loaded within a fraction of a second.
    let scene = scene(&["--kind", "anim", "--frames", "8", "--samples", "128"]);
    let coord = Coordinator::start(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &["--lease-ttl", "2"],
    );
    let mut a = worker(&coord.url, dir.path(), "a");
    let job = submit(&coord.url, &scene, &["--frames", "1-4", "--chunk", "4"]);
    wait_for(&coord.url, job, LONG, "the task to be leased", |j| {
        j["tasks_running"] == 1
    });
    assert!(
        eventually(LONG, || a.log().contains("task started")),
        "{}",
        a.log()
    );
    a.kill9();
    let killed = wait_for(&coord.url, job, LONG, "the job's status", |_| true);
    assert_eq!(
        killed["state"], "running",
        "the task ended before the kill: {killed:#}"
    );
    let _b = worker(&coord.url, dir.path(), "b");
    let done = wait_for(&coord.url, job, LONG, "the job to finish", |j| {
        j["state"] != "running" && j["state"] != "queued"
    });
    assert_eq!(done["state"], "done", "{done:#}");
    let out = dir.path().join("out");
    cli_ok(
        &coord.url,
        &["fetch", &job.to_string(), "-o", out.to_str().unwrap()],
    );
    let refs = dir.path().join("refs");
    reference(&scene, 1, 4, &refs);
    assert_matches_reference(&out, &refs, 1..=4);
    assert!(
        coord.proc.log().contains("lease expired"),
        "{}",
        coord.proc.log()
    );
}

#[test]
fn a_coordinator_killed_mid_job_recovers_it_on_restart() {
    let dir = scratch();
    // Enough samples that the job is still running when the first frame is
    // seen: at 8 samples a warm session renders the other five frames
    // (about 60 ms each) before the status poll notices the first.
    let scene = scene(&["--kind", "anim", "--frames", "8", "--samples", "128"]);
    let data = dir.path().join("data");
    let mut coord = Coordinator::start(&data, "127.0.0.1:0", &["--lease-ttl", "3"]);
    let addr = coord.addr.clone();
    let url = coord.url.clone();
    let _w = worker(&url, dir.path(), "a");
    let job = submit(&url, &scene, &["--frames", "1-6"]);
    wait_for(&url, job, LONG, "a first frame", |j| {
        j["frames_done"].as_u64().unwrap() >= 1
    });
    coord.proc.kill9();
    std::thread::sleep(Duration::from_millis(1500));
    let restarted = Coordinator::start(&data, &addr, &["--lease-ttl", "3"]);
    let done = wait_for(&url, job, LONG, "the job to finish", |j| {
        j["state"] == "done" || j["state"] == "failed"
    });
    assert_eq!(done["state"], "done", "{done:#}");
    assert_eq!(done["frames_done"], 6);
    let out = dir.path().join("out");
    cli_ok(
        &url,
        &["fetch", &job.to_string(), "-o", out.to_str().unwrap()],
    );
    let refs = dir.path().join("refs");
    reference(&scene, 1, 6, &refs);
    assert_matches_reference(&out, &refs, 1..=6);
    // No partial blobs: nothing is left in the blob store's temporary folder.
    assert_eq!(
        partial_blob_files(&data.join("blobs")),
        Vec::<std::path::PathBuf>::new()
    );
    let log = restarted.proc.log();
    assert!(
        log.contains("recovered state") && log.contains("open=1"),
        "{log}"
    );
}

#[test]
fn a_failing_render_fails_its_task_with_blenders_error_and_the_worker_stays_up() {
    let dir = scratch();
    let broken = scene(&[
        "--kind",
        "fail-driver",
        "--fail-mode",
        "driver-py",
        "--frames",
        "2",
    ]);
    let coord = Coordinator::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let mut w = worker(&coord.url, dir.path(), "a");
    let job = submit(
        &coord.url,
        &broken,
        &["--frames", "1", "--max-attempts", "2"],
    );
    let failed = wait_for(&coord.url, job, LONG, "the job to fail", |j| {
        j["state"] == "failed" || j["state"] == "done"
    });
    assert_eq!(
        failed["state"], "failed",
        "Blender exits 0 here; the worker must still see the error: {failed:#}"
    );
    let message = failed["message"].as_str().unwrap();
    assert!(message.contains("Error in PyDriver"), "{message}");
    assert!(
        message.contains("blender log"),
        "the log tail travels with the failure: {message}"
    );
    // A Python error in the scene fails everywhere: one attempt, not two.
    assert!(message.contains("cannot be rendered anywhere"), "{message}");
    assert_eq!(failed["tasks"][0]["attempts"], 1, "{failed:#}");
    let human = cli_ok(&coord.url, &["status", &job.to_string()]);
    assert!(
        human.contains("failed") && human.contains("PyDriver"),
        "{human}"
    );

    // The worker is still serving: an unwritable output (a scene without a
    // camera, which Blender refuses) fails too, and a good scene then renders.
    let nocamera = scene(&[
        "--kind",
        "fail-driver",
        "--fail-mode",
        "nocamera",
        "--frames",
        "2",
    ]);
    let job = submit(
        &coord.url,
        &nocamera,
        &["--frames", "1", "--max-attempts", "1"],
    );
    let failed = wait_for(&coord.url, job, LONG, "the job to fail", |j| {
        j["state"] == "failed" || j["state"] == "done"
    });
    assert!(
        failed["message"].as_str().unwrap().contains("no camera"),
        "{failed:#}"
    );
    assert!(w.alive());
    let good = scene(&["--kind", "still", "--frames", "1"]);
    let out = dir.path().join("out");
    cli_ok(
        &coord.url,
        &[
            "submit",
            good.to_str().unwrap(),
            "--frames",
            "1",
            "--wait",
            "-o",
            out.to_str().unwrap(),
        ],
    );
    assert_eq!(frames_of(&out), vec!["frame_0001.png"]);
    assert!(w.alive());
}

#[test]
fn bad_input_gets_a_clear_error_and_a_non_zero_exit() {
    let dir = scratch();
    let coord = Coordinator::start(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &["--max-frames", "1000"],
    );
    let not_blend = dir.path().join("notes.blend");
    std::fs::write(&not_blend, b"this is not a scene at all").unwrap();
    let empty = dir.path().join("empty.blend");
    std::fs::write(&empty, b"").unwrap();
    let good = scene(&["--kind", "still", "--frames", "1"]);
    let good = good.to_str().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["submit", not_blend.to_str().unwrap(), "--frames", "1"],
            "is not a Blender file",
        ),
        (
            vec!["submit", empty.to_str().unwrap(), "--frames", "1"],
            "empty or truncated",
        ),
        (
            vec!["submit", "/nonexistent/scene.blend", "--frames", "1"],
            "cannot open scene",
        ),
        (vec!["submit", good, "--frames", "10-1"], "runs backwards"),
        (vec!["submit", good, "--frames", "1-10x0"], "step of 0"),
        (vec!["submit", good, "--frames", ""], "frame set is empty"),
        (
            vec!["submit", good, "--frames", "1-5000"],
            "over the limit of 1000",
        ),
        (
            vec!["submit", good, "--frames", "1", "--chunk", "0"],
            "--chunk 0",
        ),
        (
            vec!["submit", good, "--frames", "1", "--chunk", "-3"],
            "--chunk -3",
        ),
        (vec!["status", "999"], "job 999 not found"),
        (vec!["cancel", "999"], "job 999 not found"),
        (vec!["fetch", "999", "-o", "/tmp/x"], "job 999 not found"),
    ];
    for (args, want) in cases {
        let out = cli(&coord.url, &args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(
            stderr.contains(want),
            "{args:?}: expected `{want}` in: {stderr}"
        );
    }
    // Nothing was accepted, and the coordinator is still up.
    assert_eq!(cli_ok(&coord.url, &["jobs", "--json"]).trim(), "[]");
    let unreachable = cli("http://127.0.0.1:1", &["jobs"]);
    assert!(String::from_utf8_lossy(&unreachable.stderr).contains("cannot reach the coordinator"));
}

#[test]
fn render_runs_a_private_farm_with_no_set_up() {
    // The README's first command: no coordinator, no token, no worker to start.
    let scene = scene(&[
        "--kind",
        "anim",
        "--width",
        "64",
        "--height",
        "48",
        "--samples",
        "8",
        "--frames",
        "3",
    ]);
    let dir = scratch();
    let out = dir.path().join("out");
    let run = std::process::Command::new(tessera())
        .args([
            "render",
            scene.to_str().unwrap(),
            "--workers",
            "2",
            "--tiles",
            "2x1",
            "-o",
        ])
        .arg(&out)
        .env_remove("TESSERA_TOKEN")
        .env_remove("TESSERA_COORDINATOR")
        .env("XDG_CONFIG_HOME", dir.path())
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert_eq!(
        frames_of(&out),
        vec!["frame_0001.png", "frame_0002.png", "frame_0003.png"]
    );
    let refs = dir.path().join("refs");
    reference(&scene, 1, 3, &refs);
    assert_matches_reference(&out, &refs, 1..=3);

    // With a --data directory that lives on, the frames are copies: editing
    // one cannot change the farm's stored bytes.
    let data = dir.path().join("data");
    let kept = dir.path().join("kept");
    let run = std::process::Command::new(tessera())
        .args([
            "render",
            scene.to_str().unwrap(),
            "--frames",
            "1-2",
            "--data",
        ])
        .arg(&data)
        .arg("-o")
        .arg(&kept)
        .env_remove("TESSERA_TOKEN")
        .env_remove("TESSERA_COORDINATOR")
        .env("XDG_CONFIG_HOME", dir.path())
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert_matches_reference(&kept, &refs, 1..=2);
    use std::os::unix::fs::MetadataExt;
    for f in frames_of(&kept) {
        let links = std::fs::metadata(kept.join(&f)).unwrap().nlink();
        assert_eq!(links, 1, "{f} shares its bytes with the data directory");
    }
}
