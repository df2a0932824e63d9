//! The coordinator's error type. Callers decide on the variant, never on the text.
//!
//! A store's failure ([`Error::Store`]) is built where the backend is known
//! (the sled, PostgreSQL, disk and S3 stores) and carries it ([`Backend`])
//! with its fix, so that the gRPC and HTTP adapters pass it on as it is.

use std::path::PathBuf;

/// What went wrong in the coordinator's domain layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed or breaks a limit; the message says how to fix it.
    #[error("{0}")]
    Invalid(String),
    /// A job, task, worker or blob that does not exist.
    #[error("{0} not found")]
    NotFound(String),
    /// The request conflicts with the current state (e.g. cancelling a finished job).
    #[error("{0}")]
    Conflict(String),
    /// The lease is no longer held by the caller (expired, reassigned, cancelled).
    #[error("lease {0} is no longer valid; the task was reassigned or its job ended")]
    LeaseLost(String),
    /// No valid token.
    #[error("{0}")]
    Unauthenticated(&'static str),
    /// A valid token without the right to do this.
    #[error("{0}")]
    PermissionDenied(String),
    /// A storage backend (the metadata store or the blob store) failed;
    /// nothing was acknowledged. The failure names the backend and the fix
    /// that fits it.
    #[error("{0}")]
    Store(StoreFailure),
    /// A store on another machine (PostgreSQL) did not answer, or not in
    /// time; nothing was acknowledged. Worth trying again. The message names
    /// the store and what to check.
    #[error("{0}")]
    StoreUnavailable(String),
    /// This coordinator is not (or no longer) the active one: its leadership
    /// lapsed or another coordinator took over. Callers move on to another
    /// coordinator.
    #[error("{0}")]
    NotActive(String),
    /// A file-system operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A volume the coordinator writes to is full (or would be past its
    /// reserve); the message names it and the fix. Nothing was stored.
    #[error("{0}")]
    NoSpace(String),
    /// A service the coordinator depends on (the S3 blob store) cannot be
    /// reached; nothing was stored, and the same call may succeed later.
    #[error("{0}")]
    Unavailable(String),
    /// A failure inside the coordinator that is neither the caller's nor a
    /// store's (a task that panicked, a record that cannot be rebuilt); the
    /// coordinator's log says more.
    #[error("{0}")]
    Internal(String),
}

impl Error {
    /// An invalid-input error.
    pub fn invalid(msg: impl Into<String>) -> Self {
        Self::Invalid(msg.into())
    }

    /// An I/O error with context.
    pub fn io(context: String, source: std::io::Error) -> Self {
        Self::Io { context, source }
    }

    /// An I/O error met by `backend` as that backend's failure (naming it
    /// and its fix); any other error as it is.
    pub fn on(self, backend: &Backend) -> Self {
        match self {
            Self::Io { context, source } => Self::Store(StoreFailure::new(
                backend.clone(),
                format!("{context}: {source}"),
            )),
            e => e,
        }
    }
}

impl From<StoreFailure> for Error {
    fn from(f: StoreFailure) -> Self {
        Self::Store(f)
    }
}

/// Which storage backend an error comes from, and where it is: what to do
/// about a failed write depends on it, so the backend itself says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// The sled metadata store in `dir` (`DATA/db`), on the `--data` volume.
    Sled {
        /// The database's directory.
        dir: PathBuf,
    },
    /// Blob files under `dir`, on the volume the operator names `flag`
    /// (`--data` for the default `DATA/blobs`, else `--blobs`).
    BlobDir {
        /// The blob directory.
        dir: PathBuf,
        /// The flag that names its volume.
        flag: &'static str,
    },
    /// The PostgreSQL metadata store, at `host:port/database` where the
    /// failure was seen with its address (never with a password).
    Postgres {
        /// `host:port/database`, when known.
        at: Option<String>,
    },
    /// Blobs in an S3-compatible bucket.
    S3 {
        /// `s3://bucket/prefix`.
        location: String,
        /// The endpoint URL (or `AWS S3`).
        endpoint: String,
    },
    /// The in-memory twins of unit tests.
    Memory,
}

impl Backend {
    /// The backend's fix for a failure it does not know better about.
    fn fix(&self) -> String {
        match self {
            Self::Sled { dir } => format!(
                "free space on the coordinator's --data volume or make {} writable, then try again",
                dir.display()
            ),
            Self::BlobDir { dir, flag } => format!(
                "free space on the coordinator's {flag} volume or make {} writable, then try again",
                dir.display()
            ),
            Self::Postgres { .. } => "check the PostgreSQL server's log, that its disk has room and that the coordinator's database user may write its tables, then try again".into(),
            Self::S3 { .. } => "check that the bucket exists, that the coordinator's credentials may read, write and delete there, and the S3 server's log, then try again".into(),
            Self::Memory => "this is an in-memory test store; see the test that made it fail".into(),
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Sled { dir } => write!(f, "the metadata store in {}", dir.display()),
            Self::BlobDir { dir, .. } => write!(f, "the blob store in {}", dir.display()),
            Self::Postgres { at: Some(at) } => write!(f, "the PostgreSQL store at {at}"),
            Self::Postgres { at: None } => f.write_str("the PostgreSQL store"),
            Self::S3 { location, endpoint } => {
                write!(f, "the S3 blob store {location} at {endpoint}")
            }
            Self::Memory => f.write_str("the in-memory store"),
        }
    }
}

/// A failure of one storage backend: what failed there and what to do,
/// built where the backend is known so that adapters need not guess.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{backend}: {what}; {fix}")]
pub struct StoreFailure {
    /// The backend that failed.
    pub backend: Backend,
    /// What failed, in words.
    pub what: String,
    /// What to do about it.
    pub fix: String,
}

impl StoreFailure {
    /// `what` failed on `backend`; the fix is the backend's usual one.
    pub fn new(backend: Backend, what: impl Into<String>) -> Self {
        Self {
            fix: backend.fix(),
            backend,
            what: what.into(),
        }
    }

    /// The same failure with a fix that fits it better than the backend's usual one.
    pub fn fix(mut self, fix: impl Into<String>) -> Self {
        self.fix = fix.into();
        self
    }

    /// The same backend and fix with `what` reworded.
    pub fn reword(&self, what: String) -> Self {
        Self {
            what,
            ..self.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(backend: Backend) -> String {
        Error::from(StoreFailure::new(backend, "cannot write a record: refused")).to_string()
    }

    #[test]
    fn a_sled_failure_names_its_directory_and_the_data_volume() {
        let t = text(Backend::Sled {
            dir: "/srv/tessera/db".into(),
        });
        assert!(
            t.starts_with(
                "the metadata store in /srv/tessera/db: cannot write a record: refused; "
            ),
            "{t}"
        );
        assert!(
            t.contains("free space on the coordinator's --data volume"),
            "{t}"
        );
        assert!(t.contains("make /srv/tessera/db writable"), "{t}");
    }

    #[test]
    fn a_blob_directory_failure_names_it_and_its_volume() {
        let t = text(Backend::BlobDir {
            dir: "/mnt/blobs".into(),
            flag: "--blobs",
        });
        assert!(t.starts_with("the blob store in /mnt/blobs: "), "{t}");
        assert!(
            t.contains("--blobs volume") && t.contains("make /mnt/blobs writable"),
            "{t}"
        );
        assert!(!t.contains("--data"), "{t}");
    }

    #[test]
    fn a_postgres_failure_names_the_server_and_never_the_data_volume() {
        let t = text(Backend::Postgres {
            at: Some("db.example:5432/tessera".into()),
        });
        assert!(
            t.starts_with("the PostgreSQL store at db.example:5432/tessera: "),
            "{t}"
        );
        assert!(
            t.contains("PostgreSQL server's log") && t.contains("database user"),
            "{t}"
        );
        assert!(!t.contains("--data") && !t.contains("writable"), "{t}");
        let t = text(Backend::Postgres { at: None });
        assert!(t.starts_with("the PostgreSQL store: "), "{t}");
    }

    #[test]
    fn an_s3_failure_names_the_bucket_and_endpoint() {
        let t = text(Backend::S3 {
            location: "s3://renders/farm".into(),
            endpoint: "http://minio:9000".into(),
        });
        assert!(
            t.starts_with("the S3 blob store s3://renders/farm at http://minio:9000: "),
            "{t}"
        );
        assert!(
            t.contains("bucket exists") && t.contains("credentials"),
            "{t}"
        );
        assert!(!t.contains("--data") && !t.contains("free space"), "{t}");
    }

    #[test]
    fn a_fitting_fix_replaces_the_usual_one() {
        let f = StoreFailure::new(Backend::Postgres { at: None }, "schema too new")
            .fix("upgrade this coordinator");
        assert_eq!(
            f.to_string(),
            "the PostgreSQL store: schema too new; upgrade this coordinator"
        );
        let again = f.reword("an earlier change failed".into());
        assert_eq!(again.fix, "upgrade this coordinator");
        assert_eq!(again.backend, f.backend);
    }

    #[test]
    fn an_io_error_becomes_its_backends_failure_and_others_stay() {
        let dir = Backend::BlobDir {
            dir: "/d/blobs".into(),
            flag: "--data",
        };
        let e = Error::io(
            "cannot read blob x".into(),
            std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        )
        .on(&dir);
        let Error::Store(f) = &e else {
            panic!("not a store failure: {e}");
        };
        assert_eq!(f.backend, dir);
        assert!(f.what.starts_with("cannot read blob x: "), "{e}");
        assert!(matches!(Error::invalid("bad").on(&dir), Error::Invalid(_)));
    }
}
