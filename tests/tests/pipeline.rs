//! The pipeline end to end, with real coordinators, workers and Blender:
//! job dependencies (a chain, and a chain broken by a cancel), frame
//! reruns, what each job costs, and the autoscaling signal.

use std::time::Duration;

use tessera_tests::*;

const LONG: Duration = Duration::from_secs(300);

fn small_scene() -> std::path::PathBuf {
    scene(&["--kind", "anim", "--frames", "6"])
}

/// The value of one sample in a Prometheus text page.
fn sample(body: &str, series: &str) -> Option<f64> {
    body.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

fn metrics(coord: &Coordinator) -> String {
    let url = coord.metrics.as_ref().expect("started with --http");
    http_get_as(url, Some(&coord.admin_token())).1
}

#[test]
fn a_chain_runs_in_order_a_canceled_middle_job_cancels_the_rest_and_costs_add_up() {
    let scene = small_scene();
    let dir = scratch();
    let coord = Coordinator::start(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &["--http", "127.0.0.1:0"],
    );
    let url = coord.url.clone();
    let s = scene.to_str().unwrap();
    // No worker yet: the chain is submitted and shown waiting.
    let a = submit(&url, &scene, &["--frames", "1-3"]);
    let b = submit(
        &url,
        &scene,
        &["--frames", "4-5", "--after", &a.to_string()],
    );
    let c = submit(&url, &scene, &["--frames", "6", "--after", &b.to_string()]);
    let d = submit(&url, &scene, &["--frames", "1-2"]);
    let e = submit(&url, &scene, &["--frames", "3", "--after", &d.to_string()]);
    let f = submit(&url, &scene, &["--frames", "4", "--after", &e.to_string()]);
    let sb = status(&url, b);
    assert_eq!(sb["after"], serde_json::json!([a]));
    assert_eq!(sb["waiting_for"], a);
    assert!(
        sb["waiting"]
            .as_str()
            .unwrap()
            .contains(&format!("waiting for job {a}")),
        "{sb:#}"
    );
    let jobs = cli_ok(&url, &["jobs"]);
    assert!(jobs.contains(&format!("waiting for {a}")), "{jobs}");
    // The middle of the second chain is canceled: the job after it is
    // canceled with a reason naming it; the first goes on.
    cli_ok(&url, &["cancel", &e.to_string()]);
    let sf = status(&url, f);
    assert_eq!(sf["state"], "canceled", "{sf:#}");
    let why = sf["message"].as_str().unwrap();
    assert!(
        why.contains(&format!("job {e}")) && why.contains("was canceled"),
        "{why}"
    );
    // A job after a canceled one is refused, saying what to do.
    let refused = cli(
        &url,
        &["submit", s, "--frames", "1", "--after", &e.to_string()],
    );
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains(&format!("retry job {e}")), "{err}");
    // A cycle is refused.
    let cyc = cli(&url, &["update", &a.to_string(), "--after", &c.to_string()]);
    assert!(!cyc.status.success());
    assert!(String::from_utf8_lossy(&cyc.stderr).contains("cycle"));

    // One worker at 7.20 an hour renders the chains.
    let _w = worker_with(&url, dir.path(), "w", &["--price-per-hour", "7.2"]);
    // b never runs before a is done; c never before b.
    let mut order_ok = true;
    loop {
        // Read the later jobs first: a job that has started proves the one
        // before it was done by then, and done stays done.
        let sc = status(&url, c);
        let sb = status(&url, b);
        let sa = status(&url, a);
        let started = |j: &serde_json::Value| j["state"] != "queued";
        order_ok &= !started(&sb) || sa["state"] == "done";
        order_ok &= !started(&sc) || sb["state"] == "done";
        if sc["state"] == "done" {
            break;
        }
        assert!(
            !["failed", "canceled"].contains(&sc["state"].as_str().unwrap()),
            "{sc:#}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        order_ok,
        "a job started before the job it waits for was done"
    );
    wait_for(&url, d, LONG, "the first job of the broken chain", |j| {
        j["state"] == "done"
    });
    fetch_exact(&url, b, &scene, 4..=5, dir.path());

    // Cost: every attempt at 7.20/h on one slot; the job's cost is their sum,
    // and /metrics says the same.
    let full = status(&url, a);
    let mut secs = 0.0;
    for t in full["tasks"].as_array().unwrap() {
        for at in t["attempt_log"].as_array().unwrap() {
            assert_eq!(at["price_per_hour"], 7.2);
            assert_eq!(at["gpu"], false);
            assert_eq!(at["end"], "done");
            secs += at["seconds"].as_f64().unwrap();
        }
    }
    assert!(secs > 0.0);
    let cost = full["usage"]["cost"].as_f64().unwrap();
    assert!(
        (cost - secs * 7.2 / 3600.0).abs() < 1e-9,
        "{cost} vs {secs} s"
    );
    assert!((full["usage"]["cpu_hours"].as_f64().unwrap() - secs / 3600.0).abs() < 1e-9);
    let page = metrics(&coord);
    let m = sample(&page, &format!("tessera_job_cost_total{{job=\"{a}\"}}")).unwrap();
    assert!((m - cost).abs() < 1e-9, "{m} vs {cost}");
    let text = cli_ok(&url, &["status", &a.to_string()]);
    assert!(
        text.contains("cost") && text.contains("CPU-hours"),
        "{text}"
    );
    assert_eq!(sample(&page, r#"tessera_workers{state="idle"}"#), Some(1.0));
}

#[test]
fn retry_frames_renders_only_those_frames_again_and_the_job_is_exact() {
    let scene = small_scene();
    let dir = scratch();
    let coord = Coordinator::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let url = coord.url.clone();
    let _w = worker(&url, dir.path(), "w");
    // One frame a task (a task of several frames renders all of them again).
    let job = submit(&url, &scene, &["--frames", "1-6", "--chunk", "1"]);
    wait_for(&url, job, LONG, "the job", |j| j["state"] == "done");
    let said = cli(&url, &["retry", &job.to_string(), "--frames", "2-3"]);
    assert!(said.status.success());
    let said = String::from_utf8_lossy(&said.stderr);
    assert!(said.contains("2 frame(s) to render again (2-3)"), "{said}");
    let done = wait_for(&url, job, LONG, "the rerun", |j| j["state"] == "done");
    for t in done["tasks"].as_array().unwrap() {
        let frame = t["frames"][0].as_u64().unwrap();
        let renders = t["attempt_log"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["end"] == "done")
            .count();
        let want = if (2..=3).contains(&frame) { 2 } else { 1 };
        assert_eq!(renders, want, "frame {frame}: {t:#}");
    }
    fetch_exact(&url, job, &scene, 1..=6, dir.path());
    let bad = cli(&url, &["retry", &job.to_string(), "--frames", "9"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not in job"));
}

#[test]
fn desired_slots_count_the_queue_by_class() {
    let scene = small_scene();
    let dir = scratch();
    let coord = Coordinator::start(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &["--http", "127.0.0.1:0", "--target-drain-minutes", "10"],
    );
    let url = coord.url.clone();
    // No task has finished: each queued task counts as one slot.
    submit(&url, &scene, &["--frames", "1-6"]);
    submit(
        &url,
        &scene,
        &["--frames", "1-5", "--chunk", "2", "--device", "cpu"],
    );
    let page = metrics(&coord);
    assert_eq!(
        sample(
            &page,
            r#"tessera_desired_slots{device="any",min_vram_gb="0",tags=""}"#
        ),
        Some(6.0),
        "{page}"
    );
    assert_eq!(
        sample(
            &page,
            r#"tessera_desired_slots{device="cpu",min_vram_gb="0",tags=""}"#
        ),
        Some(3.0),
        "{page}"
    );
    assert!(page.contains("# TYPE tessera_desired_slots gauge"));
}
