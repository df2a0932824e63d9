//! A coordinator on PostgreSQL, active or standby
//! (`tessera coordinator --store postgres://...`), and asking coordinators
//! which one is active (`tessera coordinator --status`).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tessera_coordinator::ha::{self, standby, Election};
use tessera_coordinator::store::PgStore;
use tessera_proto as pb;
use tessera_worker::agent::{self, Access};
use tokio::net::TcpListener;

use crate::commands::shutdown_signal;
use crate::serve::{announce, bind, say_admin_token};
use crate::CoordinatorArgs;

/// Whether `--store` names a PostgreSQL database.
pub fn is_postgres(store: &str) -> bool {
    store.starts_with("postgres://") || store.starts_with("postgresql://")
}

/// Starts with the active coordinator when `access` lists several.
pub async fn find_active(access: &Access) {
    let Ok(addresses) = tessera_worker::failover::addresses(&access.url) else {
        return;
    };
    if addresses.len() < 2 {
        return;
    }
    if let Ok(conn) = agent::channel(access) {
        tessera_worker::failover::find_active(conn, addresses.len()).await;
    }
}

/// Where clients reach this coordinator, when `--advertise` is not given.
fn default_advertise(addr: std::net::SocketAddr, tls: bool) -> String {
    let scheme = if tls { "https" } else { "http" };
    if addr.ip().is_unspecified() {
        let host = std::fs::read_to_string("/etc/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "localhost".into());
        format!("{scheme}://{host}:{}", addr.port())
    } else {
        format!("{scheme}://{addr}")
    }
}

/// Runs a coordinator on PostgreSQL: standby until it holds the leader
/// lock, then active until it is stopped or loses the lock.
pub async fn coordinator(
    args: &CoordinatorArgs,
    config: tessera_coordinator::Config,
    tls: Option<(Vec<u8>, Vec<u8>)>,
    ffmpeg: tessera_coordinator::preview::encode::Ffmpeg,
) -> Result<()> {
    let url = args.store.clone().unwrap_or_default().trim().to_string();
    if !(args.failover_seconds.is_finite() && args.failover_seconds >= 1.0) {
        bail!(
            "--failover-seconds {} is too short; use 1 second or more",
            args.failover_seconds
        );
    }
    let failover = Duration::from_secs_f64(args.failover_seconds);
    let store = {
        let url = url.clone();
        tokio::task::spawn_blocking(move || PgStore::open(&url))
            .await
            .context("the store's start panicked")??
    };
    let limits = crate::serve::connection_limits(args)?;
    let (listener, http) = bind(args).await?;
    let addr = listener.local_addr()?;
    let http_addr = http.as_ref().map(|h| h.local_addr()).transpose()?;
    let advertise = args
        .advertise
        .clone()
        .unwrap_or_else(|| default_advertise(addr, tls.is_some()));
    let election = Election::connect(&url, &ha::holder_name(), &advertise, failover).await?;
    let grpc = listener.into_std()?;
    let http = http.map(|h| h.into_std()).transpose()?;
    let mut announced = false;
    if !election.try_acquire().await? {
        announce(args, addr, http_addr);
        announced = true;
        let leader = election.leader().await?;
        println!("tessera coordinator standby: {}", leader.standby_message());
        tracing::info!(active = %leader.url, "standby: waiting for the active coordinator's lock");
        let active = standby::serve_until_active(
            &election,
            &grpc,
            http.as_ref(),
            tls.as_ref(),
            limits,
            shutdown_signal(),
        )
        .await?;
        if !active {
            return Ok(());
        }
    }
    let epoch = election.take_over().await?;
    store.fence(epoch);
    tracing::info!(epoch, advertise = %advertise, "active: loading the state from PostgreSQL");
    let blobs = crate::serve::open_blobs(args, config.max_upload)?;
    let store: Arc<dyn tessera_coordinator::store::MetaStore> = Arc::new(store);
    let data = args.data.clone();
    let mut coord = tokio::task::block_in_place(|| {
        tessera_coordinator::Coordinator::open_on(&data, store, blobs, config)
    })
    .context("cannot take over: loading the state from PostgreSQL failed")?
    .with_ffmpeg(ffmpeg)
    .with_connection_limits(limits);
    say_admin_token(&coord);
    if let Some((cert, key)) = tls {
        coord = coord.with_tls(cert, key);
    }
    if !announced {
        announce(args, addr, http_addr);
    }
    println!("tessera coordinator active (epoch {epoch})");
    let lost = std::sync::atomic::AtomicBool::new(false);
    let stop = async {
        tokio::select! {
            _ = shutdown_signal() => {}
            _ = election.lost() => lost.store(true, std::sync::atomic::Ordering::SeqCst),
        }
    };
    coord
        .serve(
            TcpListener::from_std(grpc)?,
            http.map(TcpListener::from_std).transpose()?,
            stop,
        )
        .await?;
    if lost.load(std::sync::atomic::Ordering::SeqCst) {
        bail!(
            "lost the PostgreSQL connection that holds the leadership, so another coordinator may take over; stopped serving (restart this one and it comes back as standby)"
        );
    }
    Ok(())
}

/// `tessera coordinator --status`: each address's role.
pub async fn status(access: &Access) -> Result<()> {
    let mut active = 0;
    for (url, _) in tessera_worker::failover::addresses(&access.url)? {
        let one = Access {
            url: url.clone(),
            ..access.clone()
        };
        let mut blobs = pb::blobs_client::BlobsClient::new(agent::channel(&one)?);
        let probe = blobs.missing_blobs(pb::MissingBlobsRequest { digests: vec![] });
        let role = match tokio::time::timeout(Duration::from_secs(5), probe).await {
            Err(_) => "unreachable (no answer within 5 s)".to_string(),
            Ok(Ok(_)) => "active".to_string(),
            Ok(Err(s)) if is_standby(&s) => format!("standby ({})", s.message()),
            Ok(Err(s)) if s.code() == tonic::Code::Unavailable => {
                format!("unreachable ({})", s.message())
            }
            // Refusing the token is something only a serving coordinator does.
            Ok(Err(_)) => "active".to_string(),
        };
        if role == "active" {
            active += 1;
        }
        println!("{url}  {role}");
    }
    if active == 0 {
        bail!(
            "no coordinator at {} is active; a standby takes over within --failover-seconds of the active one's death",
            access.url
        );
    }
    Ok(())
}

fn is_standby(s: &tonic::Status) -> bool {
    s.metadata()
        .get(standby::ROLE_HEADER)
        .is_some_and(|v| v.as_encoded_bytes() == b"standby")
}
