//! High availability: two (or more) coordinators on one PostgreSQL
//! database, one active, the others standby.
//!
//! ```text
//!  start ──▶ Standby ── advisory lock taken ──▶ Active ── lock connection lost ──▶ exit
//!              │  (answers every call "this coordinator is standby; the active one is ...")
//!              └─ tries the lock every second (or --failover-seconds / 4)
//! ```
//!
//! The active coordinator holds a session-level advisory lock on a
//! connection of its own ([`Election`]). When it dies, even by SIGKILL, the
//! server closes its session and frees the lock; a standby takes it, bumps
//! the leader row's epoch, loads the state from the database (leases get a
//! fresh TTL, as on a restart) and serves. The epoch fences the store: every
//! write batch checks it in its transaction ([`crate::store::PgStore::fence`]),
//! so a coordinator that lost the lock but does not know it yet writes
//! nothing. A coordinator whose lock connection ends exits, and comes back
//! as standby when restarted.
//!
//! Server-side TCP keepalives on the lock's session bound how long a silent
//! (partitioned) active keeps the lock: about `--failover-seconds`.

use std::time::Duration;

use tokio::sync::watch;

use crate::error::Error;
use crate::store::postgres::{parse_url, pg_error};

pub mod standby;

/// The advisory lock key of the active coordinator ("tessera!").
const LOCK: i64 = 0x7465_7373_6572_6121;

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
}

impl Leader {
    /// What a standby tells a caller.
    pub fn standby_message(&self) -> String {
        if self.epoch == 0 || self.url.is_empty() {
            return "this coordinator is standby; no coordinator is active yet (one takes over within --failover-seconds)".into();
        }
        format!(
            "this coordinator is standby; the active one is {} ({}, active since {}); give clients and workers both addresses (--coordinator a,b) and they find it",
            self.url, self.holder, self.since
        )
    }
}

/// A coordinator's place in the election: a connection of its own that holds
/// the advisory lock once it is active.
pub struct Election {
    client: tokio_postgres::Client,
    closed: watch::Receiver<bool>,
    holder: String,
    url: String,
    /// How often a standby tries the lock.
    pub poll: Duration,
}

impl Election {
    /// Connects to the database at `store_url` as `holder`, reachable by
    /// clients at `advertise`. `failover` bounds how long a dead or silent
    /// active one keeps the lock.
    pub async fn connect(
        store_url: &str,
        holder: &str,
        advertise: &str,
        failover: Duration,
    ) -> Result<Self, Error> {
        let mut config = parse_url(store_url)?;
        let secs = failover.as_secs().max(3);
        config
            .keepalives(true)
            .keepalives_idle(Duration::from_secs((secs / 3).max(1)))
            .connect_timeout(Duration::from_secs(secs));
        let (client, connection) = config.connect(tokio_postgres::NoTls).await.map_err(|e| {
            Error::Store(format!(
                "cannot connect to PostgreSQL at {} for the election: {e}; check --store",
                crate::store::postgres::redact(store_url)
            ))
        })?;
        let (tx, closed) = watch::channel(false);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::error!("the election's PostgreSQL connection failed: {e}");
            }
            let _ = tx.send(true);
        });
        // The server drops a silent peer (and its lock) within about
        // `failover`: idle, then three probes.
        let idle = (secs / 3).max(1);
        let interval = (secs / 6).max(1);
        client
            .batch_execute(&format!(
                "SET tcp_keepalives_idle = {idle}; SET tcp_keepalives_interval = {interval}; SET tcp_keepalives_count = 3; SET application_name = 'tessera coordinator'"
            ))
            .await
            .map_err(|e| pg_error("cannot set up the election's session", e))?;
        Ok(Self {
            client,
            closed,
            holder: holder.to_string(),
            url: advertise.to_string(),
            poll: (failover / 4).clamp(Duration::from_millis(100), Duration::from_secs(1)),
        })
    }

    /// Tries to become active; true when this coordinator now holds the lock.
    pub async fn try_acquire(&self) -> Result<bool, Error> {
        let row = self
            .client
            .query_one("SELECT pg_try_advisory_lock($1)", &[&LOCK])
            .await
            .map_err(|e| pg_error("cannot try the leader lock", e))?;
        Ok(row.get(0))
    }

    /// Records this coordinator as the active one (holding the lock) and
    /// returns its epoch, which fences its writes.
    pub async fn take_over(&self) -> Result<i64, Error> {
        let row = self
            .client
            .query_one(
                "UPDATE tessera_leader SET epoch = epoch + 1, holder = $1, url = $2, since = now() \
                 WHERE id = 1 RETURNING epoch",
                &[&self.holder, &self.url],
            )
            .await
            .map_err(|e| pg_error("cannot record the takeover", e))?;
        Ok(row.get(0))
    }

    /// The leader row.
    pub async fn leader(&self) -> Result<Leader, Error> {
        let row = self
            .client
            .query_one(
                "SELECT epoch, holder, url, to_char(since AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS \"UTC\"') \
                 FROM tessera_leader WHERE id = 1",
                &[],
            )
            .await
            .map_err(|e| pg_error("cannot read the leader row", e))?;
        Ok(Leader {
            epoch: row.get(0),
            holder: row.get(1),
            url: row.get(2),
            since: row.get(3),
        })
    }

    /// Resolves when the election's connection ends: an active coordinator
    /// has then lost the lock, and must stop.
    pub async fn lost(&self) {
        let mut closed = self.closed.clone();
        let _ = closed.wait_for(|c| *c).await;
    }
}

/// A name for this coordinator in the leader row: host and process id.
pub fn holder_name() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "coordinator".into());
    format!("{host} pid {}", std::process::id())
}
