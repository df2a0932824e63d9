//! The coordinator's HTTP side: `GET /metrics` (Prometheus, a thin adapter
//! over [`crate::adapters::metrics`]) beside the JSON API and the dashboard of
//! [`crate::adapters::api`], over plain HTTP or, with the coordinator's certificate,
//! HTTPS.

pub mod tls;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio::net::{TcpListener, TcpStream};

use crate::adapters::api::{self, Api};
use crate::adapters::connections::{ConnectionLimits, Gate, Paced, Watched};
use crate::farm::Farm;

/// Whether a coordinator may answer as active: None when it may, else the
/// words of a standby's refusal.
pub type ActiveCheck = std::sync::Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// The metrics route.
fn metrics(farm: Arc<Farm>) -> Router {
    Router::new().route(
        "/metrics",
        get(move |headers: axum::http::HeaderMap| {
            let farm = farm.clone();
            async move {
                let token = crate::auth::bearer(
                    headers
                        .get(header::AUTHORIZATION)
                        .and_then(|v| v.to_str().ok()),
                );
                let who = match farm.authenticate(token) {
                    Ok(who) => who,
                    Err(e) => {
                        let msg = format!("{e}\n");
                        return (
                            axum::http::StatusCode::UNAUTHORIZED,
                            [(header::WWW_AUTHENTICATE, "Bearer")],
                            msg,
                        )
                            .into_response();
                    }
                };
                let body = tokio::task::spawn_blocking(move || {
                    crate::adapters::metrics::render(&farm, &who)
                })
                .await
                .unwrap_or_default();
                (
                    [(header::CONTENT_TYPE, crate::adapters::metrics::CONTENT_TYPE)],
                    body,
                )
                    .into_response()
            }
        }),
    )
}

/// Everything the HTTP port serves.
pub fn app(farm: Arc<Farm>, tls: bool) -> Router {
    metrics(farm.clone()).merge(api::router(Api::new(farm, tls)))
}

/// Serves HTTP on `listener` (HTTPS with `tls`) until `shutdown` resolves,
/// its connections counted and timed by `gate`.
pub(crate) async fn serve(
    farm: Arc<Farm>,
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    gate: Arc<Gate>,
    active: Option<ActiveCheck>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_app(listener, tls, gate, shutdown, |tls| {
        let app = app(farm, tls);
        match active {
            // Every request asks first whether this coordinator is still active.
            Some(check) => app.layer(axum::middleware::from_fn(
                move |req: axum::extract::Request, next: axum::middleware::Next| {
                    let refused = check();
                    async move {
                        match refused {
                            Some(words) => crate::adapters::refusal::http_refusal(words),
                            None => next.run(req).await,
                        }
                    }
                },
            )),
            None => app,
        }
    })
    .await
}

/// Serves the router `app` makes (given whether it is HTTPS) on `listener`.
pub(crate) async fn serve_app(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    gate: Arc<Gate>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    app: impl FnOnce(bool) -> Router,
) -> std::io::Result<()> {
    let limits = *gate.limits();
    match tls {
        Some(acceptor) => {
            // Refused TLS clients are closed unanswered: plain text would
            // not reach them.
            let listener = GatedListener::new(listener, gate, false)?;
            let listener = tls::TlsListener::new(listener, acceptor)?;
            serve_connections(listener, app(true), limits, shutdown).await
        }
        None => {
            let listener = GatedListener::new(listener, gate, true)?;
            serve_connections(listener, app(false), limits, shutdown).await
        }
    }
}

/// The accept loop: hyper's HTTP/1 with a header-read timeout (which
/// `axum::serve` does not set) and every request body paced.
async fn serve_connections<L>(
    mut listener: L,
    app: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    L: axum::serve::Listener,
{
    use hyper_util::rt::{TokioIo, TokioTimer};
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (io, _) = tokio::select! {
            c = listener.accept() => c,
            _ = &mut shutdown => break,
        };
        let body_timeout = limits.body_timeout;
        let service = tower::ServiceExt::map_request(
            app.clone(),
            move |r: axum::http::Request<hyper::body::Incoming>| {
                r.map(|b| axum::body::Body::new(Paced::new(b, body_timeout)))
            },
        );
        let conn = http.serve_connection(
            TokioIo::new(io),
            hyper_util::service::TowerToHyperService::new(service),
        );
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!("HTTP connection ended: {e}");
            }
        });
    }
    drop(listener);
    // Open event streams would hold a graceful shutdown forever.
    let _ = tokio::time::timeout(Duration::from_secs(5), graceful.shutdown()).await;
    Ok(())
}

/// A TCP listener that hands out only the connections `gate` admits,
/// watched for stalls; a refused client is told why (when `tell`) and closed.
pub(crate) struct GatedListener {
    listener: TcpListener,
    gate: Arc<Gate>,
    tell: bool,
    addr: SocketAddr,
}

impl GatedListener {
    /// Gates `listener`.
    pub(crate) fn new(listener: TcpListener, gate: Arc<Gate>, tell: bool) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        Ok(Self {
            listener,
            gate,
            tell,
            addr,
        })
    }

    /// The next admitted connection.
    pub(crate) async fn accept_watched(&mut self) -> (Watched<TcpStream>, SocketAddr) {
        loop {
            let (tcp, peer) = match self.listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    // Out of files, most often: wait for some to close.
                    tracing::debug!("HTTP accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            match self.gate.admit(peer.ip()) {
                Ok(permit) => return (Watched::new(tcp, permit, 0), peer),
                Err(refusal) => {
                    let text = refusal.message(self.gate.limits());
                    tracing::debug!(%peer, "HTTP connection refused: {text}");
                    if self.tell {
                        tokio::spawn(refuse(tcp, text));
                    }
                }
            }
        }
    }
}

/// Answers a refused connection 503 with the reason, then closes it.
async fn refuse(mut tcp: TcpStream, text: String) {
    use tokio::io::AsyncWriteExt;
    let body = format!("{text}\n");
    let reply = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\nretry-after: 5\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    // Never wait on a client that does not read.
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        tcp.write_all(reply.as_bytes()).await?;
        tcp.shutdown().await
    })
    .await;
}

impl axum::serve::Listener for GatedListener {
    type Io = Watched<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        self.accept_watched().await
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.addr)
    }
}
