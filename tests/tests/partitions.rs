//! Network partitions between workers (and clients) and the coordinator,
//! made with network namespaces the test creates itself
//! ([`tessera_tests::netns`]): real coordinator, real workers inside
//! namespaces, real Blender.
//!
//! * A worker cut off mid-render: its lease expires, the task is served to
//!   another worker, and its late result changes nothing.
//! * Workers and a waiting client cut off from the coordinator (which still
//!   reaches its store): leases expire, nothing is lost, work and the client
//!   resume when the link heals.
//! * Packet loss and latency between workers and the coordinator: the job
//!   finishes exact with no work done twice beyond leases that expired.
//!
//! Latency comes from a userspace proxy ([`SilentProxy::with_delay`]): the
//! kernel here has no `netem`. Each test prints its figures on stderr
//! (`--nocapture` shows them).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use tessera_tests::netns::NetNs;
use tessera_tests::proxy::SilentProxy;
use tessera_tests::*;

const LONG: Duration = Duration::from_secs(120);

/// A coordinator the namespaces can reach (all addresses, plain text: the
/// links are the test's own) with a short lease and metrics on loopback.
fn coordinator(dir: &Path, lease_ttl: &str) -> Coordinator {
    Coordinator::start(
        &dir.join("data"),
        "0.0.0.0:0",
        &[
            "--allow-plaintext",
            "--lease-ttl",
            lease_ttl,
            "--http",
            "127.0.0.1:0",
        ],
    )
}

fn port(coord: &Coordinator) -> &str {
    coord.addr.rsplit(':').next().unwrap()
}

/// The coordinator's URL as seen from inside `ns`.
fn url_in(ns: &NetNs, coord: &Coordinator) -> String {
    format!("http://{}:{}", ns.host_ip(), port(coord))
}

/// `tessera_leases_expired_total` on the coordinator's metrics.
fn leases_expired(coord: &Coordinator) -> f64 {
    let url = coord.metrics.as_ref().expect("started with --http");
    let body = http_get_as(url, Some(&coord.admin_token())).1;
    tessera_tests::load::observe::metric(&body, "tessera_leases_expired_total").unwrap_or(0.0)
}

/// How each attempt at task `index` ended.
fn ends(job: &Value, index: usize) -> Vec<String> {
    job["tasks"][index]["attempt_log"]
        .as_array()
        .map(|log| {
            log.iter()
                .map(|a| a["end"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Leases (`JOB.TASK.GRANT`) on the coordinator's log lines that say `what`.
fn leases_logged(log: &str, what: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains(what))
        .filter_map(|l| {
            Some(
                l.split("lease=")
                    .nth(1)?
                    .split_whitespace()
                    .next()?
                    .to_string(),
            )
        })
        .collect()
}

/// Asserts every task of `job` was completed exactly once: it is done, and
/// of the results the coordinator received for it (its log) all but one
/// were ignored as duplicates. The attempt log is not enough alone: a late
/// result that lands while its expired task waits in the queue is recorded
/// without a `done` attempt. Returns how many tasks were granted to more
/// than one lease (work that started again).
fn assert_done_once(job: &Value, coordinator_log: &str) -> usize {
    let id = job["id"].as_u64().unwrap();
    let received = leases_logged(coordinator_log, "task result received");
    let duplicates = leases_logged(coordinator_log, "duplicate result ignored");
    let tasks = job["tasks"].as_array().expect("tasks in the job's view");
    let mut again = 0;
    for (i, task) in tasks.iter().enumerate() {
        let prefix = format!("{id}.{i}.");
        let of_task = |l: &Vec<String>| l.iter().filter(|x| x.starts_with(&prefix)).count();
        let recorded = of_task(&received) - of_task(&duplicates);
        assert_eq!(task["state"], "done", "task {i}: {task:#}");
        assert_eq!(
            recorded, 1,
            "task {i} has {recorded} results recorded: {task:#}"
        );
        let ends = ends(job, i);
        let done = ends.iter().filter(|e| *e == "done").count();
        assert!(done <= 1, "task {i} has {done} attempts done: {task:#}");
        let mut grants: Vec<u64> = task["attempt_log"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a["grant"].as_u64())
            .collect();
        grants.extend(
            received
                .iter()
                .filter_map(|l| l.strip_prefix(&prefix)?.parse::<u64>().ok()),
        );
        grants.sort_unstable();
        grants.dedup();
        if grants.len() > 1 {
            again += 1;
        }
    }
    again
}

/// The lease id (`JOB.TASK.GRANT`) on the first line of `log` that has `what`.
fn lease_on(log: &str, what: &str) -> Option<String> {
    let line = log.lines().find(|l| l.contains(what))?;
    let lease = line.split("lease=").nth(1)?.split_whitespace().next()?;
    Some(lease.to_string())
}

/// Whether a Blender process runs inside `ns`.
fn blender_in(ns: &NetNs) -> bool {
    ns.pids().iter().any(|p| {
        std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.starts_with("blender"))
    })
}

/// A `tessera` client command inside `ns`, as the admin, bounded by `timeout`
/// seconds so that a call the partition hangs cannot hang the test.
fn client_in(ns: &NetNs, coord: &Coordinator, timeout: u32, args: &[&str]) -> Command {
    let mut cmd = ns.command("timeout");
    cmd.arg(timeout.to_string())
        .arg(tessera())
        .args(args)
        .env("TESSERA_COORDINATOR", url_in(ns, coord))
        .env("TESSERA_TOKEN", coord.admin_token())
        .env("XDG_CONFIG_HOME", "/nonexistent");
    cmd
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// A worker cut off silently mid-render stops renewing: its lease expires
/// after the TTL and the task goes to a worker on the host. Once healed,
/// the cut-off worker's late word on its lease (a duplicate result, a
/// refused one, or a "stop" answer to its renewal) changes nothing: one
/// completion, by the second worker's grant, and every frame exact.
#[test]
fn a_worker_cut_off_mid_render_loses_its_lease_and_its_late_result_changes_nothing() {
    let test = "a_worker_cut_off_mid_render_loses_its_lease_and_its_late_result_changes_nothing";
    let Some(ns) = NetNs::create_or_skip(test) else {
        return;
    };
    let scene = scene(&[
        "--kind",
        "anim",
        "--width",
        "96",
        "--height",
        "72",
        "--samples",
        "48",
        "--frames",
        "3",
    ]);
    let dir = scratch();
    let coord = coordinator(dir.path(), "3");
    let url = coord.url.clone();
    let cut_off = ns.worker(
        &url_in(&ns, &coord),
        &worker_token(&url),
        dir.path(),
        "cut-off",
    );
    // One task of three frames: whoever holds it renders the whole job.
    let job = submit(&url, &scene, &["--frames", "1-3", "--chunk", "3"]);

    // Mid-render: the lease is granted and Blender runs in the namespace.
    assert!(
        eventually(LONG, || cut_off.log().contains("task started")
            && blender_in(&ns)),
        "the worker in the namespace did not start rendering:\n{}",
        cut_off.log()
    );
    let lost = lease_on(&cut_off.log(), "task started").expect("the lease in the log");
    let cut_off_id = workers_by_name(&url)["cut-off"]["id"].clone();
    ns.cut(Duration::from_secs(90));
    let cut = Instant::now();
    let _host = worker(&url, dir.path(), "host");

    let expired = wait_for(&url, job, LONG, "the cut-off lease to expire", |j| {
        ends(j, 0).iter().any(|e| e == "expired")
    });
    let t_expired = cut.elapsed();
    assert_eq!(expired["tasks_done"], 0, "{expired:#}");
    // Served again: leased to the host worker, or (on a slow poll) already done.
    let served = wait_for(&url, job, LONG, "the task served to the host worker", |j| {
        let t = &j["tasks"][0];
        (t["state"] == "leased" && t["worker"] != cut_off_id) || t["state"] == "done"
    });
    let t_served = cut.elapsed();
    assert_eq!(ends(&served, 0)[0], "expired");
    let done = wait_for(&url, job, LONG, "the job to end", |j| {
        j["state"] == "done" || j["state"] == "failed"
    });
    let t_done = cut.elapsed();
    assert_eq!(done["state"], "done", "{done:#}");
    assert!(
        leases_expired(&coord) >= 1.0,
        "the metric counts the expired lease"
    );

    // The link heals: the cut-off worker's late word on its lease is taken
    // as a duplicate, refused, or answered with "stop"; none of it counts.
    let healed = Instant::now();
    ns.heal();
    let outcome = |c: &str, w: &str| -> Option<&'static str> {
        if c.lines()
            .any(|l| l.contains("duplicate result ignored") && l.contains(&format!("lease={lost}")))
        {
            Some("late result ignored as a duplicate")
        } else if w.contains("result not recorded") || w.contains("refused the result") {
            Some("late result refused")
        } else if w.contains("lease lost or job ended") {
            Some("render stopped: the lease was lost")
        } else {
            None
        }
    };
    assert!(
        eventually(LONG, || outcome(&coord.proc.log(), &cut_off.log())
            .is_some()),
        "the cut-off worker was not heard from after the heal:\nworker:\n{}\ncoordinator:\n{}",
        cut_off.log(),
        coord.proc.log()
    );
    let t_heard = healed.elapsed();
    let what = outcome(&coord.proc.log(), &cut_off.log()).unwrap();

    // Nothing changed: one completion, by the host worker's grant.
    let after = status(&url, job);
    assert_eq!(after["state"], "done");
    assert_eq!(after["frames_done"], 3);
    assert_eq!(ends(&after, 0), ["expired", "done"], "{after:#}");
    assert_done_once(&after, &coord.proc.log());
    let grant_done = after["tasks"][0]["attempt_log"][1]["grant"]
        .as_u64()
        .unwrap();
    assert_ne!(
        lost,
        format!("{job}.0.{grant_done}"),
        "the recorded result is the lost lease's"
    );
    fetch_exact(&url, job, &scene, 1..=3, dir.path());
    eprintln!(
        "partition figures: lease expired {} after the cut (--lease-ttl 3), served again at {}, job done at {}; after the heal: {what} in {}",
        secs(t_expired),
        secs(t_served),
        secs(t_done),
        secs(t_heard)
    );
}

/// Workers and a client on one side of a cut, the coordinator (with its
/// store) on the other. What happens: the leases expire after the TTL and
/// their tasks wait in the queue; the coordinator records nothing new and
/// goes on serving the host side; a new call from the cut-off side fails
/// after the connect timeout saying it cannot reach the coordinator, while
/// calls in flight (the client's wait, the workers' polls and uploads) stay
/// silent. When the link heals they go on: late results of expired leases
/// are taken if their task was not done since, the job finishes, and the
/// waiting client ends with every frame exact.
#[test]
fn workers_and_a_client_cut_off_from_the_coordinator_resume_when_healed() {
    let test = "workers_and_a_client_cut_off_from_the_coordinator_resume_when_healed";
    let Some(site) = NetNs::create_or_skip(test) else {
        return;
    };
    let scene = scene(&[
        "--kind",
        "anim",
        "--width",
        "64",
        "--height",
        "48",
        "--samples",
        "32",
        "--frames",
        "6",
    ]);
    let dir = scratch();
    let coord = coordinator(dir.path(), "3");
    let url = coord.url.clone();
    let (inner, token) = (url_in(&site, &coord), worker_token(&url));
    let _w1 = site.worker(&inner, &token, dir.path(), "w1");
    let _w2 = site.worker(&inner, &token, dir.path(), "w2");
    // The artist's client is on the workers' side of the cut: it submits,
    // waits and downloads.
    let out = dir.path().join("client-out");
    let submit_cmd = client_in(
        &site,
        &coord,
        300,
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
    let client_log = dir.path().join("client.log");
    let mut client = site.spawn(submit_cmd, &client_log);
    let mut job = 0;
    assert!(
        eventually(LONG, || {
            let jobs: Value = serde_json::from_str(&cli_ok(&url, &["jobs", "--json"])).unwrap();
            job = jobs[0]["id"].as_u64().unwrap_or(0);
            job != 0
        }),
        "the client in the namespace did not submit:\n{}",
        std::fs::read_to_string(&client_log).unwrap_or_default()
    );
    // Two slots; each may hold a task leased ahead too.
    let before = wait_for(&url, job, LONG, "both workers busy", |j| {
        j["tasks_running"].as_u64().unwrap() >= 2
    });
    assert_ne!(before["state"], "done");

    site.cut(Duration::from_secs(60));
    let cut = Instant::now();
    let stalled = wait_for(&url, job, LONG, "every lease to expire", |j| {
        j["tasks_running"] == 0
    });
    let t_expired = cut.elapsed();
    // Both workers were busy a moment before the cut: their leases expire
    // (one may have been between tasks just then).
    let expired_in_cut = leases_expired(&coord);
    assert!(expired_in_cut >= 1.0, "no lease expired");
    // While cut off, a new client call fails within its connect timeout,
    // saying why, instead of hanging.
    let called = Instant::now();
    let tried = client_in(&site, &coord, 60, &["status", &job.to_string()])
        .output()
        .unwrap();
    let t_refused = called.elapsed();
    assert_eq!(
        tried.status.code(),
        Some(1),
        "a client cut off from the coordinator fails (rc 124 would be a hang): {}",
        String::from_utf8_lossy(&tried.stderr)
    );
    assert!(
        String::from_utf8_lossy(&tried.stderr).contains("cannot reach the coordinator"),
        "{}",
        String::from_utf8_lossy(&tried.stderr)
    );
    // The coordinator, unreachable, records nothing new meanwhile.
    let held = status(&url, job);
    assert_eq!(held["frames_done"], stalled["frames_done"]);
    assert_eq!(held["tasks_running"], 0);
    assert_eq!(held["state"], "running");

    let healed = Instant::now();
    site.heal();
    let frames_at_heal = held["frames_done"].as_u64().unwrap();
    wait_for(&url, job, LONG, "work to resume", |j| {
        j["tasks_running"].as_u64().unwrap() > 0
            || j["frames_done"].as_u64().unwrap() > frames_at_heal
    });
    let t_resumed = healed.elapsed();
    let done = wait_for(&url, job, LONG, "the job to end", |j| {
        j["state"] == "done" || j["state"] == "failed"
    });
    let t_done = healed.elapsed();
    assert_eq!(done["state"], "done", "{done:#}");
    let again = assert_done_once(&done, &coord.proc.log());
    let expired = leases_expired(&coord);
    assert!(
        again as f64 <= expired,
        "{again} tasks ran again, {expired} leases expired"
    );

    // The waiting client rode out the cut: it ends well, with every frame.
    assert!(
        eventually(LONG, || !client.alive()),
        "the client is still waiting after the job ended:\n{}",
        std::fs::read_to_string(&client_log).unwrap_or_default()
    );
    let rc = client.child.wait().unwrap();
    assert!(
        rc.success(),
        "the client failed ({rc:?}):\n{}",
        std::fs::read_to_string(&client_log).unwrap_or_default()
    );
    let refs = dir.path().join("refs");
    reference(&scene, 1, 6, &refs);
    assert_matches_reference(&out, &refs, 1..=6);
    eprintln!(
        "partition figures: {expired_in_cut} leases expired {} after the cut (--lease-ttl 3); a new client call failed in {}; after the heal work resumed in {} and the job was done in {} ({} tasks ran again, {} leases expired)",
        secs(t_expired),
        secs(t_refused),
        secs(t_resumed),
        secs(t_done),
        again,
        expired
    );
}

/// Two workers behind a link that drops 10 % of packets each way and a
/// proxy that adds 200 ms each way: the job finishes exact, each task done
/// once, and no task rendered twice unless a lease really expired.
#[test]
fn packet_loss_and_latency_to_the_workers_cost_no_duplicate_work() {
    let test = "packet_loss_and_latency_to_the_workers_cost_no_duplicate_work";
    let Some(ns) = NetNs::create_or_skip(test) else {
        return;
    };
    let scene = scene(&[
        "--kind",
        "anim",
        "--width",
        "64",
        "--height",
        "48",
        "--samples",
        "16",
        "--frames",
        "6",
    ]);
    let dir = scratch();
    let coord = coordinator(dir.path(), "5");
    let url = coord.url.clone();
    // Workers reach the coordinator through a proxy on the host end of
    // their link that holds every chunk 200 ms each way, over a link that
    // drops 5 % of packets each way.
    let proxy =
        SilentProxy::with_delay(ns.host_ip(), &format!("127.0.0.1:{}", port(&coord)), DELAY)
            .unwrap();
    ns.lose(LOSS, Duration::from_secs(150));
    let inner = format!("http://{}", proxy.addr());
    let token = worker_token(&url);
    let started = Instant::now();
    let _w1 = ns.worker(&inner, &token, dir.path(), "w1");
    let _w2 = ns.worker(&inner, &token, dir.path(), "w2");
    let job = submit(&url, &scene, &["--frames", "1-6"]);
    let done = wait_for(&url, job, LONG, "the job to end", |j| {
        j["state"] == "done" || j["state"] == "failed"
    });
    let took = started.elapsed();
    let dropped = ns.dropped();
    ns.heal();
    assert!(dropped > 0, "the lossy link dropped no packet");
    assert_eq!(done["state"], "done", "{done:#}");
    let again = assert_done_once(&done, &coord.proc.log());
    let expired = leases_expired(&coord);
    assert!(
        again as f64 <= expired,
        "{again} tasks were rendered more than once but only {expired} leases expired: {done:#}"
    );
    fetch_exact(&url, job, &scene, 1..=6, dir.path());
    eprintln!(
        "lossy link figures: {:.0} % loss each way, {} ms added each way: 6 frames in {} on 2 workers ({dropped} packets dropped); {again} tasks rendered twice, {expired} leases expired",
        LOSS * 100.0,
        DELAY.as_millis(),
        secs(took)
    );
}

const LOSS: f64 = 0.10;
const DELAY: Duration = Duration::from_millis(200);

/// A client in a namespace talks to an echo server on the host; a cut
/// makes the connection silent (no reset), a heal lets the held bytes
/// through, and dropping the namespace leaves nothing behind.
#[test]
fn a_cut_is_silent_a_heal_restores_and_drop_cleans_up() {
    use std::io::{BufRead, BufReader, Write};
    use std::process::Stdio;
    let Some(ns) = NetNs::create_or_skip("a_cut_is_silent_a_heal_restores_and_drop_cleans_up")
    else {
        return;
    };
    let echo = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = echo.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in echo.incoming().flatten() {
            std::thread::spawn(move || {
                let mut r = s.try_clone().unwrap();
                let mut w = s;
                let _ = std::io::copy(&mut r, &mut w);
            });
        }
    });
    // A line-echoing client inside: it prints what comes back, or dies on
    // an error (a reset would show as its exit).
    let script = format!(
        "import socket,sys\n\
         s=socket.create_connection(('{}',{port}),timeout=60)\n\
         for line in sys.stdin:\n\
         \x20 s.sendall(line.encode())\n\
         \x20 print(s.recv(100).decode().strip(),flush=True)\n",
        ns.host_ip()
    );
    let mut child = ns
        .command("python3")
        .args(["-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    writeln!(stdin, "one").unwrap();
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), "one");
    ns.cut(Duration::from_secs(30));
    writeln!(stdin, "two").unwrap();
    if let Ok(got) = rx.recv_timeout(Duration::from_secs(2)) {
        panic!("nothing crosses a cut link, not even a reset; got {got:?}");
    }
    let healed = Instant::now();
    ns.heal();
    let back = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(back, "two", "the held bytes arrive once healed");
    eprintln!("echo answered {} after the heal", secs(healed.elapsed()));

    // A fault outlives no bound.
    ns.cut(Duration::from_millis(300));
    let drops = || {
        let out = ns.command("iptables").arg("-S").output().unwrap();
        String::from_utf8_lossy(&out.stdout).matches("DROP").count()
    };
    assert_eq!(drops(), 2);
    assert!(eventually(Duration::from_secs(5), || drops() == 0));

    let (name, host_if) = (ns.name().to_string(), ns.host_if().to_string());
    let pid = child.id();
    drop(ns);
    let _ = child.wait();
    assert!(!process_alive(pid), "the namespace's processes are killed");
    let listed = Command::new("ip").args(["netns", "list"]).output().unwrap();
    assert!(!String::from_utf8_lossy(&listed.stdout).contains(&name));
    let link = Command::new("ip")
        .args(["link", "show", &host_if])
        .output()
        .unwrap();
    assert!(!link.status.success(), "the veth pair is gone");
}

/// The delay proxy holds each chunk its delay in each direction: an echo
/// through it takes at least two delays, and bytes keep their order.
#[test]
fn the_delay_proxy_adds_its_latency_each_way() {
    use std::io::{Read, Write};
    let echo = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let target = echo.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for s in echo.incoming().flatten() {
            std::thread::spawn(move || {
                let mut r = s.try_clone().unwrap();
                let mut w = s;
                let _ = std::io::copy(&mut r, &mut w);
            });
        }
    });
    let proxy = SilentProxy::with_delay("127.0.0.1", &target, DELAY).unwrap();
    let mut c = std::net::TcpStream::connect(proxy.addr()).unwrap();
    c.set_nodelay(true).unwrap();
    let sent = Instant::now();
    for chunk in [&b"abc"[..], b"def", b"ghi"] {
        c.write_all(chunk).unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut got = [0u8; 9];
    c.read_exact(&mut got).unwrap();
    let rtt = sent.elapsed();
    assert_eq!(&got, b"abcdefghi");
    assert!(rtt >= DELAY * 2, "{rtt:?}");
    // Chunks are timed from their own arrival, not queued behind each
    // other's delays.
    assert!(rtt < DELAY * 2 + Duration::from_millis(300), "{rtt:?}");
}

/// Workers cut off from the active coordinator of a pair on PostgreSQL,
/// while they still reach the standby and the active one still reaches
/// PostgreSQL: there is no failover (the active one keeps renewing its
/// leadership). The workers' calls to it run into their deadlines; the
/// standby answers that it is standby, naming the active one, so they keep
/// trying it; their leases expire. When the link heals they go on, and the
/// job finishes exact with every task done once.
#[test]
fn workers_cut_off_from_the_active_but_not_the_standby_wait_for_it() {
    use tessera_tests::postgres::{PgCoordinator, PgServer};
    let test = "workers_cut_off_from_the_active_but_not_the_standby";
    let Some(pg) = PgServer::start_or_skip(test) else {
        return;
    };
    let Some(ns) = NetNs::create_or_skip(test) else {
        return;
    };
    let dir = scratch();
    let scene = scene(&["--kind", "anim", "--frames", "8", "--samples", "128"]);
    let blobs = dir.path().join("blobs");
    let blobs = blobs.to_str().unwrap();
    let ha = ["--lease-ttl", "3", "--failover-seconds", "3"];
    let (data_a, data_b) = (dir.path().join("a"), dir.path().join("b"));
    let a = PgCoordinator::start(&data_a, "127.0.0.1:0", &pg.url(), blobs, &ha, &[]);
    assert!(
        a.wait_line("active (epoch", LONG).is_some(),
        "{}",
        a.proc.log()
    );
    let b = PgCoordinator::start(&data_b, "127.0.0.1:0", &pg.url(), blobs, &ha, &[]);
    assert!(b.wait_line("standby", LONG).is_some(), "{}", b.proc.log());
    let both = format!("{},{}", a.url, b.url);
    let (admin, token) = farm_tokens(&data_a, &a.url, &[&a.url, &b.url, &both]);
    // The workers reach each coordinator through a forwarder on the host
    // side of their link: the cut drops the packets to A's only.
    let to_a = SilentProxy::with_delay(ns.host_ip(), &a.addr, Duration::ZERO).unwrap();
    let to_b = SilentProxy::with_delay(ns.host_ip(), &b.addr, Duration::ZERO).unwrap();
    let urls = format!("http://{},http://{}", to_a.addr(), to_b.addr());
    let workers: Vec<Proc> = ["w1", "w2"]
        .iter()
        .map(|n| ns.worker(&urls, &token, dir.path(), n))
        .collect();
    let job = submit(&both, &scene, &["--frames", "1-8"]);
    wait_for(&both, job, LONG, "a frame", |j| {
        j["frames_done"].as_u64().unwrap() >= 1
    });
    let expired_before = {
        let body = http_get_as(&a.metrics, Some(&admin)).1;
        tessera_tests::load::observe::metric(&body, "tessera_leases_expired_total").unwrap_or(0.0)
    };
    let cut = Instant::now();
    ns.cut_to(ns.host_ip(), to_a.port(), Duration::from_secs(60));
    // The leases on A expire; A stays active all along, B standby.
    assert!(
        eventually(Duration::from_secs(20), || {
            let body = http_get_as(&a.metrics, Some(&admin)).1;
            tessera_tests::load::observe::metric(&body, "tessera_leases_expired_total")
                .unwrap_or(0.0)
                > expired_before
        }),
        "no lease expired on A during the cut"
    );
    let expired_in = cut.elapsed();
    std::thread::sleep(Duration::from_secs(4));
    let roles = cli(&both, &["coordinator", "--status"]);
    let roles = String::from_utf8_lossy(&roles.stdout).to_string();
    assert!(
        roles.contains(&format!("{}  active", a.url))
            && roles.contains(&format!("{}  standby", b.url)),
        "no failover while A reaches PostgreSQL: {roles}"
    );
    let held = wait_for(&both, job, LONG, "the job's view", |_| true);
    ns.heal();
    let healed = Instant::now();
    let done = wait_for(&both, job, LONG, "the job to finish", |j| {
        j["state"] == "done" || j["state"] == "failed"
    });
    assert_eq!(done["state"], "done", "{done:#}");
    let took = healed.elapsed();
    fetch_exact(&both, job, &scene, 1..=8, dir.path());
    // Each task done once, by the attempt its worker saw acknowledged.
    let acked = acknowledged(&workers.iter().map(Proc::log).collect::<Vec<_>>());
    for task in done["tasks"].as_array().expect("tasks in the job's view") {
        let index = task["index"].as_u64().unwrap();
        let log = task["attempt_log"].as_array().cloned().unwrap_or_default();
        let grants: Vec<u64> = log
            .iter()
            .filter(|a| a["end"] == "done")
            .map(|a| a["grant"].as_u64().unwrap())
            .collect();
        assert_eq!(grants.len(), 1, "task {index} done once: {task:#}");
        let prefix = format!("{job}.{index}.");
        assert!(
            acked
                .keys()
                .filter_map(|l| l.strip_prefix(&prefix)?.parse::<u64>().ok())
                .all(|g| g == grants[0]),
            "task {index}: the workers saw another grant acknowledged: {acked:?} {task:#}"
        );
    }
    eprintln!(
        "workers cut off from the active only: a lease expired {} after the cut; {} of 8 frames done when the {} cut healed; the job was done {} after the heal; no failover",
        secs(expired_in),
        held["frames_done"],
        secs(healed.duration_since(cut)),
        secs(took)
    );
}
