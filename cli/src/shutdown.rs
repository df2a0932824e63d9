//! How a long-running command stops: the signal that ends it, and the moment
//! its background tasks get to finish.

use std::time::Duration;

/// Resolves when SIGINT or SIGTERM arrives.
pub async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("signal handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// Gives a background task a moment to finish after its shutdown signal.
pub async fn settle<T>(handle: tokio::task::JoinHandle<T>) {
    let _ = tokio::time::timeout(Duration::from_secs(5), handle).await;
}
