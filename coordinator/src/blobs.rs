//! Content-addressed blob stores keyed by blake3 [`Digest`].
//!
//! [`BlobStore`] is what the farm asks of one: [`FsBlobStore`] (`fs.rs`)
//! keeps blobs as files on the coordinator's disk, made durable in batches
//! before any record names them; [`s3::S3BlobStore`] keeps them in a bucket.
//! Every write re-hashes the bytes and refuses a digest mismatch; the same
//! bytes are stored once. [`MemoryBlobStore`] is the in-memory twin for unit
//! tests.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::digest::Digest;
use crate::error::{Backend, Error};

pub mod aws_profile;
#[cfg(any(test, feature = "contract-tests"))]
pub mod contract;
mod fs;
pub mod location;
pub mod s3;

pub use fs::FsBlobStore;

/// An upload in progress: bytes are hashed as they arrive.
pub trait BlobWriter: Send {
    /// Appends bytes.
    fn write(&mut self, data: &[u8]) -> Result<(), Error>;
    /// Verifies the digest and size, then makes the blob visible. Returns
    /// whether the store already held it. A store may keep the blob's bytes
    /// off the disk until [`BlobStore::make_durable`].
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

    /// Makes every blob committed so far durable: after a crash each one is
    /// whole under its address (once the store is opened again). The group
    /// commit calls it before it writes records, so a stored record never
    /// names a blob a crash can lose.
    /// A store whose writes are durable when they are answered (S3, memory)
    /// has nothing to do.
    fn make_durable(&self) -> Result<(), Error> {
        Ok(())
    }

    /// Makes the blobs in `named` durable before a record naming them is
    /// written, like [`BlobStore::make_durable`] (which it may call, making
    /// others durable too); a store that can tell that none of them is
    /// waiting for a sync answers at once, without waiting for a sync of
    /// other blobs under way. The group commit calls it for the blobs its
    /// records name: a batch of leases, or of results the results' sync
    /// already made durable, never waits for the syncs of new uploads.
    fn make_named_durable(&self, _named: &[Digest]) -> Result<(), Error> {
        self.make_durable()
    }

    /// Whether committed blobs wait for [`BlobStore::make_durable`] (a
    /// local directory); when not, nobody need ask for a sync.
    fn defers_durability(&self) -> bool {
        false
    }

    /// Whether a [`BlobStore::make_durable`] with no new blob still has
    /// work: tidying after earlier ones (see `FsBlobStore::linked`).
    fn settling(&self) -> bool {
        false
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

/// Where a [`FsBlobStore`] at `root` keeps `digest` once it is durable, for
/// a reader in the same process that copies it out (`tessera render`).
pub fn blob_path(root: &Path, digest: &Digest) -> PathBuf {
    let hex = digest.hex();
    root.join(&hex[..2]).join(&hex[2..])
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
        fs.make_durable().unwrap();
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
        store.make_durable().unwrap();
        let hex = d.to_hex();
        assert!(root.join(&hex[..2]).join(&hex[2..]).is_file());
        assert!(
            store.settling(),
            "its name under tmp/ waits for a sync of its link"
        );
        store.make_durable().unwrap();
        assert!(!store.settling());
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
