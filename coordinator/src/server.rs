//! Running a coordinator: open the data directory, serve gRPC, expire leases.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tessera_proto as pb;
use tokio::net::TcpListener;

use crate::blob_store::FsBlobStore;
use crate::clock::SystemClock;
use crate::error::Error;
use crate::farm::{Config, Farm};
use crate::grpc::{BlobsService, FarmService, WorkService, CHUNK};
use crate::store::SledStore;

/// Largest gRPC message accepted (blobs travel in 1 MiB chunks).
const MAX_MESSAGE: usize = 4 * CHUNK;

/// A coordinator over a data directory.
pub struct Coordinator {
    farm: Arc<Farm>,
}

impl Coordinator {
    /// Opens `data` (creating it): metadata in `data/db`, blobs in `data/blobs`.
    pub fn open(data: &Path, config: Config) -> Result<Self, Error> {
        std::fs::create_dir_all(data)
            .map_err(|e| Error::io(format!("cannot create {}", data.display()), e))?;
        let store = Arc::new(SledStore::open(&data.join("db"))?);
        let blobs = Arc::new(FsBlobStore::open(&data.join("blobs"), config.max_upload)?);
        let farm = Farm::open(store, blobs, Arc::new(SystemClock), config)?;
        farm.recover_stitching()?;
        Ok(Self {
            farm: Arc::new(farm),
        })
    }

    /// The domain service.
    pub fn farm(&self) -> &Arc<Farm> {
        &self.farm
    }

    /// Serves gRPC on `listener` (and HTTP on `http`, when given) until
    /// `shutdown` resolves.
    pub async fn serve(
        self,
        listener: TcpListener,
        http: Option<TcpListener>,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), Error> {
        let (http_stop, http_stopped) = tokio::sync::oneshot::channel::<()>();
        let http_task = http.map(|l| {
            let farm = self.farm.clone();
            tokio::spawn(async move {
                let stopped = async move {
                    let _ = http_stopped.await;
                };
                if let Err(e) = crate::http::serve(farm, l, stopped).await {
                    tracing::error!("HTTP server stopped: {e}");
                }
            })
        });
        let farm = self.farm.clone();
        let reaper = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            loop {
                tick.tick().await;
                if let Err(e) = farm.expire_leases() {
                    tracing::error!("cannot expire leases: {e}");
                }
            }
        });
        let addr = listener.local_addr().ok();
        tracing::info!(?addr, "coordinator listening");
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let blobs = pb::blobs_server::BlobsServer::new(BlobsService::new(self.farm.clone()))
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        let farm = pb::farm_server::FarmServer::new(FarmService::new(self.farm.clone()))
            .max_decoding_message_size(MAX_MESSAGE);
        let work = pb::work_server::WorkServer::new(WorkService::new(self.farm.clone()))
            .max_decoding_message_size(MAX_MESSAGE);
        let result = tonic::transport::Server::builder()
            .add_service(blobs)
            .add_service(farm)
            .add_service(work)
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await;
        reaper.abort();
        let _ = http_stop.send(());
        if let Some(t) = http_task {
            let _ = t.await;
        }
        result.map_err(|e| Error::Store(format!("server stopped: {e}")))
    }
}
