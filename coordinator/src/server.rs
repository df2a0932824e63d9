//! Running a coordinator: open the data directory, serve gRPC, expire leases.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tessera_proto as pb;
use tokio::net::TcpListener;

use crate::adapters::connections::{ConnectionLimits, Gate, PaceBodies, Permit, Watched};
use crate::adapters::grpc::{BlobsService, FarmService, WorkService};
use crate::adapters::lanes::{self, Conn, Homed, Lane, Rewound};
use crate::auth::Role;
use crate::blobs::{BlobStore, FsBlobStore};
use crate::clock::SystemClock;
use crate::error::Error;
use crate::farm::{Config, Farm};
use crate::store::{MetaStore, SledStore};
use tonic::service::interceptor::InterceptedService;

/// A coordinator over a data directory.
pub struct Coordinator {
    farm: Arc<Farm>,
    admin_token: Option<std::path::PathBuf>,
    tls: Option<(Vec<u8>, Vec<u8>)>,
    /// How preview videos are made, and where their frames are laid out.
    previews: (crate::imaging::video::Ffmpeg, std::path::PathBuf),
    /// How many connections both ports take, and how long they may stall.
    limits: ConnectionLimits,
    /// Asked on every request: Some(words) when this coordinator may no
    /// longer answer as active (see [`crate::ha`]).
    active: Option<ActiveCheck>,
}

pub use crate::adapters::http::ActiveCheck;

/// Aborts a background task when the server's future ends or is dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Writes a secret readable by its owner only.
fn write_secret(path: &Path, secret: &str) -> Result<(), Error> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| Error::io(format!("cannot write {}", path.display()), e))?;
    writeln!(f, "{secret}").map_err(|e| Error::io(format!("cannot write {}", path.display()), e))
}

impl Coordinator {
    /// Opens `data` (creating it): metadata in `data/db`, blobs in `data/blobs`.
    pub fn open(data: &Path, config: Config) -> Result<Self, Error> {
        let blobs =
            Arc::new(FsBlobStore::open(&data.join("blobs"), config.max_upload)?.in_data_dir(data));
        Self::open_with_blobs(data, config, blobs)
    }

    /// Opens `data` (creating it) for the metadata, with the blobs in
    /// `blobs` (see [`crate::blobs::location::open`]).
    pub fn open_with_blobs(
        data: &Path,
        config: Config,
        blobs: Arc<dyn BlobStore>,
    ) -> Result<Self, Error> {
        std::fs::create_dir_all(data)
            .map_err(|e| Error::io(format!("cannot create {}", data.display()), e))?;
        let store = Arc::new(SledStore::open(&data.join("db"))?);
        Self::open_on(data, store, blobs, config)
    }

    /// Opens a coordinator on `store` and `blobs`, with its admin token
    /// (when this start creates one) written to `data/admin.token`.
    pub fn open_on(
        data: &Path,
        store: Arc<dyn MetaStore>,
        blobs: Arc<dyn BlobStore>,
        config: Config,
    ) -> Result<Self, Error> {
        std::fs::create_dir_all(data)
            .map_err(|e| Error::io(format!("cannot create {}", data.display()), e))?;
        let farm = Farm::open(store, blobs, Arc::new(SystemClock), config)?;
        // Frames a preview left behind when the coordinator stopped mid-way.
        let _ = std::fs::remove_dir_all(data.join("tmp").join("previews"));
        farm.recover_stitching()?;
        let admin_token = match farm.ensure_admin()? {
            Some(token) => {
                let path = data.join("admin.token");
                write_secret(&path, &token)?;
                tracing::warn!("created the admin token; it is in {}", path.display());
                Some(path)
            }
            None => None,
        };
        Ok(Self {
            farm: Arc::new(farm),
            admin_token,
            tls: None,
            previews: (Default::default(), data.join("tmp").join("previews")),
            limits: ConnectionLimits::default(),
            active: None,
        })
    }

    /// Where the admin token was written, when this start created it.
    pub fn admin_token_path(&self) -> Option<&Path> {
        self.admin_token.as_deref()
    }

    /// Serves gRPC (and the HTTP port) over TLS with this certificate chain
    /// and key (PEM).
    pub fn with_tls(mut self, cert_pem: Vec<u8>, key_pem: Vec<u8>) -> Self {
        self.tls = Some((cert_pem, key_pem));
        self
    }

    /// Makes preview videos with this ffmpeg (default: `ffmpeg` on `PATH`,
    /// at most 10 minutes a preview).
    pub fn with_ffmpeg(mut self, ffmpeg: crate::imaging::video::Ffmpeg) -> Self {
        self.previews.0 = ffmpeg;
        self
    }

    /// Bounds connections and their stalls on both ports (default:
    /// [`ConnectionLimits::default`]).
    pub fn with_connection_limits(mut self, limits: ConnectionLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Refuses every request, as a standby would, whenever `check` says
    /// so (a coordinator whose leadership lapsed).
    pub fn with_active_check(mut self, check: ActiveCheck) -> Self {
        self.active = Some(check);
        self
    }

    /// The domain service.
    pub fn farm(&self) -> &Arc<Farm> {
        &self.farm
    }

    /// Serves gRPC on `listener` (and HTTP on `http`, when given) until
    /// `shutdown` resolves. Clients are served in a lane of their own
    /// ([`crate::adapters::lanes`]); the fleet on the runtime this runs on.
    pub async fn serve(
        self,
        listener: TcpListener,
        http: Option<TcpListener>,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), Error> {
        // One count for both ports: they draw on one file limit.
        let gate = Gate::new(self.limits);
        // The HTTP port serves HTTPS with the same certificate as gRPC.
        let http_tls = match (&http, &self.tls) {
            (Some(_), Some((cert, key))) => Some(crate::adapters::http::tls::acceptor(cert, key)?),
            _ => None,
        };
        let addr = listener.local_addr().ok();
        let http = http.map(|l| l.into_std()).transpose().map_err(lane_io)?;
        // Every gRPC connection is accepted, its TLS session made, and
        // sorted into a lane by its first request in the clients' lane.
        let grpc_tls = match &self.tls {
            Some((cert, key)) => Some(crate::adapters::http::tls::grpc_acceptor(cert, key)?),
            None => None,
        };
        let (fleet_tx, fleet_rx) = tokio::sync::mpsc::unbounded_channel::<Handed>();
        let lane_listener = listener.into_std().map_err(lane_io)?;
        let lane = {
            let servers = LaneServers {
                farm: self.farm.clone(),
                active: self.active.clone(),
                gate: gate.clone(),
                http,
                http_tls,
                grpc: lane_listener,
                grpc_tls,
                router: self.grpc_router(),
                fleet: fleet_tx,
            };
            lanes::ClientsLane::start(move |stopped| servers.serve(stopped)).map_err(lane_io)?
        };
        // Previews are made on a thread of their own, one at a time, until
        // this returns (the guard stops it).
        let (ffmpeg, scratch) = self.previews.clone();
        let _previews =
            crate::farm::preview_runner::Runner::new(self.farm.clone(), ffmpeg, scratch).start();
        let farm = self.farm.clone();
        let reaper = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            let mut ticks: u64 = 0;
            loop {
                tick.tick().await;
                ticks += 1;
                // Off the runtime's threads: these wait for the store.
                let f = farm.clone();
                let _ = tokio::task::spawn_blocking(move || {
                    if let Err(e) = f.expire_leases() {
                        tracing::error!("cannot expire leases: {e}");
                    }
                    // Frames left in the stitch queue (a stitch that failed to
                    // read, a retry after a cancel) and blobs nothing references.
                    f.stitch_pending();
                    // Jobs whose dependency failed, jobs at their budget.
                    f.react();
                    f.collect_garbage();
                    // Finished jobs past --keep-days, twice a minute.
                    if let (Some(keep), 0) = (f.config().keep_ms, ticks % 60) {
                        let n = f.archive_older_than(keep);
                        if n > 0 {
                            tracing::info!(jobs = n, "finished jobs archived (--keep-days)");
                        }
                    }
                })
                .await;
            }
        });
        let _reaper_guard = AbortOnDrop(reaper.abort_handle());
        tracing::info!(?addr, "coordinator listening");
        let incoming = tokio_stream::StreamExt::filter_map(
            tokio_stream::wrappers::UnboundedReceiverStream::new(fleet_rx),
            |mut h: Handed| match h.conn.homed().settle() {
                Ok(()) => Some(Ok::<_, std::io::Error>(Watched::new(
                    Rewound::new(h.head, h.conn),
                    h.permit,
                    0,
                ))),
                Err(e) => {
                    tracing::warn!("cannot take over a worker's connection: {e}");
                    None
                }
            },
        );
        let result = self
            .grpc_router()
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await;
        reaper.abort();
        lane.finish().await;
        result.map_err(|e| Error::Internal(format!("the gRPC server stopped: {e}")))
    }

    /// The gRPC services, as each lane serves them.
    fn grpc_router(&self) -> GrpcRouter {
        let guard = |roles: &'static [Role]| {
            let farm = self.farm.clone();
            let active = self.active.clone();
            move |req: tonic::Request<()>| {
                if let Some(words) = active.as_ref().and_then(|check| check()) {
                    return Err(crate::adapters::refusal::refusal_status(words));
                }
                crate::adapters::grpc::authorize(&farm, req, roles)
            }
        };
        let max_message = self.farm.config().max_message;
        let blobs = InterceptedService::new(
            pb::blobs_server::BlobsServer::new(BlobsService::new(self.farm.clone()))
                .max_decoding_message_size(max_message)
                .max_encoding_message_size(max_message),
            guard(&[Role::Admin, Role::User, Role::Worker]),
        );
        let farm = InterceptedService::new(
            pb::farm_server::FarmServer::new(FarmService::new(self.farm.clone()))
                .max_decoding_message_size(max_message),
            guard(&[Role::Admin, Role::User]),
        );
        // A Complete may carry small results inline on top of its fields.
        let max_work_message =
            max_message.saturating_add(crate::adapters::grpc::INLINE_COMPLETE_MAX as usize);
        let work = InterceptedService::new(
            pb::work_server::WorkServer::new(WorkService::new(self.farm.clone()))
                .max_decoding_message_size(max_work_message),
            guard(&[Role::Admin, Role::Worker]),
        );
        // Wide HTTP/2 windows: blobs stream in 1 MiB chunks (the default
        // 64 KiB windows stall them every few chunks).
        let limits = self.limits;
        // TLS sessions are made in the clients' lane, before sorting.
        tonic::transport::Server::builder()
            .initial_stream_window_size(Some(8 << 20))
            .initial_connection_window_size(Some(32 << 20))
            // Pings keep a live client's connection moving (so only a dead
            // or silent one meets --idle-timeout) and find dead peers.
            .http2_keepalive_interval(Some(limits.keepalive()))
            .http2_keepalive_timeout(Some(limits.keepalive()))
            .layer(PaceBodies(limits.body_timeout))
            .add_service(blobs)
            .add_service(farm)
            .add_service(work)
    }
}

/// The gRPC services with their layers, as each lane serves them.
type GrpcRouter = tonic::transport::server::Router<
    tower::layer::util::Stack<PaceBodies, tower::layer::util::Identity>,
>;

/// What the clients' lane serves: the HTTP port whole, and every gRPC
/// connection until it is sorted (then the clients' ones).
struct LaneServers {
    farm: Arc<Farm>,
    active: Option<ActiveCheck>,
    gate: Arc<Gate>,
    http: Option<std::net::TcpListener>,
    http_tls: Option<tokio_rustls::TlsAcceptor>,
    grpc: std::net::TcpListener,
    grpc_tls: Option<tokio_rustls::TlsAcceptor>,
    router: GrpcRouter,
    fleet: tokio::sync::mpsc::UnboundedSender<Handed>,
}

impl LaneServers {
    /// Serves until `stopped` (on the lane's runtime, where the listeners
    /// join its reactor).
    async fn serve(self, stopped: lanes::Stopped) {
        let Self {
            farm,
            active,
            gate,
            http,
            http_tls,
            grpc,
            grpc_tls,
            router,
            fleet,
        } = self;
        let http_task = http.map(|l| {
            let (stopped, gate) = (stopped.clone(), gate.clone());
            tokio::spawn(async move {
                let l = TcpListener::from_std(l)?;
                crate::adapters::http::serve(farm, l, http_tls, gate, active, stopped.wait()).await
            })
        });
        match TcpListener::from_std(grpc) {
            Ok(l) => {
                let (clients_tx, clients_rx) = tokio::sync::mpsc::unbounded_channel();
                let accept = tokio::spawn(accept(l, grpc_tls, gate, clients_tx, fleet));
                let _accept_guard = AbortOnDrop(accept.abort_handle());
                let incoming = tokio_stream::StreamExt::map(
                    tokio_stream::wrappers::UnboundedReceiverStream::new(clients_rx),
                    Ok::<_, std::io::Error>,
                );
                if let Err(e) = router
                    .serve_with_incoming_shutdown(incoming, stopped.wait())
                    .await
                {
                    tracing::error!("the clients' gRPC server stopped: {e}");
                }
            }
            Err(e) => tracing::error!("cannot serve gRPC in the clients' lane: {e}"),
        }
        if let Some(t) = http_task {
            match t.await {
                Ok(Err(e)) => tracing::error!("HTTP server stopped: {e}"),
                Err(e) => tracing::error!("HTTP server stopped: {e}"),
                Ok(Ok(())) => {}
            }
        }
    }
}

/// A worker's connection, sorted in the clients' lane and handed to the
/// fleet's runtime (which registers the socket with its own reactor).
struct Handed {
    conn: Conn,
    permit: Permit,
    head: Vec<u8>,
}

/// The gRPC port's accept loop, in the clients' lane: each connection
/// `gate` admits is sorted by its first request, then served in the lane
/// or handed to the fleet. Refused and silent ones are closed.
async fn accept(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    gate: Arc<Gate>,
    clients: tokio::sync::mpsc::UnboundedSender<Watched<Rewound<Conn>>>,
    fleet: tokio::sync::mpsc::UnboundedSender<Handed>,
) {
    loop {
        let (s, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of file descriptors, most likely: let some close.
                tracing::warn!("cannot accept a gRPC connection: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(permit) = gate.admit_grpc(&s) else {
            continue;
        };
        // The TLS handshake and the HTTP/2 preface are due within the
        // header timeout.
        let deadline = tokio::time::Instant::now() + gate.limits().header_timeout;
        let (clients, fleet, tls) = (clients.clone(), fleet.clone(), tls.clone());
        tokio::spawn(async move {
            let mut conn = match tls {
                None => Conn::Plain(Homed::new(s)),
                Some(tls) => {
                    match tokio::time::timeout_at(deadline, tls.accept(Homed::new(s))).await {
                        Ok(Ok(t)) => Conn::Tls(Box::new(t)),
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, "TLS handshake failed: {e}");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "TLS handshake not done within the header timeout");
                            return;
                        }
                    }
                }
            };
            match lanes::sort(&mut conn, deadline).await {
                Ok((Lane::Clients, head)) => {
                    tracing::debug!(%peer, "a client's connection, served in the clients' lane");
                    let _ = clients.send(Watched::new(Rewound::new(head, conn), permit, 0));
                }
                Ok((Lane::Fleet, head)) => match conn.homed().leave() {
                    Ok(()) => {
                        let _ = fleet.send(Handed { conn, permit, head });
                    }
                    Err(e) => tracing::warn!(%peer, "cannot hand a connection over: {e}"),
                },
                Err(e) => tracing::debug!(%peer, "connection closed before its first request: {e}"),
            }
        });
    }
}

fn lane_io(e: std::io::Error) -> Error {
    Error::io("cannot start the clients' lane".into(), e)
}
