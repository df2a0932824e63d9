//! At most one event per interval, the first at once: what the event
//! streams (`tessera watch`, the dashboard's live updates) send when a job
//! changes. A change after a quiet spell goes out immediately, so a job's
//! last change (done) reaches its watcher without a wait, while a burst of
//! changes still makes at most one event per interval.

use std::time::Duration;

use tokio::sync::broadcast::error::{RecvError, TryRecvError};
use tokio::sync::broadcast::Receiver;
use tokio::time::Instant;

use crate::farm::FarmEvent;

/// Paces a stream of events.
#[derive(Debug)]
pub(crate) struct Throttle {
    every: Duration,
    last: Option<Instant>,
}

impl Throttle {
    /// At most one event per `every`.
    pub(crate) fn new(every: Duration) -> Self {
        Self { every, last: None }
    }

    /// Waits until the next event may go (at once when none went within
    /// the interval), and counts it as gone.
    pub(crate) async fn ready(&mut self) {
        if let Some(last) = self.last {
            tokio::time::sleep_until(last + self.every).await;
        }
        self.last = Some(Instant::now());
    }

    /// Takes in the rest of a burst of farm `events`, each handed to `take`
    /// (`Err(Lagged)` when some were missed), until the next event may go:
    /// at once when `now` or when `take` answers true (a job's end, which
    /// never waits); then what is already queued. False when the farm's
    /// channel closed.
    pub(crate) async fn burst(
        &mut self,
        events: &mut Receiver<FarmEvent>,
        now: bool,
        mut take: impl FnMut(Result<FarmEvent, RecvError>) -> bool,
    ) -> bool {
        if !now {
            let wait = self.ready();
            tokio::pin!(wait);
            loop {
                tokio::select! {
                    () = &mut wait => break,
                    e = events.recv() => match e {
                        Err(RecvError::Closed) => return false,
                        e => {
                            if take(e) {
                                break;
                            }
                        }
                    },
                }
            }
        }
        loop {
            match events.try_recv() {
                Ok(e) => {
                    take(Ok(e));
                }
                Err(TryRecvError::Lagged(n)) => {
                    take(Err(RecvError::Lagged(n)));
                }
                Err(TryRecvError::Closed) => return false,
                Err(TryRecvError::Empty) => return true,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_first_event_and_one_after_a_quiet_spell_go_at_once_a_burst_is_paced() {
        let every = Duration::from_millis(100);
        let mut t = Throttle::new(every);
        let start = Instant::now();
        t.ready().await;
        assert_eq!(start.elapsed(), Duration::ZERO);
        // Another at once: waits out the interval.
        t.ready().await;
        assert_eq!(start.elapsed(), every);
        // After a quiet spell longer than the interval: no wait.
        tokio::time::sleep(Duration::from_millis(250)).await;
        let quiet = Instant::now();
        t.ready().await;
        assert_eq!(quiet.elapsed(), Duration::ZERO);
        // 40 ms later: the rest of the interval, 60 ms.
        tokio::time::sleep(Duration::from_millis(40)).await;
        let soon = Instant::now();
        t.ready().await;
        assert_eq!(soon.elapsed(), Duration::from_millis(60));
    }

    /// One burst: how long it took and what it took in (`None`: missed).
    async fn burst_of(
        t: &mut Throttle,
        rx: &mut Receiver<FarmEvent>,
    ) -> (Duration, Vec<Option<FarmEvent>>) {
        let start = Instant::now();
        let mut seen = Vec::new();
        assert!(
            t.burst(rx, false, |e| {
                let end = matches!(e, Ok(FarmEvent::JobEnded(_)));
                seen.push(e.ok());
                end
            })
            .await
        );
        (start.elapsed(), seen)
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_waits_out_the_interval_unless_a_job_ends() {
        use crate::model::ids::JobId;
        let every = Duration::from_millis(100);
        let (tx, mut rx) = tokio::sync::broadcast::channel(16);
        let mut t = Throttle::new(every);
        t.ready().await;
        // Changes only: all are taken in, and the burst ends with the interval.
        tx.send(FarmEvent::Job(JobId(1))).unwrap();
        tx.send(FarmEvent::Job(JobId(2))).unwrap();
        let (took, seen) = burst_of(&mut t, &mut rx).await;
        assert_eq!(took, every);
        assert_eq!(
            seen,
            [
                Some(FarmEvent::Job(JobId(1))),
                Some(FarmEvent::Job(JobId(2)))
            ]
        );
        // A job's end cuts the wait; what is queued after it is still taken.
        tx.send(FarmEvent::JobEnded(JobId(1))).unwrap();
        tx.send(FarmEvent::Job(JobId(3))).unwrap();
        let (took, seen) = burst_of(&mut t, &mut rx).await;
        assert_eq!(took, Duration::ZERO);
        assert_eq!(
            seen,
            [
                Some(FarmEvent::JobEnded(JobId(1))),
                Some(FarmEvent::Job(JobId(3)))
            ]
        );
        // The channel closed: false.
        drop(tx);
        assert!(!t.burst(&mut rx, true, |_| false).await);
    }
}
