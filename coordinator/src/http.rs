//! The coordinator's HTTP side: `GET /metrics` (Prometheus, a thin adapter
//! over [`crate::metrics`]) beside the JSON API and the dashboard of
//! [`crate::api`], over plain HTTP or, with the coordinator's certificate,
//! HTTPS.

use std::future::Future;
use std::sync::Arc;

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;

use crate::api::{self, Api};
use crate::farm::Farm;

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
                let body = tokio::task::spawn_blocking(move || crate::metrics::render(&farm, &who))
                    .await
                    .unwrap_or_default();
                (
                    [(
                        header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
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

/// Serves HTTP on `listener` (HTTPS with `tls`) until `shutdown` resolves.
pub async fn serve(
    farm: Arc<Farm>,
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    match tls {
        Some(acceptor) => {
            let listener = api::tls::TlsListener::new(listener, acceptor)?;
            axum::serve(listener, app(farm, true))
                .with_graceful_shutdown(shutdown)
                .await
        }
        None => {
            axum::serve(listener, app(farm, false))
                .with_graceful_shutdown(shutdown)
                .await
        }
    }
}
