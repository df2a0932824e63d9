//! The worker's error type.

/// What went wrong in a worker.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Blender could not be started or identified.
    #[error("cannot run Blender at `{path}`: {reason}; install it (apt-get install blender) or pass --blender PATH")]
    Blender {
        /// The executable tried.
        path: String,
        /// What happened.
        reason: String,
    },
    /// A `bpy` runtime could not be installed; the reason names the fix.
    #[error("cannot install Blender {line} (bpy): {reason}")]
    Install {
        /// The line or release asked for (`4.5`).
        line: String,
        /// What happened, and what to do.
        reason: String,
    },
    /// The coordinator refused or failed a call.
    #[error("coordinator: {0}")]
    Rpc(#[from] tonic::Status),
    /// The coordinator address is unusable.
    #[error("bad coordinator address `{0}`; use a URL like http://127.0.0.1:7878")]
    Address(String),
    /// TLS or token set-up is wrong.
    #[error("cannot connect securely: {0}")]
    Tls(String),
    /// A downloaded blob did not match its digest.
    #[error("blob {expected} arrived corrupted (hashed to {got})")]
    Corrupt {
        /// The digest asked for.
        expected: String,
        /// The digest of what arrived.
        got: String,
    },
    /// The cache's disk has no room for a blob, even after evicting the
    /// scenes no task uses.
    #[error(
        "no space in this worker's cache ({dir}) for {what}: it needs {:.1} MiB with 1 MiB to spare, {:.1} MiB are free after evicting {evicted} cached scene(s) no task uses; free space there or move --cache to a larger disk",
        mib(*needed),
        mib(*free)
    )]
    NoSpace {
        /// The cache directory.
        dir: String,
        /// What did not fit (`scene 1a2b3c4d5e6f`).
        what: String,
        /// Its size in bytes.
        needed: u64,
        /// Bytes free when it was refused.
        free: u64,
        /// Scenes evicted to make room.
        evicted: usize,
    },
    /// A file-system operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: std::io::Error,
    },
}

/// Bytes in MiB, for messages.
fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

impl Error {
    /// An I/O error with context.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }
}
