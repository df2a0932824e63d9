//! The coordinator's error type. Callers decide on the variant, never on the text.

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
    /// The durable store failed; nothing was acknowledged.
    #[error("metadata store: {0}")]
    Store(String),
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
}

impl From<sled::Error> for Error {
    fn from(e: sled::Error) -> Self {
        Self::Store(e.to_string())
    }
}

impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Self::Store(format!("corrupt record: {e}"))
    }
}
