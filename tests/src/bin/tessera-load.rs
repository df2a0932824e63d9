//! `tessera-load`: drives a real `tessera coordinator` with fake workers and
//! clients over gRPC on loopback and prints what it measured.
//!
//! * `run`: one measured run (W workers x S slots against one job of N tasks);
//!   starts its own coordinator with `--tessera BIN`, or measures a running one
//!   with `--coordinator URL --admin-token-file FILE [--pid PID] [--metrics URL]`.
//! * `recover`: kill -9 a coordinator with N tasks on disk and time its restart
//!   up to the first lease served.
//! * `table`: two designs' JSON lines side by side, with ratios.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use tessera_tests::load::process::CoordinatorProcess;
use tessera_tests::load::report::{compare, compare_recovery};
use tessera_tests::load::run::{recovery, run, RecoveryConfig};
use tessera_tests::load::setup::make_scene;
use tessera_tests::load::{LoadError, Recovery, Report, RunConfig, Target};

/// Load generator for the Tessera coordinator.
#[derive(Parser, Debug)]
#[command(name = "tessera-load", about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// One measured run; prints a table row (or a JSON line with --json).
    Run(RunArgs),
    /// Time a coordinator's restart after kill -9 with a big job on disk.
    Recover(RecoverArgs),
    /// Print two designs' runs (JSON lines) side by side with ratios.
    Table {
        /// JSON lines of the new design's runs (and its `recover` line).
        #[arg(long)]
        new: PathBuf,
        /// JSON lines of the baseline's runs (and its `recover` line).
        #[arg(long)]
        baseline: PathBuf,
    },
}

/// How to get a coordinator and a scene.
#[derive(Args, Debug)]
struct CoordArgs {
    /// Start this `tessera` binary as the coordinator (fresh data directory, port 0).
    #[arg(long)]
    tessera: Option<PathBuf>,
    /// Extra argument for the started coordinator (repeatable), e.g. `--coordinator-arg=--lease-ttl=60`.
    #[arg(long, allow_hyphen_values = true)]
    coordinator_arg: Vec<String>,
    /// Data directory of the started coordinator (default: a temporary one, removed after).
    #[arg(long)]
    data: Option<PathBuf>,
    /// A scene to upload (default: a tiny one made with Blender's make_scene.py).
    #[arg(long)]
    scene: Option<PathBuf>,
    /// Blender, to make the default scene.
    #[arg(long, env = "TESSERA_BLENDER", default_value = "blender")]
    blender: PathBuf,
    /// A name for the design measured, shown in the row and the JSON.
    #[arg(long, default_value = "new")]
    design: String,
    /// Print one JSON line instead of a table row.
    #[arg(long)]
    json: bool,
    /// Seconds the job's SubmitJob may take before the run reports a timeout.
    #[arg(long, default_value_t = 120.0)]
    submit_timeout: f64,
}

#[derive(Args, Debug)]
struct RunArgs {
    #[command(flatten)]
    coord: CoordArgs,
    /// Measure a coordinator that is already running at this URL.
    #[arg(long, conflicts_with = "tessera")]
    coordinator: Option<String>,
    /// Its admin token, in a file (with --coordinator).
    #[arg(long, requires = "coordinator")]
    admin_token_file: Option<PathBuf>,
    /// Its process id, for RSS and CPU (with --coordinator).
    #[arg(long, requires = "coordinator")]
    pid: Option<u32>,
    /// Its /metrics URL (with --coordinator).
    #[arg(long, requires = "coordinator")]
    metrics: Option<String>,
    /// Fake workers, each with its own connection.
    #[arg(long, short = 'w', default_value_t = 10)]
    workers: u32,
    /// Slots per worker.
    #[arg(long, short = 's', default_value_t = 2)]
    slots: u32,
    /// Tasks in the job (one frame each).
    #[arg(long, short = 'n', default_value_t = 10_000)]
    tasks: u32,
    /// Fake render time per task, in milliseconds (Progress goes every second of it).
    #[arg(long, default_value_t = 200)]
    render_ms: u64,
    /// Spread of the fake render times, a fraction of --render-ms: each
    /// render takes a time drawn evenly from render-ms x (1 +- this). At 0
    /// every slot renders exactly as long, so slots that start together
    /// stay in step and call the coordinator in waves; real frames differ.
    #[arg(long, default_value_t = 0.0)]
    render_jitter: f64,
    /// Seconds of load before the window (ends early at 10% of the tasks done).
    #[arg(long, default_value_t = 5.0)]
    warmup: f64,
    /// Seconds of the measured window (ends early at 90% of the tasks done).
    #[arg(long, default_value_t = 15.0)]
    window: f64,
    /// Milliseconds between the status client's polls (ListJobs + GetJob).
    #[arg(long, default_value_t = 100)]
    status_pause_ms: u64,
    /// Milliseconds a Lease may wait for a task (its long-poll).
    #[arg(long, default_value_t = 15_000)]
    lease_wait_ms: u64,
    /// Seconds adding users, the scene upload and registering every worker may take.
    #[arg(long, default_value_t = 120.0)]
    setup_timeout: f64,
    /// Upload every result with PutBlob before its Complete, even where the
    /// coordinator accepts small results inside Complete (the default then).
    #[arg(long)]
    no_inline: bool,
    /// Slots report a result, then wait for the next task before they
    /// render again, instead of leasing the next task while they render
    /// (as workers do): every round trip then falls between two renders.
    #[arg(long)]
    no_lease_ahead: bool,
}

#[derive(Args, Debug)]
struct RecoverArgs {
    #[command(flatten)]
    coord: CoordArgs,
    /// Tasks on disk when the coordinator is killed.
    #[arg(long, short = 'n', default_value_t = 1_000_000)]
    tasks: u32,
    /// Seconds from the restart to the first lease before it is a timeout.
    #[arg(long, default_value_t = 120.0)]
    recovery_timeout: f64,
}

/// `--render-jitter`, checked: a fraction from 0 to 0.9.
fn jitter(f: f64) -> Result<f64, LoadError> {
    if (0.0..=0.9).contains(&f) {
        Ok(f)
    } else {
        Err(LoadError::Coordinator(format!(
            "--render-jitter {f}: give a fraction of the render time from 0 to 0.9 (e.g. 0.2 for +-20 %)"
        )))
    }
}

fn secs(s: f64, what: &str) -> Result<Duration, LoadError> {
    Duration::try_from_secs_f64(s)
        .map_err(|_| LoadError::Coordinator(format!("{what} {s} is not a number of seconds")))
}

/// The scene's bytes: `--scene`, or one made with Blender in `scratch`.
fn scene_bytes(c: &CoordArgs, scratch: &Path) -> Result<Vec<u8>, LoadError> {
    let path = match &c.scene {
        Some(p) => p.clone(),
        None => make_scene(&c.blender, &scratch.join("scene.blend"))?,
    };
    std::fs::read(&path).map_err(|e| LoadError::io(format!("cannot read {}", path.display()), e))
}

/// The data directory: `--data`, or one inside `scratch`.
fn data_dir(c: &CoordArgs, scratch: &Path) -> PathBuf {
    c.data.clone().unwrap_or_else(|| scratch.join("data"))
}

/// Arguments for a started coordinator: the caller's, with `--max-frames`
/// raised to fit the job unless the caller set it.
fn coordinator_args(c: &CoordArgs, tasks: u32) -> Vec<String> {
    let mut args = c.coordinator_arg.clone();
    if !args.iter().any(|a| a.starts_with("--max-frames")) {
        args.push(format!("--max-frames={}", tasks.max(100_000)));
    }
    args
}

fn scratch() -> Result<tempfile::TempDir, LoadError> {
    tempfile::Builder::new()
        .prefix("tessera-load-")
        .tempdir()
        .map_err(|e| LoadError::io("cannot make a temporary directory", e))
}

async fn run_cmd(a: RunArgs) -> Result<(), LoadError> {
    let tmp = scratch()?;
    let scene = scene_bytes(&a.coord, tmp.path())?;
    let cfg = RunConfig {
        design: a.coord.design.clone(),
        workers: a.workers.max(1),
        slots: a.slots.max(1),
        tasks: a.tasks.max(1),
        render: Duration::from_millis(a.render_ms),
        render_jitter: jitter(a.render_jitter)?,
        lease_wait: Duration::from_millis(a.lease_wait_ms),
        warmup: secs(a.warmup, "--warmup")?,
        window: secs(a.window, "--window")?,
        status_pause: Duration::from_millis(a.status_pause_ms),
        submit_timeout: secs(a.coord.submit_timeout, "--submit-timeout")?,
        setup_timeout: secs(a.setup_timeout, "--setup-timeout")?,
        put_blob: a.no_inline,
        lease_ahead: !a.no_lease_ahead,
        ..RunConfig::default()
    };
    // Started here, or already running.
    let mut started = None;
    let (target, pid) = match (&a.coord.tessera, &a.coordinator) {
        (Some(bin), _) => {
            let data = data_dir(&a.coord, tmp.path());
            let args = coordinator_args(&a.coord, cfg.tasks);
            let c = CoordinatorProcess::start(bin, &data, "127.0.0.1:0", &args, cfg.setup_timeout)?;
            let t = (c.target.clone(), Some(c.pid()));
            started = Some(c);
            t
        }
        (None, Some(url)) => {
            let file = a.admin_token_file.as_ref().ok_or_else(|| {
                LoadError::Coordinator("--coordinator needs --admin-token-file".into())
            })?;
            let token = std::fs::read_to_string(file)
                .map_err(|e| LoadError::io(format!("cannot read {}", file.display()), e))?;
            let target = Target {
                url: url.clone(),
                admin_token: token.trim().to_string(),
                metrics: a.metrics.clone(),
            };
            (target, a.pid)
        }
        (None, None) => return Err(LoadError::Coordinator(
            "say which coordinator: --tessera BIN starts one, --coordinator URL uses a running one"
                .into(),
        )),
    };
    let report = run(&target, pid, scene, &cfg).await;
    drop(started);
    if a.coord.json {
        println!("{}", report.to_json());
        // The row on stderr too, so a script collecting the JSON shows progress.
        eprintln!("{}", report.row());
    } else {
        println!("{}\n{}", Report::header(), report.row());
        if let Some(e) = &report.last_error {
            eprintln!("last error: {e}");
        }
    }
    Ok(())
}

async fn recover_cmd(a: RecoverArgs) -> Result<(), LoadError> {
    let bin = a
        .coord
        .tessera
        .clone()
        .ok_or_else(|| LoadError::Coordinator("recover needs --tessera BIN".into()))?;
    let tmp = scratch()?;
    let scene = scene_bytes(&a.coord, tmp.path())?;
    let cfg = RecoveryConfig {
        design: a.coord.design.clone(),
        bin,
        data: data_dir(&a.coord, tmp.path()),
        extra: coordinator_args(&a.coord, a.tasks),
        tasks: a.tasks.max(1),
        submit_timeout: secs(a.coord.submit_timeout, "--submit-timeout")?,
        recovery_timeout: secs(a.recovery_timeout, "--recovery-timeout")?,
    };
    let r = recovery(&cfg, scene).await;
    if a.coord.json {
        println!("{}", r.to_json());
        eprintln!("{}", r.lines());
    } else {
        println!("{}", r.lines());
    }
    Ok(())
}

/// Runs and recovery measures from a file of JSON lines.
fn read_lines(path: &Path) -> Result<(Vec<Report>, Option<Recovery>), LoadError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| LoadError::io(format!("cannot read {}", path.display()), e))?;
    let (mut runs, mut rec) = (Vec::new(), None);
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let bad = |e: serde_json::Error| {
            LoadError::Coordinator(format!(
                "{}:{}: not a tessera-load JSON line: {e}",
                path.display(),
                i + 1
            ))
        };
        let v: serde_json::Value = serde_json::from_str(line).map_err(bad)?;
        if v.get("first_lease_s").is_some() {
            rec = Some(serde_json::from_value(v).map_err(bad)?);
        } else {
            runs.push(serde_json::from_value(v).map_err(bad)?);
        }
    }
    Ok((runs, rec))
}

fn table_cmd(new: &Path, baseline: &Path) -> Result<(), LoadError> {
    let (n, nr) = read_lines(new)?;
    let (b, br) = read_lines(baseline)?;
    print!("{}", compare(&n, &b));
    if nr.is_some() || br.is_some() {
        println!();
        print!(
            "{}",
            compare_recovery(&nr.unwrap_or_default(), &br.unwrap_or_default())
        );
    }
    Ok(())
}

/// Runs `work` until it ends or SIGTERM/SIGINT comes; then it is dropped,
/// which kills the coordinator it started (`timeout` in the benchmark
/// script sends SIGTERM to a run past its cap).
async fn or_signal(
    work: impl std::future::Future<Output = Result<(), LoadError>>,
) -> Result<(), LoadError> {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return work.await;
    };
    tokio::select! {
        r = work => r,
        _ = term.recv() => Err(LoadError::Coordinator("stopped by SIGTERM".into())),
        _ = int.recv() => Err(LoadError::Coordinator("stopped by SIGINT".into())),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Command::Run(a) => runtime.block_on(or_signal(run_cmd(a))),
        Command::Recover(a) => runtime.block_on(or_signal(recover_cmd(a))),
        Command::Table { new, baseline } => table_cmd(&new, &baseline),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
