//! Units of work and group commit.
//!
//! Every change follows one sequence: compute the new records on copies
//! under the state lock, hand them to the committer ([`Farm::commit`]) and
//! install them in memory, still under the lock, so that the order of
//! commits is the order of changes; then drop the lock and wait for the
//! [`Ticket`]. One committer thread takes every change queued while the
//! previous write ran, makes the blobs its records name durable where they
//! are not yet ([`BlobStore::make_named_durable`]; every waiting blob when
//! a job record names a file set), and writes the changes as one store
//! transaction with one flush (and `fsync`). A caller is answered only once
//! the write holding its change is on disk, so "acknowledged means stored"
//! holds while hundreds of changes share one flush.
//!
//! Results' blobs, the bulk of the blob syncs, are made durable earlier, in
//! groups of their own ([`ResultSync`]), before their Complete computes its
//! change: a lease queued beside a result then waits for the metadata flush
//! only, never for a results' sync under way.
//!
//! Memory may run ahead of the disk by the changes in flight; readers may see
//! them, none is acknowledged before it is stored. When a write fails, the
//! committer fails it and every change queued behind it (they were computed
//! on top of it), and rebuilds the state from the store before any caller
//! hears of the failure: memory again equals what is stored.

use std::sync::mpsc::{Receiver, Sender};
use std::sync::Condvar;

use super::*;
use crate::store::{ArchivedJob, Record};

/// A record to write, owned so that it can wait in the commit queue.
#[derive(Debug, Clone)]
pub(super) enum Owned {
    // Boxed: a job record is several times larger than the others.
    Job(Box<Job>),
    Task(Task),
    Worker(WorkerRecord),
    User(UserRecord),
    RemoveUser(String),
    Grant(String, Digest),
    Archive(Box<ArchivedJob>),
    Delete(JobId),
    Stitched(JobId, FrameOutput),
}

impl Owned {
    fn record(&self) -> Record<'_> {
        match self {
            Owned::Job(j) => Record::Job(j),
            Owned::Task(t) => Record::Task(t),
            Owned::Worker(w) => Record::Worker(w),
            Owned::User(u) => Record::User(u),
            Owned::RemoveUser(n) => Record::RemoveUser(n),
            Owned::Grant(u, d) => Record::Grant(u, *d),
            Owned::Archive(a) => Record::Archive(a),
            Owned::Delete(id) => Record::Delete(*id),
            Owned::Stitched(id, o) => Record::Stitched(*id, o),
        }
    }
}

/// A change waiting in the commit queue.
pub(super) struct Entry {
    records: Vec<Owned>,
    done: Arc<Slot>,
}

#[derive(Default)]
struct Slot {
    result: Mutex<Option<Result<(), Error>>>,
    ready: Condvar,
    notify: Notify,
}

impl Slot {
    fn finish(&self, r: Result<(), Error>) {
        *self.result.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
        self.ready.notify_all();
        self.notify.notify_one();
    }

    fn take(&self) -> Option<Result<(), Error>> {
        self.result.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// An error of the kind of `err` (which callers decide on: try again,
/// move to another coordinator), for a change of the failed batch or, when
/// `behind`, for one queued behind it. A store's failure keeps its backend
/// and fix.
fn like(err: &Error, behind: bool) -> Error {
    let words = |m: &str| {
        if behind {
            format!("an earlier change could not be stored ({m}); try again")
        } else {
            m.to_string()
        }
    };
    match err {
        Error::StoreUnavailable(m) => Error::StoreUnavailable(words(m)),
        Error::NotActive(m) => Error::NotActive(words(m)),
        Error::NoSpace(m) => Error::NoSpace(words(m)),
        Error::Store(f) if behind => Error::Store(f.reword(format!(
            "an earlier change could not be stored ({})",
            f.what
        ))),
        Error::Store(f) => Error::Store(f.clone()),
        other => Error::Internal(words(&other.to_string())),
    }
}

/// A promise that a change will be stored: wait for it before telling
/// anyone the change happened.
#[must_use = "a change is acknowledged only after its ticket says it is stored"]
pub struct Ticket(Option<Arc<Slot>>);

impl Ticket {
    /// A ticket for a change that wrote nothing.
    pub(super) fn none() -> Self {
        Ticket(None)
    }

    /// Blocks until the change is stored (or failed to be).
    pub fn wait(self) -> Result<(), Error> {
        let Some(slot) = self.0 else { return Ok(()) };
        let mut r = slot.result.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(r) = r.take() {
                return r;
            }
            r = slot.ready.wait(r).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Waits without blocking the async runtime.
    pub async fn stored(self) -> Result<(), Error> {
        let Some(slot) = self.0 else { return Ok(()) };
        loop {
            let notified = slot.notify.notified();
            if let Some(r) = slot.take() {
                return r;
            }
            notified.await;
        }
    }
}

/// A result file's bytes carried inside its Complete instead of uploaded
/// first, with what its output claims of them.
#[derive(Debug)]
pub struct Carried {
    /// What error messages call it: `frame 7`, or `frame 7 (pass X)`.
    pub what: String,
    /// The digest the output claims.
    pub digest: Digest,
    pub bytes: Vec<u8>,
}

impl Carried {
    /// The digests of `carried`: files whose bytes prove their sender holds
    /// them.
    pub fn digests(carried: &[Carried]) -> Vec<Digest> {
        carried.iter().map(|c| c.digest).collect()
    }

    /// Whether the bytes are the ones the output claims.
    pub fn verify(&self) -> Result<(), Error> {
        let got = Digest::of(&self.bytes);
        if got == self.digest {
            Ok(())
        } else {
            Err(Error::invalid(format!(
                "{}: the bytes sent inline hash to {got}, not to the claimed digest {}; report the blake3 digest of the bytes sent",
                self.what, self.digest
            )))
        }
    }
}

/// Checks every carried file against its digest, then stores them all;
/// nothing is stored when any is refused.
pub(super) fn store_carried(blobs: &dyn BlobStore, carried: &[Carried]) -> Result<(), Error> {
    for c in carried {
        c.verify()?;
    }
    for c in carried {
        blobs.put(c.digest, &c.bytes)?;
        tracing::debug!(digest = %c.digest, size = c.bytes.len(), "{} stored inline", c.what);
    }
    Ok(())
}

/// A result's request to the sync thread: its carried files to store
/// first, and where to answer.
struct SyncRequest {
    carried: Vec<Carried>,
    done: Arc<Slot>,
}

/// Makes results' blobs durable before their change is queued, in groups:
/// one thread takes every request queued while the previous sync ran,
/// stores the files each carries (checked against their digests), and
/// answers them all with one [`BlobStore::make_durable`]. A Complete waits
/// here and only then computes its change, so the group commit that stores
/// its records finds no blob left to sync, and the leases sharing that
/// commit wait for the metadata flush alone, not for the results'
/// syncs. The commit still syncs any blob a change names (a scene, a
/// stitched frame) that is not yet durable. Storing carried files here
/// rather than on a thread of their own saves a Complete one hand-off
/// between threads (two context switches) per result.
/// A store whose writes are durable when answered (S3) needs no thread.
pub(super) struct ResultSync(Option<Sender<SyncRequest>>);

impl ResultSync {
    /// Starts the sync thread when `blobs` defers durability; it ends when
    /// the farm is dropped.
    pub(super) fn start(blobs: Arc<dyn BlobStore>, stats: Arc<Mutex<Stats>>) -> Self {
        if !blobs.defers_durability() {
            return Self(None);
        }
        let (tx, rx) = std::sync::mpsc::channel::<SyncRequest>();
        std::thread::Builder::new()
            .name("tessera-blob-sync".into())
            .spawn(move || {
                // A tidy-up that failed waits for the next group.
                let mut tidy_failed = false;
                loop {
                    // Idle with links of the last sync not yet covered by
                    // one, a sync of nothing new covers them and tidies up
                    // (see `FsBlobStore::linked`); under load the next
                    // group's sync does it anyway. The group commit links
                    // blobs too (a scene, a stitched frame), so an idle
                    // thread also looks again every half second.
                    let wait = if blobs.settling() {
                        SETTLE_AFTER
                    } else {
                        SETTLE_AFTER * 10
                    };
                    let first = match rx.recv_timeout(wait) {
                        Ok(r) => r,
                        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                            if blobs.settling() && !tidy_failed {
                                if let Err(e) = blobs.make_durable() {
                                    tracing::warn!("cannot tidy the blob store: {e}");
                                    tidy_failed = true;
                                }
                            }
                            continue;
                        }
                        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                    };
                    tidy_failed = false;
                    let mut group = vec![first];
                    group.extend(rx.try_iter());
                    let started = std::time::Instant::now();
                    // Each request's own files first: one refused, or one
                    // that cannot be written, fails that request alone.
                    let stored: Vec<Result<(), Error>> = group
                        .iter()
                        .map(|r| store_carried(&*blobs, &r.carried))
                        .collect();
                    let result = blobs.make_durable();
                    stats
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .result_sync_took(group.len(), started.elapsed().as_secs_f64());
                    for (r, own) in group.into_iter().zip(stored) {
                        r.done.finish(
                            own.and_then(|()| result.as_ref().map_err(|e| like(e, false)).copied()),
                        );
                    }
                }
            })
            .expect("the blob sync thread starts");
        Self(Some(tx))
    }

    /// A ticket that says stored once `carried` is stored and every blob
    /// written before the call is durable; `Err(carried)` when the store
    /// needs no sync thread, to be stored by the caller.
    pub(super) fn request(&self, carried: Vec<Carried>) -> Result<Ticket, Vec<Carried>> {
        let Some(tx) = &self.0 else {
            return Err(carried);
        };
        let done = Arc::new(Slot::default());
        if tx
            .send(SyncRequest {
                carried,
                done: done.clone(),
            })
            .is_err()
        {
            done.finish(Err(shutting_down()));
        }
        Ok(Ticket(Some(done)))
    }
}

/// How long the results' sync thread waits idle before it tidies after
/// its last group (see [`ResultSync`]).
const SETTLE_AFTER: std::time::Duration = std::time::Duration::from_millis(50);

/// Why a change was not stored: the farm's threads are gone.
fn shutting_down() -> Error {
    Error::Unavailable(
        "the coordinator is shutting down, so nothing was stored; try again once it is back or on another coordinator".into(),
    )
}

/// What the committer needs to rebuild the state after a failed write.
pub(super) struct Committer {
    /// Weak: the state holds the queue's sender, and the thread ends when
    /// the farm (the state's owner) is dropped.
    pub(super) state: std::sync::Weak<Mutex<State>>,
    pub(super) store: Arc<dyn MetaStore>,
    pub(super) blobs: Arc<dyn BlobStore>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) lease_ttl_ms: u64,
    pub(super) stats: Arc<Mutex<Stats>>,
}

/// The most changes written in one transaction.
const MAX_BATCH: usize = 4096;

impl Committer {
    /// Starts the committer thread; it ends when every sender is gone.
    pub(super) fn start(self) -> Sender<Entry> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("tessera-commit".into())
            .spawn(move || self.run(rx))
            .expect("the commit thread starts");
        tx
    }

    fn run(self, rx: Receiver<Entry>) {
        while let Ok(first) = rx.recv() {
            // Changes are queued under the farm's lock: once it is free,
            // every change computed in the same take of it is queued too (a
            // result and the lease asked for with it), and shares this
            // commit instead of waiting for the next.
            if let Some(state) = self.state.upgrade() {
                drop(state.lock().unwrap_or_else(|e| e.into_inner()));
            }
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(e) => batch.push(e),
                    Err(_) => break,
                }
            }
            let records: Vec<Record<'_>> = batch
                .iter()
                .flat_map(|e| e.records.iter().map(Owned::record))
                .collect();
            let started = std::time::Instant::now();
            // A batch of barriers only (see `rebuild_after_panic`) writes nothing.
            // Blobs first: a stored record never names a blob a crash can
            // lose, and every upload so far shares this batch's sync.
            let result = if records.is_empty() {
                Ok(())
            } else {
                match named_blobs(&records) {
                    Some(named) => self.blobs.make_named_durable(&named),
                    None => self.blobs.make_durable(),
                }
                .and_then(|()| self.store.write(&records))
            };
            let took = started.elapsed().as_secs_f64();
            drop(records);
            {
                let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
                stats.commit_took(took);
                stats.committed_changes += batch.len() as u64;
            }
            match result {
                Ok(()) => {
                    for e in batch {
                        e.done.finish(Ok(()));
                    }
                }
                Err(err) => {
                    let msg = err.to_string();
                    tracing::error!("a write failed; rebuilding the state from the store: {msg}");
                    let state = self.state.upgrade();
                    let mut st = state
                        .as_ref()
                        .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()));
                    // Everything queued behind the failed write was computed
                    // on top of it: it fails too.
                    let mut behind = Vec::new();
                    while let Ok(e) = rx.try_recv() {
                        behind.push(e);
                    }
                    if let Some(st) = st.as_mut() {
                        self.rebuild(st);
                    }
                    drop(st);
                    for e in batch {
                        e.done.finish(Err(like(&err, false)));
                    }
                    for e in behind {
                        e.done.finish(Err(like(&err, true)));
                    }
                }
            }
        }
    }

    fn rebuild(&self, st: &mut State) {
        rebuild(
            &*self.store,
            &*self.blobs,
            self.clock.now_ms(),
            self.lease_ttl_ms,
            st,
        );
    }
}

/// The blobs `records` name directly, which must be durable before they
/// are written; `None` when one names blobs through something else (a
/// job's scene and file set, whose list is a blob itself, or an archive's
/// summary): then every waiting blob is made durable. A job record is
/// rewritten by more than its submit (its first lease, a carving lease of a
/// job sized by the farm, a stitched frame), so such a batch still waits
/// for a results' sync under way; telling a rewrite that names no new blob
/// from a submit would need the farm to mark it.
fn named_blobs(records: &[Record<'_>]) -> Option<Vec<Digest>> {
    let mut named = Vec::new();
    for r in records {
        match r {
            Record::Task(t) => {
                if let TaskState::Done { outputs } = &t.state {
                    named.extend(outputs.iter().map(|o| o.digest));
                }
                for c in t.verify.iter().flat_map(|v| &v.candidates) {
                    named.extend(c.outputs.iter().map(|o| o.digest));
                }
            }
            Record::Stitched(_, o) => named.push(o.digest),
            Record::Grant(_, d) => named.push(*d),
            Record::Worker(_) | Record::User(_) | Record::RemoveUser(_) | Record::Delete(_) => {}
            Record::Job(_) | Record::Archive(_) => return None,
        }
    }
    Some(named)
}

/// Makes memory equal the store again, keeping what is not stored
/// (health, the event channel, parked lease calls, which are woken).
fn rebuild(
    store: &dyn MetaStore,
    blobs: &dyn BlobStore,
    now: u64,
    lease_ttl_ms: u64,
    st: &mut State,
) {
    // The file sets memory knows are not read again: a rebuild reads the
    // store, and blobs only for file sets it has not seen.
    let known = st.file_sets.clone();
    match State::recover(store, blobs, now, lease_ttl_ms, known) {
        Ok(mut fresh) => {
            fresh.health = std::mem::take(&mut st.health);
            fresh.events = st.events.take();
            fresh.commits = st.commits.take();
            fresh.blobs.keep_touched(&mut st.blobs);
            fresh.next_job = fresh.next_job.max(st.next_job);
            fresh.schedule.keep_waiters(&mut st.schedule);
            *st = fresh;
            st.schedule.wake_all();
        }
        Err(e) => {
            tracing::error!(
                "cannot read the store back to rebuild the state ({e}); stop the coordinator and check its --data volume"
            );
        }
    }
}

/// How long a rebuild after a panic waits for the writes queued before it.
const DRAIN_BEFORE_REBUILD: std::time::Duration = std::time::Duration::from_secs(10);

impl Farm {
    /// Makes `st`, which a panic left half-changed (a poisoned lock), equal
    /// the store again: reference counts, indexes and queues computed on a
    /// change that never finished must not let the collector free a live
    /// blob. Waits first for the changes already queued to be written, so
    /// the store read back holds them.
    pub(super) fn rebuild_after_panic(&self, st: &mut State) {
        tracing::error!(
            "a panic interrupted a change to the farm's state; rebuilding it from the store"
        );
        let done = Arc::new(Slot::default());
        let barrier = Entry {
            records: Vec::new(),
            done: done.clone(),
        };
        if let Some(tx) = &st.commits {
            if tx.send(barrier).is_ok() {
                // Bounded: the committer takes this lock when a write fails.
                let r = done.result.lock().unwrap_or_else(|e| e.into_inner());
                let (r, timeout) = done
                    .ready
                    .wait_timeout_while(r, DRAIN_BEFORE_REBUILD, |r| r.is_none())
                    .unwrap_or_else(|e| e.into_inner());
                if timeout.timed_out() {
                    tracing::warn!("the writes queued before the panic are not stored yet; rebuilding without them");
                }
                drop(r);
            }
        }
        rebuild(
            &*self.store,
            &*self.blobs,
            self.clock.now_ms(),
            self.config.lease_ttl_ms,
            st,
        );
    }

    /// Queues `records` for the store; call with the state lock held, then
    /// install the change, drop the lock and wait for the ticket.
    pub(super) fn commit(&self, st: &State, records: Vec<Owned>) -> Ticket {
        if records.is_empty() {
            return Ticket::none();
        }
        let done = Arc::new(Slot::default());
        let entry = Entry {
            records,
            done: done.clone(),
        };
        match &st.commits {
            Some(tx) if tx.send(entry).is_ok() => Ticket(Some(done)),
            _ => {
                done.finish(Err(shutting_down()));
                Ticket(Some(done))
            }
        }
    }

    /// The unit of work: writes `job` (when it changed) and `changed` tasks
    /// (and `extra` records), installs them, and returns the ticket to wait
    /// on once the lock is dropped.
    pub(super) fn save(
        &self,
        st: &mut State,
        job: Job,
        mut changed: Vec<Task>,
        extra: Vec<Owned>,
    ) -> Ticket {
        let now = self.clock.now_ms();
        self.account(st, &mut changed, now);
        let mut records: Vec<Owned> = changed.iter().cloned().map(Owned::Task).collect();
        records.extend(extra);
        if st.jobs.get(&job.id) != Some(&job) {
            records.push(Owned::Job(Box::new(job.clone())));
        }
        let ticket = self.commit(st, records);
        st.install(job, changed, now);
        ticket
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blobs::FsBlobStore;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_result_sync_puts_every_waiting_blob_in_place_before_it_answers() {
        let dir = tempfile::tempdir().unwrap();
        let fs = Arc::new(FsBlobStore::open(dir.path(), 1 << 20).unwrap());
        let blobs: Arc<dyn BlobStore> = fs.clone();
        let stats = Arc::new(Mutex::new(Stats::default()));
        let sync = Arc::new(ResultSync::start(blobs.clone(), stats.clone()));
        let waiting = || std::fs::read_dir(dir.path().join("tmp")).unwrap().count();
        let mut digests = Vec::new();
        for i in 0..20u8 {
            let bytes = vec![i; 100 + usize::from(i)];
            let d = Digest::of(&bytes);
            blobs.put(d, &bytes).unwrap();
            digests.push((d, bytes));
        }
        assert_eq!(waiting(), 20, "an upload waits under tmp/ for a sync");
        // Results reported at once share syncs; each answer comes only
        // once every blob stored before its call is in place.
        let calls: Vec<_> = (0..8)
            .map(|_| {
                let sync = sync.clone();
                tokio::spawn(async move { sync.request(Vec::new()).unwrap().stored().await })
            })
            .collect();
        for c in calls {
            c.await.unwrap().unwrap();
        }
        assert!(
            digests.iter().all(|(d, _)| fs.path(d).is_file()),
            "every waiting blob was linked into place"
        );
        // Idle, the thread syncs the links and lets their names under tmp/ go.
        let by = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while waiting() > 0 && std::time::Instant::now() < by {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(waiting(), 0, "tmp/ is tidied once the thread is idle");
        assert!(!blobs.settling());
        let counted = stats.lock().unwrap().clone();
        assert_eq!(counted.result_sync_results, 8, "each result counted once");
        let groups = counted.result_sync_latency.count();
        assert!(
            (1..=8).contains(&groups),
            "each group timed once: {groups} groups for 8 results"
        );
        for (d, bytes) in &digests {
            let placed = fs.path(d);
            assert!(placed.is_file(), "{} is not in place", placed.display());
            assert_eq!(&blobs.read(d).unwrap(), bytes);
        }
        // Nothing waiting: answered at once, nothing to do.
        sync.request(Vec::new()).unwrap().stored().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_result_sync_stores_carried_files_and_refuses_a_wrong_digest_alone() {
        let dir = tempfile::tempdir().unwrap();
        let fs = Arc::new(FsBlobStore::open(dir.path(), 1 << 20).unwrap());
        let blobs: Arc<dyn BlobStore> = fs.clone();
        let sync = ResultSync::start(blobs.clone(), Arc::default());
        let carried = |what: &str, bytes: Vec<u8>, claimed: Digest| Carried {
            what: what.into(),
            digest: claimed,
            bytes,
        };
        let good = b"frame 1 pixels".to_vec();
        let good_digest = Digest::of(&good);
        let other = b"frame 2 pixels".to_vec();
        let other_digest = Digest::of(&other);
        let lie = b"not frame 3".to_vec();
        let lie_claim = Digest::of(b"frame 3 pixels");
        // Both queued before either is answered, so they may share a group.
        let ok = sync
            .request(vec![carried("frame 1", good.clone(), good_digest)])
            .unwrap();
        let bad = sync
            .request(vec![
                carried("frame 2", other.clone(), other_digest),
                carried("frame 3", lie, lie_claim),
            ])
            .unwrap();
        ok.stored().await.unwrap();
        let err = bad.stored().await.unwrap_err().to_string();
        assert!(err.contains("frame 3"), "{err}");
        assert!(err.contains("claimed digest"), "{err}");
        assert!(
            fs.path(&good_digest).is_file(),
            "the good result's file is in place"
        );
        assert_eq!(blobs.read(&good_digest).unwrap(), good);
        assert!(
            blobs.read(&other_digest).is_err() && blobs.read(&lie_claim).is_err(),
            "nothing of a refused result is stored"
        );
    }

    #[tokio::test]
    async fn a_store_durable_on_write_needs_no_result_sync() {
        let sync = ResultSync::start(
            Arc::new(crate::blobs::MemoryBlobStore::default()),
            Arc::default(),
        );
        assert!(
            sync.0.is_none(),
            "no thread for a store with nothing to sync"
        );
        assert!(
            sync.request(Vec::new()).is_err(),
            "the caller stores what it carries"
        );
    }
}
