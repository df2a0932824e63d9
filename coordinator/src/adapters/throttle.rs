//! At most one event per interval, the first at once: what the event
//! streams (`tessera watch`, the dashboard's live updates) send when a job
//! changes. A change after a quiet spell goes out immediately, so a job's
//! last change (done) reaches its watcher without a wait, while a burst of
//! changes still makes at most one event per interval.

use std::time::Duration;

use tokio::time::Instant;

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
}
