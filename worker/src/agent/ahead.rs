//! Leasing ahead: a slot asks for its next task while it renders, so that
//! the next render starts as soon as the current one ends instead of after
//! a lease round trip (and the upload and report of the current task).
//!
//! The slot asks once its current task's scene and files are in place and
//! the render is handed to Blender, never during a download: a task whose
//! download stalls or fails holds no second one. The coordinator answers at
//! once, and grants a task only when no idle slot waits for it (see
//! `LeaseRequest.ahead`). A task leased ahead is held by an [`Ahead`]:
//! renewed with the worker's other leases (marked `waiting`, so its
//! slot-time starts when it does) until its slot starts it, and released
//! at once, never left to expire, when the worker shuts down or the slot
//! will not run it.

use std::sync::Arc;
use std::time::Duration;

use tessera_proto as pb;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use super::carry::Carry;
use super::renew::{Holding, Renewal};
use super::{retry, Shared};
use crate::blender::Renderer;
use crate::connect::Conn;

/// What the slot decides for the task it holds ahead.
enum Decision {
    /// Its turn came: the slot renders it.
    Run,
    /// The slot stops or cannot render it: it goes back to the coordinator.
    Release(&'static str),
}

/// A task leased ahead, renewed until its slot starts or releases it.
pub(super) struct Ahead {
    task: pb::TaskAssignment,
    decide: oneshot::Sender<Decision>,
    /// Ends with whether the task is still the slot's to run: false when
    /// its lease was lost (the job was cancelled, ...) or it was released.
    keeper: JoinHandle<bool>,
}

impl Ahead {
    /// The task, to render now; `None` when it is no longer this slot's
    /// (its keeper said why in the log).
    pub(super) async fn start(self) -> Option<pb::TaskAssignment> {
        let _ = self.decide.send(Decision::Run);
        self.keeper.await.unwrap_or(false).then_some(self.task)
    }

    /// Gives the task back to the coordinator (the slot will not run it)
    /// and waits until that is done.
    pub(super) async fn release(self, why: &'static str) {
        let _ = self.decide.send(Decision::Release(why));
        let _ = self.keeper.await;
    }
}

/// Asks the coordinator for a task ahead for `slot`, whose current render
/// (of job `warm`) has started; holds the task when one is granted. The ask
/// rides on the report of the slot's previous task when that is still on
/// its way (see [`carry`]), else it is a Lease call of its own.
///
/// [`carry`]: super::carry
pub(super) async fn ask<R: Renderer>(
    shared: &Arc<Shared<R>>,
    slot: u32,
    warm: u64,
    shutdown: &watch::Receiver<bool>,
    carry: &Carry,
) -> Option<Ahead> {
    if *shutdown.borrow() || !shared.cache.has_room() {
        return None;
    }
    let req = pb::LeaseRequest {
        worker_id: shared.worker_id.read().await.clone(),
        slot,
        cached_scenes: shared.cache.digests(),
        // A coordinator that predates `ahead` holds the call for this long.
        wait_ms: 0,
        warm_job: Some(warm),
        ahead: true,
    };
    let carried = match carry.ask(req.clone()) {
        Some(answered) => answered.await.ok().flatten(),
        None => None,
    };
    let with_result = carried.is_some();
    let answer = match carried {
        // The coordinator answered it with the report.
        Some(answer) => answer,
        None => {
            let mut client = pb::work_client::WorkClient::new(shared.channel.clone());
            let answer = client
                .lease(crate::deadline::request(
                    req,
                    crate::deadline::lease(Duration::ZERO),
                ))
                .await;
            match answer {
                Ok(r) => r.into_inner(),
                Err(s) => {
                    // The slot leases as usual once its render ends.
                    tracing::info!(slot, "no task leased ahead: {}", s.message());
                    return None;
                }
            }
        }
    };
    let task = answer.task?;
    tracing::info!(
        slot,
        job = task.job_id,
        task = task.task_index,
        lease = %task.lease_id,
        with_result,
        "next task leased ahead"
    );
    if task.job_id != warm {
        // Another job's: its Blender may start while this render runs.
        expect_next(shared, slot, &task);
    }
    let (decide, decided) = oneshot::channel();
    let renewal = shared.renewals.hold(&task.lease_id, Holding::Waiting);
    let keeper = tokio::spawn(keep(
        pb::work_client::WorkClient::new(shared.channel.clone()),
        renewal,
        decided,
        shutdown.clone(),
    ));
    Some(Ahead {
        task,
        decide,
        keeper,
    })
}

/// Lets `renderer` know that `slot`'s next task, leased ahead, is `task` of
/// another job than its current render's, so that it may start the Blender
/// that task needs meanwhile.
fn expect_next<R: Renderer>(shared: &Shared<R>, slot: u32, task: &pb::TaskAssignment) {
    let (device, gpu_uuid) = super::slot_device(shared, slot, task);
    shared.renderer.expect(
        slot,
        &crate::blender::NextLaunch {
            device,
            gpu_uuid,
            blender: Some(task.blender.clone()).filter(|b| !b.is_empty()),
            scene_python: task.scene_python,
        },
    );
}

/// Keeps `renewal`'s lease renewed (with the worker's other leases, see
/// [`renew`]) until the slot decides, and releases it when the slot says so
/// or the worker shuts down.
///
/// [`renew`]: super::renew
async fn keep(
    client: pb::work_client::WorkClient<Conn>,
    mut renewal: Renewal,
    mut decided: oneshot::Receiver<Decision>,
    mut shutdown: watch::Receiver<bool>,
) -> bool {
    let lease = renewal.lease().to_string();
    let why = tokio::select! {
        biased;
        d = &mut decided => match d {
            Ok(Decision::Run) => return true,
            Ok(Decision::Release(why)) => why,
            Err(_) => "its slot ended",
        },
        _ = stopping(&mut shutdown) => "the worker is shutting down",
        why = renewal.over() => {
            tracing::warn!(%lease, "task held ahead dropped: {why}");
            return false;
        }
    };
    drop(renewal);
    release(&client, &lease, why).await;
    false
}

/// Gives a task leased ahead back to the coordinator, unstarted, because
/// `why`.
pub(super) async fn release(client: &pb::work_client::WorkClient<Conn>, lease: &str, why: &str) {
    let req = pb::ReleaseRequest {
        lease_id: lease.to_string(),
        preempted: false,
        reason: String::new(),
    };
    match retry(
        "releasing a task held ahead",
        Duration::from_secs(5),
        || {
            let (mut c, r) = (client.clone(), req.clone());
            async move { c.release(r).await }
        },
    )
    .await
    {
        Ok(_) => tracing::info!(%lease, "task held ahead released, not started: {why}"),
        Err(s) => tracing::warn!(%lease, "cannot release the task held ahead: {}", s.message()),
    }
}

/// Resolves once `shutdown` is true; never when its sender is gone.
async fn stopping(shutdown: &mut watch::Receiver<bool>) {
    while !*shutdown.borrow_and_update() {
        if shutdown.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
