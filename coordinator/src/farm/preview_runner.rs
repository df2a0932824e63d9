//! The coordinator's preview maker: a thread of its own that makes the
//! previews the farm says are due ([`Farm::previews_due`]), one at a time,
//! and records each outcome. Frames are read and ffmpeg runs without the
//! farm's lock and off the async runtime, so leases, results and the API
//! go on meanwhile; one preview at a time keeps ffmpeg from taking every
//! core of the coordinator's machine.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::digest::Digest;
use crate::farm::Farm;
use crate::imaging::video::{self as encode, Ffmpeg};
use crate::model::job::JobId;
use crate::model::preview::{Outcome, Video};

/// How often the maker looks for due previews when idle.
const IDLE: Duration = Duration::from_millis(500);

/// How long a job whose outcome could not be stored waits before the next try.
const STORE_BACKOFF: Duration = Duration::from_secs(30);

/// Makes due previews until stopped.
pub struct Runner {
    farm: Arc<Farm>,
    ffmpeg: Ffmpeg,
    /// Where frames are laid out for ffmpeg (under the data directory).
    scratch: PathBuf,
    /// Jobs whose outcome could not be stored, and when to try again.
    backoff: HashMap<JobId, Instant>,
}

/// Stops a running [`Runner`] when dropped (it finishes the preview in
/// hand first).
pub struct Stop(Arc<AtomicBool>);

impl Drop for Stop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

impl Runner {
    /// A maker for `farm` that runs `ffmpeg` and works under `scratch`.
    pub fn new(farm: Arc<Farm>, ffmpeg: Ffmpeg, scratch: PathBuf) -> Self {
        Self {
            farm,
            ffmpeg,
            scratch,
            backoff: HashMap::new(),
        }
    }

    /// Starts the maker on a thread of its own; it stops when the returned
    /// [`Stop`] is dropped.
    pub fn start(mut self) -> Stop {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let spawned = std::thread::Builder::new()
            .name("tessera-preview".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    if self.run_once() == 0 {
                        std::thread::sleep(IDLE);
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::error!("cannot start the preview maker: {e}; previews will not be made");
        }
        Stop(stop)
    }

    /// Makes every preview due now; returns how many were tried.
    pub fn run_once(&mut self) -> usize {
        let now = Instant::now();
        self.backoff.retain(|_, until| *until > now);
        let due: Vec<JobId> = self
            .farm
            .previews_due()
            .into_iter()
            .filter(|id| !self.backoff.contains_key(id))
            .collect();
        for &id in &due {
            self.make(id);
        }
        due.len()
    }

    /// Makes job `id`'s preview and records how it ended.
    fn make(&mut self, id: JobId) {
        let work = match self.farm.preview_work(id) {
            Ok(Some(w)) => w,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(job = %id, "cannot read the job for its preview: {e}");
                self.backoff.insert(id, Instant::now() + STORE_BACKOFF);
                return;
            }
        };
        tracing::info!(job = %id, frames = work.frames.len(), fps = work.fps, "making a preview");
        let limit = self.farm.config().max_pixels;
        let encoded = encode::encode(
            &work.frames,
            &**self.farm.blobs(),
            work.fps,
            &self.ffmpeg,
            limit,
            &self.scratch,
        );
        let outcome = match encoded {
            Ok(e) => {
                let digest = Digest::of(&e.bytes);
                // Until the job names it, the collector must leave it alone
                // (the same bytes may be garbage of a deleted job).
                self.farm.touch_blobs_blocking(&[digest]);
                match self.farm.blobs().put(digest, &e.bytes) {
                    Ok(_) => Outcome::Ready(Video {
                        digest,
                        size: e.bytes.len() as u64,
                        frames: e.frames,
                        width: e.width,
                        height: e.height,
                        fps: work.fps,
                        note: work.note,
                    }),
                    Err(err) => {
                        Outcome::Failed(format!("the preview was made but cannot be stored: {err}"))
                    }
                }
            }
            Err(e) => {
                let msg = e.for_job(id.0);
                tracing::warn!(job = %id, "no preview: {msg}");
                Outcome::Failed(msg)
            }
        };
        if let Err(e) = self.farm.record_preview(id, outcome) {
            tracing::error!(job = %id, "cannot record the job's preview: {e}");
            self.backoff.insert(id, Instant::now() + STORE_BACKOFF);
        }
    }
}
