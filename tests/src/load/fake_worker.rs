//! Fake workers: real `Work` and `Blobs` calls, no Blender. Each
//! [`FakeWorker`] has its own HTTP/2 connection; each of its slots loops:
//! Lease (long-poll), "render" for a fixed time, then Complete with a small
//! result unique to the lease: carried
//! inside the Complete call when the coordinator accepts results inline,
//! else uploaded with PutBlob first (always, with `FleetConfig::put_blob`).
//! The Complete asks for the slot's next lease too, as a real worker's
//! does (`CompleteRequest.next`); the slot leases with a Lease call only
//! when that brought no task, or the coordinator predates the field.
//! With `FleetConfig::lease_ahead` (the default of `tessera-load`) a slot
//! works as a worker's slot does (see the worker's `agent::ahead`): once a
//! render starts, it asks for the task after it (`LeaseRequest.ahead`),
//! with the previous task's Complete when that result is still to be
//! reported, so the next render starts as its render ends and the report
//! travels during that render. Without it, a slot reports, then waits for
//! the answer's task before it renders again: every round trip falls
//! between two renders.
//! Like a real worker, each fake worker renews all its leases in one Renew
//! call every `progress_every` (see [`FakeWorker::renew_leases`]); with a
//! coordinator that predates Renew, each slot sends Progress for its own
//! lease instead, as the workers of that day did.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tessera_proto as pb;
use tokio::task::JoinSet;
use tonic::Code;

use super::stats::Timings;
use super::{blobs, connect, work, Conn, LoadError};

/// How the fake workers behave.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// Workers, each with its own connection and token share.
    pub workers: u32,
    /// Slots per worker: tasks each works on at once.
    pub slots: u32,
    /// The fake render time of a task.
    pub render: Duration,
    /// Spread of the render times: each takes `render` x (1 + u x this),
    /// u drawn evenly from -1 to 1 per task (0: all exactly `render`).
    pub render_jitter: f64,
    /// Between a worker's Renew calls (each renews all its leases).
    pub progress_every: Duration,
    /// How long a Lease may wait for a task (`wait_ms`).
    pub lease_wait: Duration,
    /// The scene the workers claim to hold in their caches.
    pub scene: String,
    /// Size of each result blob in bytes.
    pub result_bytes: usize,
    /// Upload every result with PutBlob, even where the coordinator
    /// accepts it inline in Complete (to measure both ways).
    pub put_blob: bool,
    /// Lease the next task while rendering, as workers do (see the module
    /// doc); false: report, then wait for the next task between renders.
    pub lease_ahead: bool,
}

/// A Complete the coordinator acknowledged.
#[derive(Debug, Clone)]
pub struct Acked {
    /// The job.
    pub job: u64,
    /// The task's index in its job.
    pub task: u32,
    /// The lease the task was completed under.
    pub lease: String,
    /// The digests of the results it reported.
    pub outputs: Vec<String>,
    /// When the acknowledgement arrived.
    pub at: Instant,
}

/// What the fleet did, shared by every slot.
#[derive(Debug, Default)]
pub struct Recorder {
    /// Lease calls that returned a task (long-poll waits that ended empty
    /// are only counted, in `empty_leases`).
    pub lease: Timings,
    /// Lease calls that ended without a task (the wait ran out).
    pub empty_leases: AtomicU64,
    /// Leases granted in a Complete's answer, not by a Lease call.
    pub carried_leases: AtomicU64,
    /// A slot's idle time between two renders: from the end of one to the
    /// next task in hand. Leasing ahead, that task was asked for when the
    /// render started, so this is what a render waits for a round trip
    /// that did not end within it; without, it holds the result's report
    /// and the next lease's grant (the same work in every design).
    pub idle: Timings,
    /// Acknowledged Complete calls.
    pub complete: Timings,
    /// Results from the render's end to their Complete acknowledged, the
    /// upload included: the same work whether a result travels inside
    /// Complete or by PutBlob first.
    pub result: Timings,
    /// Renew calls (one renews all of a worker's leases).
    pub progress: Timings,
    /// Result uploads.
    pub put_blob: Timings,
    /// Results sent inside their Complete call instead of uploaded.
    pub inline_results: AtomicU64,
    /// Leases the workers were told they had lost (Progress said stop, or
    /// Complete was refused as lost).
    pub lost: AtomicU64,
    /// Calls that failed for any other reason.
    pub errors: AtomicU64,
    /// Complete calls sent and not yet answered.
    pub completes_in_flight: AtomicU64,
    acked: Mutex<Vec<Acked>>,
    acked_count: AtomicU64,
    last_error: Mutex<Option<String>>,
}

impl Recorder {
    /// Acknowledged completions so far.
    pub fn acked_count(&self) -> u64 {
        self.acked_count.load(Ordering::Relaxed)
    }

    /// Every acknowledged completion so far.
    pub fn acked(&self) -> Vec<Acked> {
        self.acked.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Acknowledged completions that arrived within `[from, to]`.
    pub fn acked_between(&self, from: Instant, to: Instant) -> usize {
        self.acked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|a| a.at >= from && a.at <= to)
            .count()
    }

    /// The last error a call met, if any.
    pub fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn ack(&self, a: Acked) {
        self.acked.lock().unwrap_or_else(|e| e.into_inner()).push(a);
        self.acked_count.fetch_add(1, Ordering::Relaxed);
    }

    fn error(&self, what: &str, s: &tonic::Status) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(format!("{what}: {} ({:?})", s.message(), s.code()));
    }
}

/// One registered fake worker.
#[derive(Clone)]
pub struct FakeWorker {
    /// Its id, as the coordinator gave it.
    pub id: String,
    /// The largest result the coordinator accepts inline (0: none).
    pub inline_max: u64,
    work: pb::work_client::WorkClient<Conn>,
    blobs: pb::blobs_client::BlobsClient<Conn>,
    /// The leases its slots render now or hold ahead, each with what wakes
    /// its slot when a renewal says the lease is lost.
    held: Arc<Mutex<HashMap<String, Arc<tokio::sync::Notify>>>>,
    /// Whether the coordinator serves Renew; a coordinator that predates it
    /// gets one Progress call per lease a second from each slot, as the
    /// workers of its day sent.
    renews: bool,
}

impl FakeWorker {
    /// Connects (a connection of its own) and registers a worker named `name`
    /// with `slots` CPU slots that holds `scene` in its cache.
    pub async fn register(
        url: &str,
        token: &str,
        name: &str,
        slots: u32,
        scene: &str,
    ) -> Result<Self, LoadError> {
        let conn = connect(url, token)?;
        let mut work = work(conn.clone());
        let info = pb::WorkerInfo {
            name: name.to_string(),
            slots,
            device: "cpu".into(),
            blender_version: "Blender 3.4.1 (tessera-load fake)".into(),
            cpu_cores: slots,
            cached_scenes: vec![scene.to_string()],
            slot_info: (0..slots)
                .map(|slot| pb::SlotInfo {
                    slot,
                    device: "cpu".into(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let registered = work
            .register(info)
            .await
            .map_err(|s| LoadError::rpc(format!("registering worker {name}"), s))?
            .into_inner();
        let renews = match work.renew(pb::RenewRequest::default()).await {
            Ok(_) => true,
            Err(s) if s.code() == Code::Unimplemented => false,
            Err(s) => return Err(LoadError::rpc(format!("renewing for worker {name}"), s)),
        };
        Ok(Self {
            id: registered.worker_id,
            // One frame per task: a Complete carries one result.
            inline_max: registered
                .inline_result_max
                .min(registered.inline_complete_max),
            work,
            blobs: blobs(conn),
            held: Arc::default(),
            renews,
        })
    }

    /// One Lease call for `slot`, waiting up to `wait`; whether it returned
    /// a task (which is then left to expire).
    pub async fn lease_once(&self, slot: u32, scene: &str, wait: Duration) -> bool {
        let req = self.lease_request(slot, scene, wait);
        match self.work.clone().lease(req).await {
            Ok(r) => r.into_inner().task.is_some(),
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                false
            }
        }
    }

    /// The slot's request for a task, waiting up to `wait` for one.
    fn lease_request(&self, slot: u32, scene: &str, wait: Duration) -> pb::LeaseRequest {
        pb::LeaseRequest {
            worker_id: self.id.clone(),
            slot,
            cached_scenes: vec![scene.to_string()],
            wait_ms: wait.as_millis().min(u128::from(u32::MAX)) as u32,
            warm_job: None,
            ahead: false,
        }
    }

    /// The slot's request for the task after the one it renders: answered
    /// at once (granted only when no idle slot waits for a task).
    fn ahead_request(&self, slot: u32, scene: &str) -> pb::LeaseRequest {
        pb::LeaseRequest {
            ahead: true,
            ..self.lease_request(slot, scene, Duration::ZERO)
        }
    }

    /// A Lease call for the task after the one `slot` renders (no earlier
    /// result to carry the ask); the task when one was granted.
    async fn lease_ahead(
        &self,
        slot: u32,
        cfg: &FleetConfig,
        rec: &Recorder,
    ) -> Option<pb::TaskAssignment> {
        let start = Instant::now();
        match self
            .work
            .clone()
            .lease(self.ahead_request(slot, &cfg.scene))
            .await
        {
            Ok(r) => {
                let task = r.into_inner().task;
                if task.is_some() {
                    rec.lease.record(start);
                }
                task
            }
            Err(s) => {
                rec.error("lease ahead", &s);
                None
            }
        }
    }

    /// Runs slot `slot` until the task running it is aborted.
    pub async fn run_slot(self, slot: u32, cfg: Arc<FleetConfig>, rec: Arc<Recorder>) {
        let mut backoff = Duration::from_millis(50);
        let mut draws = Draws::new(&self.id, slot);
        // The task the last Complete brought, and when the last render ended.
        let mut next: Option<pb::TaskAssignment> = None;
        let mut ended: Option<Instant> = None;
        // Leasing ahead: the task rendered last, its result still to be
        // reported, and when its render ended.
        let mut unreported: Option<(pb::TaskAssignment, Instant)> = None;
        loop {
            if next.is_none() {
                if let Some((done, at)) = unreported.take() {
                    // No task in hand to render meanwhile: reported now,
                    // asking for the next task with it.
                    let ask = self.lease_request(slot, &cfg.scene, Duration::ZERO);
                    next = self.report(done, at, ask, &cfg, &rec).await;
                }
            }
            let task = match next.take() {
                Some(task) => task,
                None => {
                    let req = self.lease_request(slot, &cfg.scene, cfg.lease_wait);
                    let start = Instant::now();
                    match self.work.clone().lease(req).await {
                        Ok(r) => {
                            backoff = Duration::from_millis(50);
                            match r.into_inner().task {
                                Some(task) => {
                                    rec.lease.record(start);
                                    task
                                }
                                None => {
                                    rec.empty_leases.fetch_add(1, Ordering::Relaxed);
                                    ended = None;
                                    continue;
                                }
                            }
                        }
                        Err(s) => {
                            rec.error("lease", &s);
                            tokio::time::sleep(backoff).await;
                            backoff = (backoff * 2).min(Duration::from_secs(1));
                            ended = None;
                            continue;
                        }
                    }
                }
            };
            if let Some(ended) = ended.take() {
                rec.idle.record(ended);
            }
            let took = draws.render_time(cfg.render, cfg.render_jitter);
            if !cfg.lease_ahead {
                (ended, next) = self.render(task, slot, took, &cfg, &rec).await;
                continue;
            }
            // While this task renders: the last result's report, asking
            // for the task after this one with it, or a Lease call for it.
            let ask = async {
                match unreported.take() {
                    Some((done, at)) => {
                        let ask = self.ahead_request(slot, &cfg.scene);
                        self.report(done, at, ask, &cfg, &rec).await
                    }
                    None => self.lease_ahead(slot, &cfg, &rec).await,
                }
            };
            // The render's end is taken when it ends, not when the ask is
            // answered: a late answer is the slot's idle time.
            let render = async { (self.hold(&task, took, &cfg, &rec).await, Instant::now()) };
            let ((rendered, at), asked) = tokio::join!(render, ask);
            next = asked;
            // Renewed until its render starts, as a worker renews a task it
            // holds ahead.
            if let Some(t) = &next {
                self.hold_lease(t);
            }
            if rendered {
                ended = Some(at);
                unreported = Some((task, at));
            } else {
                rec.lost.fetch_add(1, Ordering::Relaxed);
                ended = None;
            }
        }
    }

    /// Renews every lease the worker's slots hold, in one Renew call every
    /// `progress_every`, as a real worker does; wakes a slot whose lease is
    /// lost. Runs until aborted.
    pub async fn renew_leases(self, cfg: Arc<FleetConfig>, rec: Arc<Recorder>) {
        let mut work = self.work.clone();
        // Real workers start at different times, so their renewals are not
        // in step: each fake worker's first comes at a moment of its own.
        let phase = Draws::new(&self.id, u32::MAX).unit();
        tokio::time::sleep(cfg.progress_every.mul_f64(phase)).await;
        loop {
            tokio::time::sleep(cfg.progress_every).await;
            let held: Vec<(String, Arc<tokio::sync::Notify>)> = self
                .held
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .map(|(l, n)| (l.clone(), n.clone()))
                .collect();
            if held.is_empty() {
                continue;
            }
            let leases = held.iter().map(|(lease, _)| halfway(lease)).collect();
            let start = Instant::now();
            match work.renew(pb::RenewRequest { leases }).await {
                Ok(r) => {
                    rec.progress.record(start);
                    for ((_, lost), a) in held.iter().zip(&r.get_ref().answers) {
                        if !a.keep_going {
                            lost.notify_one();
                        }
                    }
                }
                Err(s) => rec.error("renew", &s),
            }
        }
    }

    /// Holds the task's lease among those [`FakeWorker::renew_leases`]
    /// renews until `done_at`; false when a renewal said it was lost.
    async fn held_until(&self, task: &pb::TaskAssignment, done_at: tokio::time::Instant) -> bool {
        // A task leased ahead is held (and renewed) already: a loss told
        // while it waited ends its render at once.
        let lost = self.hold_lease(task);
        let held = || self.held.lock().unwrap_or_else(|e| e.into_inner());
        let rendered = tokio::select! {
            _ = tokio::time::sleep_until(done_at) => true,
            _ = lost.notified() => false,
        };
        held().remove(&task.lease_id);
        rendered
    }

    /// Puts `task`'s lease among those the worker renews (see
    /// [`FakeWorker::renew_leases`]); what wakes its slot when it is lost.
    fn hold_lease(&self, task: &pb::TaskAssignment) -> Arc<tokio::sync::Notify> {
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(task.lease_id.clone())
            .or_default()
            .clone()
    }

    /// The slot's own Progress call every `progress_every` until
    /// `done_at`, for a coordinator that predates Renew; false when the
    /// lease was lost (counted by the caller).
    async fn progress_until(
        &self,
        task: &pb::TaskAssignment,
        done_at: tokio::time::Instant,
        cfg: &FleetConfig,
        rec: &Recorder,
    ) -> bool {
        let mut work = self.work.clone();
        let mut next = tokio::time::Instant::now() + cfg.progress_every;
        while next < done_at {
            tokio::time::sleep_until(next).await;
            next += cfg.progress_every;
            let start = Instant::now();
            match work.progress(halfway(&task.lease_id)).await {
                Ok(r) if r.get_ref().keep_going => rec.progress.record(start),
                Ok(_) => return false,
                Err(s) => rec.error("progress", &s),
            }
        }
        tokio::time::sleep_until(done_at).await;
        true
    }

    /// Works on one leased task: "renders" (its lease renewed meanwhile),
    /// then reports a result, asking for the slot's next lease with it.
    /// Returns when the render ended (`None` when it did not) and the next
    /// task, when the Complete's answer brought one.
    async fn render(
        &self,
        task: pb::TaskAssignment,
        slot: u32,
        took: Duration,
        cfg: &FleetConfig,
        rec: &Recorder,
    ) -> (Option<Instant>, Option<pb::TaskAssignment>) {
        if !self.hold(&task, took, cfg, rec).await {
            rec.lost.fetch_add(1, Ordering::Relaxed);
            return (None, None);
        }
        let rendered = Instant::now();
        let ask = self.lease_request(slot, &cfg.scene, Duration::ZERO);
        (
            Some(rendered),
            self.report(task, rendered, ask, cfg, rec).await,
        )
    }

    /// "Renders" `task` for `took`, its lease renewed meanwhile; false when
    /// the lease was lost (not counted here).
    async fn hold(
        &self,
        task: &pb::TaskAssignment,
        took: Duration,
        cfg: &FleetConfig,
        rec: &Recorder,
    ) -> bool {
        let done_at = tokio::time::Instant::now() + took;
        if self.renews {
            self.held_until(task, done_at).await
        } else {
            self.progress_until(task, done_at, cfg, rec).await
        }
    }

    /// Reports the result of `task`, whose render ended at `rendered`,
    /// asking for a task with `ask`; the task when the answer brought one.
    async fn report(
        &self,
        task: pb::TaskAssignment,
        rendered: Instant,
        ask: pb::LeaseRequest,
        cfg: &FleetConfig,
        rec: &Recorder,
    ) -> Option<pb::TaskAssignment> {
        let mut work = self.work.clone();
        let mut outputs = Vec::new();
        for &frame in &task.frames {
            match self.upload_result(&task, frame, cfg, rec).await {
                Ok(o) => outputs.push(o),
                Err(s) => {
                    rec.error("put blob", &s);
                    return None;
                }
            }
        }
        let digests = outputs.iter().map(|o| o.digest.clone()).collect();
        let start = Instant::now();
        rec.completes_in_flight.fetch_add(1, Ordering::Relaxed);
        let answer = work
            .complete(pb::CompleteRequest {
                lease_id: task.lease_id.clone(),
                outputs,
                next: Some(ask),
                ..Default::default()
            })
            .await;
        rec.completes_in_flight.fetch_sub(1, Ordering::Relaxed);
        match answer {
            Ok(r) => {
                rec.complete.record(start);
                rec.result.record(rendered);
                rec.ack(Acked {
                    job: task.job_id,
                    task: task.task_index,
                    lease: task.lease_id,
                    outputs: digests,
                    at: Instant::now(),
                });
                let next = r.into_inner().next.and_then(|n| n.task);
                if next.is_some() {
                    rec.carried_leases.fetch_add(1, Ordering::Relaxed);
                }
                next
            }
            Err(s) if s.code() == Code::FailedPrecondition => {
                rec.lost.fetch_add(1, Ordering::Relaxed);
                None
            }
            Err(s) => {
                rec.error("complete", &s);
                None
            }
        }
    }

    /// A small "frame" whose bytes name the lease, so every result is a
    /// blob of its own: inline when the coordinator accepts it (and the
    /// fleet does not force PutBlob), else uploaded with PutBlob.
    async fn upload_result(
        &self,
        task: &pb::TaskAssignment,
        frame: u32,
        cfg: &FleetConfig,
        rec: &Recorder,
    ) -> Result<pb::FrameOutput, tonic::Status> {
        let mut bytes = format!(
            "tessera-load result: lease {} frame {frame}\n",
            task.lease_id
        )
        .into_bytes();
        bytes.resize(cfg.result_bytes.max(bytes.len()), b'.');
        let digest = blake3::hash(&bytes).to_hex().to_string();
        let size = bytes.len() as u64;
        let inline = !cfg.put_blob && size <= self.inline_max;
        let data = if inline {
            rec.inline_results.fetch_add(1, Ordering::Relaxed);
            Some(bytes)
        } else {
            let chunk = pb::BlobChunk {
                digest: digest.clone(),
                size,
                data: bytes,
            };
            let start = Instant::now();
            self.blobs
                .clone()
                .put_blob(tokio_stream::iter([chunk]))
                .await?;
            rec.put_blob.record(start);
            None
        };
        Ok(pb::FrameOutput {
            frame,
            digest,
            ext: "png".into(),
            size,
            pass: String::new(),
            data,
        })
    }
}

/// Fake workers at work: every slot is a task on the runtime.
pub struct Fleet {
    slots: JoinSet<()>,
    /// What they did.
    pub recorder: Arc<Recorder>,
    /// How long registering every worker took.
    pub registered_in: Duration,
}

impl Fleet {
    /// Registers `cfg.workers` workers (spread over `tokens`, all at once)
    /// within `limit`, then starts every slot.
    pub async fn start(
        url: &str,
        tokens: &[String],
        cfg: FleetConfig,
        limit: Duration,
    ) -> Result<Self, LoadError> {
        if tokens.is_empty() {
            return Err(LoadError::Coordinator(
                "no worker token to register with".into(),
            ));
        }
        let start = Instant::now();
        let mut registering = JoinSet::new();
        for i in 0..cfg.workers {
            let (url, scene) = (url.to_string(), cfg.scene.clone());
            let token = tokens[i as usize % tokens.len()].clone();
            let slots = cfg.slots;
            registering.spawn(async move {
                FakeWorker::register(&url, &token, &format!("fake-{i}"), slots, &scene).await
            });
        }
        let workers = super::within("registering the fake workers", limit, async {
            let mut workers = Vec::new();
            while let Some(r) = registering.join_next().await {
                workers.push(r.map_err(|e| LoadError::Coordinator(e.to_string()))??);
            }
            Ok(workers)
        })
        .await?;
        let registered_in = start.elapsed();
        let cfg = Arc::new(cfg);
        let recorder = Arc::new(Recorder::default());
        let mut slots = JoinSet::new();
        for w in workers {
            for slot in 0..cfg.slots {
                slots.spawn(w.clone().run_slot(slot, cfg.clone(), recorder.clone()));
            }
            if w.renews {
                slots.spawn(w.renew_leases(cfg.clone(), recorder.clone()));
            }
        }
        Ok(Self {
            slots,
            recorder,
            registered_in,
        })
    }

    /// Stops every slot where it is: calls in flight are dropped unanswered.
    pub async fn stop(mut self) -> Arc<Recorder> {
        self.slots.shutdown().await;
        self.recorder
    }
}

/// The renewal of a fake render: half its samples done.
fn halfway(lease: &str) -> pb::ProgressRequest {
    pb::ProgressRequest {
        lease_id: lease.to_string(),
        frames_done: 0,
        samples_done: 1,
        samples_total: 2,
        waiting: false,
    }
}

/// A slot's render times: a small generator (xorshift64*) seeded from the
/// worker and slot, so a run's draws repeat and slots differ.
struct Draws(u64);

impl Draws {
    fn new(worker: &str, slot: u32) -> Self {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (worker, slot).hash(&mut h);
        Self(h.finish() | 1)
    }

    /// Evenly from 0 to 1.
    fn unit(&mut self) -> f64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// `render` x (1 + u x `jitter`), u evenly from -1 to 1.
    fn render_time(&mut self, render: Duration, jitter: f64) -> Duration {
        if jitter <= 0.0 {
            return render;
        }
        render.mul_f64(1.0 + jitter * (2.0 * self.unit() - 1.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_times_spread_evenly_within_the_jitter() {
        let render = Duration::from_millis(1000);
        let mut d = Draws::new("w", 3);
        let times: Vec<f64> = (0..10_000)
            .map(|_| d.render_time(render, 0.2).as_secs_f64())
            .collect();
        assert!(
            times.iter().all(|&t| (0.8..=1.2).contains(&t)),
            "out of range"
        );
        let mean = times.iter().sum::<f64>() / times.len() as f64;
        assert!((mean - 1.0).abs() < 0.01, "mean {mean}");
        let low = times.iter().filter(|&&t| t < 0.9).count();
        assert!((2_000..3_000).contains(&low), "{low} of 10,000 below 0.9 s");
        assert_eq!(Draws::new("w", 0).render_time(render, 0.0), render);
        assert_ne!(Draws::new("w", 0).unit(), Draws::new("w", 1).unit());
    }
}
