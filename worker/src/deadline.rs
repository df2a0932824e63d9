//! Deadlines of calls to a coordinator.
//!
//! Every call carries one (the `grpc-timeout` header): the caller's own when
//! it set one with [`request`], else its channel's default ([`WORKER_CALL`]
//! for workers, [`CLIENT_CALL`] for the CLI). [`crate::failover::Failover`]
//! enforces it from the moment the call is made, waiting for a connection
//! included, and treats a call that runs past it like a refused connection:
//! the next call goes to the next coordinator address. A coordinator that
//! went silent (a partition that drops packets, a stopped process, a proxy
//! that keeps connections open) thus costs at most one deadline.
//!
//! The deadline covers a call until its answer starts: a unary call whole,
//! an upload (client stream) whole, a download (server stream) until its
//! first message; HTTP/2 keepalive pings (see `agent::endpoint`) end a
//! stream that goes silent after that.

use std::time::Duration;

use tonic::codegen::http::HeaderMap;

/// A worker's calls: register, renew, report, telemetry, blob lookups.
/// Renewals come every second or so, so a silent coordinator is noticed
/// within about this much while a task renders.
pub const WORKER_CALL: Duration = Duration::from_secs(10);

/// The CLI's calls (and any other caller of [`crate::connect::channel`]):
/// longer, since a page of a large job or a submit of a million frames may
/// take a while on a busy coordinator.
pub const CLIENT_CALL: Duration = Duration::from_secs(30);

/// What a long-poll `Lease` gets beyond the wait it asks for.
pub const LEASE_MARGIN: Duration = Duration::from_secs(10);

/// The slowest upload rate an upload's deadline allows for, bytes per second.
pub const UPLOAD_MIN_RATE: u64 = 1 << 20;

/// A lease renewal (`Progress`) under a lease TTL of `ttl`: a third of it,
/// between 1 and 10 s, so that a worker whose coordinator went silent
/// reaches the next address (a standby that took over) while its lease,
/// which a new active coordinator extends by one TTL, still holds.
pub fn renewal(ttl: Duration) -> Duration {
    (ttl / 3).clamp(Duration::from_secs(1), WORKER_CALL)
}

/// A long-poll `Lease` that waits up to `wait`.
pub fn lease(wait: Duration) -> Duration {
    wait + LEASE_MARGIN
}

/// An upload of `size` bytes: 30 s plus a second per MiB.
pub fn upload(size: u64) -> Duration {
    Duration::from_secs(30) + Duration::from_secs(size / UPLOAD_MIN_RATE)
}

/// `message` as a request with deadline `d`.
pub fn request<T>(message: T, d: Duration) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    req.set_timeout(d);
    req
}

/// The deadline a request carries in its `grpc-timeout` header: up to
/// eight digits and a unit (`H`, `M`, `S`, `m`, `u`, `n`).
pub fn of(headers: &HeaderMap) -> Option<Duration> {
    let v = headers.get("grpc-timeout")?.to_str().ok()?;
    if v.len() < 2 || v.len() > 9 {
        return None;
    }
    let (digits, unit) = v.split_at(v.len() - 1);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_tonic_writes_is_read_back() {
        for d in [
            Duration::from_millis(1500),
            Duration::from_secs(25),
            Duration::from_secs(7200),
        ] {
            let req = request((), d);
            let got = of(&req.metadata().clone().into_headers()).unwrap();
            // tonic rounds to its eight-digit units.
            assert!(
                got <= d && d - got < Duration::from_millis(1),
                "{d:?} {got:?}"
            );
        }
        let mut h = HeaderMap::new();
        assert_eq!(of(&h), None);
        h.insert("grpc-timeout", "12x".parse().unwrap());
        assert_eq!(of(&h), None);
        h.insert("grpc-timeout", "3M".parse().unwrap());
        assert_eq!(of(&h), Some(Duration::from_secs(180)));
    }

    #[test]
    fn long_calls_get_longer_deadlines() {
        assert_eq!(lease(Duration::from_secs(15)), Duration::from_secs(25));
        assert_eq!(renewal(Duration::from_secs(30)), Duration::from_secs(10));
        assert_eq!(renewal(Duration::from_secs(6)), Duration::from_secs(2));
        assert_eq!(renewal(Duration::from_millis(300)), Duration::from_secs(1));
        assert_eq!(upload(0), Duration::from_secs(30));
        assert_eq!(upload(100 << 20), Duration::from_secs(130));
    }
}
