//! What rendering costs: the slot-time of every attempt, priced by the
//! worker that spent it.
//!
//! A worker declares the price of its whole machine per hour
//! (`--price-per-hour`) and a capacity class (`--capacity`). A slot costs an
//! equal share of that price: a 4-GPU machine at 8.00/h charges 2.00/h per
//! GPU slot. Every attempt that ends (a result, a failure, an expired lease,
//! a release on shutdown, a preemption, a cancel) is recorded on its task
//! with its slot-time and cost, so failed and preempted attempts are paid
//! for and reported on their own. A job's totals are sums over its tasks.

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::model::ids::WorkerId;

/// How a worker's capacity is bought.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Capacity {
    /// Paid by the hour, kept until released.
    #[default]
    OnDemand,
    /// Cheaper, but the provider may take it back at short notice.
    Spot,
    /// Paid ahead for a term.
    Reserved,
}

impl Capacity {
    /// The name flags and views use.
    pub fn name(self) -> &'static str {
        match self {
            Self::OnDemand => "on-demand",
            Self::Spot => "spot",
            Self::Reserved => "reserved",
        }
    }
}

impl std::str::FromStr for Capacity {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        match s.trim() {
            "" | "on-demand" => Ok(Self::OnDemand),
            "spot" => Ok(Self::Spot),
            "reserved" => Ok(Self::Reserved),
            other => Err(Error::invalid(format!(
                "capacity `{other}` is not known; use on-demand, spot or reserved"
            ))),
        }
    }
}

/// Which capacity a job accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum CapacityPref {
    /// Any worker, spot included.
    #[default]
    SpotOk,
    /// On-demand and reserved workers only: never preempted.
    OnDemandOnly,
}

impl CapacityPref {
    /// The name flags and views use.
    pub fn name(self) -> &'static str {
        match self {
            Self::SpotOk => "spot-ok",
            Self::OnDemandOnly => "on-demand-only",
        }
    }

    /// Whether a worker of `capacity` may render the job.
    pub fn accepts(self, capacity: Capacity) -> bool {
        self == Self::SpotOk || capacity != Capacity::Spot
    }
}

impl std::str::FromStr for CapacityPref {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        match s.trim() {
            "" | "spot-ok" | "any" => Ok(Self::SpotOk),
            "on-demand-only" => Ok(Self::OnDemandOnly),
            other => Err(Error::invalid(format!(
                "capacity preference `{other}` is not known; use spot-ok or on-demand-only"
            ))),
        }
    }
}

/// How an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AttemptEnd {
    /// Its result was recorded.
    Done,
    /// It failed (an attempt was charged to the task).
    Failed,
    /// Its lease expired: the worker went silent.
    Expired,
    /// The worker gave it back on shutdown, or the job was paused.
    Released,
    /// The worker was preempted (SIGTERM on spot or scale-in capacity).
    Preempted,
    /// Its job was cancelled or failed while it ran, or another grant's
    /// result was recorded first.
    Canceled,
}

impl AttemptEnd {
    /// Lowercase name for views.
    pub fn name(self) -> &'static str {
        match self {
            Self::Done => "done",
            Self::Failed => "failed",
            Self::Expired => "expired",
            Self::Released => "released",
            Self::Preempted => "preempted",
            Self::Canceled => "canceled",
        }
    }
}

/// One grant of a task, ended, with what it cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    /// Who rendered.
    pub worker: WorkerId,
    /// Which grant of the task.
    pub grant: u32,
    /// Slot-time, ms.
    pub ms: u64,
    /// Whether the slot rendered on a GPU.
    pub gpu: bool,
    /// The slot's price per hour when it ran.
    pub price_per_hour: f64,
    /// How it ended.
    pub end: AttemptEnd,
}

impl Attempt {
    /// What it cost: its hours times the slot's price.
    pub fn cost(&self) -> f64 {
        self.ms as f64 / 3_600_000.0 * self.price_per_hour
    }
}

/// Sums over attempts.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Usage {
    /// Slot-time on GPUs, ms (every attempt).
    pub gpu_ms: u64,
    /// Slot-time on CPUs, ms (every attempt).
    pub cpu_ms: u64,
    /// Cost of every attempt.
    pub cost: f64,
    /// Slot-time of attempts that failed or expired, ms.
    pub failed_ms: u64,
    /// Their cost.
    pub failed_cost: f64,
    /// Slot-time of preempted attempts, ms.
    pub preempted_ms: u64,
    /// Their cost.
    pub preempted_cost: f64,
    /// Attempts that produced the recorded result, and their slot-time.
    pub done_attempts: u64,
    /// Slot-time of those, ms (for the mean task time).
    pub done_ms: u64,
}

impl Usage {
    /// Adds (or, with `sign` false, takes away) one attempt.
    pub fn count(&mut self, a: &Attempt, add: bool) {
        fn step(v: &mut u64, by: u64, add: bool) {
            *v = if add {
                v.saturating_add(by)
            } else {
                v.saturating_sub(by)
            };
        }
        let (cost, sign) = (a.cost(), if add { 1.0 } else { -1.0 });
        step(
            if a.gpu {
                &mut self.gpu_ms
            } else {
                &mut self.cpu_ms
            },
            a.ms,
            add,
        );
        self.cost += sign * cost;
        match a.end {
            AttemptEnd::Failed | AttemptEnd::Expired => {
                step(&mut self.failed_ms, a.ms, add);
                self.failed_cost += sign * cost;
            }
            AttemptEnd::Preempted => {
                step(&mut self.preempted_ms, a.ms, add);
                self.preempted_cost += sign * cost;
            }
            AttemptEnd::Done => {
                step(&mut self.done_attempts, 1, add);
                step(&mut self.done_ms, a.ms, add);
            }
            AttemptEnd::Released | AttemptEnd::Canceled => {}
        }
        // Sums of float costs drift by rounding when taken away again.
        for c in [
            &mut self.cost,
            &mut self.failed_cost,
            &mut self.preempted_cost,
        ] {
            if c.abs() < 1e-12 {
                *c = 0.0;
            }
        }
    }

    /// The mean slot-time of a successful attempt, ms, once there is one.
    pub fn mean_done_ms(&self) -> Option<u64> {
        (self.done_attempts > 0).then(|| self.done_ms / self.done_attempts)
    }
}

/// Checks a price per hour.
pub fn check_price(price: f64) -> Result<f64, Error> {
    if price.is_finite() && (0.0..=1_000_000.0).contains(&price) {
        Ok(price)
    } else {
        Err(Error::invalid(format!(
            "a price per hour of {price} is not valid; use a number from 0 to 1000000"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(ms: u64, gpu: bool, price: f64, end: AttemptEnd) -> Attempt {
        Attempt {
            worker: WorkerId("w".into()),
            grant: 1,
            ms,
            gpu,
            price_per_hour: price,
            end,
        }
    }

    #[test]
    fn usage_sums_and_unsums_attempts() {
        let a = attempt(1_800_000, true, 2.0, AttemptEnd::Done);
        let b = attempt(3_600_000, false, 0.5, AttemptEnd::Failed);
        let c = attempt(360_000, true, 2.0, AttemptEnd::Preempted);
        let mut u = Usage::default();
        for x in [&a, &b, &c] {
            u.count(x, true);
        }
        assert_eq!((u.gpu_ms, u.cpu_ms), (2_160_000, 3_600_000));
        assert!((u.cost - (1.0 + 0.5 + 0.2)).abs() < 1e-9, "{}", u.cost);
        assert!((u.failed_cost - 0.5).abs() < 1e-9);
        assert!((u.preempted_cost - 0.2).abs() < 1e-9);
        assert_eq!(u.mean_done_ms(), Some(1_800_000));
        for x in [&a, &b, &c] {
            u.count(x, false);
        }
        assert_eq!(u, Usage::default());
    }

    #[test]
    fn spot_workers_serve_only_jobs_that_accept_them() {
        assert!(CapacityPref::SpotOk.accepts(Capacity::Spot));
        assert!(!CapacityPref::OnDemandOnly.accepts(Capacity::Spot));
        assert!(CapacityPref::OnDemandOnly.accepts(Capacity::Reserved));
        assert!("cheap".parse::<Capacity>().is_err());
        assert!(check_price(-1.0).is_err() && check_price(f64::NAN).is_err());
    }
}
