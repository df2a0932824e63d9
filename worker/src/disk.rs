//! Free space on the worker's disks: how much an unprivileged user may still
//! write, and the margin every download leaves free. Used by the scene cache
//! and by blob downloads alike.

use std::path::Path;

/// Bytes a download leaves free beyond its own size: room for Blender's
/// outputs and the cache's small files.
pub const MARGIN: u64 = 1 << 20;

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
