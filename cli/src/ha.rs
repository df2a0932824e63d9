//! A coordinator on PostgreSQL, active or standby
//! (`tessera coordinator --store postgres://...`), and asking coordinators
//! which one is active (`tessera coordinator --status`).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tessera_coordinator::ha::{self, standby, Election};
use tessera_coordinator::store::PgStore;
use tessera_proto as pb;
use tessera_worker::connect::{self, Access};
use tokio::net::TcpListener;

use crate::setup::{announce, bind, connection_limits, open_blobs, say_admin_token};
use crate::shutdown::shutdown_signal;
use crate::CoordinatorArgs;

/// Starts with the active coordinator when `access` lists several.
pub async fn find_active(access: &Access) {
    let Ok(addresses) = tessera_worker::failover::addresses(&access.url) else {
        return;
    };
    if addresses.len() < 2 {
        return;
    }
    if let Ok(conn) = connect::channel(access) {
        connect::find_active(conn, addresses.len()).await;
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

/// Runs a coordinator on PostgreSQL: standby until it takes over, then
/// active until its leadership ends (lapsed, deposed, PostgreSQL out of
/// reach), then standby again, and so on until it is stopped. An outage
/// of PostgreSQL is ridden out, never a reason to exit.
pub async fn coordinator(
    args: &CoordinatorArgs,
    config: tessera_coordinator::Config,
    tls: Option<(Vec<u8>, Vec<u8>)>,
    ffmpeg: tessera_coordinator::imaging::video::Ffmpeg,
) -> Result<()> {
    let url = args.store.clone().unwrap_or_default().trim().to_string();
    if !(args.failover_seconds.is_finite() && args.failover_seconds >= 1.0) {
        bail!(
            "--failover-seconds {} is too short; use 1 second or more",
            args.failover_seconds
        );
    }
    let failover = Duration::from_secs_f64(args.failover_seconds);
    let holder = ha::holder_name();
    let store = {
        let url = url.clone();
        let session = ha::session_name(&holder);
        // A store call may take as long as a failover, no longer.
        tokio::task::spawn_blocking(move || PgStore::open_as(&url, &session, failover))
            .await
            .context("the store's start panicked")??
    };
    let limits = connection_limits(args)?;
    let (listener, http) = bind(args).await?;
    let addr = listener.local_addr()?;
    let http_addr = http.as_ref().map(|h| h.local_addr()).transpose()?;
    let advertise = args
        .advertise
        .clone()
        .unwrap_or_else(|| default_advertise(addr, tls.is_some()));
    let election =
        Election::connect(&url, &holder, &advertise, failover, store.health_handle()).await?;
    let grpc = listener.into_std()?;
    let http = http.map(|h| h.into_std()).transpose()?;
    let blobs = open_blobs(args, config.max_upload)?;
    // One stop signal for every term and standby spell.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = stop_tx.send(true);
    });
    let stopped = || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    // The listening lines come first, once.
    let announced = std::cell::Cell::new(false);
    let announce_once = || {
        if !announced.replace(true) {
            announce(args, addr, http_addr);
        }
    };
    loop {
        let term = match standby::first_look(&election).await {
            Ok(term) => term,
            Err(words) => {
                announce_once();
                println!("tessera coordinator standby: {words}");
                tracing::info!("standby: {words}");
                match standby::serve_until_active(
                    &election,
                    &grpc,
                    http.as_ref(),
                    tls.as_ref(),
                    limits,
                    stopped(),
                    words,
                )
                .await?
                {
                    Some(term) => term,
                    None => return Ok(()),
                }
            }
        };
        let epoch = term.epoch;
        tracing::info!(epoch, advertise = %advertise, "active: loading the state from PostgreSQL");
        let serve = async {
            let store: Arc<dyn tessera_coordinator::store::MetaStore> =
                Arc::new(store.fenced(epoch, term.lease.clone()));
            let data = args.data.clone();
            let blobs = blobs.clone();
            let config = config.clone();
            let coord = tokio::task::spawn_blocking(move || {
                tessera_coordinator::Coordinator::open_on(&data, store, blobs, config)
            })
            .await
            .context("loading the state panicked")?;
            let coord = match coord {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("tessera coordinator: cannot take over, loading the state from PostgreSQL failed: {e:#}; standing by");
                    return Ok::<_, anyhow::Error>(false);
                }
            };
            let lease = term.lease.clone();
            let health = election.health().clone();
            let mut coord = coord
                .with_ffmpeg(ffmpeg.clone())
                .with_connection_limits(limits)
                .with_active_check(Arc::new(move || {
                    (!lease.valid()).then(|| tessera_coordinator::ha::lapsed_message(&health))
                }));
            say_admin_token(&coord);
            if let Some((cert, key)) = &tls {
                coord = coord.with_tls(cert.clone(), key.clone());
            }
            announce_once();
            println!("tessera coordinator active (epoch {epoch})");
            let farm = coord.farm().clone();
            let grpc = TcpListener::from_std(grpc.try_clone()?)?;
            let http = http
                .as_ref()
                .map(|h| h.try_clone().and_then(TcpListener::from_std))
                .transpose()?;
            // Connections are told to go away when the term ends, too.
            let lease = term.lease.clone();
            let stop = stopped();
            let shutdown = async move {
                tokio::select! {
                    _ = stop => {}
                    _ = lease.lapsed() => {}
                }
            };
            let served = coord.serve(grpc, http, shutdown);
            tokio::pin!(served);
            let done = tokio::select! {
                _ = term.lease.lapsed() => None,
                r = &mut served => Some(r),
            };
            // Stepping down: parked calls and event streams end now; the
            // connections in flight get a moment to finish (every request
            // is refused as a standby's already), then are dropped.
            farm.stop_serving("its leadership ended".into());
            match done {
                Some(r) => {
                    r?;
                    Ok(*stop_rx.borrow())
                }
                None => {
                    let _ = tokio::time::timeout(Duration::from_secs(2), served).await;
                    Ok(false)
                }
            }
        };
        let mut why = None;
        // The lease is renewed while the term lasts, the state's loading
        // included; once it ends, the serving steps down. Both futures are
        // dropped before the leadership is released: a renewal left
        // suspended mid-call would hold the election's connection.
        let stop_requested = {
            tokio::pin!(serve);
            let hold = election.hold(&term);
            tokio::pin!(hold);
            loop {
                tokio::select! {
                    r = &mut serve => break r?,
                    w = &mut hold, if why.is_none() => why = Some(w),
                }
            }
        };
        // Whatever ended the term, a standby may take over at once.
        election.release(&term).await;
        if stop_requested {
            return Ok(());
        }
        let why = why.unwrap_or_else(|| "its leadership ended".into());
        println!("tessera coordinator stepped down (epoch {epoch}): {why}");
        tracing::warn!(epoch, "stepped down: {why}");
        // A moment before looking again, so that a standby may take over.
        tokio::select! {
            _ = stopped() => return Ok(()),
            _ = tokio::time::sleep(election.timing.poll) => {}
        }
    }
}

/// `tessera coordinator --status`: each address's role.
pub async fn status(access: &Access) -> Result<()> {
    let mut active = 0;
    for (url, _) in tessera_worker::failover::addresses(&access.url)? {
        let one = Access {
            url: url.clone(),
            ..access.clone()
        };
        let mut blobs = pb::blobs_client::BlobsClient::new(connect::channel(&one)?);
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
