//! Free space on the coordinator's volumes.
//!
//! A full disk must cost refused requests, never the store: sled stops for
//! good after one failed write (its "global error", cleared only by opening
//! it again), so the coordinator refuses any write that would leave less
//! than [`min_free`] bytes on the volume, before it touches sled or a blob
//! file. What it refuses says where and what to do
//! ([`Error::NoSpace`]). Another program can still fill the volume between
//! the check and a write; [`crate::store::SledStore`] keeps a small ballast
//! file for that case, which it gives up to reopen sled.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::Error;

/// Bytes kept free on the coordinator's volumes by default (`--min-free-mib`).
pub const DEFAULT_MIN_FREE: u64 = 64 << 20;

static MIN_FREE: AtomicU64 = AtomicU64::new(DEFAULT_MIN_FREE);

/// Sets the bytes every write must leave free (`--min-free-mib`), for the
/// stores this process opens.
pub fn set_min_free(bytes: u64) {
    MIN_FREE.store(bytes, Ordering::Relaxed);
}

/// The bytes every write must leave free.
pub fn min_free() -> u64 {
    MIN_FREE.load(Ordering::Relaxed)
}

/// Bytes an unprivileged user may still write on the file system of `path`.
#[allow(unsafe_code)] // statvfs(3); std has no safe form.
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: statvfs is plain old data; all zeroes is a valid value.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `s` a valid out-pointer.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(s.f_bavail.saturating_mul(s.f_frsize))
}

/// One volume the coordinator writes to, named as the operator knows it
/// (`--data (/var/lib/tessera)`).
#[derive(Debug, Clone)]
pub struct Volume {
    path: PathBuf,
    name: String,
}

impl Volume {
    /// The volume of `path`, called `flag` in messages (`--data`, `--blobs`).
    pub fn new(path: &Path, flag: &str) -> Self {
        Self {
            path: path.to_path_buf(),
            name: format!("{flag} ({})", path.display()),
        }
    }

    /// Refuses a write of `bytes` that would leave less than [`min_free`]
    /// on the volume. A volume whose free space cannot be read is let be:
    /// the write itself then says what is wrong.
    pub fn check(&self, bytes: u64) -> Result<(), Error> {
        let Ok(free) = free_bytes(&self.path) else {
            return Ok(());
        };
        let keep = min_free();
        if free >= bytes.saturating_add(keep) {
            return Ok(());
        }
        Err(Error::NoSpace(format!(
            "no space left on {}: {} free, this needs {} and {} stay free for the coordinator's metadata; free space there or move it to a larger volume (or lower --min-free-mib)",
            self.name,
            mib(free),
            mib(bytes),
            mib(keep)
        )))
    }

    /// An I/O error of a write to this volume: a full disk becomes
    /// [`Error::NoSpace`] naming the volume, anything else keeps `context`.
    pub fn write_error(&self, context: String, e: std::io::Error) -> Error {
        if e.kind() == std::io::ErrorKind::StorageFull {
            Error::NoSpace(format!(
                "no space left on {} ({context}); free space there or move it to a larger volume",
                self.name
            ))
        } else {
            Error::io(context, e)
        }
    }

    /// The path it was named by.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Bytes in KiB or MiB for messages.
fn mib(bytes: u64) -> String {
    if bytes < 1 << 20 {
        format!("{} KiB", bytes.div_ceil(1 << 10))
    } else {
        format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_that_would_eat_the_reserve_is_refused_naming_the_volume() {
        let dir = tempfile::tempdir().unwrap();
        let v = Volume::new(dir.path(), "--data");
        v.check(0).unwrap();
        let free = free_bytes(dir.path()).unwrap();
        let e = v.check(free).unwrap_err();
        assert!(matches!(e, Error::NoSpace(_)), "{e}");
        let text = e.to_string();
        assert!(
            text.starts_with(&format!(
                "no space left on --data ({})",
                dir.path().display()
            )),
            "{text}"
        );
        assert!(text.contains("free space"), "{text}");
    }

    #[test]
    fn a_full_disk_error_names_the_volume() {
        let v = Volume::new(Path::new("/srv/tessera"), "--data");
        let e = v.write_error(
            "cannot write a blob".into(),
            std::io::Error::from(std::io::ErrorKind::StorageFull),
        );
        assert!(matches!(e, Error::NoSpace(_)));
        assert!(e.to_string().contains("--data (/srv/tessera)"), "{e}");
        let other = v.write_error(
            "cannot write a blob".into(),
            std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        );
        assert!(matches!(other, Error::Io { .. }));
    }
}
