//! A fake coordinator for tests of the worker's side of the protocol: it
//! hands one task to the first worker that asks, stores what is uploaded,
//! answers `Complete` as told, and records every `Complete` and `Fail`.
//! It predates `Renew` (it answers `UNIMPLEMENTED`), so the worker renews
//! its leases one `Progress` call each, as with an older coordinator.
//!
//! It serves the real `Work` and `Blobs` services on loopback, so a real
//! `tessera worker` with a real Blender talks to it unchanged.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tessera_proto as pb;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

/// What the fake coordinator saw.
#[derive(Debug, Default)]
pub struct Seen {
    /// Every `Complete` request, in order.
    pub completes: Vec<pb::CompleteRequest>,
    /// Every `Fail` request, in order.
    pub fails: Vec<pb::FailRequest>,
    /// Leases handed out.
    pub leases: u32,
    /// The digest of every PutBlob, in order.
    pub puts: Vec<String>,
    /// Lease calls that came after the first `Fail`: a one-slot worker
    /// asks again only once it is done with the failed task.
    pub leases_after_fail: u32,
    /// `Renew` calls (each answered `UNIMPLEMENTED`).
    pub renews: u32,
    /// The lease of every `Progress` call, in order.
    pub progress: Vec<String>,
}

/// How `Complete` is answered.
pub type CompleteAnswer = fn(&pb::CompleteRequest) -> Result<(), Status>;

#[derive(Clone)]
struct Fake {
    seen: Arc<Mutex<Seen>>,
    blobs: Arc<Mutex<HashMap<String, Vec<u8>>>>,
    scene: String,
    frames: Vec<u32>,
    complete: CompleteAnswer,
}

/// A running fake coordinator.
pub struct FakeCoordinator {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    seen: Arc<Mutex<Seen>>,
    _runtime: tokio::runtime::Runtime,
}

impl FakeCoordinator {
    /// Serves one task rendering `frames` of the scene at `scene_path`;
    /// `Complete` is answered with `complete`.
    pub fn start(scene_path: &std::path::Path, frames: &[u32], complete: CompleteAnswer) -> Self {
        let bytes = std::fs::read(scene_path).unwrap();
        let digest = blake3::hash(&bytes).to_hex().to_string();
        let fake = Fake {
            seen: Arc::default(),
            blobs: Arc::new(Mutex::new(HashMap::from([(digest.clone(), bytes)]))),
            scene: digest,
            frames: frames.to_vec(),
            complete,
        };
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = fake.seen.clone();
        runtime.spawn(async move {
            tonic::transport::Server::builder()
                .add_service(pb::work_server::WorkServer::new(fake.clone()))
                .add_service(pb::blobs_server::BlobsServer::new(fake))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .unwrap();
        });
        Self {
            url,
            seen,
            _runtime: runtime,
        }
    }

    /// What it has seen so far.
    pub fn seen<T>(&self, f: impl FnOnce(&Seen) -> T) -> T {
        f(&self.seen.lock().unwrap())
    }
}

#[tonic::async_trait]
impl pb::work_server::Work for Fake {
    async fn register(
        &self,
        _: Request<pb::WorkerInfo>,
    ) -> Result<Response<pb::RegisterResponse>, Status> {
        Ok(Response::new(pb::RegisterResponse {
            worker_id: "fake-worker".into(),
            lease_ttl_ms: 30_000,
            ..Default::default()
        }))
    }

    async fn lease(
        &self,
        req: Request<pb::LeaseRequest>,
    ) -> Result<Response<pb::LeaseResponse>, Status> {
        let first = {
            let mut seen = self.seen.lock().unwrap();
            seen.leases += 1;
            if !seen.fails.is_empty() {
                seen.leases_after_fail += 1;
            }
            seen.leases == 1
        };
        if !first {
            let wait = Duration::from_millis(u64::from(req.get_ref().wait_ms).min(1000));
            tokio::time::sleep(wait).await;
            return Ok(Response::new(pb::LeaseResponse::default()));
        }
        Ok(Response::new(pb::LeaseResponse {
            task: Some(pb::TaskAssignment {
                lease_id: "1.0.1".into(),
                job_id: 1,
                task_index: 0,
                scene_digest: self.scene.clone(),
                scene_name: "scene.blend".into(),
                frames: self.frames.clone(),
                attempt: 1,
                lease_ttl_ms: 30_000,
                tile: None,
                device: "cpu".into(),
                file_set_digest: String::new(),
                ..Default::default()
            }),
            ended_jobs: Vec::new(),
        }))
    }

    async fn progress(
        &self,
        req: Request<pb::ProgressRequest>,
    ) -> Result<Response<pb::ProgressResponse>, Status> {
        self.seen
            .lock()
            .unwrap()
            .progress
            .push(req.into_inner().lease_id);
        Ok(Response::new(pb::ProgressResponse {
            keep_going: true,
            stop_reason: String::new(),
        }))
    }

    /// A coordinator that predates `Renew`: the worker renews each lease
    /// with its own Progress call.
    async fn renew(
        &self,
        _: Request<pb::RenewRequest>,
    ) -> Result<Response<pb::RenewResponse>, Status> {
        self.seen.lock().unwrap().renews += 1;
        Err(Status::unimplemented("Renew"))
    }

    async fn complete(
        &self,
        req: Request<pb::CompleteRequest>,
    ) -> Result<Response<pb::CompleteResponse>, Status> {
        let req = req.into_inner();
        let answer = (self.complete)(&req);
        if answer
            .as_ref()
            .is_err_and(|s| s.code() == tonic::Code::NotFound)
        {
            // "Not found" says it lost the result's blobs: it does not hold them.
            let mut blobs = self.blobs.lock().unwrap();
            for o in &req.outputs {
                blobs.remove(&o.digest);
            }
        }
        self.seen.lock().unwrap().completes.push(req);
        answer.map(|()| {
            Response::new(pb::CompleteResponse {
                duplicate: false,
                next: None,
            })
        })
    }

    async fn fail(&self, req: Request<pb::FailRequest>) -> Result<Response<pb::Ack>, Status> {
        self.seen.lock().unwrap().fails.push(req.into_inner());
        Ok(Response::new(pb::Ack {}))
    }

    async fn release(&self, _: Request<pb::ReleaseRequest>) -> Result<Response<pb::Ack>, Status> {
        Ok(Response::new(pb::Ack {}))
    }

    async fn telemetry(
        &self,
        _: Request<pb::TelemetryRequest>,
    ) -> Result<Response<pb::Ack>, Status> {
        Ok(Response::new(pb::Ack {}))
    }
}

type ChunkStream = Pin<Box<dyn Stream<Item = Result<pb::BlobChunk, Status>> + Send>>;

#[tonic::async_trait]
impl pb::blobs_server::Blobs for Fake {
    async fn missing_blobs(
        &self,
        req: Request<pb::MissingBlobsRequest>,
    ) -> Result<Response<pb::MissingBlobsResponse>, Status> {
        let blobs = self.blobs.lock().unwrap();
        Ok(Response::new(pb::MissingBlobsResponse {
            missing: req
                .into_inner()
                .digests
                .into_iter()
                .filter(|d| !blobs.contains_key(d))
                .collect(),
        }))
    }

    async fn put_blob(
        &self,
        req: Request<tonic::Streaming<pb::BlobChunk>>,
    ) -> Result<Response<pb::PutBlobResponse>, Status> {
        let mut stream = req.into_inner();
        let mut data = Vec::new();
        let mut claimed = String::new();
        while let Some(chunk) = stream.message().await? {
            if claimed.is_empty() {
                claimed = chunk.digest.clone();
            }
            data.extend_from_slice(&chunk.data);
        }
        let digest = blake3::hash(&data).to_hex().to_string();
        if digest != claimed {
            return Err(Status::invalid_argument("digest mismatch"));
        }
        let size = data.len() as u64;
        self.seen.lock().unwrap().puts.push(digest.clone());
        self.blobs.lock().unwrap().insert(digest.clone(), data);
        Ok(Response::new(pb::PutBlobResponse {
            digest,
            size,
            already_present: false,
        }))
    }

    type GetBlobStream = ChunkStream;

    async fn get_blob(
        &self,
        req: Request<pb::GetBlobRequest>,
    ) -> Result<Response<ChunkStream>, Status> {
        let digest = req.into_inner().digest;
        let data = self
            .blobs
            .lock()
            .unwrap()
            .get(&digest)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("blob {digest} not found")))?;
        let size = data.len() as u64;
        let chunk = pb::BlobChunk { digest, size, data };
        Ok(Response::new(Box::pin(tokio_stream::iter([Ok(chunk)]))))
    }
}
