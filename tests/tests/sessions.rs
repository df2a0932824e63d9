//! Warm Blender sessions end to end: one Blender process serves many renders
//! of a job, with output identical to plain renders.

use std::time::Duration;

use tessera_tests::*;

const LONG: Duration = Duration::from_secs(300);

#[test]
fn one_session_renders_frames_and_tiles_of_a_job_in_one_process_exactly() {
    let scene = scene(&[
        "--kind",
        "anim",
        "--width",
        "64",
        "--height",
        "48",
        "--samples",
        "16",
        "--adaptive",
        "--frames",
        "3",
    ]);
    let dir = scratch();
    let coord = Coordinator::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let w = worker(&coord.url, dir.path(), "a");
    let whole = dir.path().join("whole");
    cli_ok(
        &coord.url,
        &[
            "submit",
            scene.to_str().unwrap(),
            "--frames",
            "1-3",
            "--wait",
            "-o",
            whole.to_str().unwrap(),
        ],
    );
    let tiled = dir.path().join("tiled");
    cli_ok(
        &coord.url,
        &[
            "submit",
            scene.to_str().unwrap(),
            "--frames",
            "1-3",
            "--tiles",
            "2x1",
            "--wait",
            "-o",
            tiled.to_str().unwrap(),
        ],
    );

    let log = w.log();
    let started = pids_in_log(&log, "Blender session started");
    assert_eq!(started.len(), 2, "one session per job:\n{log}");
    let job1: Vec<u32> = pids_in_log(&log, "rendered in warm session job=1");
    let job2: Vec<u32> = pids_in_log(&log, "rendered in warm session job=2");
    assert_eq!(job1.len(), 3, "three frames:\n{log}");
    assert_eq!(job2.len(), 6, "three frames of two tiles:\n{log}");
    assert!(
        job1.iter().all(|p| *p == started[0]),
        "job 1 in one process:\n{log}"
    );
    assert!(
        job2.iter().all(|p| *p == started[1]),
        "job 2 in one process:\n{log}"
    );
    // Job 1's session closed as soon as the job ended, before job 2 began.
    assert!(
        log.contains("ending Blender session: its job ended job=1"),
        "{log}"
    );

    let refs = dir.path().join("refs");
    reference(&scene, 1, 3, &refs);
    for n in 1..=3 {
        let want = refs.join(format!("ref_{n:04}.png"));
        assert_same_pixels(&whole.join(format!("frame_{n:04}.png")), &want);
        assert_same_pixels(&tiled.join(format!("frame_{n:04}.png")), &want);
    }
}

#[test]
fn a_killed_blender_fails_or_requeues_its_task_and_the_slot_starts_afresh() {
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
        "6",
    ]);
    let dir = scratch();
    let coord = Coordinator::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let w = worker(&coord.url, dir.path(), "a");
    let job = submit(&coord.url, &scene, &["--frames", "1-6"]);
    wait_for(&coord.url, job, LONG, "a first frame", |j| {
        j["frames_done"].as_u64().unwrap() >= 1
    });
    let first = pids_in_log(&w.log(), "Blender session started")[0];
    assert!(process_alive(first));
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &first.to_string()])
        .status();
    let done = wait_for(&coord.url, job, LONG, "the job to end", |j| {
        j["state"] == "done" || j["state"] == "failed"
    });
    assert_eq!(done["state"], "done", "{done:#}");
    assert_eq!(done["frames_done"], 6);
    let log = w.log();
    let started = pids_in_log(&log, "Blender session started");
    assert!(
        started.len() >= 2 && started[1] != first,
        "a fresh session after the kill:\n{log}"
    );
}

#[test]
fn a_scene_with_a_missing_texture_fails_naming_the_file() {
    let scene = scene(&[
        "--kind",
        "still",
        "--missing-texture",
        "/nonexistent/textures/wood_diffuse.png",
        "--frames",
        "1",
    ]);
    let dir = scratch();
    let coord = Coordinator::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let _w = worker(&coord.url, dir.path(), "a");
    // The submit itself refuses, naming the file and how the scene refers to it.
    let refused = cli(
        &coord.url,
        &["submit", scene.to_str().unwrap(), "--frames", "1-3"],
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.contains("/nonexistent/textures/wood_diffuse.png") && stderr.contains("MissingTex"),
        "{stderr}"
    );
    // Submitted anyway, the session is the last line of defence: Blender
    // would render magenta and exit 0, the worker fails the job instead.
    let job = submit(&coord.url, &scene, &["--frames", "1-3", "--allow-missing"]);
    let failed = wait_for(&coord.url, job, LONG, "the job to end", |j| {
        j["state"] == "failed" || j["state"] == "done"
    });
    assert_eq!(
        failed["state"], "failed",
        "Blender would render magenta and exit 0: {failed:#}"
    );
    let message = failed["message"].as_str().unwrap();
    assert!(
        message.contains("/nonexistent/textures/wood_diffuse.png"),
        "{message}"
    );
    assert!(
        message.contains("cannot be rendered anywhere"),
        "no retries for a missing file: {message}"
    );
}

#[test]
fn cancelling_a_job_ends_its_sessions_on_every_worker_within_seconds() {
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
        "40",
    ]);
    let dir = scratch();
    let coord = Coordinator::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let a = worker(&coord.url, dir.path(), "a");
    let b = worker(&coord.url, dir.path(), "b");
    let job = submit(&coord.url, &scene, &["--frames", "1-40"]);
    assert!(
        eventually(LONG, || {
            !pids_in_log(&a.log(), "Blender session started").is_empty()
                && !pids_in_log(&b.log(), "Blender session started").is_empty()
        }),
        "both workers start a session"
    );
    let pids: Vec<u32> = [&a, &b]
        .iter()
        .flat_map(|w| pids_in_log(&w.log(), "Blender session started"))
        .collect();
    assert!(pids.iter().any(|p| process_alive(*p)));
    cli_ok(&coord.url, &["cancel", &job.to_string()]);
    assert!(
        eventually(Duration::from_secs(5), || pids
            .iter()
            .all(|p| !process_alive(*p))),
        "sessions still running 5 s after the cancel: {pids:?}\na:\n{}\nb:\n{}",
        a.log(),
        b.log()
    );
    let status = status(&coord.url, job);
    assert_eq!(status["state"], "canceled");
}
