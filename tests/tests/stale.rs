//! Stale leases and silent coordinators, end to end with real processes:
//! a worker whose job is cancelled mid-render is told so and goes on to
//! other work; a worker whose active coordinator goes silent (a proxy that
//! keeps its connections open and answers nothing) moves to the standby
//! that took over within its calls' deadlines, and the render it held
//! across the failover is accepted by the new active coordinator.

use std::time::{Duration, Instant};

use tessera_tests::postgres::{PgCoordinator, PgServer};
use tessera_tests::proxy::SilentProxy;
use tessera_tests::*;

const LONG: Duration = Duration::from_secs(240);

/// Seconds since midnight (UTC) now, and of a log line's RFC 3339 stamp.
fn day_seconds_now() -> f64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    t.as_secs_f64() % 86_400.0
}

/// The time of day (seconds, UTC) a log line was written at.
fn day_seconds_of(line: &str) -> Option<f64> {
    let time = line.split('T').nth(1)?.split('Z').next()?;
    let mut parts = time.split(':');
    let h: f64 = parts.next()?.parse().ok()?;
    let m: f64 = parts.next()?.parse().ok()?;
    let s: f64 = parts.next()?.parse().ok()?;
    Some(h * 3600.0 + m * 60.0 + s)
}

/// The lease ids of the `task started` lines in a worker's log, in order.
fn started(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains("task started"))
        .filter_map(|l| l.split("lease=").nth(1))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

#[test]
fn a_worker_is_told_its_job_was_cancelled_and_goes_on_to_other_work() {
    let long = scene(&[
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
    let short = scene(&["--kind", "anim", "--frames", "2"]);
    let dir = scratch();
    let coord = Coordinator::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let mut w = worker(&coord.url, dir.path(), "a");
    let cancelled = submit(&coord.url, &long, &["--frames", "1-6"]);
    // One slot: the task it renders, and maybe the next one leased ahead.
    wait_for(&coord.url, cancelled, LONG, "a render in flight", |j| {
        j["tasks_running"].as_u64().unwrap() >= 1
    });
    cli_ok(&coord.url, &["cancel", &cancelled.to_string()]);
    // The renewal (or, when the render ended just then, the result) is
    // answered with the cancel, and the worker says so.
    let told = format!("job {cancelled} was cancelled");
    assert!(
        eventually(Duration::from_secs(10), || w.log().contains(&told)),
        "no `{told}` in the worker's log:\n{}",
        w.log()
    );
    let line = w
        .log()
        .lines()
        .find(|l| l.contains(&told))
        .unwrap()
        .to_string();
    assert!(
        line.contains("stopping the task:")
            || line.contains("task dropped:")
            || line.contains("task held ahead dropped:"),
        "{line}"
    );
    assert!(!w.log().contains("not granted"), "{}", w.log());
    // It goes on to another job's task.
    let other = submit(&coord.url, &short, &["--frames", "1-2"]);
    let done = wait_for(&coord.url, other, LONG, "the other job to end", |j| {
        j["state"] == "done" || j["state"] == "failed"
    });
    assert_eq!(done["state"], "done", "{done:#}");
    fetch_exact(&coord.url, other, &short, 1..=2, dir.path());
    let counts = acknowledged(&[w.log()]);
    let prefix = format!("{other}.");
    assert_eq!(
        counts.keys().filter(|l| l.starts_with(&prefix)).count(),
        2,
        "{counts:?}"
    );
    assert!(w.alive(), "the worker exited:\n{}", w.log());
    eprintln!("worker's word on the cancel: {line}");
}

#[test]
fn a_worker_whose_coordinator_goes_silent_moves_to_the_new_active_and_its_render_is_taken() {
    let Some(pg) = PgServer::start_or_skip("a_worker_whose_coordinator_goes_silent") else {
        return;
    };
    let dir = scratch();
    let scene = scene(&["--kind", "anim", "--frames", "8", "--samples", "384"]);
    // A reaches PostgreSQL through one silent proxy and the worker reaches
    // A through another: cutting both makes A silent to everyone, as a
    // partition that drops packets does. B is reached directly.
    let pg_proxy = SilentProxy::start(&format!("127.0.0.1:{}", pg.port())).unwrap();
    let a_pg = format!("postgres://tessera@127.0.0.1:{}/tessera", pg_proxy.port());
    let blobs = dir.path().join("blobs");
    let blobs = blobs.to_str().unwrap();
    let ha = ["--lease-ttl", "6", "--failover-seconds", "3"];
    let (data_a, data_b) = (dir.path().join("a"), dir.path().join("b"));
    let a = PgCoordinator::start(&data_a, "127.0.0.1:0", &a_pg, blobs, &ha, &[]);
    assert!(
        a.wait_line("active (epoch", Duration::from_secs(30))
            .is_some(),
        "{:?}\n{}",
        a.lines(),
        a.proc.log()
    );
    let b = PgCoordinator::start(&data_b, "127.0.0.1:0", &pg.url(), blobs, &ha, &[]);
    assert!(
        b.wait_line("standby", Duration::from_secs(30)).is_some(),
        "{:?}\n{}",
        b.lines(),
        b.proc.log()
    );
    let a_port = a.addr.rsplit(':').next().unwrap();
    let w_proxy = SilentProxy::start(&format!("127.0.0.1:{a_port}")).unwrap();
    let both = format!("{},{}", a.url, b.url);
    let via_proxy = format!("http://127.0.0.1:{},{}", w_proxy.port(), b.url);
    let (_, worker_token) = farm_tokens(&data_a, &a.url, &[&a.url, &b.url, &both]);
    // One worker: every task it renders reaches B only if the worker moves.
    let env = [("TESSERA_TOKEN", worker_token.as_str())];
    let mut w = worker_env(&via_proxy, dir.path(), "w", &[], &env);
    let job = submit(&both, &scene, &["--frames", "1-4", "--chunk", "1"]);
    let before = wait_for(&both, job, LONG, "a frame done and one in flight", |j| {
        j["frames_done"].as_u64().unwrap() >= 1 && j["tasks_running"].as_u64().unwrap() >= 1
    });
    assert_eq!(before["state"], "running", "{before:#}");
    let held = started(&w.log()).last().cloned().expect("a task in flight");

    w_proxy.black_hole();
    pg_proxy.black_hole();
    let cut = Instant::now();
    let cut_at = day_seconds_now();
    assert!(
        b.wait_line("active (epoch", Duration::from_secs(20))
            .is_some(),
        "B did not take over: {:?}\n{}",
        b.lines(),
        b.proc.log()
    );
    let takeover = cut.elapsed();
    // The worker's call to A runs past its deadline and it moves on.
    let moved = "did not answer within";
    assert!(
        eventually(Duration::from_secs(30), || w.log().contains(moved)),
        "the worker never gave up on the silent coordinator:\n{}",
        w.log()
    );
    let log = w.log();
    let line = log.lines().find(|l| l.contains(moved)).unwrap();
    let gave_up = (day_seconds_of(line).unwrap() - cut_at).rem_euclid(86_400.0);
    // Within the renewal's deadline (a third of the 6 s TTL: 2 s) or a
    // long-poll's (15 s + 10 s), with slack for a busy machine.
    assert!(
        gave_up < 30.0,
        "gave up on A {gave_up:.2} s after the cut: {line}"
    );
    // Its next renewal reaches B: the job moves on under B.
    let done = wait_for(&both, job, LONG, "the job to finish", |j| {
        j["state"] == "done" || j["state"] == "failed"
    });
    assert_eq!(done["state"], "done", "{done:#}\n{}", w.log());
    fetch_exact(&both, job, &scene, 1..=4, dir.path());

    let log = w.log();
    let counts = acknowledged(std::slice::from_ref(&log));
    for index in 0..4 {
        let prefix = format!("{job}.{index}.");
        let n: usize = counts
            .iter()
            .filter(|(l, _)| l.starts_with(&prefix))
            .map(|(_, n)| n)
            .sum();
        assert_eq!(n, 1, "task {index} was completed {n} times: {counts:?}");
    }
    // The render in flight at the cut, granted by A, was accepted by B
    // under A's grant.
    assert_eq!(
        counts.get(&held),
        Some(&1),
        "the render held across the failover ({held}) was not accepted: {counts:?}\n{log}"
    );
    assert!(!log.contains("not granted"), "{log}");
    assert!(w.alive(), "the worker exited:\n{log}");
    // The first result B took after the cut.
    let first_done = log
        .lines()
        .filter(|l| l.contains("task done"))
        .filter_map(day_seconds_of)
        .map(|t| (t - cut_at).rem_euclid(86_400.0))
        .filter(|t| *t < 43_200.0)
        .fold(f64::MAX, f64::min);
    eprintln!(
        "silent active: B took over {:.2} s after the cut; the worker gave up on A {gave_up:.2} s after it; its first result after the cut was taken {first_done:.2} s after it; the job finished {:.2} s after it",
        takeover.as_secs_f64(),
        cut.elapsed().as_secs_f64()
    );
}
