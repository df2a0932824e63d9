//! Latency samples and their percentiles: a sorted `Vec` is exact, and at a
//! few million samples per run it costs less than an HDR histogram crate.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One timed call: when it ended and how long it took.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// When the call returned.
    pub at: Instant,
    /// How long it took.
    pub took: Duration,
}

/// Timed calls of one kind, kept whole so that a window can be cut out of
/// them after the run.
#[derive(Debug, Default)]
pub struct Timings(Mutex<Vec<Sample>>);

impl Timings {
    /// Records a call that started at `start` and has just returned.
    pub fn record(&self, start: Instant) {
        let at = Instant::now();
        self.lock().push(Sample {
            at,
            took: at - start,
        });
    }

    /// The calls that returned within `[from, to]`.
    pub fn window(&self, from: Instant, to: Instant) -> Latencies {
        Latencies::new(
            self.lock()
                .iter()
                .filter(|s| s.at >= from && s.at <= to)
                .map(|s| s.took)
                .collect(),
        )
    }

    /// Every call.
    pub fn all(&self) -> Latencies {
        Latencies::new(self.lock().iter().map(|s| s.took).collect())
    }

    /// How many calls returned within `[from, to]`.
    pub fn count(&self, from: Instant, to: Instant) -> usize {
        self.lock()
            .iter()
            .filter(|s| s.at >= from && s.at <= to)
            .count()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Sample>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Durations, sorted, for percentiles.
#[derive(Debug, Clone, Default)]
pub struct Latencies(Vec<Duration>);

impl Latencies {
    /// Sorts `samples`.
    pub fn new(mut samples: Vec<Duration>) -> Self {
        samples.sort_unstable();
        Self(samples)
    }

    /// How many samples there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The nearest-rank percentile `p` (0-100) in milliseconds; None without samples.
    pub fn percentile_ms(&self, p: f64) -> Option<f64> {
        if self.0.is_empty() {
            return None;
        }
        let rank = ((p / 100.0) * self.0.len() as f64).ceil() as usize;
        let i = rank.clamp(1, self.0.len()) - 1;
        Some(self.0[i].as_secs_f64() * 1000.0)
    }

    /// The largest sample in milliseconds; None without samples.
    pub fn max_ms(&self) -> Option<f64> {
        self.0.last().map(|d| d.as_secs_f64() * 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: &[u64]) -> Latencies {
        Latencies::new(v.iter().map(|&m| Duration::from_millis(m)).collect())
    }

    #[test]
    fn nearest_rank_percentiles() {
        let l = ms(&(1..=100).rev().collect::<Vec<_>>());
        assert_eq!(l.percentile_ms(50.0), Some(50.0));
        assert_eq!(l.percentile_ms(99.0), Some(99.0));
        assert_eq!(l.percentile_ms(100.0), Some(100.0));
        assert_eq!(l.percentile_ms(0.0), Some(1.0));
        assert_eq!(ms(&[7]).percentile_ms(99.0), Some(7.0));
        assert_eq!(ms(&[]).percentile_ms(50.0), None);
    }

    #[test]
    fn a_window_keeps_only_the_calls_that_ended_in_it() {
        let t = Timings::default();
        let start = Instant::now();
        t.record(start);
        let from = Instant::now();
        t.record(start);
        t.record(start);
        let to = Instant::now();
        t.record(start);
        assert_eq!(t.window(from, to).len(), 2);
        assert_eq!(t.count(from, to), 2);
    }
}
