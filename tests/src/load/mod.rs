//! A load generator for the coordinator: fake workers and clients that
//! drive a real `tessera coordinator` over its real gRPC and HTTP interfaces
//! on loopback, and the figures they measure.
//!
//! It talks to the coordinator only through the wire protocol, so the same
//! generator measures any coordinator that speaks it (today's and a
//! rewritten one side by side).
//!
//! # Layout
//! * [`process`]: a coordinator process the generator starts and kills, and
//!   what `/proc` says about it (RSS, CPU).
//! * [`setup`]: worker tokens, the scene upload, the job submit, and reading a
//!   job's tasks back page by page.
//! * [`fake_worker`]: [`FakeWorker`]s and their slots: lease, progress, upload
//!   a result, complete; every acknowledged completion is recorded.
//! * [`observe`]: a client polling `ListJobs`/`GetJob` and a `/metrics` scraper.
//! * [`stats`]: timed calls and their percentiles.
//! * [`run`]: one measured run (warm-up, window) and the kill-and-restart
//!   recovery measure.
//! * [`report`]: a run's figures as a table row or JSON, and the table that
//!   puts two designs side by side.

pub mod fake_worker;
pub mod observe;
pub mod process;
pub mod report;
pub mod run;
pub mod setup;
pub mod stats;

use std::time::Duration;

use tessera_proto as pb;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

pub use fake_worker::{Acked, FakeWorker, Fleet, FleetConfig, Recorder};
pub use report::{Recovery, Report};
pub use run::{RunConfig, Target};

/// The largest reply decoded: today's coordinator answers `GetJob` and
/// `ListJobs` with every task of a job (about 14 MB for a million frames).
pub const MAX_DECODE: usize = 1 << 30;

/// What went wrong while generating load.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A call the coordinator refused or could not answer.
    #[error("{what} failed: {} ({:?})", .status.message(), .status.code())]
    Rpc {
        /// The call.
        what: String,
        /// The coordinator's answer.
        status: tonic::Status,
    },
    /// A step that did not finish in its time.
    #[error("{what} did not finish within {after:?}")]
    Timeout {
        /// The step.
        what: String,
        /// Its time limit.
        after: Duration,
    },
    /// A file or process the generator needs.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The coordinator or its answers were not what the protocol promises.
    #[error("{0}")]
    Coordinator(String),
}

impl LoadError {
    /// An I/O error while doing `what`.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            what: what.into(),
            source,
        }
    }

    /// A refused call.
    pub fn rpc(what: impl Into<String>, status: tonic::Status) -> Self {
        Self::Rpc {
            what: what.into(),
            status,
        }
    }

    /// Whether this is a step that ran out of time.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Self::Timeout { .. })
    }
}

/// Adds `authorization: Bearer <token>` to every call.
#[derive(Clone)]
pub struct Bearer(tonic::metadata::MetadataValue<tonic::metadata::Ascii>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut().insert("authorization", self.0.clone());
        Ok(req)
    }
}

/// A connection with its token.
pub type Conn = InterceptedService<Channel, Bearer>;

/// A new HTTP/2 connection to `url` (made on first use) that sends `token`.
/// Every call of this function makes its own connection, as separate worker
/// machines would.
pub fn connect(url: &str, token: &str) -> Result<Conn, LoadError> {
    let endpoint = Endpoint::from_shared(url.to_string())
        .map_err(|e| LoadError::Coordinator(format!("`{url}` is not a coordinator URL: {e}")))?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true);
    let bearer = format!("Bearer {}", token.trim())
        .parse()
        .map_err(|_| LoadError::Coordinator("the token cannot travel in a header".into()))?;
    Ok(InterceptedService::new(
        endpoint.connect_lazy(),
        Bearer(bearer),
    ))
}

/// The `Farm` service over `conn`, decoding replies as large as [`MAX_DECODE`].
pub fn farm(conn: Conn) -> pb::farm_client::FarmClient<Conn> {
    pb::farm_client::FarmClient::new(conn).max_decoding_message_size(MAX_DECODE)
}

/// The `Work` service over `conn`.
pub fn work(conn: Conn) -> pb::work_client::WorkClient<Conn> {
    pb::work_client::WorkClient::new(conn).max_decoding_message_size(MAX_DECODE)
}

/// The `Blobs` service over `conn`.
pub fn blobs(conn: Conn) -> pb::blobs_client::BlobsClient<Conn> {
    pb::blobs_client::BlobsClient::new(conn)
}

/// Runs `fut` for at most `limit`, naming the step `what` when it runs out.
pub async fn within<T>(
    what: &str,
    limit: Duration,
    fut: impl std::future::Future<Output = Result<T, LoadError>>,
) -> Result<T, LoadError> {
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r,
        Err(_) => Err(LoadError::Timeout {
            what: what.to_string(),
            after: limit,
        }),
    }
}
