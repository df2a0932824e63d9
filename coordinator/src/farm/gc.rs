//! Blob collection: a blob no record references is deleted once nobody has
//! touched it for a grace period (see [`crate::refs`]).

use super::*;

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
        let now = self.clock.now_ms();
        let grace = self.grace_ms();
        let mut st = self.lock();
        st.touched.retain(|_, t| *t + grace > now);
        let due: Vec<Digest> = st
            .garbage
            .iter()
            .filter(|(_, since)| **since + grace <= now)
            .map(|(d, _)| *d)
            .collect();
        let mut deleted = 0;
        for d in due {
            if st.refs.count(&d) > 0 {
                st.garbage.remove(&d);
            } else if !st.touched.contains_key(&d) {
                // Under the lock: `complete` checks blobs under it too.
                match self.blobs.remove(&d) {
                    Ok(()) => {
                        st.garbage.remove(&d);
                        deleted += 1;
                    }
                    Err(e) => tracing::warn!("cannot remove blob {d}: {e}"),
                }
            }
        }
        if deleted > 0 {
            tracing::debug!(deleted, "unreferenced blobs collected");
        }
        deleted
    }
}
