//! A small tmpfs for tests of full disks: mounted on a directory, unmounted
//! when dropped. Mounting needs root (or CAP_SYS_ADMIN); without it a test
//! prints why and skips, unless `TESSERA_REQUIRE_SERVERS=1`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A mounted tmpfs.
pub struct Tmpfs {
    dir: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `mib` MiB on `dir` (created), or says why not.
    pub fn mount(dir: &Path, mib: u32) -> Result<Self, String> {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "cannot mount a tmpfs on {} (needs root): {}",
                dir.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    /// Mounts one, or prints why not and returns None; with
    /// `TESSERA_REQUIRE_SERVERS=1` a failed mount fails the test.
    pub fn mount_or_skip(test: &str, dir: &Path, mib: u32) -> Option<Self> {
        match Self::mount(dir, mib) {
            Ok(t) => Some(t),
            Err(e) if std::env::var("TESSERA_REQUIRE_SERVERS").as_deref() == Ok("1") => {
                panic!("{test}: {e}")
            }
            Err(e) => {
                eprintln!("skipped {test}: {e}");
                None
            }
        }
    }

    /// Writes `name` in it until the disk is full; returns its path.
    pub fn fill(&self, name: &str) -> PathBuf {
        fill(&self.dir.join(name))
    }

    /// Bytes free on it.
    pub fn free(&self) -> u64 {
        let out = Command::new("df")
            .args(["-B1", "--output=avail"])
            .arg(&self.dir)
            .output()
            .expect("df runs");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .nth(1)
            .and_then(|l| l.trim().parse().ok())
            .unwrap_or(0)
    }
}

/// Writes `path` until its disk is full (down to the last 512 bytes).
pub fn fill(path: &Path) -> PathBuf {
    let mut f = std::fs::File::create(path).expect("the filler can be created");
    let mut chunk = 1 << 20;
    while chunk >= 512 {
        if f.write_all(&vec![7u8; chunk]).is_err() {
            chunk /= 2;
        }
    }
    path.to_path_buf()
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazily: a process killed a moment ago may still hold a file there.
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}
