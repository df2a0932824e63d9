//! Counters kept since the coordinator started, for metrics.

/// Upper bounds of the task-duration histogram, in seconds.
pub const DURATION_BUCKETS: [f64; 12] = [
    0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
];

/// Upper bounds of the store-commit latency histogram, in seconds: an
/// fsync here takes about 0.2 ms, a slow disk or a loaded database 100 ms.
pub const COMMIT_BUCKETS: [f64; 11] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// Counters kept since the coordinator started (for metrics).
#[derive(Debug, Clone, Default)]
pub struct Stats {
    /// Completed tasks per duration bucket (cumulative counts are derived).
    pub duration_buckets: [u64; DURATION_BUCKETS.len()],
    /// Sum of task durations, seconds.
    pub duration_sum: f64,
    /// Completed tasks timed.
    pub duration_count: u64,
    /// Leases granted.
    pub leases_granted: u64,
    /// Leases that expired.
    pub leases_expired: u64,
    /// Failed attempts reported by workers.
    pub attempts_failed: u64,
    /// Store transactions written (each one flush).
    pub commits: u64,
    /// Commits per latency bucket (not cumulative), from `COMMIT_BUCKETS`.
    pub commit_buckets: [u64; COMMIT_BUCKETS.len()],
    /// Commits slower than the last bucket.
    pub commit_slowest: u64,
    /// Sum of commit latencies, seconds.
    pub commit_seconds: f64,
    /// Changes those transactions held (group commit puts several in one).
    pub committed_changes: u64,
    /// Leases handed back by preempted workers (no attempt charged).
    pub preemptions: u64,
    /// Verification renders compared with an earlier result of their task.
    pub verify_checks: u64,
    /// Tasks whose results differed between workers (counted once a task).
    pub verify_mismatches: u64,
}

impl Stats {
    /// Counts one store commit that took `seconds`.
    pub fn commit_took(&mut self, seconds: f64) {
        self.commits += 1;
        self.commit_seconds += seconds;
        match COMMIT_BUCKETS.iter().position(|b| seconds <= *b) {
            Some(i) => self.commit_buckets[i] += 1,
            None => self.commit_slowest += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commits_fall_in_their_latency_bucket() {
        let mut s = Stats::default();
        s.commit_took(0.0002);
        s.commit_took(0.2);
        s.commit_took(9.0);
        assert_eq!(s.commits, 3);
        assert_eq!(s.commit_buckets[0], 1);
        assert_eq!(s.commit_buckets[7], 1, "0.2 s is in the 0.25 s bucket");
        assert_eq!(s.commit_slowest, 1);
        assert!((s.commit_seconds - 9.2002).abs() < 1e-9);
    }
}
