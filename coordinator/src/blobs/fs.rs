//! [`FsBlobStore`]: blobs as files under `DIR/blobs/ab/cdef...`.
//!
//! Each blob is written to a temporary file under `DIR/blobs/tmp/`, named
//! by its digest, so a crash never leaves a half-written blob under its
//! address. A verified upload waits there until [`BlobStore::make_durable`]
//! (the results' sync, or the group commit before it writes records naming
//! it) flushes the bytes of every waiting blob with their names under
//! `tmp/`, then links each into place; the next call's flush covers the
//! links before their `tmp/` names go, and [`FsBlobStore::open`] links
//! again a durable blob whose link a crash lost. So a file under its
//! address is always whole, the uploads themselves never wait for a disk,
//! and a record never outlives its blob. A write that would leave less than
//! [`crate::space::min_free`] on the volume is refused before any byte is
//! written, and a full disk met mid-write leaves nothing behind: both say
//! [`Error::NoSpace`], naming the volume.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::{blob_path, BlobStore, BlobWriter};
use crate::digest::Digest;
use crate::error::{Backend, Error};
use crate::space::Volume;

/// Blobs as files under `root/ab/cdef...`.
#[derive(Debug)]
pub struct FsBlobStore {
    root: PathBuf,
    max_blob: u64,
    volume: Volume,
    /// What its failures name: the directory and its volume's flag.
    backend: Backend,
    /// Verified uploads waiting under `tmp/` for [`BlobStore::make_durable`].
    /// Shared with the writers; moving a blob into place happens under this
    /// lock, so a reader that finds a blob in neither place knows it is absent.
    waiting: Arc<Mutex<HashMap<Digest, tempfile::TempPath>>>,
    /// Held for a whole [`BlobStore::make_durable`]: two callers (the
    /// results' sync and the group commit) never interleave, so one that
    /// finds a blob no longer waiting knows it is durable.
    syncing: Mutex<()>,
    /// Blobs linked into place by a [`BlobStore::make_durable`] whose link
    /// no sync has covered yet, with their name under `tmp/`, which a sync
    /// did cover: after a crash [`FsBlobStore::open`] finds them there, whole,
    /// and links them again. The next call's sync covers the links, and that
    /// call removes these names (taken after `waiting` when both are held).
    linked: Mutex<HashMap<Digest, PathBuf>>,
    /// Below this many bytes not yet written back, machine-wide, a batch of
    /// any size takes `syncfs` (see [`QUIET_BELOW`]).
    quiet_below: u64,
    /// The blob directory, held open for `syncfs` where that call reports
    /// a failed write-back (Linux 5.8 and later): it reports any the volume
    /// had since the last call through the same descriptor, so one held
    /// since the store opened misses none, where one opened for each call
    /// would miss a failure of the kernel's own write-back before the open.
    /// A failure it reports may be another program's on the same volume:
    /// that batch fails as a failed `fdatasync` would fail it, and the
    /// next call starts after that failure. `None` where `syncfs` says
    /// nothing of failed writes (an older Linux, another system): every
    /// batch then syncs its blobs one by one.
    volume_fd: Option<std::fs::File>,
}

impl FsBlobStore {
    /// Opens (creating) the store at `root`. What an earlier crash left
    /// under `tmp/` is settled: a blob made durable there whose link into
    /// place a crash may have lost is linked again, once its bytes hash to
    /// the digest its name starts with; anything else (an upload cut off,
    /// one no sync reached) is removed.
    pub fn open(root: &Path, max_blob: u64) -> Result<Self, Error> {
        let backend = Backend::BlobDir {
            dir: root.to_path_buf(),
            flag: "--blobs",
        };
        let tmp = root.join("tmp");
        std::fs::create_dir_all(&tmp)
            .map_err(|e| Error::io(format!("cannot create {}", tmp.display()), e).on(&backend))?;
        settle_left_overs(root, &tmp)
            .map_err(|e| Error::io(format!("cannot settle {}", tmp.display()), e).on(&backend))?;
        Ok(Self {
            root: root.to_path_buf(),
            max_blob,
            volume: Volume::new(root, "--blobs"),
            backend,
            waiting: Arc::default(),
            syncing: Mutex::default(),
            linked: Mutex::default(),
            quiet_below: QUIET_BELOW,
            volume_fd: syncfs_reports_errors()
                .then(|| std::fs::File::open(root).ok())
                .flatten(),
        })
    }

    /// Sets the threshold under which a small batch takes `syncfs`
    /// ([`QUIET_BELOW`]); 0 syncs small batches file by file always.
    #[cfg(test)]
    fn quiet_below(mut self, bytes: u64) -> Self {
        self.quiet_below = bytes;
        self
    }

    /// Names the volume in messages as `--data (DIR)` (the default place,
    /// `DIR/blobs`) rather than `--blobs (ROOT)`.
    pub fn in_data_dir(mut self, data: &Path) -> Self {
        self.volume = Volume::new(data, "--data");
        self.backend = Backend::BlobDir {
            dir: self.root.clone(),
            flag: "--data",
        };
        self
    }

    /// An I/O failure of this store, naming its directory and the fix.
    fn fail(&self, context: String, e: std::io::Error) -> Error {
        Error::io(context, e).on(&self.backend)
    }

    /// The file path of a blob (present or not).
    pub fn path(&self, digest: &Digest) -> PathBuf {
        blob_path(&self.root, digest)
    }

    fn waiting(&self) -> std::sync::MutexGuard<'_, HashMap<Digest, tempfile::TempPath>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn linked(&self) -> std::sync::MutexGuard<'_, HashMap<Digest, PathBuf>> {
        self.linked.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens a blob wherever it is: waiting under `tmp/` or in place. The
    /// open file stays readable when the blob is moved into place.
    fn open_blob(&self, digest: &Digest) -> Result<std::fs::File, Error> {
        let opened = match self.waiting().get(digest) {
            Some(tmp) => std::fs::File::open(tmp),
            None => std::fs::File::open(self.path(digest)),
        };
        opened.map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::NotFound(format!("blob {digest}")),
            _ => self.fail(format!("cannot read blob {digest}"), e),
        })
    }

    /// Flushes the blob volume's written bytes and names to disk with
    /// `syncfs` through `dir` ([`Self::volume_fd`]), one call for any number
    /// of blobs. It flushes every dirty page of the volume, other programs'
    /// too, so [`BlobStore::make_durable`] uses it only for a batch of more
    /// than [`SYNCFS_FROM`] blobs, or when the machine has little else to
    /// write ([`QUIET_BELOW`]).
    #[allow(unsafe_code)] // syncfs(2); std has no safe form.
    fn sync_volume(dir: &std::fs::File) -> std::io::Result<()> {
        #[cfg(test)]
        tests::SYNCS.with(|n| n.borrow_mut().volume += 1);
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            // SAFETY: `dir` is an open descriptor for the call's duration.
            if unsafe { libc::syncfs(dir.as_raw_fd()) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        }
        #[cfg(not(target_os = "linux"))]
        unreachable!("syncfs is used on Linux only ({dir:?})")
    }

    /// Flushes one file's bytes (or one directory's names) to disk.
    fn sync_path(path: &Path, data_only: bool) -> std::io::Result<()> {
        #[cfg(test)]
        tests::SYNCS.with(|n| n.borrow_mut().files += 1);
        let f = std::fs::File::open(path)?;
        if data_only {
            f.sync_data()
        } else {
            f.sync_all()
        }
    }
}

/// What a crash left under `tmp/` (see [`FsBlobStore::open`]): a file
/// named `DIGEST.xxxx` whose bytes hash to DIGEST is linked into place
/// when it is not there (a sync made it durable and the crash took its
/// link, or no sync reached it and its bytes survived anyway: whole and
/// named by its content either way); every other file goes.
fn settle_left_overs(root: &Path, tmp: &Path) -> std::io::Result<()> {
    let mut relinked = Vec::new();
    for entry in std::fs::read_dir(tmp)? {
        let path = entry?.path();
        let digest = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.split_once('.'))
            .and_then(|(hex, _)| hex.parse::<Digest>().ok());
        if let Some(digest) = digest {
            let place = blob_path(root, &digest);
            if !place.is_file() && hashes_to(&path, &digest) {
                let shard = place.parent().expect("blob path has a parent");
                std::fs::create_dir_all(shard)?;
                std::fs::hard_link(&path, &place)?;
                relinked.push((path, shard.to_path_buf()));
                continue;
            }
        }
        let _ = std::fs::remove_file(&path);
    }
    if relinked.is_empty() {
        return Ok(());
    }
    // The links on disk (shards, then the root that may name a new one)
    // before the names they replace go.
    let mut dirs: Vec<&Path> = relinked.iter().map(|(_, shard)| shard.as_path()).collect();
    dirs.sort();
    dirs.dedup();
    for dir in dirs.into_iter().chain([root]) {
        FsBlobStore::sync_path(dir, false)?;
    }
    for (path, _) in &relinked {
        std::fs::remove_file(path)?;
    }
    tracing::warn!(
        blobs = relinked.len(),
        "blobs made durable before a crash were linked into place again"
    );
    Ok(())
}

/// Whether the file at `path` holds the bytes of `digest`.
fn hashes_to(path: &Path, digest: &Digest) -> bool {
    let mut hasher = blake3::Hasher::new();
    std::fs::File::open(path)
        .and_then(|mut f| std::io::copy(&mut f, &mut hasher))
        .is_ok_and(|_| Digest::from_hasher(&hasher) == *digest)
}

/// The most blobs [`BlobStore::make_durable`] syncs one by one; a larger
/// batch (a file set's thousands of files) takes one `syncfs` of the volume
/// for their bytes and names, where `syncfs` reports failed
/// writes ([`FsBlobStore::volume_fd`]). One by one, a batch costs a
/// `fdatasync` per blob and an `fsync` of `tmp/` and of each directory
/// the last call linked into, but never waits for
/// other programs' writes to the same disk, as `syncfs` does (measured: a
/// `syncfs` beside a compiler's fresh output took 0.5 s).
const SYNCFS_FROM: usize = 64;

/// Written bytes not yet on disk, machine-wide, under which a batch of any
/// size takes `syncfs` instead of a sync per blob and per directory: with
/// so little to write, the volume's flush costs about what the batch's own
/// bytes do, and each per-file sync is a disk cache flush of its own.
/// Measured when a batch took two flushes (see [`FsBlobStore::linked`]),
/// `scripts/bench-sync.sh` on an ext4 virtual disk: 2 blobs 0.69-0.81x the
/// time one by one, 8 blobs 0.25x, 80 blobs 0.12x; one blob alone costs
/// two flushes either way (0.62-0.72 ms against 0.52-0.63 ms into an
/// existing shard, three flushes one by one into a new one), and under
/// load a lone result is not slower with `syncfs` (`tessera-load run -w 10
/// -s 8`, three pairs: slot idle p50 4.5-6.2 ms against 5.0-6.9 ms with
/// lone blobs one by one). Over the threshold (a compiler's output, a big
/// render being written back), small batches go one by one, so they never
/// wait for other programs' bytes: beside the test suite's writes, one
/// blob took 1.74 ms with `syncfs` against 0.69 ms one by one.
const QUIET_BELOW: u64 = 8 << 20;

/// Whether `syncfs` reports a failed write-back: Linux 5.8 and later.
/// Before, it failed only for a bad descriptor, so a write the disk
/// refused would pass for durable.
fn syncfs_reports_errors() -> bool {
    cfg!(target_os = "linux")
        && std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .is_ok_and(|release| linux_reports_syncfs_errors(&release))
}

/// Whether the Linux `release` (`6.1.0-18-amd64`) is 5.8 or later.
fn linux_reports_syncfs_errors(release: &str) -> bool {
    let mut numbers = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let major = numbers.next().unwrap_or(0);
    let minor = numbers.next().unwrap_or(0);
    (major, minor) >= (5, 8)
}

/// Bytes written on this machine and not yet on disk: `Dirty` plus
/// `Writeback` of `/proc/meminfo` (every volume's, so at least the blob
/// volume's); `None` where that is not known.
fn unwritten_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let mut total = 0;
    let mut found = 0;
    for line in info.lines() {
        let Some((key, rest)) = line.split_once(':') else {
            continue;
        };
        if key == "Dirty" || key == "Writeback" {
            let kib: u64 = rest.trim().strip_suffix("kB")?.trim().parse().ok()?;
            total += kib * 1024;
            found += 1;
        }
    }
    (found == 2).then_some(total)
}

/// How many written bytes of an upload [`FsWriter`] lets pile up before it
/// asks the kernel to start writing them to disk (without waiting), so the
/// batch's sync in [`BlobStore::make_durable`] finds most of a large blob
/// already on disk instead of writing it all then.
const WRITE_BEHIND: u64 = 8 << 20;

/// Starts writeback of `len` bytes of `file` at `offset` without waiting
/// for it (`sync_file_range` with `SYNC_FILE_RANGE_WRITE`). Only a head
/// start: durability still comes from the sync in `make_durable`, so a
/// failure here changes nothing and is ignored.
#[allow(unsafe_code)] // sync_file_range(2); std has no form of it.
fn write_behind(file: &std::fs::File, offset: u64, len: u64) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
            return;
        };
        // SAFETY: `file` is an open descriptor for the call's duration.
        unsafe {
            libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, offset, len);
}

struct FsWriter {
    claimed: Digest,
    claimed_size: u64,
    written: u64,
    /// Bytes before this offset have had their writeback started.
    behind: u64,
    max_blob: u64,
    hasher: blake3::Hasher,
    file: Option<tempfile::NamedTempFile>,
    final_path: PathBuf,
    volume: Volume,
    backend: Backend,
    /// A write failed: the upload can no longer be committed.
    failed: bool,
    /// The store's uploads waiting for [`BlobStore::make_durable`].
    waiting: Arc<Mutex<HashMap<Digest, tempfile::TempPath>>>,
}

impl BlobWriter for FsWriter {
    fn write(&mut self, data: &[u8]) -> Result<(), Error> {
        self.written += data.len() as u64;
        if self.failed {
            return Err(Error::Conflict(format!(
                "the upload of {} failed earlier; send it again",
                self.claimed
            )));
        }
        if self.written > self.claimed_size || self.written > self.max_blob {
            return Err(Error::invalid(format!(
                "upload of {} is larger than its declared size of {} bytes (limit {} bytes); send the file again",
                self.claimed, self.claimed_size, self.max_blob
            )));
        }
        self.hasher.update(data);
        if let Some(file) = self.file.as_mut() {
            if let Err(e) = file.write_all(data) {
                // The temporary file goes at once: a full disk gets its
                // bytes back now, not when the upload ends.
                self.file = None;
                self.failed = true;
                return Err(self
                    .volume
                    .write_error(format!("cannot write blob {}", self.claimed), e)
                    .on(&self.backend));
            }
            // A large upload's bytes start for the disk while the rest
            // arrives; the whole blob's last bytes when it is complete.
            let pending = self.written - self.behind;
            if pending >= WRITE_BEHIND
                || (self.written == self.claimed_size && self.written >= 1 << 20)
            {
                write_behind(file.as_file(), self.behind, pending);
                self.behind = self.written;
            }
        }
        Ok(())
    }

    fn commit(self: Box<Self>) -> Result<bool, Error> {
        if self.failed {
            return Err(Error::Conflict(format!(
                "the upload of {} failed earlier; send it again",
                self.claimed
            )));
        }
        let got = Digest::from_hasher(&self.hasher);
        if got != self.claimed || self.written != self.claimed_size {
            return Err(Error::invalid(format!(
                "upload does not match its digest: claimed {} ({} bytes), received {} ({} bytes); the file changed or was corrupted in transit, send it again",
                self.claimed, self.claimed_size, got, self.written
            )));
        }
        let Some(file) = self.file else {
            return Ok(true);
        };
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        if waiting.contains_key(&self.claimed) || self.final_path.is_file() {
            // Another upload of the same bytes finished first.
            return Ok(true);
        }
        // Written (no sync yet): it waits for the next group commit.
        waiting.insert(self.claimed, file.into_temp_path());
        Ok(false)
    }
}

impl BlobStore for FsBlobStore {
    fn remove(&self, digest: &Digest) -> Result<(), Error> {
        // A waiting upload's temporary file goes with its entry.
        if self.waiting().remove(digest).is_some() {
            return Ok(());
        }
        // A name under `tmp/` kept for a link no sync covered yet goes too,
        // or a crash would bring the blob back.
        if let Some(tmp) = self.linked().remove(digest) {
            let _ = std::fs::remove_file(tmp);
        }
        match std::fs::remove_file(self.path(digest)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(self.fail(format!("cannot remove blob {digest}"), e))
            }
            _ => Ok(()),
        }
    }

    fn contains(&self, digest: &Digest) -> bool {
        self.waiting().contains_key(digest) || self.path(digest).is_file()
    }

    fn size(&self, digest: &Digest) -> Option<u64> {
        let waiting = self.waiting();
        let path = waiting.get(digest).map(|t| t.to_path_buf());
        drop(waiting);
        std::fs::metadata(path.unwrap_or_else(|| self.path(digest)))
            .ok()
            .map(|m| m.len())
    }

    fn defers_durability(&self) -> bool {
        true
    }

    fn make_named_durable(&self, named: &[Digest]) -> Result<(), Error> {
        // Linked or not, a blob no longer waiting is durable (see `linked`).
        let settled = {
            let waiting = self.waiting();
            !named.iter().any(|d| waiting.contains_key(d))
        };
        if settled {
            return Ok(());
        }
        self.make_durable()
    }

    fn settling(&self) -> bool {
        !self.linked().is_empty()
    }

    fn make_durable(&self) -> Result<(), Error> {
        let _one_at_a_time = self.syncing.lock().unwrap_or_else(|e| e.into_inner());
        let batch: Vec<(Digest, PathBuf)> = self
            .waiting()
            .iter()
            .map(|(d, t)| (*d, t.to_path_buf()))
            .collect();
        // Links of earlier calls: this call's sync covers them.
        let linked: Vec<(Digest, PathBuf)> =
            self.linked().iter().map(|(d, p)| (*d, p.clone())).collect();
        if batch.is_empty() && linked.is_empty() {
            return Ok(());
        }
        let failed = |what: &str, e| self.volume.write_error(what.into(), e).on(&self.backend);
        let whole_volume = self.volume_fd.as_ref().filter(|_| {
            batch.len() > SYNCFS_FROM || unwritten_bytes().is_some_and(|b| b < self.quiet_below)
        });
        // One flush: the new blobs' bytes and their names under `tmp/`
        // (each starts with its digest), and the earlier calls' links into
        // place with the shards they made. Once it returns, a crash loses
        // no new blob: `open` links again any that lost its link. Moving
        // blobs into place before a sync and syncing the moves after (two
        // flushes a batch) was the way before; a rename cannot take its
        // place here, since without a journal (ext4 can run without one) a
        // crash may leave a renamed file under neither name, where a link
        // leaves the old name as it was.
        if let Some(dir) = whole_volume {
            Self::sync_volume(dir).map_err(|e| failed("cannot sync new blobs to disk", e))?;
        } else {
            for (_, tmp) in &batch {
                match Self::sync_path(tmp, true) {
                    // Collected meanwhile: nothing to sync.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    r => r.map_err(|e| failed("cannot sync a new blob to disk", e))?,
                }
            }
            let mut dirs: Vec<PathBuf> = linked
                .iter()
                .map(|(d, _)| {
                    self.path(d)
                        .parent()
                        .expect("blob path has a parent")
                        .to_path_buf()
                })
                .collect();
            if !batch.is_empty() {
                dirs.push(self.root.join("tmp"));
            }
            if !linked.is_empty() {
                // Their shards may be new.
                dirs.push(self.root.clone());
            }
            dirs.sort();
            dirs.dedup();
            // Shards before the root (sorted, the root is first): a new
            // shard's entries are on disk before its name is.
            for dir in dirs.iter().rev() {
                Self::sync_path(dir, false)
                    .map_err(|e| failed("cannot sync new blob names to disk", e))?;
            }
        }
        // The earlier links are on disk: their names under `tmp/` go.
        {
            let mut still = self.linked();
            for (digest, tmp) in &linked {
                let _ = std::fs::remove_file(tmp);
                still.remove(digest);
            }
        }
        // Each new blob is linked into place (under the lock, so that a
        // reader finds it in one place or the other), its name under `tmp/`
        // kept until the next call's sync covers the link.
        let mut waiting = self.waiting();
        let mut linked = self.linked();
        for (digest, _) in &batch {
            // Collected meanwhile: nothing to link.
            let Some(tmp) = waiting.remove(digest) else {
                continue;
            };
            let path = self.path(digest);
            let parent = path.parent().expect("blob path has a parent");
            let placed = match std::fs::hard_link(&tmp, &path) {
                // A new shard (its entry in the root is synced with the link).
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    std::fs::create_dir_all(parent).and_then(|()| std::fs::hard_link(&tmp, &path))
                }
                r => r,
            }
            .or_else(|e| match e.kind() {
                // The same bytes are in place already.
                std::io::ErrorKind::AlreadyExists => Ok(()),
                _ => Err(e),
            });
            if let Err(e) = placed {
                // It stays waiting, its bytes durable: the next call tries again.
                waiting.insert(*digest, tmp);
                return Err(failed("cannot move a blob into place", e));
            }
            match tmp.keep() {
                Ok(kept) => {
                    linked.insert(*digest, kept);
                }
                Err(e) => {
                    // It waits again: the next call syncs it and finds it
                    // in place.
                    waiting.insert(*digest, e.path);
                    return Err(failed("cannot keep a new blob's name", e.error));
                }
            }
        }
        Ok(())
    }

    fn writer(&self, digest: Digest, size: u64) -> Result<Box<dyn BlobWriter>, Error> {
        if size > self.max_blob {
            return Err(Error::invalid(format!(
                "blob of {size} bytes is over the coordinator's upload limit of {} bytes; make the scene smaller or raise the coordinator's --max-upload-mib",
                self.max_blob
            )));
        }
        let present = self.contains(&digest);
        let file = if present {
            None
        } else {
            self.volume.check(size)?;
            Some(
                // Named by its digest first: after a crash, `open` knows
                // what a durable one is.
                tempfile::Builder::new()
                    .prefix(&format!("{digest}."))
                    .tempfile_in(self.root.join("tmp"))
                    .map_err(|e| {
                        self.volume
                            .write_error("cannot create a temporary blob file".into(), e)
                            .on(&self.backend)
                    })?,
            )
        };
        Ok(Box::new(FsWriter {
            claimed: digest,
            claimed_size: size,
            written: 0,
            behind: 0,
            max_blob: self.max_blob,
            hasher: blake3::Hasher::new(),
            file,
            final_path: self.path(&digest),
            volume: self.volume.clone(),
            backend: self.backend.clone(),
            failed: false,
            waiting: self.waiting.clone(),
        }))
    }

    fn read(&self, digest: &Digest) -> Result<Vec<u8>, Error> {
        use std::io::Read;
        let mut bytes = Vec::new();
        self.open_blob(digest)?
            .read_to_end(&mut bytes)
            .map_err(|e| self.fail(format!("cannot read blob {digest}"), e))?;
        Ok(bytes)
    }

    fn read_range(&self, digest: &Digest, offset: u64, len: usize) -> Result<Vec<u8>, Error> {
        use std::io::{Read, Seek, SeekFrom};
        let mut file = self.open_blob(digest)?;
        file.seek(SeekFrom::Start(offset))
            .map_err(|e| self.fail(format!("cannot read blob {digest}"), e))?;
        let mut buf = Vec::with_capacity(len);
        file.take(len as u64)
            .read_to_end(&mut buf)
            .map_err(|e| self.fail(format!("cannot read blob {digest}"), e))?;
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        /// Syncs this thread made.
        pub(super) static SYNCS: std::cell::RefCell<Syncs> = const { std::cell::RefCell::new(Syncs { volume: 0, files: 0 }) };
    }

    #[test]
    fn a_failed_write_names_the_blob_directory_and_its_volume() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("blobs");
        let store = FsBlobStore::open(&root, 1 << 20)
            .unwrap()
            .in_data_dir(dir.path());
        // Its temporary folder becomes a file: nothing can be written.
        std::fs::remove_dir(root.join("tmp")).unwrap();
        std::fs::write(root.join("tmp"), b"not a folder").unwrap();
        let Err(err) = store.writer(Digest::of(b"x"), 1) else {
            panic!("a write into a broken blob directory was accepted");
        };
        let Error::Store(f) = &err else {
            panic!("not a store failure: {err}");
        };
        assert_eq!(
            f.backend,
            Backend::BlobDir {
                dir: root.clone(),
                flag: "--data"
            }
        );
        let text = err.to_string();
        assert!(
            text.starts_with(&format!("the blob store in {}: ", root.display())),
            "{text}"
        );
        assert!(text.contains("--data volume"), "{text}");
        // A blob that cannot be read names the directory too.
        let d = Digest::of(b"unreadable");
        std::fs::create_dir_all(store.path(&d)).unwrap();
        let text = store.read(&d).unwrap_err().to_string();
        assert!(text.contains(&root.display().to_string()), "{text}");
    }

    /// Syncs counted by [`SYNCS`].
    #[derive(Debug, Default, PartialEq, Eq)]
    pub(super) struct Syncs {
        /// `syncfs` calls.
        pub(super) volume: u32,
        /// Files and directories synced one by one.
        pub(super) files: u32,
    }

    fn syncs() -> Syncs {
        SYNCS.with(|n| std::mem::take(&mut *n.borrow_mut()))
    }

    fn waiting_files(root: &Path) -> usize {
        std::fs::read_dir(root.join("tmp")).unwrap().count()
    }

    #[test]
    fn a_record_naming_only_durable_blobs_waits_for_no_sync() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("blobs");
        let store = FsBlobStore::open(&root, 1 << 20).unwrap().quiet_below(0);
        let (a, b) = (Digest::of(b"frame a"), Digest::of(b"frame b"));
        store.put(a, b"frame a").unwrap();
        store.make_durable().unwrap();
        store.put(b, b"frame b").unwrap();
        syncs();
        store.make_named_durable(&[a]).unwrap();
        store.make_named_durable(&[]).unwrap();
        assert_eq!(
            syncs(),
            Syncs::default(),
            "a is durable already: nothing to sync"
        );
        assert_eq!(store.waiting().len(), 1, "b still waits");
        store.make_named_durable(&[a, b]).unwrap();
        assert!(syncs().files >= 2, "b's bytes and its name");
        assert_eq!(std::fs::read(store.path(&b)).unwrap(), b"frame b");
        store.make_durable().unwrap();
        assert_eq!(waiting_files(&root), 0);
    }

    #[test]
    fn an_upload_waits_off_its_address_until_a_batch_makes_it_durable() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("blobs");
        // A disk busy with other writes: small batches file by file.
        let store = FsBlobStore::open(&root, 1 << 20).unwrap().quiet_below(0);
        let (a, b) = (Digest::of(b"frame a"), Digest::of(b"frame b"));
        syncs();
        assert!(!store.put(a, b"frame a").unwrap());
        assert!(!store.put(b, b"frame b").unwrap());
        assert_eq!(syncs(), Syncs::default(), "an upload alone syncs nothing");
        // Readable where it waits, never under its address before a sync.
        assert!(store.contains(&a));
        assert_eq!(store.size(&a), Some(7));
        assert_eq!(store.read(&a).unwrap(), b"frame a");
        assert_eq!(store.read_range(&b, 6, 1).unwrap(), b"b");
        assert!(!store.path(&a).exists());
        assert_eq!(waiting_files(&root), 2);
        assert!(
            store.put(a, b"frame a").unwrap(),
            "the same bytes wait once"
        );
        assert_eq!(waiting_files(&root), 2);

        // A small batch: each file's bytes, then the directory of their
        // names; then each is linked into place.
        let reader = store.open_blob(&a).unwrap();
        store.make_durable().unwrap();
        assert_eq!(
            syncs(),
            Syncs {
                volume: 0,
                files: 2 + 1
            }
        );
        assert_eq!(std::fs::read(store.path(&a)).unwrap(), b"frame a");
        assert_eq!(std::fs::read(store.path(&b)).unwrap(), b"frame b");
        assert_eq!(
            waiting_files(&root),
            2,
            "their names stay until a sync covers the links"
        );
        let mut early = String::new();
        std::io::Read::read_to_string(&mut &reader, &mut early).unwrap();
        assert_eq!(early, "frame a", "a reader opened before the link reads on");
        // The next call syncs the links (the new shards, then the root that
        // names them), then lets the names go.
        store.make_durable().unwrap();
        let shards = [&a, &b].map(|d| store.path(d).parent().unwrap().to_path_buf());
        let dirs = if shards[0] == shards[1] { 2 } else { 3 };
        assert_eq!(
            syncs(),
            Syncs {
                volume: 0,
                files: dirs
            }
        );
        assert_eq!(waiting_files(&root), 0);
        store.make_durable().unwrap();
        assert_eq!(syncs(), Syncs::default(), "nothing waiting, nothing synced");

        // A large batch: one syncfs for the bytes and their names.
        let many: Vec<Vec<u8>> = (0..=SYNCFS_FROM)
            .map(|i| format!("blob {i}").into_bytes())
            .collect();
        for bytes in &many {
            store.put(Digest::of(bytes), bytes).unwrap();
        }
        store.make_durable().unwrap();
        let synced = syncs();
        if store.volume_fd.is_some() {
            assert_eq!(
                synced,
                Syncs {
                    volume: 1,
                    files: 0
                }
            );
        } else {
            // A system whose syncfs says nothing of failed writes.
            assert_eq!(synced.volume, 0);
        }
        for bytes in &many {
            assert_eq!(
                &std::fs::read(store.path(&Digest::of(bytes))).unwrap(),
                bytes
            );
        }
        store.make_durable().unwrap();
        assert_eq!(waiting_files(&root), 0);
    }

    #[test]
    fn on_a_quiet_disk_even_one_blob_takes_the_volume_sync() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("blobs");
        let store = FsBlobStore::open(&root, 1 << 20)
            .unwrap()
            .quiet_below(u64::MAX);
        let a = Digest::of(b"frame a");
        store.put(a, b"frame a").unwrap();
        syncs();
        store.make_durable().unwrap();
        let expected = if store.volume_fd.is_some() {
            Syncs {
                volume: 1,
                files: 0,
            }
        } else {
            // Where syncfs says nothing of failed writes: its bytes, the
            // directory of its name.
            Syncs {
                volume: 0,
                files: 2,
            }
        };
        assert_eq!(syncs(), expected, "its bytes and its name, in one flush");
        assert_eq!(std::fs::read(store.path(&a)).unwrap(), b"frame a");
        store.make_named_durable(&[a]).unwrap();
        assert_eq!(syncs(), Syncs::default(), "durable: nothing more to sync");
    }

    #[test]
    fn syncfs_is_trusted_from_linux_5_8() {
        for (release, trusted) in [
            ("6.18.44-fc-v1300\n", true),
            ("5.8.0", true),
            ("5.10.0-28-amd64", true),
            ("5.4.0-150-generic", false),
            ("4.19.0-26-amd64", false),
            ("", false),
        ] {
            assert_eq!(linux_reports_syncfs_errors(release), trusted, "{release:?}");
        }
        let store = FsBlobStore::open(tempfile::tempdir().unwrap().path(), 1 << 20).unwrap();
        assert_eq!(store.volume_fd.is_some(), syncfs_reports_errors());
    }

    #[test]
    fn what_is_left_to_write_is_read_where_the_kernel_says_it() {
        let left = unwritten_bytes();
        assert_eq!(left.is_some(), cfg!(target_os = "linux"), "{left:?}");
    }

    #[test]
    fn a_crash_leaves_whole_blobs_in_place_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("blobs");
        let store = FsBlobStore::open(&root, 1 << 20).unwrap();
        let (a, b, c) = (
            Digest::of(b"kept"),
            Digest::of(b"removed"),
            Digest::of(b"durable"),
        );
        store.put(c, b"durable").unwrap();
        store.make_durable().unwrap();
        store.put(a, b"kept").unwrap();
        store.put(b, b"removed").unwrap();
        store.remove(&b).unwrap();
        assert!(!store.contains(&b));
        assert_eq!(waiting_files(&root), 2, "b's temporary file went with it");
        // A crash that took c's link (its name under tmp/ had been synced),
        // and left an upload cut off and a file of no blob.
        std::fs::remove_file(store.path(&c)).unwrap();
        let cut = Digest::of(b"cut off");
        std::fs::write(root.join("tmp").join(format!("{cut}.x1")), b"cut").unwrap();
        std::fs::write(root.join("tmp").join("stray"), b"?").unwrap();
        std::mem::forget(store);
        let store = FsBlobStore::open(&root, 1 << 20).unwrap();
        assert_eq!(
            store.read(&c).unwrap(),
            b"durable",
            "linked into place again"
        );
        // a's bytes survived this crash whole: named by its content, it is
        // taken in (a crash of the machine may as well have lost them).
        assert_eq!(store.read(&a).unwrap(), b"kept");
        assert!(!store.contains(&cut) && !store.contains(&b));
        assert_eq!(waiting_files(&root), 0);
        assert!(!store.settling());
    }

    #[test]
    fn a_removed_blob_does_not_come_back_after_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("blobs");
        let store = FsBlobStore::open(&root, 1 << 20).unwrap();
        let d = Digest::of(b"collected");
        store.put(d, b"collected").unwrap();
        store.make_durable().unwrap();
        assert!(store.settling(), "its link not yet covered by a sync");
        store.remove(&d).unwrap();
        assert!(!store.settling());
        std::mem::forget(store);
        let store = FsBlobStore::open(&root, 1 << 20).unwrap();
        assert!(!store.contains(&d));
        assert_eq!(waiting_files(&root), 0);
    }
}
