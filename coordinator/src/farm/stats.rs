//! Counters kept since the coordinator started, for metrics.

/// Upper bounds of the task-duration histogram, in seconds.
pub const DURATION_BUCKETS: [f64; 12] = [
    0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
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
    /// Changes those transactions held (group commit puts several in one).
    pub committed_changes: u64,
    /// Leases handed back by preempted workers (no attempt charged).
    pub preemptions: u64,
    /// Verification renders compared with an earlier result of their task.
    pub verify_checks: u64,
    /// Tasks whose results differed between workers (counted once a task).
    pub verify_mismatches: u64,
}
