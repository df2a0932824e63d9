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
/// the coordinator lacks, with the file set's manifest. Hashing and sending
/// overlap: a file is asked about and sent as soon as its digest is known,
/// while the next files are still being hashed.
pub async fn files(c: &mut Client, layout: &Layout) -> Result<Uploaded> {
    let mut cache = HashCache::load();
    let (entries, todo) = listed(layout, &cache)?;
    let uploaded = pipeline(c, layout, entries, todo, &mut cache).await;
    // Digests found before a failure are still right: keep them.
    cache.save();
    uploaded
}

/// Uploads the hashed files of `layout` (and its file set's manifest) that
/// the coordinator lacks; `entries` are [`hash_all`]'s, the scene first.
pub async fn send(
    c: &mut Client,
    layout: &Layout,
    entries: Vec<pb::FileEntry>,
) -> Result<Uploaded> {
    pipeline(c, layout, entries, Vec::new(), &mut HashCache::none()).await
}

/// A file still to hash: its index in the layout, path, size and mtime.
type ToHash = (usize, PathBuf, u64, i128);

/// The pipeline behind [`files`] and [`send`]: `todo`'s files are hashed in
/// parallel; each digest, once known (cached ones at once), joins the next
/// batch asked of the coordinator (one question in flight at a time, so a
/// scene of many small files asks in few calls); the files it lacks are sent
/// four at a time; last, the file set's manifest.
async fn pipeline(
    c: &mut Client,
    layout: &Layout,
    mut entries: Vec<pb::FileEntry>,
    todo: Vec<ToHash>,
    cache: &mut HashCache,
) -> Result<Uploaded> {
    // Two bars, each shown once it has work: hashing, and uploading (whose
    // total grows as the coordinator names the files it lacks).
    let bars = indicatif::MultiProgress::new();
    let hashing = bytes_bar(todo.iter().map(|t| t.2).sum(), "hashing  ", todo.is_empty());
    if !todo.is_empty() {
        bars.add(hashing.clone());
    }
    let sending = bytes_bar(0, "uploading", false);
    sending.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    let mut hashed = hash_stream(todo, hashing.clone());
    // Digests known now; the hashed ones follow on the channel.
    let mut ready: Vec<usize> = (0..entries.len())
        .filter(|&i| entries[i].shared.is_empty() && !entries[i].digest.is_empty())
        .collect();
    let mut asked = HashSet::new();
    let mut uploads = tokio::task::JoinSet::new();
    let (mut sent, mut count) = (0, 0);
    let mut hashing_done = false;
    loop {
        while let Ok(h) = hashed.try_recv() {
            ready.push(note_hash(&mut entries, cache, h?));
        }
        if ready.is_empty() {
            if hashing_done {
                break;
            }
            match hashed.recv().await {
                Some(h) => ready.push(note_hash(&mut entries, cache, h?)),
                None => hashing_done = true,
            }
            continue;
        }
        let batch: Vec<usize> = std::mem::take(&mut ready)
            .into_iter()
            .filter(|&i| asked.insert(entries[i].digest.clone()))
            .collect();
        let digests = batch.iter().map(|&i| entries[i].digest.clone()).collect();
        let lacking = missing(c, digests).await?;
        for i in batch
            .into_iter()
            .filter(|&i| lacking.contains(&entries[i].digest))
        {
            while uploads.len() >= 4 {
                let n = joined(c, uploads.join_next().await)?;
                sent += n;
            }
            let (mut blobs, bar) = (c.blobs.clone(), sending.clone());
            let (path, digest, size) = (
                layout.files[i].1.clone(),
                entries[i].digest.clone(),
                entries[i].size,
            );
            if count == 0 {
                bars.add(sending.clone());
            }
            bar.inc_length(size);
            count += 1;
            uploads.spawn(async move {
                let r = tessera_worker::transfer::put_file(&mut blobs, &path, &digest, size).await;
                bar.inc(size);
                r.map_err(|e| (path, e))
            });
        }
    }
    while !uploads.is_empty() {
        sent += joined(c, uploads.join_next().await)?;
    }
    hashing.finish_and_clear();
    sending.finish_and_clear();

    let scene = entries[0].digest.clone();
    let self_contained =
        entries.len() == 1 && layout.mappings.is_empty() && layout.missing.is_empty();
    let mut file_set = None;
    if !self_contained {
        let m = manifest(layout, entries);
        let d = blake3::hash(&m).to_hex().to_string();
        if missing(c, vec![d.clone()]).await?.contains(&d) {
            put_bytes(c, &d, m).await?;
        }
        file_set = Some(d);
    }
    Ok(Uploaded {
        scene,
        file_set,
        sent,
        count,
    })
}

/// Records a digest from [`hash_stream`] in its entry and in the cache;
/// returns the entry's index.
fn note_hash(entries: &mut [pb::FileEntry], cache: &mut HashCache, h: Hashed) -> usize {
    let (i, path, size, mtime_ns, digest) = h;
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
    i
}

/// What one upload task ends with: the bytes sent, or the file and why.
type Sent = Result<u64, (PathBuf, tessera_worker::Error)>;

/// The bytes one finished upload sent, or why it failed.
fn joined(c: &Client, r: Option<Result<Sent, tokio::task::JoinError>>) -> Result<u64> {
    match r
        .expect("joined only while uploads run")
        .expect("upload task panicked")
    {
        Ok(n) => Ok(n),
        Err((path, tessera_worker::Error::Rpc(s))) => {
            Err(c.explain(s)).with_context(|| format!("cannot upload {}", path.display()))
        }
        Err((path, e)) => {
            Err(anyhow!(e)).with_context(|| format!("cannot upload {}", path.display()))
        }
    }
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
    let (mut entries, todo) = listed(layout, cache)?;
    let total: u64 = todo.iter().map(|t| t.2).sum();
    let bar = bytes_bar(total, "hashing", quiet || todo.is_empty());
    let mut hashed = hash_stream(todo, bar.clone());
    while let Some(h) = hashed.recv().await {
        note_hash(&mut entries, cache, h?);
    }
    bar.finish_and_clear();
    Ok(entries)
}

/// The entries of `layout`'s files, with the digests `cache` knows, and the
/// files still to hash. Files on shared storage are listed, never hashed.
fn listed(layout: &Layout, cache: &HashCache) -> Result<(Vec<pb::FileEntry>, Vec<ToHash>)> {
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
        let shared = layout.is_shared(path);
        let digest = cache
            .known
            .get(path)
            .filter(|k| k.size == meta.len() && k.mtime_ns == mtime_ns(&meta) && k.mtime_ns != 0)
            .map(|k| k.digest.clone());
        if digest.is_none() && !shared {
            todo.push((i, path.clone(), meta.len(), mtime_ns(&meta)));
        }
        entries.push(pb::FileEntry {
            path: rel.clone(),
            // On shared storage: listed, not hashed or sent.
            digest: if shared {
                String::new()
            } else {
                digest.unwrap_or_default()
            },
            size: meta.len(),
            mode,
            shared: if shared {
                path.to_string_lossy().into_owned()
            } else {
                String::new()
            },
        });
    }
    Ok((entries, todo))
}

/// A file hashed: its index in the layout, path, size, mtime and digest.
type Hashed = (usize, PathBuf, u64, i128, String);

/// Hashes `todo` in parallel (as many files at a time as there are cores,
/// at most 8), advancing `bar`; each digest arrives on the channel as soon
/// as it is known. The hashing stops when the receiver is dropped.
fn hash_stream(
    todo: Vec<ToHash>,
    bar: ProgressBar,
) -> tokio::sync::mpsc::UnboundedReceiver<Result<Hashed, tessera_worker::Error>> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let parallel = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .min(8);
    tokio::spawn(async move {
        let mut set = tokio::task::JoinSet::new();
        for (i, path, size, mtime) in todo {
            while set.len() >= parallel {
                set.join_next().await;
            }
            if tx.is_closed() {
                return;
            }
            let (tx, bar) = (tx.clone(), bar.clone());
            set.spawn(async move {
                let r = tessera_worker::transfer::hash_file(&path).await;
                bar.inc(size);
                let _ = tx.send(r.map(|(digest, _)| (i, path, size, mtime, digest)));
            });
        }
        while set.join_next().await.is_some() {}
    });
    rx
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
