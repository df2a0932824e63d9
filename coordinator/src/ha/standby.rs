//! What a standby coordinator serves while it waits to take over: every gRPC
//! call is answered `Unavailable` with the words "this coordinator is
//! standby; the active one is ..." and the metadata `tessera-role: standby`
//! (clients read that field, never the words, to move on to the next
//! address); the HTTP port serves `/metrics` with the role and whether
//! PostgreSQL answers (`tessera_store_up`), and answers anything else 503
//! with the same words. While PostgreSQL is unreachable the words say so:
//! "store: PostgreSQL at … unreachable since …".
//!
//! The standby serves on duplicates of the coordinator's listening sockets
//! and stops when it takes over; the active server then accepts on the
//! originals, so the ports never change and nothing in the backlog is lost.

use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use tessera_proto as pb;
use tokio::net::TcpListener;
use tonic::body::Body;
use tonic::codegen::http;

use super::{Attempt, Election, Term};
pub use crate::adapters::refusal::ROLE_HEADER;
use crate::adapters::refusal::{http_refusal, refusal_status};
use crate::error::Error;
use crate::health::StoreHealth;

/// What a standby tells callers now (refreshed from the leader row).
type Message = Arc<RwLock<String>>;

fn refusal(msg: &Message) -> http::Response<Body> {
    let text = msg.read().unwrap_or_else(|e| e.into_inner()).clone();
    refusal_status(text).into_http()
}

macro_rules! refusing_service {
    ($name:ident, $service:expr) => {
        /// Refuses every call of one gRPC service while standby.
        #[derive(Clone)]
        struct $name(Message);

        impl tonic::server::NamedService for $name {
            const NAME: &'static str = $service;
        }

        impl tonic::codegen::Service<http::Request<Body>> for $name {
            type Response = http::Response<Body>;
            type Error = Infallible;
            type Future = std::future::Ready<Result<Self::Response, Infallible>>;

            fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
                Poll::Ready(Ok(()))
            }

            fn call(&mut self, _: http::Request<Body>) -> Self::Future {
                std::future::ready(Ok(refusal(&self.0)))
            }
        }
    };
}

refusing_service!(FarmRefusal, pb::farm_server::SERVICE_NAME);
refusing_service!(WorkRefusal, pb::work_server::SERVICE_NAME);
refusing_service!(BlobsRefusal, pb::blobs_server::SERVICE_NAME);

/// A second handle on a listening socket (the same accept queue).
fn duplicate(l: &std::net::TcpListener) -> Result<TcpListener, Error> {
    l.try_clone()
        .and_then(TcpListener::from_std)
        .map_err(|e| Error::io("cannot share the listening socket".into(), e))
}

/// The standby's HTTP routes: the role and the store's health at
/// `/metrics`, 503 elsewhere.
fn http_app(msg: Message, health: StoreHealth) -> axum::Router {
    use axum::http::header;
    axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || {
                let body = crate::adapters::metrics::standby(&health);
                async move {
                    (
                        [(header::CONTENT_TYPE, crate::adapters::metrics::CONTENT_TYPE)],
                        body,
                    )
                }
            }),
        )
        .fallback(move || {
            let text = msg.read().unwrap_or_else(|e| e.into_inner()).clone();
            async move { http_refusal(text) }
        })
}

/// What a standby says now: who is active, or that PostgreSQL is out of reach.
async fn look(election: &Election) -> Result<Attempt, String> {
    election
        .try_take_over()
        .await
        .map_err(|e| election.unreachable_message(&e))
}

/// Serves as a standby on duplicates of `grpc` and `http` until this
/// coordinator takes over (its term) or `shutdown` resolves (None).
/// PostgreSQL being out of reach is no reason to stop: the standby says so
/// and keeps trying.
pub async fn serve_until_active(
    election: &Election,
    grpc: &std::net::TcpListener,
    http: Option<&std::net::TcpListener>,
    tls: Option<&(Vec<u8>, Vec<u8>)>,
    limits: crate::adapters::connections::ConnectionLimits,
    shutdown: impl Future<Output = ()>,
    first: String,
) -> Result<Option<Term>, Error> {
    let msg: Message = Arc::new(RwLock::new(first));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let wait_stop = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let mut builder = tonic::transport::Server::builder();
    if let Some((cert, key)) = tls {
        let identity = tonic::transport::Identity::from_pem(cert, key);
        builder = builder
            .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
            .map_err(|e| {
                Error::invalid(format!("bad TLS certificate or key: {e}; give PEM files"))
            })?;
    }
    // The standby's ports are bounded like the active's: a flood must not
    // use up the files the coordinator needs when it takes over.
    let gate = crate::adapters::connections::Gate::new(limits);
    let incoming = crate::adapters::connections::gated(duplicate(grpc)?, gate.clone());
    let server = builder
        .add_service(FarmRefusal(msg.clone()))
        .add_service(WorkRefusal(msg.clone()))
        .add_service(BlobsRefusal(msg.clone()))
        .serve_with_incoming_shutdown(incoming, wait_stop(stopped.clone()));
    let grpc_task = tokio::spawn(async move {
        if let Err(e) = server.await {
            tracing::warn!("the standby's gRPC server stopped: {e}");
        }
    });
    let http_task = match http {
        Some(l) => {
            let listener = duplicate(l)?;
            let app = http_app(msg.clone(), election.health().clone());
            let done = wait_stop(stopped.clone());
            let tls = tls
                .map(|(cert, key)| crate::adapters::http::tls::acceptor(cert, key))
                .transpose()?;
            let gate = gate.clone();
            Some(tokio::spawn(async move {
                let _ = crate::adapters::http::serve_app(listener, tls, gate, done, |_| app).await;
            }))
        }
        None => None,
    };
    tokio::pin!(shutdown);
    let mut last = String::new();
    let outcome = loop {
        tokio::select! {
            _ = &mut shutdown => break None,
            _ = tokio::time::sleep(election.timing.poll) => {}
        }
        let text = match look(election).await {
            Ok(Attempt::Won(term)) => break Some(term),
            Ok(Attempt::Standby(leader)) => {
                if leader.standby_message() != last {
                    tracing::info!(active = %leader.url, holder = %leader.holder, epoch = leader.epoch, expired = leader.expired, "standby");
                }
                leader.standby_message()
            }
            Err(text) => text,
        };
        last = text.clone();
        *msg.write().unwrap_or_else(|e| e.into_inner()) = text;
    };
    let _ = stop.send(true);
    // Connections to the standby are told to go away; clients reconnect
    // to the same port, where the active server then accepts.
    for task in std::iter::once(grpc_task).chain(http_task) {
        let abort = task.abort_handle();
        if tokio::time::timeout(Duration::from_secs(2), task)
            .await
            .is_err()
        {
            abort.abort();
        }
    }
    Ok(outcome)
}

/// The first words of a standby, and the term when this coordinator can
/// take over at once.
pub async fn first_look(election: &Election) -> Result<Term, String> {
    match look(election).await {
        Ok(Attempt::Won(term)) => Ok(term),
        Ok(Attempt::Standby(leader)) => Err(leader.standby_message()),
        Err(text) => Err(text),
    }
}
