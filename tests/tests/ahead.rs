//! The farm's cost per frame, end to end: a slot leases its next task
//! while it renders, every frame arrives, and a task leased ahead that will
//! not run is released, never left to expire; without `--chunk`, a lease
//! of tiny frames takes several of them; a worker renews all its leases in
//! one call a period, and asks for a task ahead with the result before it.

use std::time::{Duration, Instant};

use tessera_tests::*;

const LONG: Duration = Duration::from_secs(300);

/// The leases named on the lines of `log` that contain `what`, in order.
fn leases_on(log: &str, what: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains(what))
        .filter_map(|l| {
            let rest = &l[l.find(what)? + what.len()..];
            let at = rest.find("lease=")? + "lease=".len();
            Some(rest[at..].split_whitespace().next()?.to_string())
        })
        .collect()
}

#[test]
fn a_one_slot_worker_leases_its_next_task_before_the_current_one_completes() {
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
        "4",
    ]);
    let dir = scratch();
    let coord = Coordinator::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let w = worker(&coord.url, dir.path(), "a");
    let out = dir.path().join("out");
    // One task a frame, so that every task but the first is leased ahead.
    submit_wait_with(&coord.url, &scene, "1-4", &out, &["--chunk", "1"]);
    assert_eq!(
        frames_of(&out),
        [
            "frame_0001.png",
            "frame_0002.png",
            "frame_0003.png",
            "frame_0004.png"
        ]
    );
    let refs = dir.path().join("refs");
    reference(&scene, 1, 4, &refs);
    assert_matches_reference(&out, &refs, 1..=4);

    // Tasks 2 to 4 were each leased ahead while the task before rendered,
    // so before that task was reported done.
    let log = w.log();
    let ahead = leases_on(&log, "next task leased ahead");
    assert_eq!(ahead.len(), 3, "three tasks leased ahead:\n{log}");
    let lines: Vec<&str> = log.lines().collect();
    let at = |what: &str, lease: &str| {
        let field = format!("lease={lease}");
        lines
            .iter()
            .position(|l| {
                let mut after = l.split_once(what).map_or("", |(_, a)| a).split_whitespace();
                after.any(|w| w == field)
            })
            .unwrap_or_else(|| panic!("no `{what}` line for lease {lease}:\n{log}"))
    };
    let started: Vec<String> = leases_on(&log, "task started");
    assert_eq!(started.len(), 4, "{log}");
    for (i, next) in ahead.iter().enumerate() {
        assert_eq!(
            &started[i + 1],
            next,
            "tasks start in the order leased:\n{log}"
        );
        let current = &started[i];
        assert!(
            at("next task leased ahead", next) < at("task done", current),
            "{next} was leased ahead before {current} was done:\n{log}"
        );
    }
    // The coordinator granted them as leases ahead.
    let coord_log = coord.proc.log();
    let granted = coord_log
        .lines()
        .filter(|l| l.contains("task leased") && l.contains("ahead=true"))
        .count();
    assert_eq!(granted, 3, "{coord_log}");
    assert!(!coord_log.contains("lease expired"), "{coord_log}");
}

#[test]
fn a_task_leased_ahead_is_released_when_the_worker_shuts_down() {
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
    let mut a = worker(&coord.url, dir.path(), "a");
    let job = submit(&coord.url, &scene, &["--frames", "1-6"]);
    assert!(
        eventually(LONG, || a.log().contains("next task leased ahead")),
        "the worker never leased a task ahead:\n{}",
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
    let log = a.log();
    let released = leases_on(&log, "task held ahead released, not started");
    assert_eq!(
        released.len(),
        1,
        "the task held ahead was released:\n{log}"
    );
    // Released, not expired: back in the queue at once (the lease TTL is
    // 30 s), and the coordinator says so for that lease.
    let queued = wait_for(
        &coord.url,
        job,
        Duration::from_secs(10),
        "every task back in the queue",
        |j| j["tasks_running"] == 0,
    );
    let coord_log = coord.proc.log();
    assert!(
        coord_log.lines().any(|l| l.contains("task released")
            && l.split_whitespace()
                .any(|w| w == format!("lease={}", released[0]))),
        "lease {} released:\n{coord_log}",
        released[0]
    );
    assert!(!coord_log.contains("lease expired"), "{coord_log}");

    // Nothing was lost: another worker renders every frame.
    let _b = worker(&coord.url, dir.path(), "b");
    let done = wait_for(&coord.url, job, LONG, "the job to end", |j| {
        j["state"] == "done" || j["state"] == "failed"
    });
    assert_eq!(done["state"], "done", "{done:#}\nqueued then: {queued:#}");
    assert_eq!(done["frames_done"], 6);
}

#[test]
fn tiny_frames_are_chunked_by_the_farm_and_an_explicit_chunk_is_kept() {
    let scene = scene(&[
        "--kind",
        "anim",
        "--width",
        "64",
        "--height",
        "48",
        "--samples",
        "4",
        "--frames",
        "12",
    ]);
    let dir = scratch();
    let coord = Coordinator::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let _w = worker(&coord.url, dir.path(), "a");
    let out = dir.path().join("out");
    submit_wait(&coord.url, &scene, "1-12", &out);
    let names: Vec<String> = (1..=12).map(|f| format!("frame_{f:04}.png")).collect();
    assert_eq!(frames_of(&out), names);
    let refs = dir.path().join("refs");
    reference(&scene, 1, 12, &refs);
    assert_matches_reference(&out, &refs, 1..=12);
    // Once a frame was measured, leases took several: fewer tasks than
    // frames, each done, every frame counted once.
    let sized = status(&coord.url, 1);
    assert_eq!(sized["state"], "done", "{sized:#}");
    assert_eq!(sized["chunk"], 0, "{sized:#}");
    assert_eq!(sized["frames_done"], 12, "{sized:#}");
    let tasks = sized["tasks_total"].as_u64().unwrap();
    assert!(tasks < 12, "12 tiny frames took {tasks} tasks:\n{sized:#}");
    assert_eq!(sized["tasks_done"], tasks, "{sized:#}");
    let log = coord.proc.log();
    assert!(
        log.lines()
            .any(|l| l.contains("task leased") && l.contains("frames=[") && l.contains(", ")),
        "no lease took more than one frame:\n{log}"
    );

    // `--chunk 1` keeps one task a frame.
    let kept = dir.path().join("kept");
    submit_wait_with(&coord.url, &scene, "1-12", &kept, &["--chunk", "1"]);
    assert_eq!(frames_of(&kept), names);
    let given = status(&coord.url, 2);
    assert_eq!(given["state"], "done", "{given:#}");
    assert_eq!(given["chunk"], 1, "{given:#}");
    assert_eq!(given["tasks_total"], 12, "{given:#}");
}

/// A counter of the Prometheus text `body`: `name` with exactly `labels`
/// (`call="renew"`), or without labels when `labels` is empty.
fn counter(body: &str, name: &str, labels: &str) -> f64 {
    let key = if labels.is_empty() {
        format!("{name} ")
    } else {
        format!("{name}{{{labels}}} ")
    };
    body.lines()
        .find_map(|l| l.strip_prefix(&key)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in:\n{body}"))
}

/// Two slots, each rendering a task and holding its next one ahead: the
/// worker renews all those leases in one Renew call a period, never one
/// Progress call per lease, and every frame arrives.
#[test]
fn a_two_slot_worker_renews_all_its_leases_in_one_call_a_period() {
    // About a second a frame on one thread: several renewal periods.
    let scene = scene(&[
        "--kind",
        "anim",
        "--width",
        "160",
        "--height",
        "120",
        "--samples",
        "128",
        "--frames",
        "6",
    ]);
    let dir = scratch();
    let coord = Coordinator::start(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &["--http", "127.0.0.1:0"],
    );
    let w = worker_with(
        &coord.url,
        dir.path(),
        "a",
        &["--slots", "2", "--device", "cpu"],
    );
    let out = dir.path().join("out");
    submit_wait_with(&coord.url, &scene, "1-6", &out, &["--chunk", "1"]);
    assert_eq!(frames_of(&out).len(), 6, "{}", w.log());

    let (_, body) = http_get_as(coord.metrics.as_ref().unwrap(), Some(&coord.admin_token()));
    let renews = counter(&body, "tessera_renewal_calls_total", "call=\"renew\"");
    let progress = counter(&body, "tessera_renewal_calls_total", "call=\"progress\"");
    let renewed = counter(&body, "tessera_leases_renewed_total", "");
    assert!(
        renews >= 2.0,
        "renewed over several periods: {renews}\n{body}"
    );
    assert_eq!(progress, 0.0, "no lease renewed on its own:\n{body}");
    assert!(
        renewed > renews,
        "calls carried several leases ({renewed} leases in {renews} calls)"
    );
    let log = w.log();
    assert!(!log.contains("cannot renew"), "{log}");

    // The asks for tasks ahead rode on the reports of the tasks before,
    // when those were on their way: the coordinator counted those leases,
    // and the worker's log says which.
    let carried = counter(&body, "tessera_leases_with_results_total", "");
    let said = log
        .lines()
        .filter(|l| l.contains("next task leased ahead") && l.contains("with_result=true"))
        .count();
    assert!(carried >= 1.0, "no ask rode on a report:\n{body}\n{log}");
    assert_eq!(carried, said as f64, "{log}");
}
