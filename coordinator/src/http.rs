//! The coordinator's HTTP side: `GET /metrics` (Prometheus). A thin adapter
//! over [`crate::metrics`].

use std::future::Future;
use std::sync::Arc;

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;

use crate::farm::Farm;

/// Serves HTTP on `listener` until `shutdown` resolves.
pub async fn serve(
    farm: Arc<Farm>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new().route(
        "/metrics",
        get(move |headers: axum::http::HeaderMap| {
            let farm = farm.clone();
            async move {
                let token = crate::auth::bearer(
                    headers
                        .get(header::AUTHORIZATION)
                        .and_then(|v| v.to_str().ok()),
                );
                if let Err(e) = farm.authenticate(token) {
                    let msg = format!("{e}\n");
                    return (
                        axum::http::StatusCode::UNAUTHORIZED,
                        [(header::WWW_AUTHENTICATE, "Bearer")],
                        msg,
                    )
                        .into_response();
                }
                let body = tokio::task::spawn_blocking(move || crate::metrics::render(&farm))
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
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}
