//! Blob collection: a blob no record references is deleted once nobody has
//! touched it for a grace period (see [`crate::farm::refs`]).

use std::collections::VecDeque;

use super::*;

/// Most blobs deleted in one pass (the pass holds the state lock).
const MAX_DELETES_PER_PASS: usize = 2000;

/// Blobs with the time each was last marked, in the order they were: the
/// oldest are found without a scan, so a pass costs what it removes.
#[derive(Debug, Default)]
pub(super) struct Timed {
    at: HashMap<Digest, u64>,
    /// (time, blob) as marked; an entry whose time no longer matches `at`
    /// was marked again or removed, and is skipped.
    order: VecDeque<(u64, Digest)>,
}

impl Timed {
    /// Marks `d` at `t` (again, if it was).
    pub(super) fn insert(&mut self, d: Digest, t: u64) {
        self.at.insert(d, t);
        self.order.push_back((t, d));
    }

    /// Marks `d` at `t` unless it is marked already.
    pub(super) fn insert_new(&mut self, d: Digest, t: u64) {
        if !self.at.contains_key(&d) {
            self.insert(d, t);
        }
    }

    /// Unmarks `d`.
    pub(super) fn remove(&mut self, d: &Digest) {
        self.at.remove(d);
    }

    /// Whether `d` is marked.
    pub(super) fn contains(&self, d: &Digest) -> bool {
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

impl Farm {
    /// Notes that a client or worker uploaded or asked about these blobs: the
    /// collector leaves them alone for a grace period, since a result naming
    /// them may be on its way.
    pub fn touch_blobs(&self, digests: &[Digest]) {
        let now = self.clock.now_ms();
        let mut st = self.lock();
        for d in digests {
            st.touched.insert(*d, now);
        }
    }

    /// How long an unreferenced, untouched blob is kept.
    fn grace_ms(&self) -> u64 {
        self.config.blob_grace_ms
    }

    /// Deletes blobs that no record references, once nobody has touched them
    /// for the grace period; returns how many were deleted.
    pub fn collect_garbage(&self) -> usize {
        // Nothing is deleted while the blob store does not answer: each try
        // would hold the lock for the store's retries, stalling the farm.
        if self.blobs_health().is_some_and(|h| !h.up()) {
            return 0;
        }
        let now = self.clock.now_ms();
        let grace = self.grace_ms();
        let mut st = self.lock();
        let cutoff = now.saturating_sub(grace);
        st.touched.expire(cutoff);
        let mut deleted = 0;
        let mut retry = Vec::new();
        while deleted < MAX_DELETES_PER_PASS {
            let Some(d) = st.garbage.pop_due(cutoff) else {
                break;
            };
            if st.refs.count(&d) > 0 {
                continue;
            }
            if st.touched.contains(&d) {
                // Touched within the grace period: look again later.
                retry.push(d);
                continue;
            }
            // Under the lock: `complete` checks blobs under it too.
            match self.blobs.remove(&d) {
                Ok(()) => deleted += 1,
                Err(e) => {
                    // The next pass tries again; one failure ends this one,
                    // so a store that stopped answering costs one try.
                    tracing::warn!("cannot remove blob {d}: {e}");
                    retry.push(d);
                    break;
                }
            }
        }
        for d in retry {
            st.garbage.insert(d, now);
        }
        if deleted > 0 {
            tracing::debug!(deleted, "unreferenced blobs collected");
        }
        drop(st);
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
