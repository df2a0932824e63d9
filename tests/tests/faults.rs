//! Faults end to end: coordinators and workers killed at random moments,
//! preempted workers, pause/resume/cancel/retry, a broken blob store.

use std::path::Path;
use std::time::{Duration, Instant};

use tessera_tests::*;

const LONG: Duration = Duration::from_secs(400);

/// A small deterministic generator: the "random" moments repeat run to run.
struct Lcg(u64);

impl Lcg {
    fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        Duration::from_millis(lo + (self.0 >> 33) % (hi - lo))
    }
}

/// Every blob is whole: its bytes hash to its name, and no temporary file is left.
fn assert_blob_store_whole(blobs: &Path) {
    let mut n = 0;
    for dir in std::fs::read_dir(blobs).unwrap().map(|e| e.unwrap()) {
        let name = dir.file_name().to_string_lossy().into_owned();
        if name == "tmp" {
            let partial = partial_blob_files(blobs);
            assert!(
                partial.is_empty(),
                "partial files in blobs/tmp: {partial:?}"
            );
            continue;
        }
        for f in std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap()) {
            let digest = blake3::hash(&std::fs::read(f.path()).unwrap())
                .to_hex()
                .to_string();
            assert_eq!(
                digest,
                format!("{name}{}", f.file_name().to_string_lossy()),
                "corrupt blob {:?}",
                f.path()
            );
            n += 1;
        }
    }
    assert!(n > 0);
}

#[test]
fn a_coordinator_killed_ten_times_mid_job_loses_nothing() {
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
        "50",
    ]);
    let dir = scratch();
    let data = dir.path().join("data");
    let mut coord = Coordinator::start(&data, "127.0.0.1:0", &["--lease-ttl", "3"]);
    let (addr, url) = (coord.addr.clone(), coord.url.clone());
    let _a = worker(&url, dir.path(), "a");
    let _b = worker(&url, dir.path(), "b");
    let job = submit(&url, &scene, &["--frames", "1-50"]);
    wait_for(&url, job, LONG, "the job to start", |j| {
        j["frames_done"].as_u64().unwrap() >= 1
    });
    let mut rng = Lcg(7);
    let mut kills_while_running = 0;
    while kills_while_running < 10 {
        std::thread::sleep(rng.millis(200, 1500));
        let state = status(&url, job)["state"].clone();
        assert!(
            state == "running",
            "the job ended after {kills_while_running} kills; make it longer"
        );
        coord.proc.kill9();
        kills_while_running += 1;
        coord = Coordinator::start(&data, &addr, &["--lease-ttl", "3"]);
    }
    let done = wait_for(&url, job, LONG, "the job to end", |j| {
        j["state"] == "done" || j["state"] == "failed"
    });
    assert_eq!(done["state"], "done", "{done:#}");
    assert_eq!(done["frames_done"], 50);
    fetch_exact(&url, job, &scene, 1..=50, dir.path());
    assert_blob_store_whole(&data.join("blobs"));
}

#[test]
fn a_worker_killed_again_and_again_loses_nothing_but_its_time() {
    let scene = scene(&[
        "--kind",
        "anim",
        "--width",
        "96",
        "--height",
        "72",
        "--samples",
        "32",
        "--frames",
        "30",
    ]);
    let dir = scratch();
    let coord = Coordinator::start(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &["--lease-ttl", "2"],
    );
    let _steady = worker(&coord.url, dir.path(), "steady");
    let mut flaky = worker(&coord.url, dir.path(), "flaky-0");
    let job = submit(&coord.url, &scene, &["--frames", "1-12"]);
    let mut rng = Lcg(11);
    for i in 1..=5 {
        std::thread::sleep(rng.millis(500, 2000));
        flaky.kill9();
        flaky = worker(&coord.url, dir.path(), &format!("flaky-{i}"));
    }
    let done = wait_for(&coord.url, job, LONG, "the job to end", |j| {
        j["state"] == "done" || j["state"] == "failed"
    });
    assert_eq!(done["state"], "done", "{done:#}");
    fetch_exact(&coord.url, job, &scene, 1..=12, dir.path());
}

#[test]
fn sigterm_releases_a_busy_workers_task_at_once() {
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
    // A long TTL: only a release (not lease expiry) can move the task quickly.
    let coord = Coordinator::start(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &["--lease-ttl", "120"],
    );
    // A spot worker: it releases at once, even with a grace period.
    let mut a = worker_with(
        &coord.url,
        dir.path(),
        "a",
        &[
            "--capacity",
            "spot",
            "--price-per-hour",
            "3.6",
            "--grace",
            "30",
        ],
    );
    let job = submit(&coord.url, &scene, &["--frames", "1-6", "--chunk", "6"]);
    wait_for(&coord.url, job, LONG, "the task to be leased", |j| {
        j["tasks_running"] == 1
    });
    // Mid-render: the worker has started Blender on the task.
    assert!(
        eventually(LONG, || a.log().contains("Blender session started")),
        "the worker never started rendering its task:\n{}",
        a.log()
    );
    let sent = Instant::now();
    a.term();
    let status = loop {
        if let Some(s) = a.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            sent.elapsed() < Duration::from_secs(15),
            "worker still up 15 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "exit status {status:?}");
    let queued = wait_for(
        &coord.url,
        job,
        Duration::from_secs(10),
        "the task back in the queue",
        |j| j["tasks_running"] == 0,
    );
    assert_eq!(queued["tasks_done"], 0);
    assert!(
        coord.proc.log().contains("task released"),
        "{}",
        coord.proc.log()
    );
    let _b = worker(&coord.url, dir.path(), "b");
    let done = wait_for(
        &coord.url,
        job,
        Duration::from_secs(100),
        "the job to end",
        |j| j["state"] == "done",
    );
    assert_eq!(
        done["tasks"][0]["attempts"], 0,
        "a release charges no attempt"
    );
    // The preempted attempt is paid for, and reported on its own.
    let log = done["tasks"][0]["attempt_log"].as_array().unwrap();
    let ends: Vec<&str> = log.iter().map(|a| a["end"].as_str().unwrap()).collect();
    assert_eq!(ends, ["preempted", "done"], "{log:?}");
    assert_eq!(log[0]["price_per_hour"], 3.6);
    let preempted = done["usage"]["preempted_cost"].as_f64().unwrap();
    let expect = log[0]["seconds"].as_f64().unwrap() * 3.6 / 3600.0;
    assert!(
        preempted > 0.0 && (preempted - expect).abs() < 1e-9,
        "{preempted} vs {expect}"
    );
    assert!(!coord.proc.log().contains("lease expired"));
}

#[test]
fn pause_resume_cancel_and_retry_reach_the_workers() {
    let small = tiny_scene("still", 4, 1);
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
    // One slot: the task it renders, and maybe the next one leased ahead.
    wait_for(&coord.url, job, LONG, "a render in flight", |j| {
        j["tasks_running"].as_u64().unwrap() >= 1
    });
    cli_ok(&coord.url, &["pause", &job.to_string()]);
    let paused = wait_for(
        &coord.url,
        job,
        Duration::from_secs(10),
        "renders to stop",
        |j| j["tasks_running"] == 0,
    );
    assert_eq!(paused["state"], "paused");
    let frames = paused["frames_done"].clone();
    // The worker keeps asking for work: a job submitted now is leased to it
    // and done, while the paused job stays as it was.
    let other = submit(&coord.url, &small, &["--frames", "1"]);
    let other = wait_for(&coord.url, other, LONG, "another job to end", |j| {
        j["state"] == "done" || j["state"] == "failed"
    });
    assert_eq!(other["state"], "done", "{other:#}");
    assert_eq!(
        status(&coord.url, job)["frames_done"],
        frames,
        "nothing renders while paused"
    );
    assert_eq!(status(&coord.url, job)["tasks_running"], 0);
    assert!(
        w.log()
            .contains(&format!("stopping the task: job {job} was paused")),
        "{}",
        w.log()
    );

    cli_ok(&coord.url, &["resume", &job.to_string()]);
    wait_for(&coord.url, job, LONG, "a render in flight again", |j| {
        j["tasks_running"].as_u64().unwrap() >= 1
    });
    cli_ok(&coord.url, &["cancel", &job.to_string()]);
    let canceled = wait_for(
        &coord.url,
        job,
        Duration::from_secs(10),
        "renders to stop",
        |j| j["tasks_running"] == 0,
    );
    assert_eq!(canceled["state"], "canceled");
    let left = 6 - canceled["frames_done"].as_u64().unwrap();
    assert!(left > 0);

    let again = cli(&coord.url, &["retry", &job.to_string()]);
    assert!(again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains(&format!("{left} frame(s) in ")),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    let done = wait_for(&coord.url, job, LONG, "the job to end", |j| {
        j["state"] == "done" || j["state"] == "failed"
    });
    assert_eq!(done["state"], "done");
    fetch_exact(&coord.url, job, &scene, 1..=6, dir.path());
    let refused = cli(&coord.url, &["retry", &job.to_string()]);
    assert!(String::from_utf8_lossy(&refused.stderr)
        .contains("only failed or canceled jobs can be retried"));
}

#[test]
fn a_broken_blob_store_refuses_new_work_and_keeps_what_it_has() {
    let scene_a = tiny_scene("still", 4, 1);
    let scene_b = tiny_scene("anim", 4, 1);
    let dir = scratch();
    let data = dir.path().join("data");
    let coord = Coordinator::start(&data, "127.0.0.1:0", &[]);
    let _w = worker(&coord.url, dir.path(), "a");
    let out = dir.path().join("out");
    cli_ok(
        &coord.url,
        &[
            "submit",
            scene_a.to_str().unwrap(),
            "--frames",
            "1",
            "--wait",
            "-o",
            out.to_str().unwrap(),
        ],
    );
    // Break the blob store: its temporary folder becomes a file (as root, a
    // read-only permission would not stop us; this does).
    let tmp = data.join("blobs/tmp");
    std::fs::remove_dir(&tmp).unwrap();
    std::fs::write(&tmp, b"not a folder").unwrap();
    let refused = cli(
        &coord.url,
        &["submit", scene_b.to_str().unwrap(), "--frames", "1"],
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        stderr.contains("the coordinator cannot store this") && stderr.contains("--data volume"),
        "{stderr}"
    );
    // What it has is still there, and the coordinator is up.
    let jobs: serde_json::Value =
        serde_json::from_str(&cli_ok(&coord.url, &["jobs", "--json"])).unwrap();
    assert_eq!(jobs.as_array().unwrap().len(), 1);
    assert_eq!(jobs[0]["state"], "done");
    let again = dir.path().join("again");
    cli_ok(&coord.url, &["fetch", "1", "-o", again.to_str().unwrap()]);
    assert_same_pixels(&again.join("frame_0001.png"), &out.join("frame_0001.png"));
    // Repaired, it takes work again.
    std::fs::remove_file(&tmp).unwrap();
    std::fs::create_dir(&tmp).unwrap();
    cli_ok(
        &coord.url,
        &[
            "submit",
            scene_b.to_str().unwrap(),
            "--frames",
            "1",
            "--wait",
        ],
    );
}

/// Issue 21 part 8: the only worker, restarted mid-job (twice) under its
/// own name and cache, finishes the job. (The hang itself, a task that
/// failed on a machine once the other workers left, is reproduced in
/// `farm::trust_tests::a_task_no_available_worker_may_take_says_why_until_a_restart`.)
#[test]
fn the_only_worker_restarted_mid_job_finishes_it() {
    let scene = scene(&[
        "--kind",
        "anim",
        "--width",
        "96",
        "--height",
        "72",
        "--samples",
        "64",
        "--frames",
        "6",
    ]);
    let dir = scratch();
    let coord = Coordinator::start(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &["--lease-ttl", "2"],
    );
    let mut solo = worker(&coord.url, dir.path(), "solo");
    let job = submit(&coord.url, &scene, &["--frames", "1-6"]);
    for round in 0..2 {
        // Mid-task: a frame is being rendered.
        wait_for(&coord.url, job, LONG, "a task to be leased", |j| {
            j["tasks"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t["state"] == "leased"))
        });
        solo.kill9();
        solo = worker(&coord.url, dir.path(), "solo");
        eprintln!("restarted the worker ({round})");
    }
    // Every runnable task must be leased or come with a reason; the job
    // then finishes on the restarted worker.
    let start = Instant::now();
    let done = loop {
        let j = status(&coord.url, job);
        if j["state"] == "done" || j["state"] == "failed" {
            break j;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the job hangs after the worker's restart: {j:#}\n{}",
            solo.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(done["state"], "done", "{done:#}");
}
