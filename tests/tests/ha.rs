//! Coordinators on PostgreSQL, end to end: real coordinators, a real
//! PostgreSQL server, real workers and real Blender. One farm on the
//! PostgreSQL store; then an active and a standby coordinator, the active
//! one killed with SIGKILL mid-job.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use tessera_tests::postgres::{PgCoordinator, PgServer};
use tessera_tests::s3::s3_or_skip;
use tessera_tests::*;

const LONG: Duration = Duration::from_secs(240);

/// The admin token (written by the first coordinator to start) and a new
/// worker token, registered for every URL in `urls`.
fn tokens(data: &Path, url: &str, urls: &[&str]) -> (String, String) {
    let admin = std::fs::read_to_string(data.join("admin.token"))
        .expect("the first coordinator writes the admin token")
        .trim()
        .to_string();
    let out = cli_as(
        url,
        Some(&admin),
        &["users", "add", "workers", "--role", "worker"],
    );
    assert!(
        out.status.success(),
        "users add: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let worker = String::from_utf8(out.stdout).unwrap().trim().to_string();
    for u in urls {
        set_tokens(u, &admin, &worker);
    }
    (admin, worker)
}

/// `task done` lines in the workers' logs, by lease id `JOB.TASK.GRANT`.
fn completions(logs: &[String]) -> BTreeMap<String, usize> {
    let mut n = BTreeMap::new();
    for log in logs {
        for line in log.lines().filter(|l| l.contains("task done")) {
            if let Some(lease) = line.split("lease=").nth(1) {
                let lease = lease.split_whitespace().next().unwrap_or("").to_string();
                *n.entry(lease).or_default() += 1;
            }
        }
    }
    n
}

#[test]
fn six_frames_on_two_workers_with_the_postgres_store_are_exact() {
    let Some(pg) =
        PgServer::start_or_skip("six_frames_on_two_workers_with_the_postgres_store_are_exact")
    else {
        return;
    };
    // Metadata in PostgreSQL, blobs in S3: nothing on the coordinator's disk.
    let Some(s3) = s3_or_skip("six_frames_on_two_workers_with_the_postgres_store_are_exact") else {
        return;
    };
    let dir = scratch();
    let scene = scene(&["--kind", "anim", "--frames", "8"]);
    let data = dir.path().join("data");
    let coord = PgCoordinator::start(
        &data,
        "127.0.0.1:0",
        &pg.url(),
        &s3.url("one"),
        &[],
        &s3.env(),
    );
    assert!(
        coord
            .wait_line("active (epoch 1)", Duration::from_secs(30))
            .is_some(),
        "{:?}\n{}",
        coord.lines(),
        coord.proc.log()
    );
    tokens(&data, &coord.url, &[&coord.url]);
    let _a = worker(&coord.url, dir.path(), "a");
    let _b = worker(&coord.url, dir.path(), "b");
    let out = dir.path().join("out");
    let submitted = cli(
        &coord.url,
        &[
            "submit",
            scene.to_str().unwrap(),
            "--frames",
            "1-6",
            "--wait",
            "-o",
            out.to_str().unwrap(),
        ],
    );
    assert!(
        submitted.status.success(),
        "submit failed: {}\n{}",
        String::from_utf8_lossy(&submitted.stderr),
        coord.proc.log()
    );
    let refs = dir.path().join("refs");
    reference(&scene, 1, 6, &refs);
    assert_matches_reference(&out, &refs, 1..=6);
    // The records are in PostgreSQL: the job and its six tasks.
    assert_eq!(
        pg.psql("tessera", "SELECT count(*) FROM tessera_jobs")
            .unwrap(),
        "1"
    );
    assert_eq!(
        pg.psql("tessera", "SELECT count(*) FROM tessera_tasks")
            .unwrap(),
        "6"
    );
    assert_eq!(
        pg.psql("tessera", "SELECT body->>'state' FROM tessera_jobs")
            .unwrap(),
        "Done"
    );
}

#[test]
fn the_standby_takes_over_when_the_active_is_killed_and_the_job_finishes_exactly() {
    let Some(pg) = PgServer::start_or_skip("the_standby_takes_over_when_the_active_is_killed")
    else {
        return;
    };
    let dir = scratch();
    // Enough samples that the job is still running when the first frames are done.
    let scene = scene(&["--kind", "anim", "--frames", "8", "--samples", "128"]);
    // Both coordinators share the PostgreSQL database and the S3 bucket.
    let Some(s3) = s3_or_skip("the_standby_takes_over_when_the_active_is_killed") else {
        return;
    };
    let blobs = s3.url("ha");
    let s3_env = s3.env();
    let (data_a, data_b) = (dir.path().join("a"), dir.path().join("b"));
    let ha = ["--lease-ttl", "5", "--failover-seconds", "3"];
    let mut a = PgCoordinator::start(&data_a, "127.0.0.1:0", &pg.url(), &blobs, &ha, &s3_env);
    assert!(
        a.wait_line("active", Duration::from_secs(30)).is_some(),
        "{}",
        a.proc.log()
    );
    let b = PgCoordinator::start(&data_b, "127.0.0.1:0", &pg.url(), &blobs, &ha, &s3_env);
    let line = b
        .wait_line("standby", Duration::from_secs(30))
        .unwrap_or_else(|| panic!("{:?}\n{}", b.lines(), b.proc.log()));
    assert!(
        line.contains(&a.url),
        "the standby names the active one: {line}"
    );
    let both = format!("{},{}", a.url, b.url);
    let (admin, worker_token) = tokens(&data_a, &a.url, &[&a.url, &b.url, &both]);

    // The standby changes nothing, and says who is active.
    let refused = cli_as(&b.url, Some(&admin), &["users", "add", "someone"]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        err.contains("this coordinator is standby; the active one is") && err.contains(&a.url),
        "{err}"
    );
    // Roles: `coordinator --status` and /metrics.
    let roles = cli_ok(&both, &["coordinator", "--status"]);
    assert!(roles.contains(&format!("{}  active", a.url)), "{roles}");
    assert!(roles.contains(&format!("{}  standby", b.url)), "{roles}");
    let (_, metrics) = http_get_as(&a.metrics, Some(&admin));
    assert!(
        metrics.contains("tessera_coordinator_role{role=\"active\"} 1"),
        "{metrics}"
    );
    let (_, metrics) = http_get(&b.metrics);
    assert!(
        metrics.contains("tessera_coordinator_role{role=\"standby\"} 1"),
        "{metrics}"
    );

    // Two workers that know both coordinators.
    let env = [("TESSERA_TOKEN", worker_token.as_str())];
    let wa = worker_env(&both, dir.path(), "wa", &[], &env);
    let wb = worker_env(&both, dir.path(), "wb", &[], &env);
    let job = submit(&both, &scene, &["--frames", "1-6"]);
    let before = wait_for(&both, job, LONG, "two frames", |j| {
        j["frames_done"].as_u64().unwrap() >= 2
    });
    a.proc.kill9();
    let killed = Instant::now();
    assert!(
        before["state"] == "running",
        "the job must still run when the active one dies: {before:#}"
    );
    let acknowledged: Vec<(u64, serde_json::Value)> = before["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["state"] == "done")
        .map(|t| (t["index"].as_u64().unwrap(), t.clone()))
        .collect();
    assert!(acknowledged.len() >= 2, "{before:#}");

    // The standby takes over within --failover-seconds (3 here; 10 s allows
    // for a busy machine), loads the state and serves.
    assert!(
        b.wait_line("active (epoch", Duration::from_secs(10))
            .is_some(),
        "no takeover within 10 s: {:?}\n{}",
        b.lines(),
        b.proc.log()
    );
    eprintln!(
        "takeover {:.2} s after the kill",
        killed.elapsed().as_secs_f64()
    );
    let done = wait_for(&both, job, LONG, "the job to finish", |j| {
        j["state"] == "done" || j["state"] == "failed"
    });
    assert_eq!(done["state"], "done", "{done:#}");
    assert_eq!(done["frames_done"], 6);
    fetch_exact(&both, job, &scene, 1..=6, dir.path());

    // Nothing acknowledged before the kill was rendered again: each such task
    // is done in the same attempt, with one completion in the workers' logs.
    let after: BTreeMap<u64, serde_json::Value> = done["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["index"].as_u64().unwrap(), t.clone()))
        .collect();
    let counts = completions(&[wa.log(), wb.log()]);
    for (index, t) in &acknowledged {
        assert_eq!(after[index]["attempts"], t["attempts"], "task {index}");
        let prefix = format!("{job}.{index}.");
        let n: usize = counts
            .iter()
            .filter(|(lease, _)| lease.starts_with(&prefix))
            .map(|(_, n)| n)
            .sum();
        assert_eq!(n, 1, "task {index} was completed {n} times: {counts:?}");
    }
    let b_log = b.proc.log();
    assert!(
        b_log.contains("recovered state") && b_log.contains("open=1"),
        "{b_log}"
    );

    // The killed one comes back as standby, naming the new active one.
    let a2 = PgCoordinator::start(&data_a, &a.addr, &pg.url(), &blobs, &ha, &s3_env);
    let line = a2
        .wait_line("standby", Duration::from_secs(30))
        .unwrap_or_else(|| panic!("{:?}\n{}", a2.lines(), a2.proc.log()));
    assert!(line.contains(&b.url), "{line}");
    let roles = cli_ok(&both, &["coordinator", "--status"]);
    assert!(roles.contains(&format!("{}  standby", a.url)), "{roles}");
    assert!(roles.contains(&format!("{}  active", b.url)), "{roles}");
    // Clients still reach the farm through either order of addresses.
    let other = format!("{},{}", a.url, b.url);
    assert_eq!(status(&other, job)["state"], "done");
}
