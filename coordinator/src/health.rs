//! Whether a store on another machine answers: the metadata store
//! (PostgreSQL: the `tessera_store_up` gauge and the "store: PostgreSQL
//! unreachable since …" line that a coordinator shows while it is down) or
//! the blob store (S3: `tessera_blobs_up`, "blobs: S3 … unreachable since …").

use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

/// Since when a store has not answered, and its last error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outage {
    /// The first failure of this outage, as `YYYY-MM-DD HH:MM:SS UTC`.
    pub since: String,
    /// The latest failure's words.
    pub error: String,
}

/// The reachability of a remote store, shared by everything that talks to
/// it (the store's calls and the election's). Cheap to clone.
#[derive(Debug, Clone)]
pub struct StoreHealth {
    /// What the store is, for messages: `PostgreSQL at HOST:PORT/DB`.
    what: Arc<str>,
    /// Which store: its gauge and the word its line starts with.
    kind: Kind,
    outage: Arc<Mutex<Option<Outage>>>,
}

/// The metadata store or the blob store.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Meta,
    Blobs,
}

impl StoreHealth {
    /// A store described as `what`, assumed up.
    pub fn new(what: impl Into<String>) -> Self {
        Self {
            what: Arc::from(what.into()),
            kind: Kind::Meta,
            outage: Arc::default(),
        }
    }

    /// The blob store described as `what` (`S3 s3://bucket/prefix at
    /// ENDPOINT`), assumed up: its gauge is `tessera_blobs_up`.
    pub fn blobs(what: impl Into<String>) -> Self {
        Self {
            kind: Kind::Blobs,
            ..Self::new(what)
        }
    }

    /// The store answered.
    pub fn answered(&self) {
        let was = self.outage.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(o) = was {
            tracing::warn!(since = %o.since, "{} answers again", self.what);
        }
    }

    /// The store did not answer (or not in time): `error` says how (its
    /// advice, after the first `; `, is left out: the status line gives it).
    pub fn failed(&self, error: &str) {
        let error = error.split("; ").next().unwrap_or(error);
        let mut outage = self.outage.lock().unwrap_or_else(|e| e.into_inner());
        match outage.as_mut() {
            Some(o) => o.error = error.to_string(),
            None => {
                tracing::error!("{} is unreachable: {error}", self.what);
                *outage = Some(Outage {
                    since: utc(SystemTime::now()),
                    error: error.to_string(),
                });
            }
        }
    }

    /// The outage in progress, if any.
    pub fn outage(&self) -> Option<Outage> {
        self.outage
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether the store answered last time.
    pub fn up(&self) -> bool {
        self.outage().is_none()
    }

    /// `store: PostgreSQL at … unreachable since … (error)`, or that it
    /// answers (`blobs: …` for the blob store).
    pub fn line(&self) -> String {
        let label = match self.kind {
            Kind::Meta => "store",
            Kind::Blobs => "blobs",
        };
        match self.outage() {
            Some(o) => format!(
                "{label}: {} unreachable since {} ({})",
                self.what, o.since, o.error
            ),
            None => format!("{label}: {} answers", self.what),
        }
    }

    /// The name and help of this store's gauge (see [`crate::adapters::metrics`]):
    /// `tessera_store_up` or `tessera_blobs_up`.
    pub fn gauge(&self) -> (&'static str, &'static str) {
        match self.kind {
            Kind::Meta => (
                "tessera_store_up",
                "Whether the metadata store (PostgreSQL) answered this coordinator's last call: 1 up, 0 unreachable.",
            ),
            Kind::Blobs => (
                "tessera_blobs_up",
                "Whether the blob store (S3) answered this coordinator's last call: 1 up, 0 unreachable.",
            ),
        }
    }
}

/// `t` as `YYYY-MM-DD HH:MM:SS UTC`.
pub fn utc(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard
/// Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn utc_text_of_known_moments() {
        assert_eq!(utc(UNIX_EPOCH), "1970-01-01 00:00:00 UTC");
        assert_eq!(
            utc(UNIX_EPOCH + Duration::from_secs(951_782_400 + 3_661)),
            "2000-02-29 01:01:01 UTC"
        );
        assert_eq!(
            utc(UNIX_EPOCH + Duration::from_secs(1_798_761_599)),
            "2026-12-31 23:59:59 UTC"
        );
    }

    #[test]
    fn an_outage_keeps_its_start_and_ends_when_the_store_answers() {
        let h = StoreHealth::new("PostgreSQL at db:5432/tessera");
        assert!(h.up());
        assert!(crate::adapters::metrics::store_health(&h).contains("tessera_store_up 1"));
        h.failed("timed out");
        let first = h.outage().unwrap();
        h.failed("connection refused");
        let second = h.outage().unwrap();
        assert_eq!(first.since, second.since);
        assert_eq!(second.error, "connection refused");
        assert!(crate::adapters::metrics::store_health(&h).contains("tessera_store_up 0"));
        assert!(
            h.line()
                .starts_with("store: PostgreSQL at db:5432/tessera unreachable since "),
            "{}",
            h.line()
        );
        h.answered();
        assert!(h.up());
        assert_eq!(h.line(), "store: PostgreSQL at db:5432/tessera answers");
    }

    #[test]
    fn the_blob_store_has_a_gauge_and_a_line_of_its_own() {
        let h = StoreHealth::blobs("S3 s3://b/p at http://s3:8333");
        assert!(crate::adapters::metrics::store_health(&h).contains("\ntessera_blobs_up 1\n"));
        h.failed("connection refused; check that the server is up");
        assert!(crate::adapters::metrics::store_health(&h).contains("\ntessera_blobs_up 0\n"));
        assert!(!crate::adapters::metrics::store_health(&h).contains("tessera_store_up"));
        assert!(
            h.line()
                .starts_with("blobs: S3 s3://b/p at http://s3:8333 unreachable since "),
            "{}",
            h.line()
        );
        assert!(h.line().ends_with("(connection refused)"), "{}", h.line());
    }
}
