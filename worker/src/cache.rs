//! The scene cache: `<cache>/scenes/<digest>.blend`, fetched once per digest,
//! verified against its blake3 digest before it is used.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::agent::Conn;
use tessera_proto as pb;

use crate::error::Error;

/// Scenes on local disk, keyed by digest.
pub struct SceneCache {
    dir: PathBuf,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    downloads: AtomicU64,
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
        Ok(Self {
            dir: dir.to_path_buf(),
            locks: Mutex::new(HashMap::new()),
            downloads: AtomicU64::new(0),
        })
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

    /// The local path of scene `digest`, downloading it first if needed.
    pub async fn scene(
        &self,
        digest: &str,
        blobs: &mut pb::blobs_client::BlobsClient<Conn>,
    ) -> Result<PathBuf, Error> {
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
        if path.is_file() {
            return Ok(path);
        }
        let bytes = crate::transfer::download_file(blobs, &expected.to_hex(), &path).await?;
        self.downloads.fetch_add(1, Ordering::Relaxed);
        tracing::info!(scene = %&digest[..12], bytes, "scene fetched into cache");
        Ok(path)
    }
}
