//! Running a coordinator or a worker: `tessera coordinator` and `tessera worker`.

use anyhow::{bail, Context, Result};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::commands::shutdown_signal;
use crate::{CoordinatorArgs, WorkerArgs};
use tessera_coordinator::connections::ConnectionLimits;
use tessera_worker::agent::Access;

/// Coordinator settings from the command line.
pub fn coordinator_config(a: &CoordinatorArgs) -> Result<tessera_coordinator::Config> {
    if !(a.lease_ttl.is_finite() && a.lease_ttl >= 0.3) {
        bail!(
            "--lease-ttl {} is too short; use 0.3 seconds or more",
            a.lease_ttl
        );
    }
    // Read by the stores this process opens (see `space`).
    tessera_coordinator::space::set_min_free(a.min_free_mib.saturating_mul(1 << 20));
    Ok(tessera_coordinator::Config {
        lease_ttl_ms: (a.lease_ttl * 1000.0) as u64,
        max_frames: a.max_frames,
        max_attempts: a.max_attempts.max(1),
        max_upload: a.max_upload_mib.saturating_mul(1 << 20),
        max_tiles: a.max_tiles,
        health: tessera_coordinator::hardware::HealthLimits {
            max_temp_c: a.max_gpu_temp,
            max_ecc_per_day: a.max_ecc_per_day,
        },
        block_after: a.block_after.max(1),
        auth: true,
        max_message: usize::try_from(a.max_message_mib.clamp(2, 1024) << 20).unwrap_or(usize::MAX),
        blob_grace_ms: match a.blob_grace {
            Some(s) if s.is_finite() && s >= 0.0 => (s * 1000.0) as u64,
            Some(s) => bail!("--blob-grace {s} is not a number of seconds; use 0 or more"),
            None => (a.lease_ttl * 2000.0) as u64,
        },
        max_pixels: a.max_pixels,
        max_workers_per_token: a.max_workers_per_token.max(1),
        max_slots: a.max_slots.max(1),
        keep_ms: match a.keep_days {
            Some(d) if d.is_finite() && d >= 0.0 => Some((d * 86_400_000.0) as u64),
            Some(d) => bail!("--keep-days {d} is not a number of days; use 0 or more"),
            None => None,
        },
        target_drain_ms: match a.target_drain_minutes {
            m if m.is_finite() && m >= 1.0 / 60.0 => (m * 60_000.0) as u64,
            m => bail!("--target-drain-minutes {m} is not a duration; use minutes, e.g. 30"),
        },
        verify_untrusted: a.verify_untrusted,
        ..Default::default()
    })
}

/// Connection caps and stall timeouts from the command line.
pub fn connection_limits(a: &CoordinatorArgs) -> Result<ConnectionLimits> {
    let secs = |flag: &str, v: f64| -> Result<std::time::Duration> {
        if !(v.is_finite() && (0.1..=86_400.0).contains(&v)) {
            bail!("{flag} {v} is not a number of seconds; use 0.1 to 86400");
        }
        Ok(std::time::Duration::from_secs_f64(v))
    };
    let total = match a.max_connections {
        Some(0) => bail!("--max-connections 0 would refuse everyone; use 1 or more"),
        Some(n) => n,
        // Leave a quarter of the files for the store, blobs and logs.
        None => open_file_limit().map_or(4096, |n| {
            usize::try_from(n / 4 * 3)
                .unwrap_or(usize::MAX)
                .clamp(64, 16_384)
        }),
    };
    if a.max_connections_per_address == 0 {
        bail!("--max-connections-per-address 0 would refuse everyone; use 1 or more");
    }
    Ok(ConnectionLimits {
        header_timeout: secs("--header-timeout", a.header_timeout)?,
        idle_timeout: secs("--idle-timeout", a.idle_timeout)?,
        body_timeout: secs("--body-timeout", a.body_timeout)?,
        per_address: a.max_connections_per_address,
        total,
    })
}

pub async fn coordinator(args: CoordinatorArgs) -> Result<()> {
    warn_if_few_files();
    let limits = connection_limits(&args)?;
    let config = coordinator_config(&args)?;
    let tls = tls_files(&args)?;
    if !(args.preview_timeout.is_finite() && args.preview_timeout > 0.0) {
        bail!(
            "--preview-timeout {} is not a number of seconds; use more than 0",
            args.preview_timeout
        );
    }
    let ffmpeg = tessera_coordinator::preview::encode::Ffmpeg {
        program: args.ffmpeg.clone(),
        timeout: std::time::Duration::from_secs_f64(args.preview_timeout.min(86_400.0)),
    };
    match args.store.as_deref().map(str::trim) {
        Some(url) if crate::ha::is_postgres(url) => {
            return crate::ha::coordinator(&args, config, tls, ffmpeg).await;
        }
        None | Some("") | Some("sled") => {}
        Some(other) => bail!(
            "--store {other}: not a store; use sled (the default, in --data) or postgres://USER@HOST:PORT/DATABASE"
        ),
    }
    let blobs = open_blobs(&args, config.max_upload)?;
    let mut coord = tessera_coordinator::Coordinator::open_with_blobs(&args.data, config, blobs)
        .with_context(|| format!("cannot open the data directory {}", args.data.display()))?
        .with_ffmpeg(ffmpeg)
        .with_connection_limits(limits);
    say_admin_token(&coord);
    if let Some((cert, key)) = tls {
        coord = coord.with_tls(cert, key);
    }
    let (listener, http) = bind(&args).await?;
    announce(
        &args,
        listener.local_addr()?,
        http.as_ref().map(|h| h.local_addr()).transpose()?,
    );
    coord.serve(listener, http, shutdown_signal()).await?;
    Ok(())
}

/// The blob store `--blobs` names (a directory, default DATA/blobs, or s3://).
pub fn open_blobs(
    args: &CoordinatorArgs,
    max_upload: u64,
) -> Result<std::sync::Arc<dyn tessera_coordinator::blob_store::BlobStore>> {
    let spec = args.blobs.as_deref().unwrap_or("");
    tessera_coordinator::blob_location::open(spec, &args.data, max_upload).with_context(|| {
        format!(
            "cannot open the blob store {}",
            tessera_coordinator::blob_location::describe(spec, &args.data)
        )
    })
}

/// Says where this start wrote the admin token, if it made one.
pub fn say_admin_token(coord: &tessera_coordinator::Coordinator) {
    if let Some(path) = coord.admin_token_path() {
        eprintln!(
            "created the admin token: {} (keep it secret; `tessera users add` makes more)",
            path.display()
        );
    }
}

/// The TLS certificate and key files, read.
pub fn tls_files(args: &CoordinatorArgs) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
    match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            let cert =
                std::fs::read(cert).with_context(|| format!("cannot read {}", cert.display()))?;
            let key =
                std::fs::read(key).with_context(|| format!("cannot read {}", key.display()))?;
            Ok(Some((cert, key)))
        }
        (None, None) => Ok(None),
        _ => bail!("give both --tls-cert and --tls-key, or neither"),
    }
}

/// Binds the gRPC port and the HTTP port (when asked for), refusing plain
/// text off loopback unless allowed.
pub async fn bind(args: &CoordinatorArgs) -> Result<(TcpListener, Option<TcpListener>)> {
    let listener = TcpListener::bind(&args.listen).await.with_context(|| {
        format!(
            "cannot listen on {}; is another coordinator running there? pick another --listen",
            args.listen
        )
    })?;
    let addr = listener.local_addr()?;
    if !addr.ip().is_loopback() && args.tls_cert.is_none() && !args.allow_plaintext {
        bail!(
            "{addr} is reachable from other machines and tokens would travel in plain text; give --tls-cert and --tls-key, or pass --allow-plaintext on a trusted network"
        );
    }
    let http = match &args.http {
        Some(a) => Some(
            TcpListener::bind(a)
                .await
                .with_context(|| format!("cannot listen on {a} for HTTP; pick another --http"))?,
        ),
        None => None,
    };
    if let Some(h) = &http {
        let h = h.local_addr()?;
        // With --tls-cert the HTTP port serves HTTPS; without, the same rule
        // as gRPC: plain text only on loopback.
        if !h.ip().is_loopback() && args.tls_cert.is_none() && !args.allow_plaintext {
            bail!(
                "--http {h} is reachable from other machines and would serve plain HTTP, so tokens would travel unencrypted; give --tls-cert and --tls-key (the port then serves HTTPS), bind it to loopback, or pass --allow-plaintext on a trusted network"
            );
        }
    }
    Ok((listener, http))
}

/// Prints where the coordinator listens: scripts and tests read these lines
/// to learn the ports when they end in :0.
pub fn announce(
    args: &CoordinatorArgs,
    addr: std::net::SocketAddr,
    http: Option<std::net::SocketAddr>,
) {
    println!("tessera coordinator listening on {addr}");
    if let Some(h) = http {
        let scheme = if args.tls_cert.is_some() {
            "https"
        } else {
            "http"
        };
        println!("tessera coordinator metrics on {scheme}://{h}/metrics");
        eprintln!("dashboard: {scheme}://{h}/ (sign in with a token; JSON API under /api/v1/)");
    }
}

/// Reads a worker token from `path` (`-`: standard input).
pub fn read_token_file(path: &std::path::Path) -> Result<String> {
    let text = if path == std::path::Path::new("-") {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
            .context("cannot read the token from standard input")?;
        s
    } else {
        std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the token file {}", path.display()))?
    };
    let token = text.trim().to_string();
    if token.is_empty() {
        bail!(
            "the token file {} is empty; put a worker token in it (`tessera users add NAME --role worker` prints one)",
            path.display()
        );
    }
    Ok(token)
}

pub async fn worker(url: &Access, args: WorkerArgs) -> Result<()> {
    let mut url = url.clone();
    if let Some(path) = &args.token_file {
        url.token = Some(read_token_file(path)?);
    } else if crate::commands::token_on_command_line() {
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
    tessera_coordinator::usage::check_price(p).map_err(|e| anyhow::anyhow!("--price-per-hour: {e}"))
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

/// The soft limit on open files (`ulimit -n`), when it can be read.
fn open_file_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse::<u64>().ok()
}

/// Descriptors under which a coordinator warns at start: every connection
/// holds one, and at 1,024 a thousand idle connections stop it serving.
const FEW_FILES: u64 = 8192;

/// Warns when the process may open few files (`ulimit -n`), and says how to
/// raise it.
fn warn_if_few_files() {
    if let Some(n) = open_file_limit().filter(|n| *n < FEW_FILES) {
        tracing::warn!(
            "this coordinator may open only {n} files (ulimit -n), and every connection takes one: raise it to at least {FEW_FILES} (LimitNOFILE= in its systemd unit, or `ulimit -n 65536`)"
        );
    }
}
