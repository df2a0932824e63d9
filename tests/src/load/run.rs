//! One measured run against a coordinator, and the recovery measure.
//!
//! A run: worker tokens, the scene, one job of N single-frame tasks; then
//! the watchers and W fake workers of S slots start. After a warm-up the
//! window opens; it closes after its time or once 90% of the tasks are
//! acknowledged, whichever comes first, so a small queue that drains early
//! does not dilute the rate with idle time.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::fake_worker::{Fleet, FleetConfig, Recorder};
use super::observe::{self, Observed};
use super::process::{proc_stat, CoordinatorProcess, ProcStat};
use super::report::{Recovery, Report};
use super::setup::{put_blob, submit, worker_tokens, WORKERS_PER_TOKEN};
use super::{within, FakeWorker, LoadError};

/// Where a coordinator is and how to talk to it as its admin.
#[derive(Debug, Clone)]
pub struct Target {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// An admin token (it adds the worker users and submits the job).
    pub admin_token: String,
    /// `http://127.0.0.1:PORT/metrics`, when it serves HTTP.
    pub metrics: Option<String>,
}

/// How a run goes.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// A name for the coordinator measured ("new", "baseline").
    pub design: String,
    /// Fake workers.
    pub workers: u32,
    /// Slots per worker.
    pub slots: u32,
    /// Tasks in the job (one frame each).
    pub tasks: u32,
    /// Fake render time per task.
    pub render: Duration,
    /// Spread of the render times, a fraction of `render` (see
    /// [`FleetConfig::render_jitter`]).
    pub render_jitter: f64,
    /// How long a Lease may wait for a task.
    pub lease_wait: Duration,
    /// Load before the window opens (it ends early once 10% of the tasks are done).
    pub warmup: Duration,
    /// The measured window (it ends early once 90% of the tasks are done).
    pub window: Duration,
    /// Between the status client's polls.
    pub status_pause: Duration,
    /// Between `/metrics` scrapes.
    pub metrics_every: Duration,
    /// For the job's `SubmitJob`.
    pub submit_timeout: Duration,
    /// For adding users, uploading the scene and registering every worker.
    pub setup_timeout: Duration,
    /// For one status poll or scrape.
    pub call_timeout: Duration,
    /// Size of each result blob.
    pub result_bytes: usize,
    /// Upload every result with PutBlob, even where the coordinator
    /// accepts it inline in Complete.
    pub put_blob: bool,
    /// Slots lease their next task while rendering, as workers do (see
    /// [`FleetConfig::lease_ahead`]).
    pub lease_ahead: bool,
}

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            design: "new".into(),
            workers: 10,
            slots: 2,
            tasks: 10_000,
            render: Duration::from_millis(200),
            render_jitter: 0.0,
            lease_wait: Duration::from_secs(15),
            warmup: Duration::from_secs(5),
            window: Duration::from_secs(15),
            status_pause: Duration::from_millis(100),
            metrics_every: Duration::from_secs(5),
            submit_timeout: Duration::from_secs(120),
            setup_timeout: Duration::from_secs(120),
            call_timeout: Duration::from_secs(30),
            result_bytes: 256,
            put_blob: false,
            lease_ahead: true,
        }
    }
}

/// Runs `cfg` against `target`, whose process is `pid` (for memory and
/// CPU; None skips them), uploading `scene` (a real .blend). Never fails:
/// what went wrong is the report's outcome.
pub async fn run(target: &Target, pid: Option<u32>, scene: Vec<u8>, cfg: &RunConfig) -> Report {
    let mut report = Report {
        design: cfg.design.clone(),
        workers: cfg.workers,
        slots: cfg.slots,
        tasks: cfg.tasks,
        render_ms: cfg.render.as_millis() as u64,
        render_jitter: cfg.render_jitter,
        lease_ahead: cfg.lease_ahead,
        outcome: "ok".into(),
        ..Default::default()
    };
    if let Err(e) = measure(target, pid, scene, cfg, &mut report).await {
        report.outcome = match e {
            LoadError::Timeout { .. } => format!("timeout: {e}"),
            e => format!("error: {e}"),
        };
    }
    report
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

fn stat(pid: Option<u32>) -> Option<ProcStat> {
    pid.and_then(|p| proc_stat(p).ok())
}

/// Waits until `limit` has passed since `from` or `enough` completions are
/// acknowledged.
async fn until(from: Instant, limit: Duration, rec: &Recorder, enough: u64) {
    while from.elapsed() < limit && rec.acked_count() < enough {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn measure(
    target: &Target,
    pid: Option<u32>,
    scene: Vec<u8>,
    cfg: &RunConfig,
    report: &mut Report,
) -> Result<(), LoadError> {
    let setup = cfg.setup_timeout;
    let tokens = within(
        "adding worker users",
        setup,
        worker_tokens(target, cfg.workers.div_ceil(WORKERS_PER_TOKEN).max(1)),
    )
    .await?;
    let digest = within(
        "uploading the scene",
        setup,
        put_blob(&target.url, &target.admin_token, scene),
    )
    .await?;
    let (job, took) = submit(target, &digest, cfg.tasks, cfg.submit_timeout).await?;
    report.submit_s = Some(took.as_secs_f64());
    report.rss_after_submit_mib = stat(pid).map(|s| mib(s.rss));

    let seen = Arc::new(Observed::default());
    let watchers = observe::Watchers::start(
        target.clone(),
        job,
        cfg.status_pause,
        cfg.metrics_every,
        cfg.call_timeout,
        seen.clone(),
    )?;
    let fleet_cfg = FleetConfig {
        workers: cfg.workers,
        slots: cfg.slots,
        render: cfg.render,
        render_jitter: cfg.render_jitter,
        progress_every: Duration::from_secs(1),
        lease_wait: cfg.lease_wait,
        scene: digest,
        result_bytes: cfg.result_bytes,
        put_blob: cfg.put_blob,
        lease_ahead: cfg.lease_ahead,
    };
    let fleet = Fleet::start(&target.url, &tokens, fleet_cfg, setup).await?;
    report.register_s = Some(fleet.registered_in.as_secs_f64());
    let rec = fleet.recorder.clone();

    let tasks = u64::from(cfg.tasks);
    until(Instant::now(), cfg.warmup, &rec, tasks / 10).await;
    let (w0, c0, own0) = (
        Instant::now(),
        stat(pid),
        proc_stat(std::process::id()).ok(),
    );
    until(w0, cfg.window, &rec, tasks * 9 / 10).await;
    let (w1, c1, own1) = (
        Instant::now(),
        stat(pid),
        proc_stat(std::process::id()).ok(),
    );
    if let Some(url) = &target.metrics {
        observe::scrape_into(url, &target.admin_token, cfg.call_timeout, &seen).await;
    }
    let rec = fleet.stop().await;
    watchers.stop();

    let secs = (w1 - w0).as_secs_f64();
    let completions = rec.acked_between(w0, w1) as u64;
    report.window_s = Some(secs);
    report.completions = Some(completions);
    report.completions_per_s = Some(completions as f64 / secs);
    let lease = rec.lease.window(w0, w1);
    report.leases = Some(lease.len() as u64);
    report.empty_leases = Some(rec.empty_leases.load(std::sync::atomic::Ordering::Relaxed));
    report.carried_leases = Some(
        rec.carried_leases
            .load(std::sync::atomic::Ordering::Relaxed),
    );
    let idle = rec.idle.window(w0, w1);
    report.idle_p50_ms = idle.percentile_ms(50.0);
    report.idle_p99_ms = idle.percentile_ms(99.0);
    report.lease_p50_ms = lease.percentile_ms(50.0);
    report.lease_p99_ms = lease.percentile_ms(99.0);
    let complete = rec.complete.window(w0, w1);
    report.complete_p50_ms = complete.percentile_ms(50.0);
    report.complete_p99_ms = complete.percentile_ms(99.0);
    let result = rec.result.window(w0, w1);
    report.result_p50_ms = result.percentile_ms(50.0);
    report.result_p99_ms = result.percentile_ms(99.0);
    report.put_blob_p99_ms = rec.put_blob.window(w0, w1).percentile_ms(99.0);
    report.inline_results = Some(
        rec.inline_results
            .load(std::sync::atomic::Ordering::Relaxed),
    );
    report.progress_p99_ms = rec.progress.window(w0, w1).percentile_ms(99.0);
    let status = seen.status.window(w0, w1);
    report.status_p50_ms = status.percentile_ms(50.0);
    report.status_p99_ms = status.percentile_ms(99.0);
    report.status_calls = Some(status.len() as u64);
    report.jobs_p99_ms = seen.jobs.window(w0, w1).percentile_ms(99.0);
    // Scrapes are few: take all of them.
    report.metrics_p99_ms = seen.metrics.all().percentile_ms(99.0);
    if let (Some(a), Some(b)) = (c0, c1) {
        report.cpu_pct = Some((b.cpu - a.cpu).as_secs_f64() / secs * 100.0);
        report.rss_mib = Some(mib(b.rss));
        report.rss_peak_mib = Some(mib(b.rss_peak));
    }
    if let (Some(a), Some(b)) = (own0, own1) {
        report.load_cpu_pct = Some((b.cpu - a.cpu).as_secs_f64() / secs * 100.0);
    }
    report.leases_expired = seen
        .last_metrics()
        .and_then(|m| observe::metric(&m, "tessera_leases_expired_total"));
    report.lost = rec.lost.load(std::sync::atomic::Ordering::Relaxed);
    report.errors = rec.errors.load(std::sync::atomic::Ordering::Relaxed)
        + seen.errors.load(std::sync::atomic::Ordering::Relaxed);
    report.last_error = rec.last_error();
    if completions == 0 {
        report.outcome = "timeout: no completion was acknowledged in the window".into();
    }
    Ok(())
}

/// How the recovery measure goes.
#[derive(Debug, Clone)]
pub struct RecoveryConfig {
    /// A name for the coordinator measured.
    pub design: String,
    /// The `tessera` binary.
    pub bin: PathBuf,
    /// A fresh data directory.
    pub data: PathBuf,
    /// Arguments passed on to `tessera coordinator`.
    pub extra: Vec<String>,
    /// Tasks on disk.
    pub tasks: u32,
    /// For the job's `SubmitJob`.
    pub submit_timeout: Duration,
    /// From the restart to the first lease served.
    pub recovery_timeout: Duration,
}

/// Starts a coordinator, submits a job of `cfg.tasks` tasks, leases and
/// completes a few, kills the coordinator with SIGKILL and restarts it on the
/// same data directory; measures the restart up to the first lease served.
pub async fn recovery(cfg: &RecoveryConfig, scene: Vec<u8>) -> Recovery {
    let mut r = Recovery {
        design: cfg.design.clone(),
        tasks: cfg.tasks,
        outcome: "ok".into(),
        ..Default::default()
    };
    if let Err(e) = recover(cfg, scene, &mut r).await {
        r.outcome = match e {
            LoadError::Timeout { .. } => format!("timeout: {e}"),
            e => format!("error: {e}"),
        };
    }
    r
}

async fn start(cfg: &RecoveryConfig, limit: Duration) -> Result<CoordinatorProcess, LoadError> {
    let (bin, data, extra) = (cfg.bin.clone(), cfg.data.clone(), cfg.extra.clone());
    tokio::task::spawn_blocking(move || {
        CoordinatorProcess::start(&bin, &data, "127.0.0.1:0", &extra, limit)
    })
    .await
    .map_err(|e| LoadError::Coordinator(e.to_string()))?
}

async fn recover(cfg: &RecoveryConfig, scene: Vec<u8>, r: &mut Recovery) -> Result<(), LoadError> {
    let setup = Duration::from_secs(60);
    let mut coord = start(cfg, setup).await?;
    let target = coord.target.clone();
    let tokens = within("adding a worker user", setup, worker_tokens(&target, 1)).await?;
    let digest = within(
        "uploading the scene",
        setup,
        put_blob(&target.url, &target.admin_token, scene),
    )
    .await?;
    let (_, took) = submit(&target, &digest, cfg.tasks, cfg.submit_timeout).await?;
    r.submit_s = Some(took.as_secs_f64());
    r.rss_mib = proc_stat(coord.pid()).ok().map(|s| mib(s.rss));
    // A little work in flight when the kill comes: some tasks done, some leased.
    let fleet_cfg = FleetConfig {
        workers: 2,
        slots: 2,
        render: Duration::from_millis(300),
        render_jitter: 0.0,
        progress_every: Duration::from_secs(1),
        lease_wait: Duration::from_secs(1),
        scene: digest.clone(),
        result_bytes: 256,
        put_blob: false,
        lease_ahead: true,
    };
    let fleet = Fleet::start(&target.url, &tokens, fleet_cfg, setup).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    coord.kill9();
    fleet.stop().await;
    drop(coord);

    let limit = cfg.recovery_timeout;
    let coord = start(cfg, limit).await?;
    r.listening_s = Some(coord.listening_after.as_secs_f64());
    let left = limit.saturating_sub(coord.spawned.elapsed());
    let url = coord.target.url.clone();
    within("serving the first lease after the restart", left, async {
        let worker = loop {
            match FakeWorker::register(&url, &tokens[0], "recovery", 1, &digest).await {
                Ok(w) => break w,
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        };
        while !worker.lease_once(0, &digest, Duration::from_secs(1)).await {}
        Ok(())
    })
    .await?;
    r.first_lease_s = Some(coord.spawned.elapsed().as_secs_f64());
    r.rss_after_mib = proc_stat(coord.pid()).ok().map(|s| mib(s.rss));
    Ok(())
}
