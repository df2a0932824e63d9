//! The scene cache: `<cache>/scenes/<digest>.blend`, fetched once per digest,
//! verified against its blake3 digest before it is used.
//!
//! A scene is downloaded to a temporary file beside its place and renamed
//! only once whole and verified, so a full disk or a crash never leaves a
//! broken scene under its name. When the disk has no room for a scene, the
//! scenes no running task uses are evicted, least recently used first, as
//! far as that makes room; when even that is not enough the download is
//! refused as [`Error::NoSpace`], saying how much is missing, and the agent
//! gives the task back and takes no work until there is room
//! ([`SceneCache::has_room`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::connect::Conn;
use tessera_proto as pb;

use crate::disk::{free_bytes, MARGIN};
use crate::error::Error;

/// Scenes on local disk, keyed by digest.
pub struct SceneCache {
    dir: PathBuf,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    downloads: AtomicU64,
    /// Scenes running tasks render from, with how many: never evicted.
    in_use: Mutex<HashMap<String, u32>>,
    /// Bytes the last refused download needed, while the disk lacks them.
    wanted: Mutex<Option<u64>>,
}

/// A scene held for a task: not evicted until dropped.
pub struct SceneHold<'a> {
    cache: &'a SceneCache,
    digest: String,
    /// The scene's file.
    pub path: PathBuf,
}

impl Drop for SceneHold<'_> {
    fn drop(&mut self) {
        let mut in_use = self.cache.in_use.lock().unwrap();
        if let Some(n) = in_use.get_mut(&self.digest) {
            *n -= 1;
            if *n == 0 {
                in_use.remove(&self.digest);
            }
        }
    }
}

impl SceneCache {
    /// Opens (creating) the cache at `dir`.
    pub fn open(dir: &Path) -> Result<Self, Error> {
        for sub in ["scenes", "tmp", "work"] {
            let p = dir.join(sub);
            std::fs::create_dir_all(&p)
                .map_err(|e| Error::io(format!("cannot create {}", p.display()), e))?;
        }
        // Partial downloads and outputs of an earlier run are worthless.
        for sub in ["tmp", "work"] {
            if let Ok(entries) = std::fs::read_dir(dir.join(sub)) {
                for e in entries.flatten() {
                    let _ = std::fs::remove_dir_all(e.path())
                        .or_else(|_| std::fs::remove_file(e.path()));
                }
            }
        }
        // Left by a download cut short by a crash (a full disk removes its own).
        if let Ok(entries) = std::fs::read_dir(dir.join("scenes")) {
            for e in entries.flatten() {
                if !e.file_name().to_string_lossy().ends_with(".blend") {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            locks: Mutex::new(HashMap::new()),
            downloads: AtomicU64::new(0),
            in_use: Mutex::new(HashMap::new()),
            wanted: Mutex::new(None),
        })
    }

    /// Whether the cache may take work: false while a scene was refused
    /// for want of space and the disk still lacks it (the caller waits and
    /// asks again; the refusal was logged with its numbers).
    pub fn has_room(&self) -> bool {
        let mut wanted = self.wanted.lock().unwrap();
        let Some(needed) = *wanted else {
            return true;
        };
        let free = free_bytes(&self.dir).unwrap_or(u64::MAX);
        if free >= needed.saturating_add(MARGIN) {
            tracing::info!(
                free_mib = free >> 20,
                "the cache has room again; taking work"
            );
            *wanted = None;
            return true;
        }
        false
    }

    /// Evicts scenes no task uses, least recently used first, until
    /// `needed` bytes (and [`MARGIN`]) are free; evicts nothing when even
    /// all of them would not make the room. Returns how many it evicted.
    fn evict_for(&self, needed: u64) -> usize {
        let free = free_bytes(&self.dir).unwrap_or(0);
        let goal = needed.saturating_add(MARGIN);
        if free >= goal {
            return 0;
        }
        let mut idle: Vec<(std::time::SystemTime, u64, PathBuf)> = {
            let in_use = self.in_use.lock().unwrap();
            std::fs::read_dir(self.dir.join("scenes"))
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| {
                    let name = e.file_name().to_str()?.to_string();
                    let digest = name.strip_suffix(".blend")?;
                    if in_use.contains_key(digest) {
                        return None;
                    }
                    let meta = e.metadata().ok()?;
                    let used = meta.accessed().or_else(|_| meta.modified()).ok()?;
                    Some((used, meta.len(), e.path()))
                })
                .collect()
        };
        if free + idle.iter().map(|(_, len, _)| len).sum::<u64>() < goal {
            return 0;
        }
        idle.sort();
        let mut evicted = 0;
        for (_, len, path) in idle {
            if free_bytes(&self.dir).unwrap_or(0) >= goal {
                break;
            }
            if std::fs::remove_file(&path).is_ok() {
                evicted += 1;
                tracing::info!(scene = %path.display(), bytes = len, "evicted a cached scene no task uses, to make room");
            }
        }
        evicted
    }

    /// A fresh, empty directory for one task's outputs.
    pub fn work_dir(&self, name: &str) -> Result<PathBuf, Error> {
        let p = self.dir.join("work").join(name);
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p)
            .map_err(|e| Error::io(format!("cannot create {}", p.display()), e))?;
        Ok(p)
    }

    /// Digests of the scenes held.
    pub fn digests(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(self.dir.join("scenes")) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| {
                e.file_name()
                    .to_str()?
                    .strip_suffix(".blend")
                    .map(str::to_string)
            })
            .collect()
    }

    /// How many scenes this cache has downloaded since it opened.
    pub fn downloads(&self) -> u64 {
        self.downloads.load(Ordering::Relaxed)
    }

    /// Scene `digest`, downloaded first if needed (making room by
    /// eviction), held against eviction until the hold is dropped.
    pub async fn scene(
        &self,
        digest: &str,
        blobs: &mut pb::blobs_client::BlobsClient<Conn>,
    ) -> Result<SceneHold<'_>, Error> {
        let expected = blake3::Hash::from_hex(digest).map_err(|_| Error::Corrupt {
            expected: digest.to_string(),
            got: "not a digest".into(),
        })?;
        let path = self
            .dir
            .join("scenes")
            .join(format!("{}.blend", expected.to_hex()));
        let lock = self
            .locks
            .lock()
            .unwrap()
            .entry(digest.to_string())
            .or_default()
            .clone();
        let _held = lock.lock().await;
        *self
            .in_use
            .lock()
            .unwrap()
            .entry(digest.to_string())
            .or_default() += 1;
        let hold = SceneHold {
            cache: self,
            digest: digest.to_string(),
            path: path.clone(),
        };
        if path.is_file() {
            // Marks it used, for the eviction order.
            if let Ok(f) = std::fs::File::open(&path) {
                let _ = f.set_times(
                    std::fs::FileTimes::new().set_accessed(std::time::SystemTime::now()),
                );
            }
            return Ok(hold);
        }
        let hex = expected.to_hex();
        let mut evicted = 0;
        let bytes = loop {
            match crate::transfer::download_file(blobs, &hex, &path).await {
                Ok(bytes) => break bytes,
                Err(Error::NoSpace { needed, .. }) if evicted == 0 => {
                    evicted = self.evict_for(needed);
                    if evicted == 0 {
                        return Err(self.refuse(digest, needed, 0));
                    }
                }
                Err(Error::NoSpace { needed, .. }) => {
                    return Err(self.refuse(digest, needed, evicted))
                }
                Err(e) => return Err(e),
            }
        };
        self.downloads.fetch_add(1, Ordering::Relaxed);
        tracing::info!(scene = %&digest[..12], bytes, "scene fetched into cache");
        Ok(hold)
    }

    /// Takes no work until `needed` bytes are free ([`SceneCache::has_room`]).
    pub fn want_room(&self, needed: u64) {
        *self.wanted.lock().unwrap() = Some(needed);
    }

    /// Refuses scene `digest` for want of room, and takes no work until
    /// `needed` bytes are free ([`SceneCache::has_room`]).
    fn refuse(&self, digest: &str, needed: u64, evicted: usize) -> Error {
        self.want_room(needed);
        let e = Error::NoSpace {
            dir: self.dir.display().to_string(),
            what: format!("scene {}", &digest[..digest.len().min(12)]),
            needed,
            free: free_bytes(&self.dir).unwrap_or(0),
            evicted,
        };
        tracing::error!("{e}; taking no work until there is room");
        e
    }
}
