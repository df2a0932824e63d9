//! Content-addressed blob stores keyed by blake3 [`Digest`].
//!
//! [`FsBlobStore`] keeps `DIR/blobs/ab/cdef...`, writing each blob to a
//! temporary file under `DIR/blobs/tmp/` and renaming it into place, so a crash
//! never leaves a half-written blob under its address. Every write re-hashes the
//! bytes and refuses a digest mismatch; the same bytes are stored once. A
//! write that would leave less than [`crate::space::min_free`] on the volume is
//! refused before any byte is written, and a full disk met mid-write leaves
//! nothing behind: both say [`Error::NoSpace`], naming the volume.
//! [`MemoryBlobStore`] is the in-memory twin for unit tests.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::digest::Digest;
use crate::error::{Backend, Error};
use crate::space::Volume;

pub mod aws_profile;
#[cfg(any(test, feature = "contract-tests"))]
pub mod contract;
pub mod location;
pub mod s3;

/// An upload in progress: bytes are hashed as they arrive.
pub trait BlobWriter: Send {
    /// Appends bytes.
    fn write(&mut self, data: &[u8]) -> Result<(), Error>;
    /// Verifies the digest and size, then makes the blob visible. Returns
    /// whether the store already held it.
    fn commit(self: Box<Self>) -> Result<bool, Error>;
}

/// Blobs [`BlobStore::remove_many`] did not delete, and why.
#[derive(Debug)]
pub struct RemoveFailed {
    /// The blobs still there (or not known to be gone).
    pub left: Vec<Digest>,
    /// The first failure.
    pub error: Error,
}

/// Storage of immutable blobs addressed by their blake3 digest.
pub trait BlobStore: Send + Sync + 'static {
    /// Whether the blob is present.
    fn contains(&self, digest: &Digest) -> bool;
    /// Size of a present blob.
    fn size(&self, digest: &Digest) -> Option<u64>;
    /// Size of a present blob, or why the store could not say (a store on
    /// another machine that does not answer), so that a caller tells "not
    /// there" from "not reachable now".
    fn try_size(&self, digest: &Digest) -> Result<Option<u64>, Error> {
        Ok(self.size(digest))
    }
    /// Starts an upload that claims `digest` and `size`.
    fn writer(&self, digest: Digest, size: u64) -> Result<Box<dyn BlobWriter>, Error>;
    /// Reads a whole blob.
    fn read(&self, digest: &Digest) -> Result<Vec<u8>, Error>;
    /// Reads `len` bytes at `offset` (for streaming large blobs).
    fn read_range(&self, digest: &Digest, offset: u64, len: usize) -> Result<Vec<u8>, Error>;

    /// Deletes a blob (a no-op when absent).
    fn remove(&self, digest: &Digest) -> Result<(), Error>;

    /// Deletes blobs (absent ones are no error) in as few requests as the
    /// store allows; on a failure, says which were not deleted.
    fn remove_many(&self, digests: &[Digest]) -> Result<(), RemoveFailed> {
        for (i, d) in digests.iter().enumerate() {
            if let Err(error) = self.remove(d) {
                // One failure ends the batch: a store that stopped
                // answering costs one try, not one per blob.
                return Err(RemoveFailed {
                    left: digests[i..].to_vec(),
                    error,
                });
            }
        }
        Ok(())
    }

    /// Whether the store answers, for a store on another machine (none for
    /// a local one).
    fn health(&self) -> Option<crate::health::StoreHealth> {
        None
    }

    /// Stores `bytes` whole (verifying them against `digest`).
    fn put(&self, digest: Digest, bytes: &[u8]) -> Result<bool, Error> {
        let mut w = self.writer(digest, bytes.len() as u64)?;
        w.write(bytes)?;
        w.commit()
    }
}

/// Blobs as files under `root/ab/cdef...`.
#[derive(Debug)]
pub struct FsBlobStore {
    root: PathBuf,
    max_blob: u64,
    volume: Volume,
    /// What its failures name: the directory and its volume's flag.
    backend: Backend,
}

impl FsBlobStore {
    /// Opens (creating) the store at `root`. Left-over temporary files of an
    /// earlier crash are removed.
    pub fn open(root: &Path, max_blob: u64) -> Result<Self, Error> {
        let backend = Backend::BlobDir {
            dir: root.to_path_buf(),
            flag: "--blobs",
        };
        let tmp = root.join("tmp");
        std::fs::create_dir_all(&tmp)
            .map_err(|e| Error::io(format!("cannot create {}", tmp.display()), e).on(&backend))?;
        if let Ok(entries) = std::fs::read_dir(&tmp) {
            for entry in entries.flatten() {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        Ok(Self {
            root: root.to_path_buf(),
            max_blob,
            volume: Volume::new(root, "--blobs"),
            backend,
        })
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
        let hex = digest.to_hex();
        self.root.join(&hex[..2]).join(&hex[2..])
    }
}

struct FsWriter {
    claimed: Digest,
    claimed_size: u64,
    written: u64,
    max_blob: u64,
    hasher: blake3::Hasher,
    file: Option<tempfile::NamedTempFile>,
    final_path: PathBuf,
    volume: Volume,
    backend: Backend,
    /// A write failed: the upload can no longer be committed.
    failed: bool,
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
        let (volume, backend) = (&self.volume, &self.backend);
        let failed = |context: String, e| volume.write_error(context, e).on(backend);
        file.as_file()
            .sync_all()
            .map_err(|e| failed("cannot sync a blob to disk".into(), e))?;
        let parent = self.final_path.parent().expect("blob path has a parent");
        let new_shard = !parent.is_dir();
        std::fs::create_dir_all(parent)
            .map_err(|e| failed(format!("cannot create {}", parent.display()), e))?;
        if new_shard {
            // The shard directory's own entry must reach the disk too.
            sync_dir(parent.parent().expect("shard has a parent")).map_err(|e| e.on(backend))?;
        }
        file.persist(&self.final_path)
            .map_err(|e| failed("cannot move a blob into place".into(), e.error))?;
        // A rename is durable only once its directory is: without this, a
        // power cut can lose a blob that was acknowledged.
        sync_dir(parent).map_err(|e| e.on(backend))?;
        Ok(false)
    }
}

/// Flushes a directory's entries (new names, renames) to disk.
fn sync_dir(dir: &Path) -> Result<(), Error> {
    #[cfg(test)]
    tests::DIR_SYNCS.with(|n| n.borrow_mut().push(dir.to_path_buf()));
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(format!("cannot sync directory {}", dir.display()), e))
}

impl BlobStore for FsBlobStore {
    fn remove(&self, digest: &Digest) -> Result<(), Error> {
        match std::fs::remove_file(self.path(digest)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(self.fail(format!("cannot remove blob {digest}"), e))
            }
            _ => Ok(()),
        }
    }

    fn contains(&self, digest: &Digest) -> bool {
        self.path(digest).is_file()
    }

    fn size(&self, digest: &Digest) -> Option<u64> {
        std::fs::metadata(self.path(digest)).ok().map(|m| m.len())
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
                tempfile::NamedTempFile::new_in(self.root.join("tmp")).map_err(|e| {
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
            max_blob: self.max_blob,
            hasher: blake3::Hasher::new(),
            file,
            final_path: self.path(&digest),
            volume: self.volume.clone(),
            backend: self.backend.clone(),
            failed: false,
        }))
    }

    fn read(&self, digest: &Digest) -> Result<Vec<u8>, Error> {
        std::fs::read(self.path(digest)).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::NotFound(format!("blob {digest}")),
            _ => self.fail(format!("cannot read blob {digest}"), e),
        })
    }

    fn read_range(&self, digest: &Digest, offset: u64, len: usize) -> Result<Vec<u8>, Error> {
        use std::io::{Read, Seek, SeekFrom};
        let mut file = std::fs::File::open(self.path(digest)).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::NotFound(format!("blob {digest}")),
            _ => self.fail(format!("cannot read blob {digest}"), e),
        })?;
        file.seek(SeekFrom::Start(offset))
            .map_err(|e| self.fail(format!("cannot read blob {digest}"), e))?;
        let mut buf = Vec::with_capacity(len);
        file.take(len as u64)
            .read_to_end(&mut buf)
            .map_err(|e| self.fail(format!("cannot read blob {digest}"), e))?;
        Ok(buf)
    }
}

/// Blobs in memory, for unit tests.
#[derive(Debug, Default)]
pub struct MemoryBlobStore {
    blobs: std::sync::Arc<Mutex<HashMap<Digest, Vec<u8>>>>,
    fail_reads: std::sync::atomic::AtomicU32,
}

impl MemoryBlobStore {
    /// Makes the next `n` reads fail as a bad disk would.
    pub fn fail_next_reads(&self, n: u32) {
        self.fail_reads
            .store(n, std::sync::atomic::Ordering::SeqCst);
    }
}

struct MemoryWriter {
    claimed: Digest,
    claimed_size: u64,
    buf: Vec<u8>,
    blobs: std::sync::Arc<Mutex<HashMap<Digest, Vec<u8>>>>,
}

impl BlobWriter for MemoryWriter {
    fn write(&mut self, data: &[u8]) -> Result<(), Error> {
        self.buf.extend_from_slice(data);
        Ok(())
    }

    fn commit(self: Box<Self>) -> Result<bool, Error> {
        if Digest::of(&self.buf) != self.claimed || self.buf.len() as u64 != self.claimed_size {
            return Err(Error::invalid(format!(
                "upload does not match its digest {}; send it again",
                self.claimed
            )));
        }
        let mut blobs = self.blobs.lock().unwrap();
        let present = blobs.contains_key(&self.claimed);
        blobs.entry(self.claimed).or_insert(self.buf);
        Ok(present)
    }
}

impl BlobStore for MemoryBlobStore {
    fn remove(&self, digest: &Digest) -> Result<(), Error> {
        self.blobs.lock().unwrap().remove(digest);
        Ok(())
    }

    fn contains(&self, digest: &Digest) -> bool {
        self.blobs.lock().unwrap().contains_key(digest)
    }

    fn size(&self, digest: &Digest) -> Option<u64> {
        self.blobs
            .lock()
            .unwrap()
            .get(digest)
            .map(|b| b.len() as u64)
    }

    fn writer(&self, digest: Digest, size: u64) -> Result<Box<dyn BlobWriter>, Error> {
        Ok(Box::new(MemoryWriter {
            claimed: digest,
            claimed_size: size,
            buf: Vec::new(),
            blobs: self.blobs.clone(),
        }))
    }

    fn read(&self, digest: &Digest) -> Result<Vec<u8>, Error> {
        use std::sync::atomic::Ordering;
        if self
            .fail_reads
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(Error::io(
                format!("cannot read blob {digest}"),
                std::io::Error::other("injected read failure"),
            )
            .on(&Backend::Memory));
        }
        self.blobs
            .lock()
            .unwrap()
            .get(digest)
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("blob {digest}")))
    }

    fn read_range(&self, digest: &Digest, offset: u64, len: usize) -> Result<Vec<u8>, Error> {
        let all = self.read(digest)?;
        let start = (offset as usize).min(all.len());
        let end = (start + len).min(all.len());
        Ok(all[start..end].to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        /// Directories this thread synced.
        pub(super) static DIR_SYNCS: std::cell::RefCell<Vec<PathBuf>> = const { std::cell::RefCell::new(Vec::new()) };
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

    #[test]
    fn a_new_blob_syncs_its_directory_after_the_rename() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("blobs");
        let store = FsBlobStore::open(&root, 1 << 20).unwrap();
        let d = Digest::of(b"durable");
        DIR_SYNCS.with(|n| n.borrow_mut().clear());
        store.put(d, b"durable").unwrap();
        let shard = store.path(&d).parent().unwrap().to_path_buf();
        let synced = DIR_SYNCS.with(|n| n.borrow().clone());
        assert_eq!(
            synced,
            vec![root.clone(), shard.clone()],
            "the new shard's parent, then the shard"
        );
        DIR_SYNCS.with(|n| n.borrow_mut().clear());
        store.put(Digest::of(b"other"), b"other").unwrap();
        let synced = DIR_SYNCS.with(|n| n.borrow().clone());
        assert!(synced.contains(
            &store
                .path(&Digest::of(b"other"))
                .parent()
                .unwrap()
                .to_path_buf()
        ));
    }

    fn stores() -> (tempfile::TempDir, Vec<Box<dyn BlobStore>>) {
        let dir = tempfile::tempdir().unwrap();
        let fs = FsBlobStore::open(&dir.path().join("blobs"), 1 << 20).unwrap();
        (
            dir,
            vec![Box::new(fs), Box::new(MemoryBlobStore::default())],
        )
    }

    #[test]
    fn the_file_and_memory_stores_keep_the_contract() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("blobs");
        let fs = FsBlobStore::open(&root, 64 << 20).unwrap();
        let kept = contract::check(&fs);
        let mut files: Vec<PathBuf> = std::fs::read_dir(&root)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name() != "tmp")
            .flat_map(|shard| std::fs::read_dir(shard.path()).unwrap().flatten())
            .map(|e| e.path())
            .collect();
        files.sort();
        let mut expected: Vec<PathBuf> = kept.iter().map(|d| fs.path(d)).collect();
        expected.sort();
        assert_eq!(files, expected, "only the kept blobs are visible");
        assert_eq!(std::fs::read_dir(root.join("tmp")).unwrap().count(), 0);

        let memory = MemoryBlobStore::default();
        let kept = contract::check(&memory);
        assert_eq!(memory.blobs.lock().unwrap().len(), kept.len());
    }

    #[test]
    fn same_bytes_are_stored_once() {
        let (_dir, stores) = stores();
        for store in stores {
            let d = Digest::of(b"frame");
            assert!(!store.put(d, b"frame").unwrap());
            assert!(store.put(d, b"frame").unwrap());
            assert_eq!(store.read(&d).unwrap(), b"frame");
            assert_eq!(store.size(&d), Some(5));
            assert_eq!(store.read_range(&d, 1, 3).unwrap(), b"ram");
        }
    }

    #[test]
    fn a_digest_mismatch_is_refused_and_nothing_is_stored() {
        let (_dir, stores) = stores();
        for store in stores {
            let claimed = Digest::of(b"one");
            let err = store.put(claimed, b"two").unwrap_err();
            assert!(matches!(err, Error::Invalid(_)), "{err}");
            assert!(!store.contains(&claimed));
        }
    }

    #[test]
    fn fs_layout_and_no_temporary_left_behind() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("blobs");
        let store = FsBlobStore::open(&root, 1 << 20).unwrap();
        let d = Digest::of(b"abc");
        store.put(d, b"abc").unwrap();
        let hex = d.to_hex();
        assert!(root.join(&hex[..2]).join(&hex[2..]).is_file());
        assert_eq!(std::fs::read_dir(root.join("tmp")).unwrap().count(), 0);
        let _ = store.put(Digest::of(b"x"), b"y");
        assert_eq!(std::fs::read_dir(root.join("tmp")).unwrap().count(), 0);
    }

    #[test]
    fn oversized_uploads_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsBlobStore::open(dir.path(), 4).unwrap();
        assert!(store.put(Digest::of(b"12345"), b"12345").is_err());
    }
}
