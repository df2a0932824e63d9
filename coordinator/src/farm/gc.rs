//! Blob collection: a blob no record references is deleted once nobody has
//! touched it for a grace period (see [`crate::farm::refs`]).

use std::collections::{HashSet, VecDeque};

use tokio::sync::watch;

use super::refs::BlobRefs;

use super::*;

/// Most blobs deleted in one pass.
const MAX_DELETES_PER_PASS: usize = 2000;

/// Blobs with the time each was last marked, in the order they were: the
/// oldest are found without a scan, so a pass costs what it removes.
#[derive(Debug, Default)]
struct Timed {
    at: HashMap<Digest, u64>,
    /// (time, blob) as marked; an entry whose time no longer matches `at`
    /// was marked again or removed, and is skipped.
    order: VecDeque<(u64, Digest)>,
}

impl Timed {
    /// Marks `d` at `t` (again, if it was).
    fn insert(&mut self, d: Digest, t: u64) {
        self.at.insert(d, t);
        self.order.push_back((t, d));
    }

    /// Marks `d` at `t` unless it is marked already.
    fn insert_new(&mut self, d: Digest, t: u64) {
        if !self.at.contains_key(&d) {
            self.insert(d, t);
        }
    }

    /// Unmarks `d`.
    fn remove(&mut self, d: &Digest) {
        self.at.remove(d);
    }

    /// Whether `d` is marked.
    fn contains(&self, d: &Digest) -> bool {
        self.at.contains_key(d)
    }

    /// Unmarks and returns the oldest blob marked at or before `t`.
    fn pop_due(&mut self, t: u64) -> Option<Digest> {
        while let Some(&(at, d)) = self.order.front() {
            if at > t {
                return None;
            }
            self.order.pop_front();
            if self.at.get(&d) == Some(&at) {
                self.at.remove(&d);
                self.shrink();
                return Some(d);
            }
        }
        self.shrink();
        None
    }

    /// Gives back the room of a large batch once it is mostly gone (the
    /// entries of a deleted job's million-file set pass through here).
    fn shrink(&mut self) {
        if self.at.capacity() > 4096 && self.at.len() < self.at.capacity() / 4 {
            self.at.shrink_to_fit();
        }
        if self.order.capacity() > 4096 && self.order.len() < self.order.capacity() / 4 {
            self.order.shrink_to_fit();
        }
    }

    /// Forgets marks older than `t`.
    fn expire(&mut self, t: u64) {
        while self.pop_due(t).is_some() {}
    }
}

/// The farm's account of its blobs: how many records reference each, which
/// no record references any more (and since when), when a client or worker
/// last touched one, and which a collection pass is deleting now. Changed
/// only through these methods, under the farm's lock.
#[derive(Debug, Default)]
pub(super) struct BlobLedger {
    /// How many records reference each blob (derived from the records).
    refs: BlobRefs,
    /// Blobs that no record references any more, and since when (ms).
    garbage: Timed,
    /// When a client or worker last uploaded or asked about a blob (ms).
    touched: Timed,
    /// Blobs a pass chose and is deleting, off the lock: nobody may upload,
    /// find or reference them until the pass is over.
    collecting: HashSet<Digest>,
}

impl BlobLedger {
    /// A record now references `d`.
    pub(super) fn add(&mut self, d: Digest) {
        self.refs.add(d);
        self.garbage.remove(&d);
    }

    /// A record no longer references `d`; unreferenced, it becomes garbage.
    pub(super) fn release(&mut self, d: Digest, now: u64) {
        if self.refs.release(&d) {
            self.garbage.insert(d, now);
        }
    }

    /// A blob was stored that no record references (a stitched frame or a
    /// preview nobody wants any more): garbage unless a record names it.
    pub(super) fn note_unreferenced(&mut self, d: Digest, now: u64) {
        if self.refs.count(&d) == 0 {
            self.garbage.insert_new(d, now);
        }
    }

    /// How many records reference `d`.
    #[cfg(test)]
    pub(super) fn count(&self, d: &Digest) -> u32 {
        self.refs.count(d)
    }

    /// Whether `d` waits to be collected.
    #[cfg(test)]
    pub(super) fn is_garbage(&self, d: &Digest) -> bool {
        self.garbage.contains(d)
    }

    /// Whether a pass is deleting `d` now.
    pub(super) fn is_collecting(&self, d: &Digest) -> bool {
        self.collecting.contains(d)
    }

    /// Whether a pass is deleting one of `digests` now: no lookups when no
    /// pass is deleting anything, as nearly always.
    fn is_collecting_any(&self, digests: &[Digest]) -> bool {
        !self.collecting.is_empty() && digests.iter().any(|d| self.collecting.contains(d))
    }

    /// Keeps the touches of `old` (memory rebuilt from the store does not
    /// know them).
    pub(super) fn keep_touched(&mut self, old: &mut BlobLedger) {
        self.touched = std::mem::take(&mut old.touched);
    }

    /// Chooses up to `max` blobs to delete: unreferenced since `cutoff` and
    /// untouched since then. They are marked as being collected until
    /// [`BlobLedger::collected`].
    fn choose(&mut self, cutoff: u64, now: u64, max: usize) -> Vec<Digest> {
        self.touched.expire(cutoff);
        let mut victims = Vec::new();
        let mut later = Vec::new();
        while victims.len() < max {
            let Some(d) = self.garbage.pop_due(cutoff) else {
                break;
            };
            if self.refs.count(&d) > 0 {
                continue;
            }
            if self.touched.contains(&d) {
                // Touched within the grace period: look again later.
                later.push(d);
                continue;
            }
            victims.push(d);
        }
        for d in later {
            self.garbage.insert(d, now);
        }
        self.collecting.extend(victims.iter().copied());
        victims
    }

    /// Ends a pass: `left` were not deleted and wait for the next one.
    fn collected(&mut self, victims: &[Digest], left: &[Digest], now: u64) {
        for d in victims {
            self.collecting.remove(d);
        }
        for d in left {
            self.garbage.insert(*d, now);
        }
    }
}

/// Collection passes, seen from outside the lock: an epoch that moves (under
/// the farm's lock) when a pass marks its victims and again when it ends.
///
/// One `watch` channel on the epoch serves every waiter. An async waiter
/// (uploads, blob questions) awaits a change; a blocking one (stitching,
/// previews) drives that same future on its own thread, parked between
/// wake-ups ([`block_on`]). The channel keeps the epoch itself, not a
/// wake-up: a waiter that read the epoch before a pass ended and subscribes
/// after sees the change at once, so no wake-up is lost and there is no
/// second mechanism to keep in step.
#[derive(Debug)]
pub(super) struct Passes {
    epoch: watch::Sender<u64>,
}

impl Default for Passes {
    fn default() -> Self {
        Self {
            epoch: watch::Sender::new(0),
        }
    }
}

impl Passes {
    /// The current epoch: unchanged between two reads means no pass
    /// started or ended in between.
    pub(super) fn epoch(&self) -> u64 {
        *self.epoch.borrow()
    }

    /// Moves the epoch and wakes its waiters; called under the farm's lock.
    fn bump(&self) {
        self.epoch.send_modify(|e| *e += 1);
    }

    /// Waits until the epoch is no longer `seen`.
    async fn moved_from(&self, seen: u64) {
        let mut rx = self.epoch.subscribe();
        // `self` holds the sender, so the channel cannot close meanwhile.
        let _ = rx.wait_for(|e| *e != seen).await;
    }

    /// [`Passes::moved_from`] for a thread that may block. Unconstrained by
    /// tokio's task budget: on a runtime's thread a spent budget would make
    /// the wait answer "not yet" at once, again and again, in [`block_on`]'s
    /// loop.
    fn moved_from_blocking(&self, seen: u64) {
        block_on(tokio::task::unconstrained(self.moved_from(seen)));
    }

    /// How many calls wait for the epoch to move now.
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.epoch.receiver_count()
    }
}

/// Runs `f` to completion on this thread, parked while it is pending and
/// unparked by its waker (the executor of `std::task::Wake`'s documentation):
/// a blocking caller waits on the same channel as the async ones.
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Arc::new(Unpark(std::thread::current())).into();
    let mut cx = std::task::Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let std::task::Poll::Ready(out) = f.as_mut().poll(&mut cx) {
            return out;
        }
        // A wake-up before this park leaves a token: it returns at once.
        std::thread::park();
    }
}

impl Farm {
    /// Notes that a client or worker uploaded or asked about these blobs: the
    /// collector leaves them alone for a grace period, since a result naming
    /// them may be on its way. When a collection pass is deleting one of
    /// them, waits for it to end first, so that the blob is asked about,
    /// uploaded or named only once it is surely gone or surely kept. Nothing
    /// waits, nor is set up to, unless a pass is deleting one of them.
    pub async fn touch_blobs(&self, digests: &[Digest]) {
        while let Err(seen) = self.try_touch(digests) {
            self.passes.moved_from(seen).await;
        }
    }

    /// [`Farm::touch_blobs`] for a thread that may block.
    pub fn touch_blobs_blocking(&self, digests: &[Digest]) {
        while let Err(seen) = self.try_touch(digests) {
            self.passes.moved_from_blocking(seen);
        }
    }

    /// Touches `digests` unless a pass is deleting one of them; then
    /// returns the epoch read under the lock, which moves when that pass
    /// ends.
    fn try_touch(&self, digests: &[Digest]) -> Result<(), u64> {
        let now = self.clock.now_ms();
        let mut st = self.lock();
        if st.blobs.is_collecting_any(digests) {
            return Err(self.passes.epoch());
        }
        for d in digests {
            st.blobs.touched.insert(*d, now);
        }
        Ok(())
    }

    /// How long an unreferenced, untouched blob is kept.
    fn grace_ms(&self) -> u64 {
        self.config.blob_grace_ms
    }

    /// Deletes blobs that no record references, once nobody has touched them
    /// for the grace period; returns how many were deleted. The victims are
    /// chosen and marked under the lock and deleted after it is released (in
    /// batches, on S3); while marked, nobody may upload, find or reference
    /// them ([`Farm::touch_blobs`] waits, a result naming one is refused).
    pub fn collect_garbage(&self) -> usize {
        // Nothing is deleted while the blob store does not answer.
        if self.blobs_health().is_some_and(|h| !h.up()) {
            return 0;
        }
        let now = self.clock.now_ms();
        let cutoff = now.saturating_sub(self.grace_ms());
        let victims = {
            let mut st = self.lock();
            let victims = st.blobs.choose(cutoff, now, MAX_DELETES_PER_PASS);
            if !victims.is_empty() {
                self.passes.bump();
            }
            victims
        };
        if victims.is_empty() {
            return 0;
        }
        let left = match self.blobs.remove_many(&victims) {
            Ok(()) => Vec::new(),
            Err(failed) => {
                // The next pass tries again.
                tracing::warn!(
                    "cannot remove {} of {} unreferenced blobs: {}",
                    failed.left.len(),
                    victims.len(),
                    failed.error
                );
                failed.left
            }
        };
        {
            let mut st = self.lock();
            st.blobs.collected(&victims, &left, now);
            self.passes.bump();
        }
        let deleted = victims.len() - left.len();
        if deleted > 0 {
            tracing::debug!(deleted, "unreferenced blobs collected");
        }
        if deleted >= MAX_DELETES_PER_PASS / 2 {
            // A large batch (a deleted job's file set) freed its marks.
            return_freed_memory();
        }
        deleted
    }
}

/// Hands memory freed by a large removal back to the system: glibc keeps
/// freed heap pages for reuse, so deleting jobs with million-entry file
/// sets would otherwise leave the process as large as at its peak.
pub(super) fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    // SAFETY: malloc_trim takes no pointers and only releases free memory.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blobs::{BlobWriter, MemoryBlobStore, RemoveFailed};
    use crate::clock::ManualClock;
    use crate::store::MemoryStore;
    use std::sync::mpsc;

    use super::super::tests::until;

    /// Blobs in memory whose deletions wait until the test lets them go on.
    struct HeldBlobs {
        inner: MemoryBlobStore,
        started: Mutex<mpsc::Sender<()>>,
        go_on: Mutex<mpsc::Receiver<()>>,
    }

    impl BlobStore for HeldBlobs {
        fn contains(&self, d: &Digest) -> bool {
            self.inner.contains(d)
        }
        fn size(&self, d: &Digest) -> Option<u64> {
            self.inner.size(d)
        }
        fn writer(&self, d: Digest, size: u64) -> Result<Box<dyn BlobWriter>, Error> {
            self.inner.writer(d, size)
        }
        fn read(&self, d: &Digest) -> Result<Vec<u8>, Error> {
            self.inner.read(d)
        }
        fn read_range(&self, d: &Digest, offset: u64, len: usize) -> Result<Vec<u8>, Error> {
            self.inner.read_range(d, offset, len)
        }
        fn remove(&self, d: &Digest) -> Result<(), Error> {
            self.inner.remove(d)
        }
        fn remove_many(&self, digests: &[Digest]) -> Result<(), RemoveFailed> {
            self.started.lock().unwrap().send(()).unwrap();
            self.go_on.lock().unwrap().recv().unwrap();
            self.inner.remove_many(digests)
        }
    }

    /// The pass is held open while it deletes (by [`HeldBlobs`]), so the
    /// touches below are surely made while it runs; [`Passes::waiting`]
    /// shows them waiting.
    #[tokio::test]
    async fn blobs_are_deleted_off_the_lock_and_nobody_uses_one_while_it_goes() {
        let (started_tx, started) = mpsc::channel();
        let (go_on, go_on_rx) = mpsc::channel();
        let blobs = Arc::new(HeldBlobs {
            inner: MemoryBlobStore::default(),
            started: Mutex::new(started_tx),
            go_on: Mutex::new(go_on_rx),
        });
        let scene_bytes = b"BLENDER-v304 scene ... ENDB\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0";
        let scene = Digest::of(scene_bytes);
        blobs.put(scene, scene_bytes).unwrap();
        let clock = Arc::new(ManualClock::at(1_000_000));
        let farm = Arc::new(
            Farm::open(
                Arc::new(MemoryStore::default()),
                blobs.clone(),
                clock.clone(),
                super::super::tests::config(),
            )
            .unwrap(),
        );
        farm.submit(super::super::tests::sub(scene, "1", 1))
            .unwrap();
        let w = super::super::tests::worker(&farm, "a");
        let a = farm.try_lease(&w, &HashSet::new()).unwrap().unwrap();
        // The frame's bytes are garbage of an earlier job, untouched for
        // longer than the grace period.
        let bytes = b"png 1";
        let frame = Digest::of(bytes);
        blobs.put(frame, bytes).unwrap();
        let out = FrameOutput {
            frame: 1,
            digest: frame,
            ext: "png".into(),
            size: bytes.len() as u64,
            pass: String::new(),
        };
        farm.lock().blobs.note_unreferenced(frame, clock.now_ms());
        clock.advance(farm.config().blob_grace_ms + 1);
        let pass = std::thread::spawn({
            let farm = farm.clone();
            move || farm.collect_garbage()
        });
        started.recv().unwrap();
        // The pass is deleting: the lock is free, and the blob is out of use.
        assert!(farm.lock().blobs.is_collecting(&frame));
        let refused = farm.complete(a.lease, vec![out.clone()]).unwrap_err();
        assert!(
            matches!(&refused, Error::NotFound(m) if m.contains("upload it again")),
            "a result naming a blob being collected is refused: {refused}"
        );
        // An upload of the same bytes, and a stitched frame that happens to
        // be them, wait for the pass to end.
        let upload = tokio::spawn({
            let (farm, blobs) = (farm.clone(), blobs.clone());
            async move {
                farm.touch_blobs(&[frame]).await;
                blobs.contains(&frame)
            }
        });
        let stitched = std::thread::spawn({
            let (farm, blobs) = (farm.clone(), blobs.clone());
            move || {
                farm.touch_blobs_blocking(&[frame]);
                blobs.contains(&frame)
            }
        });
        until(
            "the upload and the stitched frame to wait for the pass",
            || farm.passes.waiting() == 2,
        )
        .await;
        assert!(!upload.is_finished() && !stitched.is_finished());
        assert!(
            !farm.lock().blobs.touched.contains(&frame),
            "nothing touched the blob while it went"
        );
        go_on.send(()).unwrap();
        assert_eq!(pass.join().unwrap(), 1);
        assert!(
            !upload.await.unwrap(),
            "the upload went on only once the old bytes were gone"
        );
        assert!(
            !stitched.join().unwrap(),
            "the stitched frame went on only once the old bytes were gone"
        );
        assert!(farm.lock().blobs.touched.contains(&frame));
        assert_eq!(farm.passes.waiting(), 0);
        assert!(!farm.lock().blobs.is_collecting(&frame));
        // Uploaded again, the result is taken.
        blobs.put(frame, bytes).unwrap();
        farm.complete(a.lease, vec![out]).unwrap();
        assert!(blobs.contains(&frame));
    }

    #[test]
    fn the_oldest_marks_come_out_first_and_a_new_mark_replaces_an_old_one() {
        let (a, b, c) = (Digest::of(b"a"), Digest::of(b"b"), Digest::of(b"c"));
        let mut t = Timed::default();
        t.insert(a, 1);
        t.insert(b, 2);
        t.insert(a, 3);
        t.insert_new(b, 9);
        t.insert(c, 4);
        t.remove(&c);
        assert_eq!(t.pop_due(2), Some(b), "a was marked again at 3");
        assert_eq!(t.pop_due(2), None);
        assert_eq!(t.pop_due(5), Some(a));
        assert_eq!(t.pop_due(5), None, "c was unmarked");
        assert!(!t.contains(&a) && !t.contains(&b) && !t.contains(&c));
    }
}
