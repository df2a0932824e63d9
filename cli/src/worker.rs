//! `tessera worker`: the worker's options turned into its configuration
//! (runtimes, GPUs and slots, tags, limits, token), then the worker run
//! until a shutdown signal.

use anyhow::{bail, Context, Result};
use tokio::sync::watch;

use crate::access::{read_token_file, token_on_command_line};
use crate::shutdown::shutdown_signal;
use crate::WorkerArgs;
use tessera_worker::connect::Access;

/// Runs a worker until SIGINT or SIGTERM.
pub async fn run(url: &Access, args: WorkerArgs) -> Result<()> {
    let mut url = url.clone();
    if let Some(path) = &args.token_file {
        url.token = Some(read_token_file(path)?);
    } else if token_on_command_line() {
        tracing::warn!("the token is on the command line, where any process on this machine can read it (/proc/PID/cmdline); use --token-file");
    }
    let url = &url;
    let memory = match args.blender_max_memory_gib {
        Some(n) => gib(n),
        None => physical_memory() / 4 * 3,
    };
    tessera_worker::blender::set_memory_limit(memory);
    // Blender is told absolute paths (a task's folder, the scene): a
    // relative --cache would mean another folder to it.
    let cache = std::path::absolute(&args.cache)
        .with_context(|| format!("cannot resolve --cache {}", args.cache.display()))?;
    let runtimes_dir = args
        .runtimes
        .clone()
        .or_else(|| std::env::var_os("TESSERA_RUNTIMES").map(Into::into))
        .unwrap_or_else(|| cache.join("runtimes"));
    let mut runtimes = crate::runtimes::offer(&args.blender, &runtimes_dir).await?;
    for o in &runtimes {
        tracing::info!(
            version = %o.caps.version,
            kind = o.runtime.kind.name(),
            exe = %o.runtime.exe.display(),
            features = ?o.caps.features,
            devices = ?o.caps.devices,
            "Blender runtime"
        );
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    let choice =
        tessera_worker::slots::DeviceChoice::parse(&args.device).map_err(anyhow::Error::msg)?;
    let probe = std::sync::Arc::new(tessera_worker::gpu::Hardware::probe());
    for note in probe.notes() {
        tracing::info!("hardware: {note}");
    }
    #[cfg_attr(not(feature = "test-hooks"), allow(unused_mut))]
    let mut gpus: Vec<tessera_worker::gpu::GpuInfo> = probe.gpus().to_vec();
    let probed = gpus.len();
    #[cfg(feature = "test-hooks")]
    for (i, d) in args.fake_gpu.iter().enumerate() {
        let declared: tessera_worker::slots::DeclaredGpu = d.parse().map_err(anyhow::Error::msg)?;
        gpus.push(declared.info((probed + i) as u32));
    }
    for g in &gpus {
        tracing::info!(index = g.index, vendor = %g.vendor, kind = %g.device_type, memory_mib = g.memory_bytes >> 20, uuid = %g.uuid, "GPU: {}", g.name);
    }
    let declared: Vec<bool> = (0..gpus.len()).map(|i| i >= probed).collect();
    let plans = tessera_worker::slots::plan(&gpus, &declared, choice, args.slots)
        .map_err(anyhow::Error::msg)?;
    for p in &plans {
        tracing::info!(slot = p.slot, device = p.device.name(), gpu = ?p.gpu, "slot");
    }
    // OptiX's denoiser runs where OptiX does.
    if plans
        .iter()
        .any(|p| p.device == tessera_worker::blender::Device::Optix)
    {
        for o in &mut runtimes {
            o.caps
                .features
                .push(tessera_worker::capabilities::feature::OPTIX_DENOISE.to_string());
        }
    }
    if args.allow_scene_python {
        tracing::warn!("--allow-scene-python: jobs submitted with --scene-python run the Python stored in their scenes on this machine");
        for o in &mut runtimes {
            o.caps
                .features
                .push(tessera_worker::capabilities::feature::SCENE_PYTHON.to_string());
        }
    }
    for t in &args.tag {
        if t.is_empty()
            || t.len() > 64
            || !t
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            bail!("tag `{t}` is not a tag; use up to 64 letters, digits, `-`, `_` or `.`");
        }
    }
    if !(args.telemetry_interval.is_finite() && args.telemetry_interval >= 0.1) {
        bail!(
            "--telemetry-interval {} is too short; use 0.1 seconds or more",
            args.telemetry_interval
        );
    }
    let slots = plans.len() as u32;
    let hardware = tessera_worker::agent::HardwareConfig {
        gpus,
        probed,
        probe: Some(probe.clone()),
        #[cfg(feature = "test-hooks")]
        declared_telemetry: args.fake_telemetry.clone(),
        interval: std::time::Duration::from_secs_f64(args.telemetry_interval),
        notes: probe.notes().to_vec(),
    };
    let name = args.name.unwrap_or_else(|| {
        std::fs::read_to_string("/etc/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "worker".into())
    });
    let config = tessera_worker::agent::WorkerConfig {
        access: url.clone(),
        name,
        cache,
        slots: plans,
        runtimes,
        threads: args.threads.or(Some((cores / slots).max(1))),
        hardware,
        tags: args.tag.clone(),
        cache_max_bytes: gib(args.cache_max_gib),
        max_root_bytes: gib(args.max_root_gib.unwrap_or(args.cache_max_gib)),
        path_map: args
            .path_map
            .iter()
            .map(|m| match m.split_once('=') {
                Some((from, to)) if from.starts_with('/') && !to.is_empty() => {
                    Ok((from.to_string(), std::path::PathBuf::from(to)))
                }
                _ => bail!("--path-map {m} is not PREFIX=LOCAL; use e.g. --path-map /mnt/projects=/net/projects"),
            })
            .collect::<Result<_>>()?,
        grace: if args.capacity == "spot" && args.grace > 0.0 {
            tracing::warn!("--capacity spot: renders are released at once on SIGTERM; --grace is ignored");
            std::time::Duration::ZERO
        } else {
            grace(args.grace)?
        },
        #[cfg(feature = "test-hooks")]
        fail_first_render: args.fail_first_render,
        price_per_hour: price(args.price_per_hour)?,
        capacity: args.capacity.clone(),
        untrusted: args.untrusted,
        #[cfg(feature = "test-hooks")]
        test_corrupt_pixel: args.test_corrupt_pixel,
        allow_scene_python: args.allow_scene_python,
        spare_blender: !args.no_spare_blender,
        spare_scene_python: false,
    };
    tracing::info!(slots, "worker starting");
    let mode = render_mode(args.fresh_process, args.session_idle)?;
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutting down: releasing tasks in flight");
        let _ = tx.send(true);
    });
    tessera_worker::agent::run_blender(config, mode, rx).await?;
    Ok(())
}

/// The price per hour, from the command line.
fn price(p: f64) -> Result<f64> {
    tessera_coordinator::model::usage::check_price(p)
        .map_err(|e| anyhow::anyhow!("--price-per-hour: {e}"))
}

/// The shutdown grace period, from the command line.
fn grace(secs: f64) -> Result<std::time::Duration> {
    if !(secs.is_finite() && secs >= 0.0) {
        bail!("--grace {secs} is not a duration; give seconds, e.g. 30");
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

/// Fresh processes or warm sessions, from the command line.
pub fn render_mode(fresh: bool, idle_s: f64) -> Result<tessera_worker::agent::RenderMode> {
    use tessera_worker::agent::RenderMode;
    if fresh {
        return Ok(RenderMode::FreshProcess);
    }
    if !(idle_s.is_finite() && idle_s > 0.0) {
        bail!("--session-idle {idle_s} is not a duration; give seconds, e.g. 60");
    }
    Ok(RenderMode::Sessions {
        idle: std::time::Duration::from_secs_f64(idle_s),
    })
}

/// Bytes in `n` GiB (negative: none).
fn gib(n: f64) -> u64 {
    (n.max(0.0) * (1u64 << 30) as f64) as u64
}

/// This machine's memory in bytes (`MemTotal`), or 0 (no limit) where
/// /proc/meminfo cannot be read.
fn physical_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        })
        .unwrap_or(0)
}
