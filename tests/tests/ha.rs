//! Coordinators on PostgreSQL, end to end: real coordinators, a real
//! PostgreSQL server, real workers and real Blender. One farm on the
//! PostgreSQL store; then an active and a standby coordinator, the active
//! one killed with SIGKILL mid-job, cut off from PostgreSQL by a silent
//! network, and PostgreSQL itself restarted mid-job.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use tessera_tests::postgres::{PgCoordinator, PgServer};
use tessera_tests::proxy::SilentProxy;
use tessera_tests::s3::s3_or_skip;
use tessera_tests::*;

const LONG: Duration = Duration::from_secs(240);

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
    farm_tokens(&data, &coord.url, &[&coord.url]);
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
    let (admin, worker_token) = farm_tokens(&data_a, &a.url, &[&a.url, &b.url, &both]);

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
    let job = submit(&both, &scene, &["--frames", "1-6", "--chunk", "1"]);
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
    let counts = tessera_tests::acknowledged(&[wa.log(), wb.log()]);
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

/// What a coordinator answers a client with now: `active`, `standby`, or
/// `unreachable` (no answer within a second, or an error without a role).
async fn role(url: &str, token: &str) -> &'static str {
    use tessera_proto as pb;
    let probe = async {
        let channel = tonic::transport::Endpoint::from_shared(url.to_string())
            .ok()?
            .connect_timeout(Duration::from_millis(500))
            .connect()
            .await
            .ok()?;
        let mut blobs = pb::blobs_client::BlobsClient::new(channel);
        let mut req = tonic::Request::new(pb::MissingBlobsRequest { digests: vec![] });
        req.metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().ok()?);
        Some(match blobs.missing_blobs(req).await {
            Ok(_) => "active",
            Err(s)
                if s.metadata()
                    .get("tessera-role")
                    .is_some_and(|v| v == "standby") =>
            {
                "standby"
            }
            Err(_) => "unreachable",
        })
    };
    tokio::time::timeout(Duration::from_secs(1), probe)
        .await
        .ok()
        .flatten()
        .unwrap_or("unreachable")
}

/// One look at both coordinators: when, A's role, B's role.
type Look = (Instant, &'static str, &'static str);

/// Polls both coordinators' roles side by side every 50 ms until `stop`.
fn poll_roles(
    a: String,
    b: String,
    token: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<Vec<Look>> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut looks = Vec::new();
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            let at = Instant::now();
            let (ra, rb) = rt.block_on(async { tokio::join!(role(&a, &token), role(&b, &token)) });
            looks.push((at, ra, rb));
            std::thread::sleep(Duration::from_millis(50));
        }
        looks
    })
}

/// Two coordinators on one PostgreSQL database (A reaching it at `url_a`,
/// B at `url_b`), blobs in one shared directory, and two workers that
/// know both.
struct Pair {
    a: PgCoordinator,
    b: PgCoordinator,
    both: String,
    admin: String,
    workers: Vec<Proc>,
}

impl Pair {
    fn start(
        dir: &Path,
        ns: Option<&tessera_tests::netns::NetNs>,
        url_a: &str,
        url_b: &str,
    ) -> Pair {
        let blobs = dir.join("blobs");
        let blobs = blobs.to_str().unwrap();
        let ha = ["--lease-ttl", "5", "--failover-seconds", "3"];
        let (data_a, data_b) = (dir.join("a"), dir.join("b"));
        let a = match ns {
            Some(ns) => PgCoordinator::start_in(ns, &data_a, url_a, blobs, &ha, &[]),
            None => PgCoordinator::start(&data_a, "127.0.0.1:0", url_a, blobs, &ha, &[]),
        };
        assert!(
            a.wait_line("active (epoch", Duration::from_secs(30))
                .is_some(),
            "{:?}\n{}",
            a.lines(),
            a.proc.log()
        );
        let b = PgCoordinator::start(&data_b, "127.0.0.1:0", url_b, blobs, &ha, &[]);
        assert!(
            b.wait_line("standby", Duration::from_secs(30)).is_some(),
            "{:?}\n{}",
            b.lines(),
            b.proc.log()
        );
        let both = format!("{},{}", a.url, b.url);
        let (admin, worker_token) = farm_tokens(&data_a, &a.url, &[&a.url, &b.url, &both]);
        let env = [("TESSERA_TOKEN", worker_token.as_str())];
        let workers = ["wa", "wb"]
            .iter()
            .map(|n| worker_env(&both, dir, n, &[], &env))
            .collect();
        Pair {
            a,
            b,
            both,
            admin,
            workers,
        }
    }

    fn worker_logs(&self) -> Vec<String> {
        self.workers.iter().map(|w| w.log()).collect()
    }

    /// Asserts that every task of `job` (`n` tasks) was completed once.
    fn assert_each_task_completed_once(&self, job: u64, n: u64) {
        let counts = acknowledged(&self.worker_logs());
        for index in 0..n {
            let prefix = format!("{job}.{index}.");
            let done: usize = counts
                .iter()
                .filter(|(lease, _)| lease.starts_with(&prefix))
                .map(|(_, n)| n)
                .sum();
            assert_eq!(
                done, 1,
                "task {index} was completed {done} times: {counts:?}"
            );
        }
    }
}

#[test]
fn a_silent_cut_between_the_active_and_postgres_hands_over_without_two_actives() {
    let Some(pg) = PgServer::start_or_skip("a_silent_cut_between_the_active_and_postgres") else {
        return;
    };
    let dir = scratch();
    let scene = scene(&["--kind", "anim", "--frames", "8", "--samples", "128"]);
    // A reaches PostgreSQL only through the proxy; B directly.
    let proxy = SilentProxy::start(&format!("127.0.0.1:{}", pg.port())).unwrap();
    let via_proxy = format!("postgres://tessera@127.0.0.1:{}/tessera", proxy.port());
    let mut pair = Pair::start(dir.path(), None, &via_proxy, &pg.url());
    cut_between_active_and_postgres(
        &mut pair,
        dir.path(),
        &scene,
        ("silent cut", "127.0.0.1"),
        &|| proxy.black_hole(),
        &|| proxy.restore(),
    );
}

/// The same cut made by the kernel: A runs in a network namespace of its
/// own and iptables there drops every packet between it and PostgreSQL
/// (reached through a forwarder on the host side of its link, as a pooler
/// would be), while its workers and clients still reach it.
#[test]
fn a_packet_drop_between_the_active_and_postgres_hands_over_without_two_actives() {
    let test = "a_packet_drop_between_the_active_and_postgres";
    let Some(pg) = PgServer::start_or_skip(test) else {
        return;
    };
    let Some(ns) = tessera_tests::netns::NetNs::create_or_skip(test) else {
        return;
    };
    let dir = scratch();
    let scene = scene(&["--kind", "anim", "--frames", "8", "--samples", "128"]);
    let forwarder = SilentProxy::with_delay(
        ns.host_ip(),
        &format!("127.0.0.1:{}", pg.port()),
        Duration::ZERO,
    )
    .unwrap();
    let url_a = format!(
        "postgres://tessera@{}:{}/tessera",
        ns.host_ip(),
        forwarder.port()
    );
    let mut pair = Pair::start(dir.path(), Some(&ns), &url_a, &pg.url());
    cut_between_active_and_postgres(
        &mut pair,
        dir.path(),
        &scene,
        ("packet drop", ns.host_ip()),
        &|| ns.cut_to(ns.host_ip(), forwarder.port(), Duration::from_secs(120)),
        &|| ns.heal(),
    );
}

/// Cuts A (active) from PostgreSQL mid-job with `cut`: A stops answering as
/// active, B takes over, clients never see two actives, the job finishes
/// exact with every task completed once; after `heal`, A is a standby
/// naming B. `what` names the cut in the figures; `store_host` is the host
/// A reaches PostgreSQL at.
fn cut_between_active_and_postgres(
    pair: &mut Pair,
    dir: &Path,
    scene: &Path,
    (what, store_host): (&str, &str),
    cut: &dyn Fn(),
    heal: &dyn Fn(),
) {
    let job = submit(&pair.both, scene, &["--frames", "1-6", "--chunk", "1"]);
    let before = wait_for(&pair.both, job, LONG, "two frames", |j| {
        j["frames_done"].as_u64().unwrap() >= 2
    });
    assert_eq!(before["state"], "running", "{before:#}");

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let poller = poll_roles(
        pair.a.url.clone(),
        pair.b.url.clone(),
        pair.admin.clone(),
        stop.clone(),
    );
    // Let the poller see A active first.
    std::thread::sleep(Duration::from_millis(300));
    cut();
    let cut = Instant::now();
    assert!(
        pair.b
            .wait_line("active (epoch", Duration::from_secs(20))
            .is_some(),
        "B did not take over: {:?}\n{}",
        pair.b.lines(),
        pair.b.proc.log()
    );
    let takeover = cut.elapsed();
    // While the cut lasts, A says what is down.
    assert!(
        eventually(Duration::from_secs(10), || http_get(&pair.a.metrics)
            .1
            .contains("tessera_store_up 0")),
        "{}",
        http_get(&pair.a.metrics).1
    );
    let roles = cli(&pair.both, &["coordinator", "--status"]);
    let roles = String::from_utf8_lossy(&roles.stdout).to_string();
    assert!(
        roles.contains(&format!("{}  standby", pair.a.url))
            && roles.contains(&format!("store: PostgreSQL at {store_host}"))
            && roles.contains("unreachable since"),
        "{roles}"
    );
    assert!(
        roles.contains(&format!("{}  active", pair.b.url)),
        "{roles}"
    );
    // A few more looks with B active and A cut off.
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let looks = poller.join().unwrap();
    let since_cut = |t: Instant| t.saturating_duration_since(cut).as_secs_f64();
    let shown: Vec<_> = looks
        .iter()
        .map(|(t, a, b)| format!("{:+.2}s A {a} B {b}", since_cut(*t)))
        .collect();
    let both_active: Vec<_> = looks
        .iter()
        .filter(|(_, a, b)| *a == "active" && *b == "active")
        .collect();
    assert!(both_active.is_empty(), "two actives: {shown:?}");
    let a_last = looks
        .iter()
        .rev()
        .find(|(_, a, _)| *a == "active")
        .map(|l| l.0)
        .expect("A was seen active");
    assert!(
        looks
            .iter()
            .any(|l| l.0 < cut && l.1 == "active" && l.2 == "standby"),
        "A active and B standby before the cut: {shown:?}"
    );
    let b_first = looks
        .iter()
        .find(|(_, _, b)| *b == "active")
        .map(|l| l.0)
        .unwrap_or_else(|| panic!("B never answered as active: {shown:?}"));
    assert!(
        a_last < b_first,
        "A answered as active after B did: {shown:?}"
    );
    eprintln!(
        "{what}: A last answered as active {:.2} s after the cut, B first {:.2} s after it (its takeover line {:.2} s)",
        since_cut(a_last),
        since_cut(b_first),
        takeover.as_secs_f64()
    );
    // The bounds (module doc of coordinator::ha) with F = 3 s: A stops by
    // F - F/6 = 2.5 s after the cut; B takes over by F + poll + deadlines
    // (3 + 0.75 + 2 x 1 s), then loads the state. Slack for a busy machine.
    assert!(
        since_cut(a_last) < 4.0,
        "A answered as active too long after the cut: {shown:?}"
    );
    assert!(
        takeover <= Duration::from_secs(10),
        "B took over {takeover:?} after the cut"
    );
    assert!(
        pair.a
            .wait_line("stepped down", Duration::from_secs(5))
            .is_some(),
        "{:?}",
        pair.a.lines()
    );

    let done = wait_for(&pair.both, job, LONG, "the job to finish", |j| {
        j["state"] == "done" || j["state"] == "failed"
    });
    assert_eq!(done["state"], "done", "{done:#}");
    fetch_exact(&pair.both, job, scene, 1..=6, dir);
    pair.assert_each_task_completed_once(job, 6);

    // The network heals: A comes back as standby, naming B, and stays alive.
    heal();
    let b_url = pair.b.url.clone();
    assert!(
        eventually(Duration::from_secs(15), || {
            let out = cli(&pair.both, &["coordinator", "--status"]);
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            text.contains(&format!(
                "{}  standby (this coordinator is standby; the active one is {b_url}",
                pair.a.url
            ))
        }),
        "{}",
        String::from_utf8_lossy(&cli(&pair.both, &["coordinator", "--status"]).stdout)
    );
    assert!(pair.a.proc.alive() && pair.b.proc.alive());
}

#[test]
fn postgres_restarting_mid_job_fast_or_immediate_stops_neither_coordinator() {
    let Some(pg) = PgServer::start_or_skip("postgres_restarting_mid_job") else {
        return;
    };
    let dir = scratch();
    // Enough frames that the job is still running when the second stop
    // comes: with 6, all were once done before it (the workers' first
    // frames no longer wait for Blender to start).
    let scene = scene(&["--kind", "anim", "--frames", "24", "--samples", "128"]);
    let mut pair = Pair::start(dir.path(), None, &pg.url(), &pg.url());
    let job = submit(&pair.both, &scene, &["--frames", "1-24", "--chunk", "1"]);
    for (mode, frames) in [("fast", 1), ("immediate", 3)] {
        let before = wait_for(&pair.both, job, LONG, "frames", |j| {
            j["frames_done"].as_u64().unwrap() >= frames
        });
        assert_eq!(before["state"], "running", "{before:#}");
        pg.stop(mode).unwrap();
        let down = Instant::now();
        // The active one refuses a write at once, naming PostgreSQL and
        // what to check; nothing hangs.
        let refused = cli_as(&pair.both, Some(&pair.admin), &["users", "add", "someone"]);
        let err = String::from_utf8_lossy(&refused.stderr).to_string();
        assert!(!refused.status.success(), "stored while down: {err}");
        assert!(
            err.contains("PostgreSQL") && err.contains("check that"),
            "-m {mode}: {err}"
        );
        assert!(
            down.elapsed() < Duration::from_secs(10),
            "refused only after {:?}",
            down.elapsed()
        );
        eprintln!(
            "\n-m {mode}: the active one refused a write: {}",
            err.trim()
        );
        // Both say what is down.
        for c in [&pair.a, &pair.b] {
            assert!(
                eventually(Duration::from_secs(10), || {
                    let (_, m) = http_get_as(&c.metrics, Some(&pair.admin));
                    m.contains("tessera_store_up 0")
                }),
                "{}",
                http_get_as(&c.metrics, Some(&pair.admin)).1
            );
        }
        // A write while PostgreSQL is down is refused promptly, and the
        // refusal names it (once each coordinator has noticed the outage).
        for url in [&pair.a.url, &pair.b.url] {
            let mut last = String::new();
            let named = eventually(Duration::from_secs(10), || {
                let started = Instant::now();
                let refused = cli_as(url, Some(&pair.admin), &["users", "add", "someone"]);
                last = String::from_utf8_lossy(&refused.stderr).to_string();
                assert!(!refused.status.success(), "stored while down: {last}");
                assert!(
                    started.elapsed() < Duration::from_secs(15),
                    "refused only after {:?}: {last}",
                    started.elapsed()
                );
                last.contains("PostgreSQL")
            });
            assert!(named, "-m {mode}, {url}: {last}");
            eprintln!("-m {mode}: {url} refused a write later: {}", last.trim());
        }
        eprintln!(
            "-m {mode}: PostgreSQL down for {:.1} s",
            down.elapsed().as_secs_f64()
        );
        pg.start_again().unwrap();
        assert!(pair.a.proc.alive(), "A exited:\n{}", pair.a.proc.log());
        assert!(pair.b.proc.alive(), "B exited:\n{}", pair.b.proc.log());
        // Leadership is decided again: exactly one active.
        let back = Instant::now();
        assert!(
            eventually(Duration::from_secs(20), || {
                let out = cli(&pair.both, &["coordinator", "--status"]);
                let text = String::from_utf8_lossy(&out.stdout).to_string();
                out.status.success() && text.matches("  active").count() == 1
            }),
            "{}\n{}\n{}",
            String::from_utf8_lossy(&cli(&pair.both, &["coordinator", "--status"]).stdout),
            pair.a.proc.log(),
            pair.b.proc.log()
        );
        eprintln!(
            "-m {mode}: one coordinator active {:.1} s after PostgreSQL was back",
            back.elapsed().as_secs_f64()
        );
    }
    let done = wait_for(&pair.both, job, LONG, "the job to finish", |j| {
        j["state"] == "done" || j["state"] == "failed"
    });
    assert_eq!(done["state"], "done", "{done:#}");
    fetch_exact(&pair.both, job, &scene, 1..=24, dir.path());
    assert!(pair.a.proc.alive() && pair.b.proc.alive());
    // The store is up again on both.
    for c in [&pair.a, &pair.b] {
        assert!(
            eventually(Duration::from_secs(10), || http_get_as(
                &c.metrics,
                Some(&pair.admin)
            )
            .1
            .contains("tessera_store_up 1")),
            "{}",
            http_get_as(&c.metrics, Some(&pair.admin)).1
        );
    }
}

#[test]
fn s3_killed_mid_job_and_started_again_loses_no_frame_and_says_it_is_down() {
    let test = "s3_killed_mid_job_and_started_again";
    let Some(pg) = PgServer::start_or_skip(test) else {
        return;
    };
    let Some(mut s3) = s3_or_skip(test) else {
        return;
    };
    let dir = scratch();
    let scene = scene(&["--kind", "anim", "--frames", "8", "--samples", "128"]);
    let data = dir.path().join("data");
    let blobs = s3.url("outage");
    let coord = PgCoordinator::start(&data, "127.0.0.1:0", &pg.url(), &blobs, &[], &s3.env());
    assert!(
        coord
            .wait_line("active (epoch 1)", Duration::from_secs(30))
            .is_some(),
        "{:?}\n{}",
        coord.lines(),
        coord.proc.log()
    );
    let (admin, worker_token) = farm_tokens(&data, &coord.url, &[&coord.url]);
    let env = [("TESSERA_TOKEN", worker_token.as_str())];
    let mut workers = vec![
        worker_env(&coord.url, dir.path(), "wa", &[], &env),
        worker_env(&coord.url, dir.path(), "wb", &[], &env),
    ];
    let metrics = || http_get_as(&coord.metrics, Some(&admin)).1;
    assert!(
        metrics().contains("\ntessera_blobs_up 1\n"),
        "{}",
        metrics()
    );
    let started = Instant::now();
    // Eight frames on two one-slot workers: each slot renders one and
    // holds one leased ahead, so tasks are still queued for a worker that
    // joins during the outage.
    let job = submit(&coord.url, &scene, &["--frames", "1-8", "--chunk", "1"]);
    let before = wait_for(&coord.url, job, LONG, "a frame", |j| {
        j["frames_done"].as_u64().unwrap() >= 1
    });
    assert_eq!(before["state"], "running", "{before:#}");

    s3.kill();
    let down = Instant::now();
    // While it is down, /metrics and `tessera status` say so.
    assert!(
        eventually(Duration::from_secs(15), || metrics()
            .contains("\ntessera_blobs_up 0\n")),
        "{}",
        metrics()
    );
    let noticed = down.elapsed();
    let text = cli_ok(&coord.url, &["status", &job.to_string()]);
    assert!(
        text.contains(&format!("blobs: S3 {blobs}")) && text.contains("unreachable since"),
        "{text}"
    );
    let json = status(&coord.url, job);
    assert!(
        json["outages"]
            .as_array()
            .is_some_and(|o| o.iter().any(|l| l.as_str().unwrap().starts_with("blobs: "))),
        "{json:#}"
    );
    // A worker that joins now must fetch the scene: its download is
    // retried, not failed.
    workers.push(worker_env(&coord.url, dir.path(), "wc", &[], &env));
    // Results in flight at the kill may land; after that nothing is
    // acknowledged until the frames can be stored.
    std::thread::sleep(Duration::from_secs(3));
    let frozen = status(&coord.url, job)["frames_done"].as_u64().unwrap();
    while down.elapsed() < Duration::from_secs(12) {
        std::thread::sleep(Duration::from_millis(500));
        let now = status(&coord.url, job);
        assert_eq!(
            now["frames_done"].as_u64().unwrap(),
            frozen,
            "a frame was acknowledged while S3 was down: {now:#}"
        );
    }
    let restarted = down.elapsed();
    s3.start_again().unwrap();
    let outage = down.elapsed();
    let back = Instant::now();
    assert!(
        eventually(Duration::from_secs(30), || metrics()
            .contains("\ntessera_blobs_up 1\n")),
        "{}",
        metrics()
    );
    let up_again = back.elapsed();
    wait_for(&coord.url, job, LONG, "a frame after S3 is back", |j| {
        j["frames_done"].as_u64().unwrap() > frozen
    });
    let next_frame = back.elapsed();
    let done = wait_for(&coord.url, job, LONG, "the job to finish", |j| {
        j["state"] == "done" || j["state"] == "failed"
    });
    assert_eq!(done["state"], "done", "{done:#}");
    let total = started.elapsed();
    assert!(
        done["outages"].as_array().is_none_or(|o| o.is_empty()),
        "{done:#}"
    );
    fetch_exact(&coord.url, job, &scene, 1..=8, dir.path());

    // Every task completed once, and both kinds of transfer were retried.
    let logs: Vec<String> = workers.iter().map(|w| w.log()).collect();
    let counts = acknowledged(&logs);
    for index in 0..8 {
        let prefix = format!("{job}.{index}.");
        let n: usize = counts
            .iter()
            .filter(|(lease, _)| lease.starts_with(&prefix))
            .map(|(_, n)| n)
            .sum();
        assert_eq!(n, 1, "task {index} was completed {n} times: {counts:?}");
    }
    let retries = |what: &str| {
        logs.iter()
            .flat_map(|l| l.lines())
            .filter(|l| l.contains(what) && l.contains("retrying in"))
            .count()
    };
    // A small result travels inside its Complete: retried as a report.
    let uploads = retries("uploading a frame") + retries("reporting a result");
    let downloads = retries("fetching the scene");
    assert!(downloads > 0, "no download was retried:\n{}", logs[2]);
    assert!(
        uploads > 0,
        "no result was sent again:\n{}",
        logs.join("\n")
    );
    // Every acknowledged frame's blob is in the bucket.
    let bucket = tessera_coordinator::blobs::s3::S3BlobStore::open_with(
        &blobs,
        1 << 30,
        &s3.env()
            .iter()
            .map(|(k, v)| (*k, v.as_str()))
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let keys = bucket.keys().unwrap();
    for o in done["outputs"].as_array().unwrap() {
        let d: tessera_coordinator::digest::Digest = o["digest"].as_str().unwrap().parse().unwrap();
        assert!(keys.contains(&bucket.key(&d)), "{o} is not in the bucket");
    }
    eprintln!(
        "S3 outage: killed, started again after {:.1} s, answering after {:.1} s; tessera_blobs_up 0 after {:.1} s, \
         1 again {:.1} s after it answered; next frame {:.1} s after that; job {:.1} s in all; \
         {uploads} upload and {downloads} download retries",
        restarted.as_secs_f64(),
        outage.as_secs_f64(),
        noticed.as_secs_f64(),
        up_again.as_secs_f64(),
        next_frame.as_secs_f64(),
        total.as_secs_f64()
    );
}
