//! Blob reference counts: which stored blobs the farm's records still need.
//!
//! A blob is referenced by a job's scene, by its preview video, by each stitched frame, by the
//! outputs of a done whole-frame task, and by the tile outputs of a done tile
//! task until its frame is stitched. Counts are derived from the durable
//! records (rebuilt at start, kept up to date on every change), so they need no
//! storage of their own. A blob whose count falls to zero becomes garbage, and
//! is deleted only after a grace period in which nobody uploaded it or asked
//! for it: two frames may share a tile's bytes (a transparent corner), and the
//! second frame's worker may be about to name that blob in its result.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::state::{frame_tasks, Change};
use crate::digest::Digest;
use crate::model::job::Job;
use crate::model::output::FrameOutput;
use crate::model::task::{Task, TaskState};

/// How many records reference each blob.
#[derive(Debug, Default)]
pub struct BlobRefs {
    counts: HashMap<Digest, u32>,
}

impl BlobRefs {
    /// Counts one more reference.
    pub fn add(&mut self, d: Digest) {
        *self.counts.entry(d).or_default() += 1;
    }

    /// Drops one reference; returns whether none is left.
    pub fn release(&mut self, d: &Digest) -> bool {
        match self.counts.get_mut(d) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            Some(_) => {
                self.counts.remove(d);
                // A map never shrinks by itself: after a job with a million
                // files goes, its counts' table would stay allocated.
                if self.counts.capacity() > 4096 && self.counts.len() < self.counts.capacity() / 4 {
                    self.counts.shrink_to_fit();
                }
                true
            }
            None => {
                tracing::error!(digest = %d, "released a blob reference that was never counted");
                true
            }
        }
    }

    /// References held now.
    pub fn count(&self, d: &Digest) -> u32 {
        self.counts.get(d).copied().unwrap_or(0)
    }
}

/// The blobs `job` itself references: its scene, its file set and the
/// set's entries (`files`), its stitched frames and its preview video.
pub fn job_refs<'a>(job: &'a Job, files: &'a [Digest]) -> impl Iterator<Item = Digest> + 'a {
    std::iter::once(job.scene)
        .chain(job.file_set)
        .chain(files.iter().copied())
        .chain(job.stitched.iter().map(|o| o.digest))
        .chain(job.preview.digest())
}

/// The blobs a task of `job` references: its outputs once done, except the
/// tiles of a frame that has been stitched (the frame replaces them).
pub fn task_refs<'a>(task: &'a Task, job: &Job) -> impl Iterator<Item = Digest> + 'a {
    let consumed = task.tile.is_some()
        && task
            .frames
            .first()
            .is_some_and(|f| job.stitched.binary_search_by_key(f, |o| o.frame).is_ok());
    let outputs = match &task.state {
        TaskState::Done { outputs } if !consumed => outputs.as_slice(),
        _ => &[],
    };
    // Results held for verification keep their blobs until it settles.
    let held = task.verify.iter().flat_map(|v| &v.candidates);
    outputs
        .iter()
        .chain(held.flat_map(|c| &c.outputs))
        .map(|o| o.digest)
}

/// The references a change adds and those it releases: a new job's own;
/// stitched frames and a preview video that came or went; each changed
/// task's before and after; and the tiles of frames the change stitched.
pub(super) fn change_refs(change: &Change<'_>, files: &[Digest]) -> (Vec<Digest>, Vec<Digest>) {
    let (job, old_job) = (change.job, change.old_job);
    let mut added: Vec<Digest> = Vec::new();
    let mut released: Vec<Digest> = Vec::new();
    match old_job {
        None => added.extend(job_refs(job, files)),
        Some(old) if !std::sync::Arc::ptr_eq(&old.stitched, &job.stitched) => {
            let key = |o: &FrameOutput| (o.frame, o.pass.clone());
            let before: HashSet<(u32, String)> = old.stitched.iter().map(key).collect();
            let after: HashSet<(u32, String)> = job.stitched.iter().map(key).collect();
            added.extend(
                job.stitched
                    .iter()
                    .filter(|o| !before.contains(&key(o)))
                    .map(|o| o.digest),
            );
            // Frames rendered again (`retry --frames`) let go of their old image.
            released.extend(
                old.stitched
                    .iter()
                    .filter(|o| !after.contains(&key(o)))
                    .map(|o| o.digest),
            );
        }
        Some(_) => {}
    }
    // A preview made (or made again) references its video instead.
    if let Some(old) = old_job {
        let (was, now) = (old.preview.digest(), job.preview.digest());
        if was != now {
            added.extend(now);
            released.extend(was);
        }
    }
    for (i, old) in change.tasks() {
        if let Some(old) = old {
            released.extend(task_refs(old, old_job.unwrap_or(job)));
        }
        added.extend(task_refs(&change.list[i as usize], job));
    }
    // Tiles of newly stitched frames stop referencing their blobs.
    if let Some(old) = old_job.filter(|_| !change.newly_stitched.is_empty()) {
        let changed: HashSet<u32> = change.tasks().map(|(i, _)| i).collect();
        for &frame in &change.newly_stitched {
            for t in frame_tasks(change.list, frame) {
                if !changed.contains(&t.index) {
                    released.extend(task_refs(t, old));
                }
            }
        }
    }
    (added, released)
}

/// Every reference of `job`, its file set's entries `files`, and its tasks.
pub fn all_refs(job: &Job, files: &[Digest], tasks: &[Arc<Task>]) -> Vec<Digest> {
    let mut refs: Vec<Digest> = job_refs(job, files).collect();
    for t in tasks {
        refs.extend(task_refs(t, job));
    }
    refs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_rise_and_fall_to_zero() {
        let mut refs = BlobRefs::default();
        let d = Digest::of(b"tile");
        refs.add(d);
        refs.add(d);
        assert!(!refs.release(&d));
        assert_eq!(refs.count(&d), 1);
        assert!(refs.release(&d));
        assert_eq!(refs.count(&d), 0);
    }
}
