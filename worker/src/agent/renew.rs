//! Lease renewals: one `Renew` call a renewal period for every lease the
//! worker holds (its running tasks, with their progress, and the tasks it
//! holds ahead), instead of one `Progress` call per lease. A worker of eight
//! slots, each rendering one task and holding the next, makes one call a
//! period instead of sixteen.
//!
//! A lease is renewed while its [`Renewal`] lives; the renewal says when the
//! coordinator answers that the lease is over (the job was cancelled, the
//! lease expired and went to another worker, ...), with the reason. Each
//! lease gets exactly the answer a `Progress` call for it would, so a
//! coordinator that predates `Renew` (it answers `UNIMPLEMENTED`) is sent one
//! `Progress` call per lease instead, as before.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tessera_proto as pb;
use tokio::sync::oneshot;
use tonic::Code;

use super::dropped;
use crate::blender::Progress;
use crate::connect::Conn;

/// What a lease renews for.
pub(super) enum Holding {
    /// A task rendering now: its renewals carry its progress.
    Running(Arc<Progress>),
    /// A task held ahead, waiting for its slot (see `ahead`).
    Waiting,
}

struct Entry {
    holding: Holding,
    /// Told why once the coordinator says the lease is over.
    over: Option<oneshot::Sender<String>>,
}

/// The leases the worker holds, renewed together by [`run`].
#[derive(Default)]
pub(super) struct Renewals {
    leases: Mutex<HashMap<String, Entry>>,
}

impl Renewals {
    /// Renews `lease` from the next renewal on, until the returned
    /// [`Renewal`] is dropped.
    pub(super) fn hold(self: &Arc<Self>, lease: &str, holding: Holding) -> Renewal {
        let (tx, rx) = oneshot::channel();
        self.lock().insert(
            lease.to_string(),
            Entry {
                holding,
                over: Some(tx),
            },
        );
        Renewal {
            lease: lease.to_string(),
            renewals: self.clone(),
            over: rx,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.leases.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A renewal request for every lease held now.
    fn requests(&self) -> Vec<pb::ProgressRequest> {
        self.lock()
            .iter()
            .map(|(lease, e)| match &e.holding {
                Holding::Running(p) => pb::ProgressRequest {
                    lease_id: lease.clone(),
                    frames_done: p.frames.load(Ordering::Relaxed),
                    samples_done: p.samples_done.load(Ordering::Relaxed),
                    samples_total: p.samples_total.load(Ordering::Relaxed),
                    waiting: false,
                },
                Holding::Waiting => pb::ProgressRequest {
                    lease_id: lease.clone(),
                    waiting: true,
                    ..Default::default()
                },
            })
            .collect()
    }

    /// Tells `lease`'s holder that it is over, and why.
    fn end(&self, lease: &str, why: String) {
        if let Some(tx) = self.lock().get_mut(lease).and_then(|e| e.over.take()) {
            let _ = tx.send(why);
        }
    }

    /// Acts on the answer for each lease of `asked`.
    fn settle(
        &self,
        asked: &[pb::ProgressRequest],
        answers: Vec<Result<pb::ProgressResponse, tonic::Status>>,
    ) {
        for (req, answer) in asked.iter().zip(answers) {
            let lease = &req.lease_id;
            match answer {
                Ok(r) if !r.keep_going => {
                    let why = match r.stop_reason.as_str() {
                        "" => "lease lost or job ended".to_string(),
                        why => why.to_string(),
                    };
                    self.end(lease, why);
                }
                Ok(_) => {}
                // The coordinator says the lease is over for good (the job
                // was cancelled, the lease expired, ...): rendering on would
                // be wasted.
                Err(s) if dropped(&s) => self.end(lease, s.message().to_string()),
                Err(s) => tracing::warn!(%lease, "cannot renew the lease: {}", s.message()),
            }
        }
    }
}

/// A lease being renewed; dropping it stops the renewals.
pub(super) struct Renewal {
    lease: String,
    renewals: Arc<Renewals>,
    over: oneshot::Receiver<String>,
}

impl Renewal {
    /// The lease renewed.
    pub(super) fn lease(&self) -> &str {
        &self.lease
    }

    /// Why the lease is over, once the coordinator says so; never resolves
    /// while it holds.
    pub(super) async fn over(&mut self) -> String {
        match (&mut self.over).await {
            Ok(why) => why,
            Err(_) => std::future::pending().await,
        }
    }
}

impl Drop for Renewal {
    fn drop(&mut self) {
        self.renewals.lock().remove(&self.lease);
    }
}

/// Renews every held lease once every `every()` (read again each period:
/// it follows the lease TTL the coordinator gave at registration), each
/// call bounded by `deadline()`. Runs until aborted.
pub(super) async fn run(
    renewals: Arc<Renewals>,
    client: pb::work_client::WorkClient<Conn>,
    every: impl Fn() -> Duration,
    deadline: impl Fn() -> Duration,
) {
    let mut together = true;
    loop {
        tokio::time::sleep(every()).await;
        let asked = renewals.requests();
        if asked.is_empty() {
            continue;
        }
        let deadline = deadline();
        if together {
            let req = pb::RenewRequest {
                leases: asked.clone(),
            };
            let replied = client
                .clone()
                .renew(crate::deadline::request(req, deadline))
                .await;
            match replied {
                Ok(r) => {
                    let answers = r.into_inner().answers;
                    if answers.len() != asked.len() {
                        tracing::warn!(
                            "the coordinator answered {} of {} lease renewals; renewing again next time",
                            answers.len(),
                            asked.len()
                        );
                        continue;
                    }
                    let answers = answers.into_iter().map(answer).collect();
                    renewals.settle(&asked, answers);
                    continue;
                }
                Err(s) if s.code() == Code::Unimplemented => {
                    tracing::info!(
                        "the coordinator predates renewing leases together; renewing each on its own"
                    );
                    together = false;
                }
                Err(s) => {
                    tracing::warn!(
                        leases = asked.len(),
                        "cannot renew the leases: {}",
                        s.message()
                    );
                    continue;
                }
            }
        }
        let answers = one_by_one(&client, &asked, deadline).await;
        renewals.settle(&asked, answers);
    }
}

/// One lease's answer from a `Renew` call, as its `Progress` call would
/// have given it.
fn answer(r: pb::LeaseRenewal) -> Result<pb::ProgressResponse, tonic::Status> {
    if r.code == 0 {
        Ok(pb::ProgressResponse {
            keep_going: r.keep_going,
            stop_reason: r.stop_reason,
        })
    } else {
        Err(tonic::Status::new(Code::from_i32(r.code), r.error))
    }
}

/// A `Progress` call for each lease of `asked`, all at once.
async fn one_by_one(
    client: &pb::work_client::WorkClient<Conn>,
    asked: &[pb::ProgressRequest],
    deadline: Duration,
) -> Vec<Result<pb::ProgressResponse, tonic::Status>> {
    let calls: Vec<_> = asked
        .iter()
        .map(|req| {
            let (mut c, req) = (client.clone(), req.clone());
            tokio::spawn(async move {
                c.progress(crate::deadline::request(req, deadline))
                    .await
                    .map(tonic::Response::into_inner)
            })
        })
        .collect();
    let mut answers = Vec::with_capacity(calls.len());
    for call in calls {
        answers.push(
            call.await
                .unwrap_or_else(|e| Err(tonic::Status::internal(format!("renewal call: {e}")))),
        );
    }
    answers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renewal_is_held_until_dropped_and_told_why_its_lease_is_over() {
        let renewals = Arc::new(Renewals::default());
        let progress = Arc::new(Progress::default());
        progress.samples_done.store(3, Ordering::Relaxed);
        let mut running = renewals.hold("1.0.1", Holding::Running(progress));
        let waiting = renewals.hold("1.1.1", Holding::Waiting);
        let mut asked = renewals.requests();
        asked.sort_by(|a, b| a.lease_id.cmp(&b.lease_id));
        assert_eq!(asked.len(), 2);
        assert_eq!((asked[0].samples_done, asked[0].waiting), (3, false));
        assert!(asked[1].waiting);
        renewals.settle(
            &asked,
            vec![
                Err(tonic::Status::failed_precondition(
                    "job 1 was cancelled; drop this task",
                )),
                Ok(pb::ProgressResponse {
                    keep_going: true,
                    stop_reason: String::new(),
                }),
            ],
        );
        let why = ready_within(running.over());
        assert_eq!(why.as_deref(), Some("job 1 was cancelled; drop this task"));
        drop(waiting);
        assert_eq!(
            renewals.requests().len(),
            1,
            "a dropped renewal is not renewed"
        );
        drop(running);
        assert!(renewals.requests().is_empty());
    }

    #[test]
    fn an_error_in_a_renew_answer_is_the_status_a_progress_call_would_give() {
        let s = answer(pb::LeaseRenewal {
            code: Code::NotFound as i32,
            error: "job 7 of lease 7.0.1 (it was deleted or archived); drop this task".into(),
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(s.code(), Code::NotFound);
        assert!(dropped(&s));
        let ok = answer(pb::LeaseRenewal {
            keep_going: true,
            ..Default::default()
        })
        .unwrap();
        assert!(ok.keep_going);
    }

    /// What `f` gives within 100 ms, if anything.
    fn ready_within<F: std::future::Future>(f: F) -> Option<F::Output> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            tokio::time::timeout(Duration::from_millis(100), f)
                .await
                .ok()
        })
    }
}
