//! The farm's lock and the rule that comes with it: nothing does I/O while
//! holding it. One slow S3 request or PostgreSQL query under the lock would
//! stall every lease, result and status call behind it; so blobs are
//! checked before the lock is taken, the collector deletes after releasing
//! it, and durable writes go to the committer thread (see `txn`).
//!
//! Debug builds keep the rule: the farm's blob and metadata stores are
//! wrapped ([`checked_blobs`], [`checked_store`]) so that a call made while
//! this thread holds the lock panics, naming the call; every unit and
//! end-to-end test runs debug builds. The one exception is on purpose:
//! after a failed write or a panic, memory is rebuilt from the store under
//! the lock (the farm stops until memory equals the store again); that
//! path takes the mutex directly, not through [`Locked`].

use std::sync::Arc;

use super::State;
use crate::blobs::{BlobStore, BlobWriter, RemoveFailed};
use crate::digest::Digest;
use crate::error::Error;
use crate::health::StoreHealth;
use crate::model::ids::JobId;
use crate::model::output::FrameOutput;
use crate::store::{ArchivedJob, MetaStore, Record, Snapshot};

std::thread_local! {
    /// How many farm locks this thread holds now.
    static LOCKS_HELD: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Whether this thread holds a farm's lock now.
pub fn lock_held() -> bool {
    LOCKS_HELD.with(|n| n.get() > 0)
}

/// The farm's state, locked: counted while it lives (see [`lock_held`]).
pub(super) struct Locked<'a>(std::sync::MutexGuard<'a, State>);

impl<'a> Locked<'a> {
    pub(super) fn new(guard: std::sync::MutexGuard<'a, State>) -> Self {
        LOCKS_HELD.with(|n| n.set(n.get() + 1));
        Locked(guard)
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        LOCKS_HELD.with(|n| n.set(n.get() - 1));
    }
}

impl std::ops::Deref for Locked<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.0
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.0
    }
}

/// Panics when the farm's lock is held: `call` would do I/O under it.
#[track_caller]
fn refuse_under_lock(call: &str) {
    assert!(
        !lock_held(),
        "{call} was called while holding the farm's lock: no I/O under the lock (see ARCHITECTURE.md); \
         check or fetch before taking the lock, or act after releasing it"
    );
}

/// `blobs`, checked against I/O under the farm's lock in debug builds.
pub(super) fn checked_blobs(blobs: Arc<dyn BlobStore>) -> Arc<dyn BlobStore> {
    if cfg!(debug_assertions) {
        Arc::new(Checked(blobs))
    } else {
        blobs
    }
}

/// `store`, checked against I/O under the farm's lock in debug builds.
pub(super) fn checked_store(store: Arc<dyn MetaStore>) -> Arc<dyn MetaStore> {
    if cfg!(debug_assertions) {
        Arc::new(Checked(store))
    } else {
        store
    }
}

/// A store whose every call first checks that the farm's lock is not held.
struct Checked<T: ?Sized>(Arc<T>);

impl BlobStore for Checked<dyn BlobStore> {
    fn contains(&self, digest: &Digest) -> bool {
        refuse_under_lock("BlobStore::contains");
        self.0.contains(digest)
    }
    fn size(&self, digest: &Digest) -> Option<u64> {
        refuse_under_lock("BlobStore::size");
        self.0.size(digest)
    }
    fn try_size(&self, digest: &Digest) -> Result<Option<u64>, Error> {
        refuse_under_lock("BlobStore::try_size");
        self.0.try_size(digest)
    }
    fn writer(&self, digest: Digest, size: u64) -> Result<Box<dyn BlobWriter>, Error> {
        refuse_under_lock("BlobStore::writer");
        self.0.writer(digest, size)
    }
    fn read(&self, digest: &Digest) -> Result<Vec<u8>, Error> {
        refuse_under_lock("BlobStore::read");
        self.0.read(digest)
    }
    fn read_range(&self, digest: &Digest, offset: u64, len: usize) -> Result<Vec<u8>, Error> {
        refuse_under_lock("BlobStore::read_range");
        self.0.read_range(digest, offset, len)
    }
    fn remove(&self, digest: &Digest) -> Result<(), Error> {
        refuse_under_lock("BlobStore::remove");
        self.0.remove(digest)
    }
    fn remove_many(&self, digests: &[Digest]) -> Result<(), RemoveFailed> {
        refuse_under_lock("BlobStore::remove_many");
        self.0.remove_many(digests)
    }
    fn make_durable(&self) -> Result<(), Error> {
        refuse_under_lock("BlobStore::make_durable");
        self.0.make_durable()
    }
    fn make_named_durable(&self, named: &[Digest]) -> Result<(), Error> {
        refuse_under_lock("BlobStore::make_named_durable");
        self.0.make_named_durable(named)
    }
    fn defers_durability(&self) -> bool {
        self.0.defers_durability()
    }
    fn health(&self) -> Option<StoreHealth> {
        // In memory: the health the last request left.
        self.0.health()
    }
    fn put(&self, digest: Digest, bytes: &[u8]) -> Result<bool, Error> {
        refuse_under_lock("BlobStore::put");
        self.0.put(digest, bytes)
    }
}

impl MetaStore for Checked<dyn MetaStore> {
    fn load(&self) -> Result<Snapshot, Error> {
        refuse_under_lock("MetaStore::load");
        self.0.load()
    }
    fn write(&self, records: &[Record<'_>]) -> Result<(), Error> {
        refuse_under_lock("MetaStore::write");
        self.0.write(records)
    }
    fn load_archived(&self, id: JobId) -> Result<Option<ArchivedJob>, Error> {
        refuse_under_lock("MetaStore::load_archived");
        self.0.load_archived(id)
    }
    fn archived_outputs(&self, id: JobId) -> Result<Vec<FrameOutput>, Error> {
        refuse_under_lock("MetaStore::archived_outputs");
        self.0.archived_outputs(id)
    }
    fn purge_tasks(&self, id: JobId) -> Result<(), Error> {
        refuse_under_lock("MetaStore::purge_tasks");
        self.0.purge_tasks(id)
    }
    fn health(&self) -> Option<StoreHealth> {
        self.0.health()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blobs::MemoryBlobStore;

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "BlobStore::contains was called while holding the farm's lock")]
    fn a_blob_call_under_the_lock_panics_in_debug_builds() {
        let blobs = checked_blobs(Arc::new(MemoryBlobStore::default()));
        let state = std::sync::Mutex::new(State::default());
        let _locked = Locked::new(state.lock().unwrap());
        blobs.contains(&Digest::of(b"x"));
    }

    #[test]
    fn a_blob_call_without_the_lock_goes_through() {
        let blobs = checked_blobs(Arc::new(MemoryBlobStore::default()));
        let state = std::sync::Mutex::new(State::default());
        drop(Locked::new(state.lock().unwrap()));
        assert!(!lock_held());
        assert!(!blobs.contains(&Digest::of(b"x")));
    }
}
