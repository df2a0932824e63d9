//! A coordinator's setup from `tessera coordinator`'s options: its
//! `Config`, connection limits, TLS files, blob store and store kind, its
//! bound ports and the lines that announce them. Shared by the coordinator
//! on sled ([`crate::serve`]) and on PostgreSQL ([`crate::ha`]); knows
//! neither.

use anyhow::{bail, Context, Result};
use tokio::net::TcpListener;

use crate::CoordinatorArgs;
use tessera_coordinator::adapters::connections::ConnectionLimits;

/// Whether `--store` names a PostgreSQL database.
pub fn is_postgres(store: &str) -> bool {
    store.starts_with("postgres://") || store.starts_with("postgresql://")
}

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
        health: tessera_coordinator::model::hardware::HealthLimits {
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

/// The blob store `--blobs` names (a directory, default DATA/blobs, or s3://).
pub fn open_blobs(
    args: &CoordinatorArgs,
    max_upload: u64,
) -> Result<std::sync::Arc<dyn tessera_coordinator::blobs::BlobStore>> {
    let spec = args.blobs.as_deref().unwrap_or("");
    tessera_coordinator::blobs::location::open(spec, &args.data, max_upload).with_context(|| {
        format!(
            "cannot open the blob store {}",
            tessera_coordinator::blobs::location::describe(spec, &args.data)
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
pub fn warn_if_few_files() {
    if let Some(n) = open_file_limit().filter(|n| *n < FEW_FILES) {
        tracing::warn!(
            "this coordinator may open only {n} files (ulimit -n), and every connection takes one: raise it to at least {FEW_FILES} (LimitNOFILE= in its systemd unit, or `ulimit -n 65536`)"
        );
    }
}
