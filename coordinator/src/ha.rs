//! High availability: two (or more) coordinators on one PostgreSQL
//! database, one active, the others standby.
//!
//! ```text
//!          ┌────────── lease expired on the server: take over (epoch + 1) ──────────┐
//!          │                                                                        ▼
//!  start ─▶ Standby ◀── lease lapsed / deposed / PostgreSQL unreachable ────────── Active
//!           (answers every call "this coordinator is standby; …")      (renews its lease every F/3)
//! ```
//!
//! **Leadership is a lease.** The leader row holds the active coordinator's
//! epoch and `expires_at`, a moment on the *server's* clock. The active one
//! renews it every F/3 (F = `--failover-seconds`): `expires_at = now() + F`,
//! only while the epoch is still its own. A standby polls the row every
//! P = min(F/4, 1 s); once the lease has expired it ends the old holder's
//! sessions (`pg_terminate_backend` of every session named after it, which
//! releases any row lock a silent one still holds), then bumps the epoch
//! with a compare-and-set and loads the state from the database (leases get
//! a fresh TTL, as on a restart). Nothing depends on a session staying
//! open: a session that a proxy keeps open and silent holds nothing.
//!
//! **The active one's own deadline** is `sent + F - G` (G = F/6), counted
//! from when it *sent* its last renewal that the server confirmed. The
//! server counted F from when it ran that renewal, later, so the active
//! one's deadline always comes at least G before the lease can expire.
//! Past its deadline it refuses every call as a standby would (the gRPC
//! interceptor and the HTTP port check the lease on each request), its
//! store refuses every write, and it steps down: its farm is dropped, and
//! it serves as a standby on the same ports, reconnecting to PostgreSQL
//! as needed, until leadership is decided again. Its state is loaded from
//! the database again when it next takes over.
//!
//! **Bounds**, for a cut (a crash, a silent network, PostgreSQL down) at T:
//! * the old active one stops acknowledging and stops answering as active
//!   by T + F - G, strictly before any standby can take over;
//! * a standby takes over by T + F + P + one election deadline (ending the
//!   old sessions and the compare-and-set; `min(F/3, 5 s)` each at most),
//!   and serves once it has read the state;
//! * clients never see two active coordinators: one stops before the
//!   other starts;
//! * no write of the old active lands after the takeover: every write
//!   batch checks, in its transaction, that the epoch is its own and that
//!   the lease has not expired on the server's clock
//!   ([`crate::store::PgStore::fenced`]), and the takeover's `UPDATE` of
//!   the leader row waits for any batch in flight.
//!
//! A coordinator stopped cleanly (SIGTERM) gives the lease up, and a
//! standby takes over within P. PostgreSQL restarting is an outage like
//! any other: both coordinators stay up, reconnect and decide leadership
//! again.

use std::time::{Duration, Instant};

use crate::error::Error;
use crate::health::StoreHealth;
use crate::store::postgres::{
    connect, describe, located, parse_url, pg_error, session_settings, PgTls, CHECK_SERVER,
};

pub mod standby;

pub use crate::store::leadership::Lease;

/// Who is active, as the leader row says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// Bumped by every takeover.
    pub epoch: i64,
    /// The active coordinator's name (host and process).
    pub holder: String,
    /// Where clients reach it (its `--advertise` URL).
    pub url: String,
    /// Since when, as text.
    pub since: String,
    /// Whether its lease expired on the server's clock (it stopped renewing).
    pub expired: bool,
    /// The name of its sessions.
    session: String,
}

impl Leader {
    /// What a standby tells a caller.
    pub fn standby_message(&self) -> String {
        if self.epoch == 0 || self.url.is_empty() {
            return "this coordinator is standby; no coordinator is active yet (one takes over within --failover-seconds)".into();
        }
        if self.expired {
            return format!(
                "this coordinator is standby; the last active one, {} ({}), stopped renewing its leadership; a standby takes over within a second",
                self.url, self.holder
            );
        }
        format!(
            "this coordinator is standby; the active one is {} ({}, active since {}); give clients and workers both addresses (--coordinator a,b) and they find it",
            self.url, self.holder, self.since
        )
    }
}

/// The timings that follow from `--failover-seconds` (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    /// F: how long the lease lasts on the server after each renewal.
    pub failover: Duration,
    /// How often the active one renews (F/3).
    pub renew_every: Duration,
    /// G: how much earlier than the server the active one gives up (F/6).
    pub guard: Duration,
    /// P: how often a standby reads the leader row.
    pub poll: Duration,
    /// The most one election statement may take.
    pub deadline: Duration,
}

impl Timing {
    /// The timings for a failover of `failover`.
    pub fn new(failover: Duration) -> Self {
        Self {
            failover,
            renew_every: failover / 3,
            guard: failover / 6,
            poll: (failover / 4).clamp(Duration::from_millis(100), Duration::from_secs(1)),
            deadline: (failover / 3).clamp(Duration::from_millis(200), Duration::from_secs(5)),
        }
    }

    /// Until when a renewal (or takeover) sent at `sent` lets this
    /// coordinator act as active: F - G after it was sent.
    pub fn valid_until(&self, sent: Instant) -> Instant {
        sent + self.failover - self.guard
    }
}

/// One term as the active coordinator.
#[derive(Debug, Clone)]
pub struct Term {
    /// The epoch that fences this term's writes.
    pub epoch: i64,
    /// Until when it may act as active.
    pub lease: Lease,
}

/// What one look at the leader row found.
#[derive(Debug)]
pub enum Attempt {
    /// This coordinator took over.
    Won(Term),
    /// Another one is active (or was, and a takeover is under way).
    Standby(Leader),
}

/// A coordinator's place in the election: a connection of its own to the
/// leader row, opened again whenever it fails.
pub struct Election {
    config: tokio_postgres::Config,
    /// Plain, or TLS verified against the URL's CA (`sslmode=verify-full`).
    tls: PgTls,
    client: tokio::sync::Mutex<Option<tokio_postgres::Client>>,
    holder: String,
    url: String,
    session: String,
    health: StoreHealth,
    /// The timings that follow from `--failover-seconds`.
    pub timing: Timing,
}

/// The name of a coordinator's sessions (PostgreSQL's `application_name`,
/// at most 63 bytes) for the holder name `holder`.
pub fn session_name(holder: &str) -> String {
    let mut name = format!("tessera {holder}");
    while name.len() > 63 {
        name.pop();
    }
    name
}

impl Election {
    /// Connects to the database at `store_url` as `holder`, reachable by
    /// clients at `advertise`, with leases of `failover`; reports whether
    /// PostgreSQL answers to `health`.
    pub async fn connect(
        store_url: &str,
        holder: &str,
        advertise: &str,
        failover: Duration,
        health: StoreHealth,
    ) -> Result<Self, Error> {
        let timing = Timing::new(failover);
        let session = session_name(holder);
        let (mut config, tls) = parse_url(store_url)?;
        session_settings(&mut config, &session, timing.deadline);
        let election = Self {
            config,
            tls,
            client: tokio::sync::Mutex::new(None),
            holder: holder.to_string(),
            url: advertise.to_string(),
            session,
            health,
            timing,
        };
        election.leader().await.map_err(|e| match e {
            Error::StoreUnavailable(m) => Error::StoreUnavailable(format!(
                "cannot reach {} for the election: {m}; check --store",
                describe(store_url)
            )),
            other => other,
        })?;
        Ok(election)
    }

    /// Whether PostgreSQL answers.
    pub fn health(&self) -> &StoreHealth {
        &self.health
    }

    /// Runs `f` on the election's connection (opened again when needed)
    /// within the election's deadline; a connection that failed or ran out
    /// of time is closed, and the outcome tells [`Election::health`].
    async fn call<T, F>(&self, what: &str, f: F) -> Result<T, Error>
    where
        F: for<'c> FnOnce(
            &'c tokio_postgres::Client,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<T, tokio_postgres::Error>> + Send + 'c>,
        >,
    {
        let deadline = self.timing.deadline;
        // The wait for the connection counts against the deadline too.
        let attempt = async {
            let mut slot = self.client.lock().await;
            if slot.as_ref().is_none_or(|c| c.is_closed()) {
                let client = connect(&self.config, &self.tls)
                    .await
                    .map_err(|e| pg_error(&format!("cannot {what}"), e))?;
                *slot = Some(client);
            }
            let client = slot.as_ref().expect("connected above");
            f(client)
                .await
                .map_err(|e| pg_error(&format!("cannot {what}"), e))
        };
        let result = match tokio::time::timeout(deadline, attempt).await {
            Ok(r) => r.map_err(|e| located(e, &config_address(&self.config))),
            Err(_) => Err(Error::StoreUnavailable(format!(
                "cannot {what}: {} did not answer within {} ms; {CHECK_SERVER}",
                describe_config(&self.config),
                deadline.as_millis()
            ))),
        };
        match &result {
            Ok(_) => self.health.answered(),
            Err(e) => {
                // Possibly stuck behind a silent network: never reused
                // (unless another call holds it meanwhile; it decides then).
                if let Ok(mut slot) = self.client.try_lock() {
                    *slot = None;
                }
                if let Error::StoreUnavailable(m) = e {
                    self.health.failed(m);
                } else {
                    self.health.answered();
                }
            }
        }
        result
    }

    /// The leader row.
    pub async fn leader(&self) -> Result<Leader, Error> {
        self.call("read the leader row", |c| {
            Box::pin(async move {
                let row = c
                    .query_one(
                        "SELECT epoch, holder, url, \
                         to_char(since AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS \"UTC\"'), \
                         expires_at <= now(), session FROM tessera_leader WHERE id = 1",
                        &[],
                    )
                    .await?;
                Ok(Leader {
                    epoch: row.get(0),
                    holder: row.get(1),
                    url: row.get(2),
                    since: row.get(3),
                    expired: row.get(4),
                    session: row.get(5),
                })
            })
        })
        .await
    }

    /// Takes over when the active coordinator's lease has expired (or
    /// none was ever active): ends the old holder's sessions, then bumps
    /// the epoch unless another standby did first.
    pub async fn try_take_over(&self) -> Result<Attempt, Error> {
        let leader = self.leader().await?;
        if leader.epoch > 0 && !leader.expired {
            return Ok(Attempt::Standby(leader));
        }
        if !leader.session.is_empty() {
            // A silent old active may still hold a row lock in a
            // transaction: ending its sessions releases it. Best effort:
            // the server also ends sessions idle in a transaction.
            let old = leader.session.clone();
            let ended = self
                .call("end the old active coordinator's sessions", move |c| {
                    Box::pin(async move {
                        let row = c
                            .query_one(
                                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                                 WHERE application_name = $1 AND pid <> pg_backend_pid()",
                                &[&old],
                            )
                            .await?;
                        Ok(row.get::<_, i64>(0))
                    })
                })
                .await;
            match ended {
                Ok(n) if n > 0 => {
                    tracing::warn!(sessions = n, holder = %leader.holder, "ended the old active coordinator's sessions")
                }
                Ok(_) => {}
                Err(e) => tracing::warn!("cannot end the old active coordinator's sessions: {e}"),
            }
        }
        let sent = Instant::now();
        let (holder, url, session) = (self.holder.clone(), self.url.clone(), self.session.clone());
        let failover = self.timing.failover.as_secs_f64();
        let seen = leader.epoch;
        let won = self
            .call("record the takeover", move |c| {
                Box::pin(async move {
                    let row = c
                        .query_opt(
                            "UPDATE tessera_leader SET epoch = epoch + 1, holder = $1, url = $2, \
                             since = now(), expires_at = now() + make_interval(secs => $3), session = $4 \
                             WHERE id = 1 AND epoch = $5 AND expires_at <= now() RETURNING epoch",
                            &[&holder, &url, &failover, &session, &seen],
                        )
                        .await?;
                    Ok(row.map(|r| r.get::<_, i64>(0)))
                })
            })
            .await?;
        match won {
            Some(epoch) => Ok(Attempt::Won(Term {
                epoch,
                lease: Lease::until(self.timing.valid_until(sent)),
            })),
            None => Ok(Attempt::Standby(self.leader().await?)),
        }
    }

    /// Renews `term`'s lease once; false when another coordinator took over.
    async fn renew(&self, term: &Term) -> Result<bool, Error> {
        let failover = self.timing.failover.as_secs_f64();
        let epoch = term.epoch;
        self.call("renew the leadership", move |c| {
            Box::pin(async move {
                let n = c
                    .execute(
                        "UPDATE tessera_leader SET expires_at = now() + make_interval(secs => $1) \
                         WHERE id = 1 AND epoch = $2",
                        &[&failover, &epoch],
                    )
                    .await?;
                Ok(n == 1)
            })
        })
        .await
    }

    /// Keeps `term`'s lease renewed; returns why it ended (the lease is
    /// then revoked): deposed, or not confirmed in time.
    pub async fn hold(&self, term: &Term) -> String {
        let t = self.timing;
        let mut next = Instant::now() + t.renew_every;
        let mut failing = false;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(next.into()) => {}
                _ = term.lease.lapsed() => break,
            }
            let sent = Instant::now();
            let left = term.lease.remaining();
            let outcome = tokio::time::timeout(left, self.renew(term)).await;
            match outcome {
                Ok(Ok(true)) => {
                    term.lease.extend(t.valid_until(sent));
                    if std::mem::take(&mut failing) {
                        tracing::warn!(epoch = term.epoch, "leadership renewed again");
                    }
                    next = sent + t.renew_every;
                }
                Ok(Ok(false)) => {
                    term.lease.revoke();
                    let now = self.leader().await.ok();
                    return match now {
                        Some(l) => format!(
                            "another coordinator took over (epoch {}, at {})",
                            l.epoch, l.url
                        ),
                        None => "another coordinator took over".into(),
                    };
                }
                Ok(Err(e)) => {
                    if !std::mem::replace(&mut failing, true) {
                        tracing::warn!(
                            left_ms = term.lease.remaining().as_millis() as u64,
                            "cannot renew the leadership; trying again until it lapses: {e}"
                        );
                    }
                    next = Instant::now() + t.poll.min(Duration::from_millis(250));
                }
                Err(_) => next = Instant::now(),
            }
        }
        term.lease.revoke();
        format!(
            "PostgreSQL did not confirm this coordinator's leadership within {:.1} s, or its state could not be read back ({})",
            (t.failover - t.guard).as_secs_f64(),
            self.health.line()
        )
    }

    /// Gives the lease of `term` up (a clean stop), so that a standby
    /// takes over at its next look. Best effort.
    pub async fn release(&self, term: &Term) {
        term.lease.revoke();
        let epoch = term.epoch;
        let r = self
            .call("give the leadership up", move |c| {
                Box::pin(async move {
                    c.execute(
                        "UPDATE tessera_leader SET expires_at = now() WHERE id = 1 AND epoch = $1",
                        &[&epoch],
                    )
                    .await
                })
            })
            .await;
        if let Err(e) = r {
            tracing::warn!(
                "cannot give the leadership up (a standby takes over when it expires): {e}"
            );
        }
    }

    /// What this coordinator tells callers while standby, when the leader
    /// row cannot be read because of `e`.
    pub fn unreachable_message(&self, e: &Error) -> String {
        match self.health.outage() {
            Some(_) => format!(
                "this coordinator is standby; {}; leadership is decided again once PostgreSQL answers; {CHECK_SERVER}",
                self.health.line()
            ),
            None => format!("this coordinator is standby; {e}"),
        }
    }
}

/// What an active coordinator tells callers once its leadership has lapsed
/// (PostgreSQL did not confirm it in time), with the store's state in
/// `health`: while PostgreSQL is down no coordinator is active, so it also
/// says what to check.
pub fn lapsed_message(health: &StoreHealth) -> String {
    format!(
        "this coordinator is standby: its leadership lapsed (PostgreSQL did not confirm it in time; {}); use the active coordinator, and if none is active, {CHECK_SERVER}",
        health.line()
    )
}

/// `PostgreSQL at HOST:PORT/DB` of a parsed configuration.
fn describe_config(config: &tokio_postgres::Config) -> String {
    format!("PostgreSQL at {}", config_address(config))
}

/// `HOST:PORT/DB` of a parsed configuration.
fn config_address(config: &tokio_postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => "localhost".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!("{host}:{port}/{}", config.get_dbname().unwrap_or(""))
}

/// A name for this coordinator in the leader row: host and process id.
pub fn holder_name() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "coordinator".into());
    format!("{host} pid {}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_active_one_gives_up_before_the_server_lets_a_standby_in() {
        for secs in [1.0, 3.0, 10.0, 30.0] {
            let t = Timing::new(Duration::from_secs_f64(secs));
            let sent = Instant::now();
            // The server counts F from when it ran the renewal, no earlier
            // than it was sent.
            let server_expiry = sent + t.failover;
            assert!(t.valid_until(sent) < server_expiry, "{t:?}");
            assert!(server_expiry - t.valid_until(sent) >= t.guard);
            // Two renewals fit in one lease, so one lost renewal costs nothing.
            assert!(t.renew_every * 2 < t.failover - t.guard, "{t:?}");
            assert!(t.poll <= Duration::from_secs(1));
        }
    }

    #[test]
    fn session_names_fit_postgres() {
        let long = "h".repeat(100);
        assert!(session_name(&long).len() <= 63);
        assert_eq!(session_name("box pid 7"), "tessera box pid 7");
    }
}
