//! Counters kept since the coordinator started, for metrics.

/// Upper bounds of the task-duration histogram, in seconds.
pub const DURATION_BUCKETS: [f64; 12] = [
    0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
];

/// Upper bounds of the latency histograms (store commits, lease grants), in
/// seconds: an fsync here takes about 0.2 ms, a slow disk or a loaded
/// database 100 ms.
pub const LATENCY_BUCKETS: [f64; 11] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// A latency histogram over [`LATENCY_BUCKETS`].
#[derive(Debug, Clone, Default)]
pub struct Latency {
    /// Observations per bucket (not cumulative).
    pub buckets: [u64; LATENCY_BUCKETS.len()],
    /// Observations slower than the last bucket.
    pub slowest: u64,
    /// Sum of the observations, seconds.
    pub seconds: f64,
}

impl Latency {
    /// Counts one observation of `seconds`.
    pub fn observe(&mut self, seconds: f64) {
        self.seconds += seconds;
        match LATENCY_BUCKETS.iter().position(|b| seconds <= *b) {
            Some(i) => self.buckets[i] += 1,
            None => self.slowest += 1,
        }
    }

    /// Observations in all.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum::<u64>() + self.slowest
    }
}

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
    /// Of the leases granted, those asked for with a result (in a
    /// Complete's answer) instead of by a Lease call.
    pub leases_with_results: u64,
    /// Renew calls (each renews all of a worker's leases).
    pub renew_calls: u64,
    /// Progress calls (one lease each: workers that predate Renew).
    pub progress_calls: u64,
    /// Lease renewals asked for, by either call.
    pub leases_renewed: u64,
    /// Failed attempts reported by workers.
    pub attempts_failed: u64,
    /// Store transactions written (each one flush).
    pub commits: u64,
    /// How long each commit took.
    pub commit_latency: Latency,
    /// How long each granted lease took to serve once a task was ready for
    /// its slot: the lock, the pick and the durable write of the lease (a
    /// parked call's idle wait for work is not counted).
    pub lease_latency: Latency,
    /// Changes those transactions held (group commit puts several in one).
    pub committed_changes: u64,
    /// How long each group of results took to be made durable by the
    /// results' sync (before their changes are computed): storing the
    /// files they carry and syncing every blob waiting. Its count is the
    /// number of groups.
    pub result_sync_latency: Latency,
    /// Results those groups held; over the groups, the mean group.
    pub result_sync_results: u64,
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
        self.commit_latency.observe(seconds);
    }

    /// Counts one group of `results` made durable in `seconds`.
    pub fn result_sync_took(&mut self, results: usize, seconds: f64) {
        self.result_sync_results += results as u64;
        self.result_sync_latency.observe(seconds);
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
        let c = &s.commit_latency;
        assert_eq!(c.buckets[0], 1);
        assert_eq!(c.buckets[7], 1, "0.2 s is in the 0.25 s bucket");
        assert_eq!(c.slowest, 1);
        assert_eq!(c.count(), 3);
        assert!((c.seconds - 9.2002).abs() < 1e-9);
    }
}
