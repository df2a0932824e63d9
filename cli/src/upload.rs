//! The CLI's one upload path: a job's files hashed with blake3 (with a
//! cache keyed by path, size and modification time), the coordinator asked
//! which it lacks, and those sent, with the file set's manifest. `tessera
//! submit` (a scene or a bundle), `tessera render`, `tessera deps` and the
//! add-on's `tessera hash` all go through here; nothing else in the CLI
//! sends blobs.
//!
//! Takes a [`Layout`] from [`crate::fileset`] (or a bundle) and a
//! [`Client`]; knows nothing of job specs or commands.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use prost::Message;
use serde::{Deserialize, Serialize};
use tessera_proto as pb;

use crate::client::Client;
use crate::fileset::{cache_dir, mtime_ns, Layout};

/// What an upload stored on the coordinator and what it sent.
#[derive(Debug, Clone)]
pub struct Uploaded {
    /// The scene's digest.
    pub scene: String,
    /// The file set's digest; None for a self-contained scene.
    pub file_set: Option<String>,
    /// Bytes sent.
    pub sent: u64,
    /// Files sent (the others were on the coordinator already).
    pub count: usize,
}

impl Uploaded {
    /// Says what an upload of a layout of `files` files sent.
    pub fn say(&self, files: usize) {
        match (self.sent, files) {
            (0, 1) => eprintln!("scene already on the coordinator; 0 bytes uploaded"),
            (0, n) => eprintln!(
                "scene and its {} file(s) already on the coordinator; 0 bytes uploaded",
                n - 1
            ),
            (b, 1) => eprintln!("uploaded scene: {b} bytes"),
            (b, n) => eprintln!(
                "uploaded {} of {n} file(s) (the scene and what it uses): {b} bytes",
                self.count
            ),
        }
    }
}

/// Hashes the files of `layout` (reusing the hash cache) and uploads those
/// the coordinator lacks, with the file set's manifest.
pub async fn files(c: &mut Client, layout: &Layout) -> Result<Uploaded> {
    let mut cache = HashCache::load();
    let entries = hash_all(layout, &mut cache, false).await?;
    cache.save();
    send(c, layout, entries).await
}

/// Uploads the hashed files of `layout` (and its file set's manifest) that
/// the coordinator lacks; `entries` are [`hash_all`]'s, the scene first.
pub async fn send(
    c: &mut Client,
    layout: &Layout,
    entries: Vec<pb::FileEntry>,
) -> Result<Uploaded> {
    let scene = entries[0].digest.clone();
    let self_contained =
        entries.len() == 1 && layout.mappings.is_empty() && layout.missing.is_empty();
    let manifest = (!self_contained).then(|| manifest(layout, entries.clone()));
    let manifest_digest = manifest
        .as_ref()
        .map(|m| blake3::hash(m).to_hex().to_string());
    let mut digests: Vec<String> = entries
        .iter()
        .filter(|e| e.shared.is_empty())
        .map(|e| e.digest.clone())
        .collect();
    digests.extend(manifest_digest.clone());
    let lacking = missing(c, digests).await?;
    let (sent, count) = send_files(c, layout, &entries, &lacking, false).await?;
    if let (Some(m), Some(d)) = (manifest, &manifest_digest) {
        if lacking.contains(d) {
            put_bytes(c, d, m).await?;
        }
    }
    Ok(Uploaded {
        scene,
        file_set: manifest_digest,
        sent,
        count,
    })
}

/// Uploads `bytes` as blob `digest`.
async fn put_bytes(c: &mut Client, digest: &str, bytes: Vec<u8>) -> Result<()> {
    let size = bytes.len() as u64;
    let chunk = pb::BlobChunk {
        digest: digest.to_string(),
        size,
        data: bytes,
    };
    let deadline = tessera_worker::deadline::upload(size);
    c.blobs
        .put_blob(tessera_worker::deadline::request(
            tokio_stream::iter(vec![chunk]),
            deadline,
        ))
        .await
        .map_err(|s| c.explain(s))?;
    Ok(())
}

/// A remembered digest: valid while the file keeps its size and mtime.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Known {
    size: u64,
    mtime_ns: i128,
    digest: String,
}

/// Digests of files hashed before, in `~/.cache/tessera/hashes.json`.
#[derive(Debug, Default)]
pub struct HashCache {
    path: Option<PathBuf>,
    known: HashMap<PathBuf, Known>,
    changed: bool,
}

impl HashCache {
    /// Loads the cache (an unreadable one is started afresh).
    pub fn load() -> Self {
        let path = cache_dir().map(|d| d.join("hashes.json"));
        let known = path
            .as_ref()
            .and_then(|p| std::fs::read(p).ok())
            .and_then(|b| serde_json::from_slice::<Vec<(PathBuf, Known)>>(&b).ok())
            .map(|v| v.into_iter().collect())
            .unwrap_or_default();
        Self {
            path,
            known,
            changed: false,
        }
    }

    /// An empty cache that is never saved: every file is read and hashed,
    /// for checks that must not trust a size and mtime.
    pub fn none() -> Self {
        Self::default()
    }

    /// Saves the cache if anything changed; failures only cost speed.
    pub fn save(&self) {
        let Some(path) = self.path.as_ref().filter(|_| self.changed) else {
            return;
        };
        let list: Vec<(&PathBuf, &Known)> = self.known.iter().collect();
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(path.parent().unwrap_or(Path::new(".")))?;
            let tmp = path.with_extension("json.tmp");
            std::fs::write(&tmp, serde_json::to_vec(&list)?)?;
            std::fs::rename(&tmp, path)
        };
        if let Err(e) = write() {
            tracing::debug!("cannot save the hash cache {}: {e}", path.display());
        }
    }
}

/// Hashes every file of `layout` (reusing `cache` where a file is
/// unchanged), in parallel, with a progress bar; returns the entries.
pub async fn hash_all(
    layout: &Layout,
    cache: &mut HashCache,
    quiet: bool,
) -> Result<Vec<pb::FileEntry>> {
    use std::os::unix::fs::PermissionsExt;
    let mut entries = Vec::with_capacity(layout.files.len());
    let mut todo = Vec::new();
    for (i, (rel, path)) in layout.files.iter().enumerate() {
        let meta =
            std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
        if !meta.is_file() {
            bail!(
                "{} is not a regular file; the scene must refer to files",
                path.display()
            );
        }
        let mode = if meta.permissions().mode() & 0o111 != 0 {
            0o755
        } else {
            0o644
        };
        let digest = cache
            .known
            .get(path)
            .filter(|k| k.size == meta.len() && k.mtime_ns == mtime_ns(&meta) && k.mtime_ns != 0)
            .map(|k| k.digest.clone());
        if digest.is_none() && !layout.is_shared(path) {
            todo.push((i, path.clone(), meta.len(), mtime_ns(&meta)));
        }
        if layout.is_shared(path) {
            // On shared storage: listed, not hashed or sent.
            entries.push(pb::FileEntry {
                path: rel.clone(),
                digest: String::new(),
                size: meta.len(),
                mode,
                shared: path.to_string_lossy().into_owned(),
            });
            continue;
        }
        entries.push(pb::FileEntry {
            path: rel.clone(),
            digest: digest.unwrap_or_default(),
            size: meta.len(),
            mode,
            shared: String::new(),
        });
    }
    let total: u64 = todo.iter().map(|t| t.2).sum();
    let bar = bytes_bar(total, "hashing", quiet || todo.is_empty());
    let parallel = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .min(8);
    let results = futures_lite_map(todo, parallel, |(i, path, size, mtime)| {
        let bar = bar.clone();
        async move {
            let (digest, _) = tessera_worker::transfer::hash_file(&path).await?;
            bar.inc(size);
            Ok::<_, tessera_worker::Error>((i, path, size, mtime, digest))
        }
    })
    .await;
    bar.finish_and_clear();
    for r in results {
        let (i, path, size, mtime_ns, digest) = r?;
        entries[i].digest = digest.clone();
        cache.known.insert(
            path,
            Known {
                size,
                mtime_ns,
                digest,
            },
        );
        cache.changed = true;
    }
    Ok(entries)
}

/// Runs `f` over `items`, at most `n` at a time; results in any order.
async fn futures_lite_map<T, R, F, Fut>(items: Vec<T>, n: usize, f: F) -> Vec<R>
where
    T: Send + 'static,
    R: Send + 'static,
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = R> + Send + 'static,
{
    let mut set = tokio::task::JoinSet::new();
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        while set.len() >= n.max(1) {
            if let Some(r) = set.join_next().await {
                out.push(r.expect("task panicked"));
            }
        }
        set.spawn(f(item));
    }
    while let Some(r) = set.join_next().await {
        out.push(r.expect("task panicked"));
    }
    out
}

fn bytes_bar(total: u64, what: &str, hidden: bool) -> ProgressBar {
    if hidden {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template(&format!(
            "{what} {{bar:30}} {{bytes}}/{{total_bytes}} {{bytes_per_sec}} {{eta}}"
        ))
        .expect("valid template"),
    );
    bar
}

/// The encoded FileSet message of `layout` with `entries`.
fn manifest(layout: &Layout, entries: Vec<pb::FileEntry>) -> Vec<u8> {
    pb::FileSet {
        scene: layout.scene.clone(),
        files: entries,
        mappings: layout
            .mappings
            .iter()
            .map(|(from, to)| pb::PathMapping {
                from: from.clone(),
                to: to.clone(),
            })
            .collect(),
        missing: layout.missing.clone(),
    }
    .encode_to_vec()
}

/// Which of `digests` the coordinator lacks (for this user).
pub async fn missing(c: &mut Client, digests: Vec<String>) -> Result<HashSet<String>> {
    let mut out = HashSet::new();
    // Batches keep each message well under the gRPC size limit.
    for batch in digests.chunks(10_000) {
        let m = c
            .blobs
            .missing_blobs(pb::MissingBlobsRequest {
                digests: batch.to_vec(),
            })
            .await
            .map_err(|s| c.explain(s))?
            .into_inner()
            .missing;
        out.extend(m);
    }
    Ok(out)
}

/// Uploads the files of `layout` whose digests are in `lacking`, in
/// parallel with a progress bar; returns the bytes and files sent.
async fn send_files(
    c: &mut Client,
    layout: &Layout,
    entries: &[pb::FileEntry],
    lacking: &HashSet<String>,
    quiet: bool,
) -> Result<(u64, usize)> {
    let mut seen = HashSet::new();
    let todo: Vec<(PathBuf, String, u64)> = layout
        .files
        .iter()
        .zip(entries)
        .filter(|(_, e)| lacking.contains(&e.digest) && seen.insert(e.digest.clone()))
        .map(|((_, p), e)| (p.clone(), e.digest.clone(), e.size))
        .collect();
    let total: u64 = todo.iter().map(|t| t.2).sum();
    let count = todo.len();
    let bar = bytes_bar(total, "uploading", quiet || todo.is_empty());
    let blobs = c.blobs.clone();
    let results = futures_lite_map(todo, 4, |(path, digest, size)| {
        let (mut blobs, bar) = (blobs.clone(), bar.clone());
        async move {
            let r = tessera_worker::transfer::put_file(&mut blobs, &path, &digest, size).await;
            bar.inc(size);
            r.map_err(|e| (path, e))
        }
    })
    .await;
    bar.finish_and_clear();
    let mut sent = 0;
    for r in results {
        match r {
            Ok(n) => sent += n,
            Err((path, tessera_worker::Error::Rpc(s))) => {
                return Err(c.explain(s))
                    .with_context(|| format!("cannot upload {}", path.display()))
            }
            Err((path, e)) => {
                return Err(anyhow!(e)).with_context(|| format!("cannot upload {}", path.display()))
            }
        }
    }
    Ok((sent, count))
}

/// `tessera hash`: one JSON line per file, `{"path", "digest", "size"}`.
/// Every file is read: the add-on writes bundle manifests with it, and a
/// manifest must say what the bytes are, not what a cache remembers.
pub async fn hash_command(mut files: Vec<PathBuf>, stdin: bool) -> Result<()> {
    if stdin {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .context("cannot read paths from standard input")?;
        files.extend(text.lines().filter(|l| !l.is_empty()).map(PathBuf::from));
    }
    let layout = Layout {
        files: files
            .iter()
            .map(|p| (p.to_string_lossy().into_owned(), p.clone()))
            .collect(),
        ..Default::default()
    };
    let entries = hash_all(&layout, &mut HashCache::none(), true).await?;
    let mut out = String::new();
    for ((path, _), e) in layout.files.iter().zip(&entries) {
        let line = serde_json::json!({"path": path, "digest": e.digest, "size": e.size});
        out.push_str(&line.to_string());
        out.push('\n');
    }
    print!("{out}");
    Ok(())
}
