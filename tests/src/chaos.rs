//! A chaos run: a farm on PostgreSQL and S3, with two coordinators and four
//! workers, renders an animation and a tiled frame set while random faults
//! hit it for a bounded time. Then every frame must be exact, every
//! completion a worker saw acknowledged must be the one the store recorded
//! (once per task), and no job may be left without a reason.
//!
//! `scripts/chaos.sh` runs the long version (`tessera-chaos`); the suite runs
//! a short one (`tests/tests/chaos.rs`). Faults come one at a time, each
//! healed before the next, chosen by a seeded generator so that a failing
//! run can be repeated with `--seed`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::netns::NetNs;
use crate::postgres::{PgCoordinator, PgServer};
use crate::proxy::SilentProxy;
use crate::s3::S3Server;
use crate::*;

/// A fault the run can inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// SIGKILL a worker mid-render; start it again a moment later.
    KillWorker,
    /// SIGKILL the active coordinator; the standby takes over; the killed
    /// one comes back as standby.
    KillCoordinator,
    /// Stop PostgreSQL (`pg_ctl stop -m fast` or `-m immediate`, chosen at
    /// random) for up to a few seconds, then start it again: the
    /// coordinators ride it out.
    RestartDatabase,
    /// SIGKILL the S3 server for a few seconds, then start it again on its
    /// data: uploads and downloads retry.
    KillS3,
    /// Cut a worker's network silently (every packet dropped, no reset) for
    /// up to 9 s: longer than the lease TTL, its leases expire.
    PartitionWorker,
    /// 200 ms more each way and 5 % packet loss on a worker's link for a
    /// few seconds.
    SlowLink,
}

impl Fault {
    /// Every fault, in the order `--faults` lists them.
    pub const ALL: [Fault; 6] = [
        Fault::KillWorker,
        Fault::KillCoordinator,
        Fault::RestartDatabase,
        Fault::KillS3,
        Fault::PartitionWorker,
        Fault::SlowLink,
    ];

    /// Whether it needs the workers in network namespaces.
    fn needs_links(self) -> bool {
        matches!(self, Fault::PartitionWorker | Fault::SlowLink)
    }

    /// Its name on the command line and in the report.
    pub fn name(self) -> &'static str {
        match self {
            Fault::KillWorker => "kill-worker",
            Fault::KillCoordinator => "kill-coordinator",
            Fault::RestartDatabase => "restart-database",
            Fault::KillS3 => "kill-s3",
            Fault::PartitionWorker => "partition-worker",
            Fault::SlowLink => "slow-link",
        }
    }

    /// Parses a name from [`Fault::name`].
    pub fn parse(s: &str) -> Result<Fault, String> {
        Fault::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Fault::ALL.iter().map(|f| f.name()).collect();
                format!("unknown fault {s:?}; the faults are {}", names.join(", "))
            })
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// How long faults are injected (fewer if the jobs end first).
    pub duration: Duration,
    /// Frames of the animation job.
    pub frames: u32,
    /// Frames of the tiled job (2x2 tiles each).
    pub tiled_frames: u32,
    /// Workers.
    pub workers: usize,
    /// Seed of the fault schedule.
    pub seed: u64,
    /// The faults to choose from.
    pub faults: Vec<Fault>,
    /// Where the farm's files go; a temporary directory when `None`.
    pub dir: Option<PathBuf>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            duration: Duration::from_secs(300),
            frames: 200,
            tiled_frames: 8,
            workers: 4,
            seed: 1,
            faults: Fault::ALL.to_vec(),
            dir: None,
        }
    }
}

/// The figures of a run that passed.
#[derive(Debug, Default)]
pub struct Report {
    /// Faults injected, by kind.
    pub injected: BTreeMap<&'static str, u32>,
    /// How long faults were injected.
    pub window: Duration,
    /// Frames delivered and checked against plain Blender.
    pub frames_exact: u32,
    /// Jobs submitted (rounds of two).
    pub jobs: usize,
    /// Tasks in all jobs.
    pub tasks: usize,
    /// Attempts that ended because their lease expired.
    pub leases_expired: usize,
    /// Tasks leased more than once: work that started again.
    pub rendered_again: usize,
    /// From the last fault healed to both jobs done.
    pub recovery: Duration,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let faults: Vec<String> = self
            .injected
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        writeln!(
            f,
            "faults injected over {:.0} s: {}",
            self.window.as_secs_f64(),
            if faults.is_empty() {
                "none".into()
            } else {
                faults.join(", ")
            }
        )?;
        writeln!(
            f,
            "frames exact: {} (jobs: {}, tasks: {})",
            self.frames_exact, self.jobs, self.tasks
        )?;
        writeln!(f, "leases expired: {}", self.leases_expired)?;
        writeln!(
            f,
            "tasks rendered again (leased more than once): {}",
            self.rendered_again
        )?;
        write!(
            f,
            "from the last fault to the jobs' end: {:.1} s",
            self.recovery.as_secs_f64()
        )
    }
}

/// A seeded xorshift generator: the same seed, the same fault schedule.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// A duration between `lo` and `hi` milliseconds.
    fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }
}

/// The farm under test.
struct Farm {
    dir: PathBuf,
    pg: PgServer,
    s3: S3Server,
    coordinators: Vec<(PathBuf, Option<PgCoordinator>, String)>,
    both: String,
    worker_token: String,
    workers: Vec<Option<Proc>>,
    /// Each worker's own network, when namespaces can be made here.
    links: Vec<Link>,
    /// Logs of workers killed along the way.
    old_logs: Vec<String>,
}

/// A worker's network: a namespace of its own, reaching each coordinator
/// through a proxy on the host side of its link (where latency is added,
/// this kernel having no `netem`).
struct Link {
    // Dropped first: its processes end before their proxies close.
    ns: NetNs,
    proxies: Vec<SilentProxy>,
    urls: String,
}

const HA: [&str; 4] = ["--lease-ttl", "5", "--failover-seconds", "3"];

impl Farm {
    fn start(dir: &Path, workers: usize, links: bool) -> Farm {
        let pg = PgServer::start().unwrap_or_else(|e| panic!("PostgreSQL did not start: {e}"));
        let s3 = S3Server::start().unwrap_or_else(|e| panic!("the S3 server did not start: {e}"));
        let blobs = s3.url("chaos");
        let mut coordinators = Vec::new();
        for name in ["a", "b"] {
            let data = dir.join(name);
            let c = PgCoordinator::start(&data, "127.0.0.1:0", &pg.url(), &blobs, &HA, &s3.env());
            assert!(
                c.wait_line(if name == "a" { "active" } else { "standby" }, LONG)
                    .is_some(),
                "coordinator {name} did not start: {:?}\n{}",
                c.lines(),
                c.proc.log()
            );
            let addr = c.addr.clone();
            coordinators.push((data, Some(c), addr));
        }
        let urls: Vec<String> = coordinators
            .iter()
            .map(|(_, _, addr)| format!("http://{addr}"))
            .collect();
        let both = urls.join(",");
        let (_, worker_token) =
            farm_tokens(&coordinators[0].0, &urls[0], &[&urls[0], &urls[1], &both]);
        let mut links_made = Vec::new();
        for _ in 0..workers {
            if !links {
                break;
            }
            let ns = NetNs::create().unwrap_or_else(|e| panic!("no network namespace: {e}"));
            let proxies: Vec<SilentProxy> = coordinators
                .iter()
                .map(|(_, _, addr)| {
                    SilentProxy::adjustable(ns.host_ip(), addr)
                        .unwrap_or_else(|e| panic!("no proxy on {}: {e}", ns.host_ip()))
                })
                .collect();
            let urls = proxies
                .iter()
                .map(|p| format!("http://{}", p.addr()))
                .collect::<Vec<_>>()
                .join(",");
            links_made.push(Link { ns, proxies, urls });
        }
        let mut farm = Farm {
            dir: dir.to_path_buf(),
            pg,
            s3,
            coordinators,
            both,
            worker_token,
            workers: Vec::new(),
            links: links_made,
            old_logs: Vec::new(),
        };
        for i in 0..workers {
            let w = farm.start_worker(i);
            farm.workers.push(Some(w));
        }
        farm
    }

    fn start_worker(&self, i: usize) -> Proc {
        let name = format!("w{i}");
        match self.links.get(i) {
            Some(link) => link
                .ns
                .worker(&link.urls, &self.worker_token, &self.dir, &name),
            None => {
                let env = [("TESSERA_TOKEN", self.worker_token.as_str())];
                worker_env(&self.both, &self.dir, &name, &[], &env)
            }
        }
    }

    /// The index of the coordinator that says it is active, if one does.
    fn active(&self) -> Option<usize> {
        let out = cli(&self.both, &["coordinator", "--status"]);
        let text = String::from_utf8_lossy(&out.stdout);
        self.coordinators.iter().position(|(_, c, addr)| {
            c.is_some() && text.contains(&format!("http://{addr}  active"))
        })
    }

    /// Injects `fault`, holds it a moment, and heals it.
    fn inject(&mut self, fault: Fault, rng: &mut Rng) -> bool {
        match fault {
            Fault::KillWorker => {
                let i = rng.below(self.workers.len() as u64) as usize;
                let Some(mut w) = self.workers[i].take() else {
                    return false;
                };
                w.kill9();
                self.old_logs.push(w.log());
                std::thread::sleep(rng.millis(500, 3000));
                self.workers[i] = Some(self.start_worker(i));
                true
            }
            Fault::KillCoordinator => {
                let Some(i) = self.active() else {
                    return false;
                };
                let (data, c, addr) = &mut self.coordinators[i];
                let Some(mut proc) = c.take() else {
                    return false;
                };
                proc.proc.kill9();
                // Down for a while; the standby takes over meanwhile.
                std::thread::sleep(rng.millis(1000, 5000));
                let again = PgCoordinator::start(
                    data,
                    addr,
                    &self.pg.url(),
                    &self.s3.url("chaos"),
                    &HA,
                    &self.s3.env(),
                );
                assert!(
                    eventually(LONG, || again
                        .lines()
                        .iter()
                        .any(|l| l.contains("standby") || l.contains("active"))),
                    "a killed coordinator did not come back: {:?}\n{}",
                    again.lines(),
                    again.proc.log()
                );
                *c = Some(again);
                true
            }
            Fault::KillS3 => {
                self.s3.kill();
                std::thread::sleep(rng.millis(1000, 5000));
                self.s3
                    .start_again()
                    .unwrap_or_else(|e| panic!("the S3 server did not start again: {e}"));
                true
            }
            Fault::PartitionWorker => {
                let Some(link) = self.links.get(rng.below(self.links.len() as u64) as usize) else {
                    return false;
                };
                let hold = rng.millis(2000, 9000);
                link.ns.cut(hold + Duration::from_secs(5));
                std::thread::sleep(hold);
                link.ns.heal();
                true
            }
            Fault::SlowLink => {
                let Some(link) = self.links.get(rng.below(self.links.len() as u64) as usize) else {
                    return false;
                };
                let hold = rng.millis(3000, 10000);
                for p in &link.proxies {
                    p.set_delay(Duration::from_millis(200));
                }
                link.ns.lose(0.05, hold + Duration::from_secs(5));
                std::thread::sleep(hold);
                link.ns.heal();
                for p in &link.proxies {
                    p.set_delay(Duration::ZERO);
                }
                true
            }
            Fault::RestartDatabase => {
                let mode = ["fast", "immediate"][rng.below(2) as usize];
                self.pg
                    .stop(mode)
                    .unwrap_or_else(|e| panic!("PostgreSQL did not stop: {e}"));
                std::thread::sleep(rng.millis(500, 4000));
                self.pg
                    .start_again()
                    .unwrap_or_else(|e| panic!("PostgreSQL did not start again: {e}"));
                true
            }
        }
    }

    fn worker_logs(&self) -> Vec<String> {
        let mut logs = self.old_logs.clone();
        logs.extend(self.workers.iter().flatten().map(Proc::log));
        logs
    }
}

const LONG: Duration = Duration::from_secs(60);

/// Submits a job, retrying while no coordinator is active (a fault may
/// have just been healed).
fn submit_retrying(url: &str, scene: &Path, args: &[&str]) -> u64 {
    let mut all = vec!["submit", scene.to_str().unwrap()];
    all.extend_from_slice(args);
    let deadline = Instant::now() + LONG;
    loop {
        let out = cli(url, &all);
        if out.status.success() {
            return String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse()
                .expect("submit prints the job id");
        }
        assert!(
            Instant::now() < deadline,
            "no coordinator took a submit for a minute: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The job's status, or `None` while no coordinator answers.
fn try_status(url: &str, job: u64) -> Option<serde_json::Value> {
    let out = cli(url, &["status", &job.to_string(), "--json"]);
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).ok())
        .flatten()
}

fn finished(v: &serde_json::Value) -> bool {
    matches!(v["state"].as_str(), Some("done" | "failed" | "canceled"))
}

/// Runs the chaos and checks the farm; panics with what went wrong.
pub fn run(opts: &Options) -> Report {
    let tmp = scratch();
    let dir = opts.dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(&dir).unwrap();
    let mut rng = Rng::new(opts.seed);
    let scene = dir.join("chaos.blend");
    make_scene(
        &scene,
        &[
            "--kind",
            "anim",
            "--frames",
            &opts.frames.max(opts.tiled_frames).to_string(),
            "--samples",
            "4",
        ],
    );
    // Partitions and slow links need the workers in namespaces of their
    // own (root and iptables); without them those faults are left out.
    let mut faults = opts.faults.clone();
    let links = faults.iter().any(|f| f.needs_links())
        && match crate::netns::ensure_iptables().and_then(|()| NetNs::create().map(drop)) {
            Ok(()) => true,
            Err(e) => {
                eprintln!(
                    "chaos: no partitions or slow links (cannot make a network namespace: {e})"
                );
                faults.retain(|f| !f.needs_links());
                false
            }
        };
    let mut farm = Farm::start(&dir, opts.workers, links);
    eprintln!(
        "chaos: rounds of an animation ({} frames) and a tiled job ({} frames in 2x2 tiles) on 2 coordinators and {} workers; faults for {} s (seed {})",
        opts.frames,
        opts.tiled_frames,
        opts.workers,
        opts.duration.as_secs(),
        opts.seed
    );

    // The jobs so far: (job, frames). A new round is submitted whenever the
    // last one is done, so the farm has work for every fault.
    let mut jobs: Vec<(u64, u32)> = Vec::new();
    let submit_round = |farm: &Farm, jobs: &mut Vec<(u64, u32)>| {
        let anim = submit_retrying(
            &farm.both,
            &scene,
            &["--frames", &format!("1-{}", opts.frames)],
        );
        let tiled = submit_retrying(
            &farm.both,
            &scene,
            &[
                "--frames",
                &format!("1-{}", opts.tiled_frames),
                "--tiles",
                "2x2",
            ],
        );
        jobs.push((anim, opts.frames));
        jobs.push((tiled, opts.tiled_frames));
    };
    submit_round(&farm, &mut jobs);

    let mut report = Report::default();
    let started = Instant::now();
    let mut last_fault = Instant::now();
    while started.elapsed() < opts.duration && !faults.is_empty() {
        std::thread::sleep(rng.millis(1000, 4000));
        let done = jobs[jobs.len() - 2..]
            .iter()
            .all(|(j, _)| try_status(&farm.both, *j).is_some_and(|v| finished(&v)));
        if done {
            submit_round(&farm, &mut jobs);
        }
        let fault = faults[rng.below(faults.len() as u64) as usize];
        if farm.inject(fault, &mut rng) {
            eprintln!(
                "chaos: {:>5.1} s {}",
                started.elapsed().as_secs_f64(),
                fault.name()
            );
            *report.injected.entry(fault.name()).or_default() += 1;
            last_fault = Instant::now();
        }
    }
    report.window = last_fault.duration_since(started);
    report.jobs = jobs.len();

    // Every job ends, and ends done; a job that fails says why.
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut views = Vec::new();
    for &(job, _) in &jobs {
        let view = loop {
            if let Some(v) = try_status(&farm.both, job).filter(finished) {
                break v;
            }
            assert!(
                Instant::now() < deadline,
                "job {job} did not finish within 10 minutes of the last fault: {:#}",
                try_status(&farm.both, job).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(250));
        };
        assert_eq!(view["state"], "done", "job {job} did not finish: {view:#}");
        views.push(view);
    }
    report.recovery = last_fault.elapsed();

    // Every coordinator still running answers, as the active one or as a
    // standby: none is left alive but deaf after its faults.
    let roles = eventually(LONG, || {
        let out = cli(&farm.both, &["coordinator", "--status"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let answering = text
            .lines()
            .filter(|l| l.contains("  active") || l.contains("  standby"))
            .count();
        answering == farm.coordinators.len()
    });
    assert!(
        roles,
        "a coordinator does not answer: {}",
        String::from_utf8_lossy(&cli(&farm.both, &["coordinator", "--status"]).stdout)
    );

    // Every frame exact: both jobs against one plain Blender render.
    let refs = dir.join("refs");
    reference(&scene, 1, opts.frames.max(opts.tiled_frames), &refs);
    for &(job, frames) in &jobs {
        let out = dir.join(format!("out-{job}"));
        cli_ok(
            &farm.both,
            &["fetch", &job.to_string(), "-o", out.to_str().unwrap()],
        );
        assert_matches_reference(&out, &refs, 1..=frames);
        report.frames_exact += frames;
    }

    // Every acknowledged completion is the one the store holds: each task is
    // done once, and a result a worker saw acknowledged is that attempt.
    let acked = acknowledged(&farm.worker_logs());
    for (view, &(job, _)) in views.iter().zip(&jobs) {
        for task in view["tasks"].as_array().expect("tasks in the job's view") {
            report.tasks += 1;
            let index = task["index"].as_u64().unwrap();
            let log = task["attempt_log"].as_array().cloned().unwrap_or_default();
            let done: Vec<u64> = log
                .iter()
                .filter(|a| a["end"] == "done")
                .map(|a| a["grant"].as_u64().unwrap())
                .collect();
            assert_eq!(
                done.len(),
                1,
                "task {job}.{index} is recorded done {} times: {task:#}",
                done.len()
            );
            let prefix = format!("{job}.{index}.");
            let grants: BTreeSet<u64> = acked
                .keys()
                .filter_map(|l| l.strip_prefix(&prefix)?.parse().ok())
                .collect();
            assert!(
                grants.iter().all(|g| *g == done[0]),
                "task {job}.{index}: workers saw grants {grants:?} acknowledged, the store holds grant {}: {task:#}",
                done[0]
            );
            report.leases_expired += log.iter().filter(|a| a["end"] == "expired").count();
            if log.len() > 1 {
                report.rendered_again += 1;
            }
        }
    }
    drop(farm);
    report
}
