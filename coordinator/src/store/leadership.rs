//! The active coordinator's own view of its leadership: valid until a
//! moment on this machine's monotonic clock, extended by each renewal that
//! PostgreSQL confirmed, and never again once revoked.
//!
//! The moment is counted from when the renewal was *sent* (see
//! [`crate::ha::Timing`]), so it always falls before the expiry the server
//! recorded, which counts from when the server ran the renewal.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Until when this coordinator may act as the active one. Cheap to clone;
/// clones share the clock.
#[derive(Clone, Debug)]
pub struct Lease(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    base: Instant,
    /// Nanoseconds after `base` at which the leadership lapses.
    until: AtomicU64,
    revoked: AtomicBool,
}

impl Lease {
    /// A lease valid until `until`.
    pub fn until(until: Instant) -> Self {
        let base = Instant::now();
        let lease = Lease(Arc::new(Inner {
            base,
            until: AtomicU64::new(0),
            revoked: AtomicBool::new(false),
        }));
        lease.extend(until);
        lease
    }

    fn nanos(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.0.base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Moves the end to `until` when that is later (a renewal confirmed).
    pub fn extend(&self, until: Instant) {
        let n = self.nanos(until);
        self.0.until.fetch_max(n, Ordering::SeqCst);
    }

    /// Ends the leadership now, for good (deposed, or stepping down).
    pub fn revoke(&self) {
        self.0.revoked.store(true, Ordering::SeqCst);
    }

    /// Time left; zero once lapsed or revoked.
    pub fn remaining(&self) -> Duration {
        if self.0.revoked.load(Ordering::SeqCst) {
            return Duration::ZERO;
        }
        let until = self.0.until.load(Ordering::SeqCst);
        let now = self.nanos(Instant::now());
        Duration::from_nanos(until.saturating_sub(now))
    }

    /// Whether this coordinator may still act as the active one.
    pub fn valid(&self) -> bool {
        !self.remaining().is_zero()
    }

    /// Resolves once the lease has lapsed or was revoked.
    pub async fn lapsed(&self) {
        loop {
            let left = self.remaining();
            if left.is_zero() {
                return;
            }
            // Wakes at least every 100 ms to notice a revocation.
            tokio::time::sleep(left.min(Duration::from_millis(100))).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_lapses_at_its_end_and_extends_only_forward() {
        let now = Instant::now();
        let lease = Lease::until(now + Duration::from_secs(60));
        assert!(lease.valid());
        lease.extend(now + Duration::from_secs(1));
        assert!(
            lease.remaining() > Duration::from_secs(50),
            "an older renewal does not shorten it"
        );
        let past = Lease::until(now);
        assert!(!past.valid());
        assert_eq!(past.remaining(), Duration::ZERO);
    }

    #[test]
    fn a_revoked_lease_stays_revoked() {
        let lease = Lease::until(Instant::now() + Duration::from_secs(60));
        lease.revoke();
        assert!(!lease.valid());
        lease.extend(Instant::now() + Duration::from_secs(120));
        assert!(!lease.valid(), "a late renewal does not revive it");
    }

    #[tokio::test]
    async fn lapsed_resolves_when_the_time_is_up() {
        let lease = Lease::until(Instant::now() + Duration::from_millis(50));
        let started = Instant::now();
        tokio::time::timeout(Duration::from_secs(5), lease.lapsed())
            .await
            .expect("the lease lapses");
        assert!(started.elapsed() >= Duration::from_millis(40));
    }
}
