//! Materialising a job's root from its file set.
//!
//! Every file arrives once, as a blob verified against its blake3 digest, in
//! `<cache>/blobs/ab/cdef...` (read-only). A job's root,
//! `<cache>/roots/<file set digest>/`, holds hard links to those blobs (or
//! copies across file systems) at the paths the file set names, so relative
//! paths resolve exactly as on the artist's machine. The blob cache is bounded
//! (`--cache-max-gib`) and evicts the least recently used blobs, never one that
//! a root in use links.

use std::collections::{HashMap, HashSet};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

use prost::Message;
use tessera_proto as pb;

use crate::connect::Conn;
use crate::error::Error;

/// A job root ready to render from.
#[derive(Debug, Clone)]
pub struct JobRoot {
    /// The root folder.
    pub root: PathBuf,
    /// The scene inside it.
    pub scene: PathBuf,
    /// Absolute paths the scene refers to, and the same file under the root.
    pub mappings: Vec<(String, PathBuf)>,
    /// Files the submitter did not have.
    pub missing: Vec<String>,
}

/// The content-addressed file cache and the roots built from it.
pub struct FileCache {
    dir: PathBuf,
    max_bytes: u64,
    /// Most bytes of copies in one root (`--max-root-gib`).
    max_root_bytes: u64,
    /// (artist's shared-storage prefix, where this machine sees it).
    path_map: Vec<(String, PathBuf)>,
    /// Roots being rendered from, by file-set digest, with how many tasks use each.
    in_use: Mutex<HashMap<String, u32>>,
    /// One download or build at a time per digest.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// Holds a root in use until dropped; its blobs are not evicted meanwhile.
pub struct RootGuard {
    cache: Arc<FileCache>,
    set: String,
    /// The root.
    pub root: JobRoot,
}

impl Drop for RootGuard {
    fn drop(&mut self) {
        let mut in_use = self.cache.in_use.lock().unwrap();
        if let Some(n) = in_use.get_mut(&self.set) {
            *n -= 1;
            if *n == 0 {
                in_use.remove(&self.set);
            }
        }
    }
}

/// Refuses a file-set path that could leave the root.
fn safe_join(root: &Path, rel: &str) -> Result<PathBuf, Error> {
    let p = Path::new(rel);
    let plain = !rel.is_empty()
        && !rel.contains('\\')
        && p.components().all(|c| matches!(c, Component::Normal(_)));
    if !plain {
        return Err(Error::io(
            format!("the file set names `{rel}`, which is not a plain relative path"),
            std::io::Error::from(std::io::ErrorKind::InvalidData),
        ));
    }
    Ok(root.join(p))
}

/// The file in a root that holds the bytes its copies take.
const COPIED: &str = ".tessera-copied";

/// Puts blob `src` (`size` bytes) at `dest` by `link`, or by a copy when
/// linking fails (another file system, or the blob's link count is spent).
/// A copy may take at most `budget` bytes, so one small file listed many
/// times cannot fill the disk. Returns the bytes copied.
fn place(
    src: &Path,
    dest: &Path,
    size: u64,
    budget: u64,
    link: impl Fn(&Path, &Path) -> std::io::Result<()>,
) -> Result<u64, Error> {
    let parent = dest.parent().expect("joined path has a parent");
    std::fs::create_dir_all(parent).map_err(io(format!("cannot create {}", parent.display())))?;
    if link(src, dest).is_ok() {
        return Ok(0);
    }
    if size > budget {
        return Err(Error::io(
            format!(
                "the job root needs copies past this worker's limit of its bytes on disk (--max-root-gib), at {}: free the cache's file system of links, or raise --max-root-gib",
                dest.display()
            ),
            std::io::Error::from(std::io::ErrorKind::StorageFull),
        ));
    }
    std::fs::copy(src, dest).map_err(io(format!("cannot copy to {}", dest.display())))?;
    Ok(size)
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::io(what, e)
}

impl FileCache {
    /// Opens (creating) the cache under `dir`, bounded to `max_bytes` of
    /// blobs and roots' copies, with at most `max_root_bytes` of copies in
    /// one root; `path_map` says where this machine sees shared storage.
    pub fn open(
        dir: &Path,
        max_bytes: u64,
        max_root_bytes: u64,
        path_map: Vec<(String, PathBuf)>,
    ) -> Result<Arc<Self>, Error> {
        for sub in ["blobs", "roots", "tmp"] {
            let p = dir.join(sub);
            std::fs::create_dir_all(&p).map_err(io(format!("cannot create {}", p.display())))?;
        }
        Ok(Arc::new(Self {
            dir: dir.to_path_buf(),
            max_bytes,
            max_root_bytes,
            path_map,
            in_use: Mutex::new(HashMap::new()),
            locks: Mutex::new(HashMap::new()),
        }))
    }

    fn lock_for(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.locks
            .lock()
            .unwrap()
            .entry(key.to_string())
            .or_default()
            .clone()
    }

    /// Where blob `digest` lives in the cache.
    pub fn blob_path(&self, digest: &str) -> PathBuf {
        self.dir.join("blobs").join(&digest[..2]).join(&digest[2..])
    }

    /// The local path of blob `digest`, downloading and verifying it first if needed.
    pub async fn blob(
        &self,
        digest: &str,
        blobs: &mut pb::blobs_client::BlobsClient<Conn>,
    ) -> Result<PathBuf, Error> {
        if digest.len() != 64 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::Corrupt {
                expected: digest.to_string(),
                got: "not a digest".into(),
            });
        }
        let path = self.blob_path(digest);
        let lock = self.lock_for(digest);
        let _held = lock.lock().await;
        if path.is_file() {
            // Recently used: the eviction order reads modification times.
            let _ = std::fs::File::open(&path)
                .and_then(|f| f.set_modified(std::time::SystemTime::now()));
            return Ok(path);
        }
        let parent = path.parent().expect("blob path has a parent");
        std::fs::create_dir_all(parent)
            .map_err(io(format!("cannot create {}", parent.display())))?;
        crate::transfer::download_file(blobs, digest, &path).await?;
        let mut perms = std::fs::metadata(&path)
            .map_err(io(format!("cannot read {}", path.display())))?
            .permissions();
        // Roots link this very file: a render must not be able to change it.
        perms.set_readonly(true);
        std::fs::set_permissions(&path, perms)
            .map_err(io(format!("cannot protect {}", path.display())))?;
        Ok(path)
    }

    /// Builds (or reuses) the root of file set `set` and holds it in use.
    pub async fn root(
        self: &Arc<Self>,
        set: &str,
        blobs: &mut pb::blobs_client::BlobsClient<Conn>,
    ) -> Result<RootGuard, Error> {
        *self
            .in_use
            .lock()
            .unwrap()
            .entry(set.to_string())
            .or_default() += 1;
        let guard = |root| RootGuard {
            cache: self.clone(),
            set: set.to_string(),
            root,
        };
        let result = self.build(set, blobs).await;
        match result {
            Ok(root) => Ok(guard(root)),
            Err(e) => {
                drop(guard(JobRoot {
                    root: PathBuf::new(),
                    scene: PathBuf::new(),
                    mappings: Vec::new(),
                    missing: Vec::new(),
                }));
                Err(e)
            }
        }
    }

    async fn build(
        &self,
        set: &str,
        blobs: &mut pb::blobs_client::BlobsClient<Conn>,
    ) -> Result<JobRoot, Error> {
        let manifest_path = self.blob(set, blobs).await?;
        let bytes = std::fs::read(&manifest_path)
            .map_err(io(format!("cannot read {}", manifest_path.display())))?;
        let fs = pb::FileSet::decode(bytes.as_slice()).map_err(|e| {
            Error::io(
                format!("file set {set} is not a FileSet message ({e})"),
                std::io::Error::from(std::io::ErrorKind::InvalidData),
            )
        })?;
        let root = self.dir.join("roots").join(set);
        let lock = self.lock_for(&format!("root {set}"));
        let _held = lock.lock().await;
        let done = root.join(".tessera-complete");
        if !done.is_file() {
            let _ = std::fs::remove_dir_all(&root);
            let files = root.join("files");
            let mut copied = 0u64;
            for f in &fs.files {
                let dest = safe_join(&files, &f.path)?;
                if !f.shared.is_empty() {
                    self.link_shared(f, &dest)?;
                    continue;
                }
                let src = self.blob(&f.digest, blobs).await?;
                let size = std::fs::metadata(&src)
                    .map_err(io(format!("cannot read {}", src.display())))?
                    .len();
                if size != f.size {
                    return Err(Error::Corrupt {
                        expected: format!("{} ({} bytes)", f.path, f.size),
                        got: format!("{size} bytes"),
                    });
                }
                let placed = place(
                    &src,
                    &dest,
                    size,
                    self.max_root_bytes.saturating_sub(copied),
                    |a, b| std::fs::hard_link(a, b),
                );
                match placed {
                    Ok(n) => copied += n,
                    Err(e) => {
                        let _ = std::fs::remove_dir_all(&root);
                        return Err(e);
                    }
                }
            }
            // Copies cost disk where links do not: the cache bound counts them.
            let tally = root.join(COPIED);
            std::fs::write(&tally, copied.to_string())
                .map_err(io(format!("cannot write {}", tally.display())))?;
            std::fs::write(&done, set).map_err(io(format!("cannot write {}", done.display())))?;
        }
        let files = root.join("files");
        let mappings = fs
            .mappings
            .iter()
            .map(|m| Ok((m.from.clone(), safe_join(&files, &m.to)?)))
            .collect::<Result<_, Error>>()?;
        Ok(JobRoot {
            scene: safe_join(&files, &fs.scene)?,
            root: files,
            mappings,
            missing: fs.missing,
        })
    }

    /// The `--path-map` entry whose artist's prefix `shared` is under:
    /// that prefix, where this machine sees it, and the rest of the path.
    fn mapping<'a>(&'a self, shared: &'a str) -> Option<(&'a str, &'a Path, &'a str)> {
        self.path_map.iter().find_map(|(from, to)| {
            let rest = shared.strip_prefix(from.trim_end_matches('/'))?;
            Some((from.as_str(), to.as_path(), rest.strip_prefix('/')?))
        })
    }

    /// This machine's path of a shared file, if it stays inside the share.
    /// The rest after the prefix must be plain parts (a leading `/` would
    /// make `join` drop the share, `..` would climb out of it), and the
    /// file, links resolved, must still be under the share.
    fn inside_share(share: &Path, rest: &str) -> Option<PathBuf> {
        let plain = !rest.contains('\0')
            && rest
                .split('/')
                .all(|p| !p.is_empty() && p != "." && p != "..");
        if !plain {
            return None;
        }
        let real = std::fs::canonicalize(share.join(rest)).ok()?;
        let share = std::fs::canonicalize(share).ok()?;
        (real.starts_with(&share) && real.is_file()).then_some(real)
    }

    /// Links a shared-storage file into a root, after checking that this
    /// machine sees the same file (same size) inside the share its
    /// `--path-map` names. A refusal names the entry and nothing of this
    /// machine's files: whether a path exists or how big it is stays here.
    fn link_shared(&self, f: &pb::FileEntry, dest: &Path) -> Result<(), Error> {
        let (from, share, rest) = self.mapping(&f.shared).ok_or_else(|| {
            Error::io(
                format!(
                    "the job reads {} from shared storage, which this worker does not map; start it with `--path-map PREFIX=WHERE-THIS-MACHINE-SEES-IT`",
                    f.shared
                ),
                std::io::Error::from(std::io::ErrorKind::NotFound),
            )
        })?;
        let local = Self::inside_share(share, rest)
            .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.len() == f.size))
            .ok_or_else(|| {
                Error::io(
                    format!(
                        "the shared entry `{}` ({}) is not a file inside the share {from} as it was at submit (missing, changed, or outside the share); check the share and submit again",
                        f.path, f.shared
                    ),
                    std::io::Error::from(std::io::ErrorKind::InvalidData),
                )
            })?;
        let parent = dest.parent().expect("joined path has a parent");
        std::fs::create_dir_all(parent)
            .map_err(io(format!("cannot create {}", parent.display())))?;
        std::os::unix::fs::symlink(&local, dest)
            .map_err(io(format!("cannot link {}", dest.display())))
    }

    /// Bytes of copies in each root, by file-set digest.
    fn root_copies(&self) -> HashMap<String, u64> {
        let Ok(roots) = std::fs::read_dir(self.dir.join("roots")) else {
            return HashMap::new();
        };
        roots
            .flatten()
            .filter_map(|r| {
                let n = std::fs::read_to_string(r.path().join(COPIED)).ok()?;
                Some((
                    r.file_name().to_string_lossy().into_owned(),
                    n.trim().parse().ok()?,
                ))
            })
            .collect()
    }

    /// Bytes of blobs held.
    fn blobs_on_disk(&self) -> Vec<(PathBuf, u64, std::time::SystemTime)> {
        let mut out = Vec::new();
        let Ok(shards) = std::fs::read_dir(self.dir.join("blobs")) else {
            return out;
        };
        for shard in shards.flatten() {
            let Ok(files) = std::fs::read_dir(shard.path()) else {
                continue;
            };
            for f in files.flatten() {
                if let Ok(m) = f.metadata() {
                    let t = m.modified().unwrap_or(std::time::UNIX_EPOCH);
                    out.push((f.path(), m.len(), t));
                }
            }
        }
        out
    }

    /// Evicts least recently used blobs (and the roots that link them) until
    /// the cache fits its bound; blobs of roots in use stay. Returns the bytes freed.
    pub fn evict(&self) -> Result<u64, Error> {
        let mut held = self.blobs_on_disk();
        let copies = self.root_copies();
        let total: u64 = held.iter().map(|h| h.1).sum::<u64>() + copies.values().sum::<u64>();
        if total <= self.max_bytes {
            return Ok(0);
        }
        let in_use: Vec<String> = self.in_use.lock().unwrap().keys().cloned().collect();
        let mut keep: HashSet<PathBuf> = HashSet::new();
        for set in &in_use {
            keep.insert(self.blob_path(set));
            if let Ok(bytes) = std::fs::read(self.blob_path(set)) {
                if let Ok(fs) = pb::FileSet::decode(bytes.as_slice()) {
                    keep.extend(
                        fs.files
                            .iter()
                            .filter(|f| f.shared.is_empty())
                            .map(|f| self.blob_path(&f.digest)),
                    );
                }
            }
        }
        held.sort_by_key(|h| h.2);
        // Every root not in use goes below, and its copies with it.
        let mut freed: u64 = copies
            .iter()
            .filter(|(name, _)| !in_use.contains(name))
            .map(|(_, n)| n)
            .sum();
        let mut over = (total - self.max_bytes).saturating_sub(freed);
        let mut evicted = HashSet::new();
        for (path, size, _) in held {
            if over == 0 {
                break;
            }
            if keep.contains(&path) {
                continue;
            }
            std::fs::remove_file(&path).map_err(io(format!("cannot evict {}", path.display())))?;
            evicted.insert(path);
            freed += size;
            over = over.saturating_sub(size);
        }
        // Roots not in use are rebuilt on demand; drop them so no root keeps
        // an evicted blob alive through its hard link.
        if let Ok(roots) = std::fs::read_dir(self.dir.join("roots")) {
            for r in roots.flatten() {
                let name = r.file_name().to_string_lossy().into_owned();
                if !in_use.contains(&name) {
                    let _ = std::fs::remove_dir_all(r.path());
                }
            }
        }
        if freed > 0 {
            tracing::info!(freed, "evicted least recently used files from the cache");
        }
        Ok(freed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_that_leave_the_root_are_refused() {
        let root = Path::new("/cache/roots/x/files");
        assert_eq!(
            safe_join(root, "shots/a.blend").unwrap(),
            root.join("shots/a.blend")
        );
        for bad in ["../x", "/etc/passwd", "a/../../x", "", "a\\b", "./a"] {
            assert!(safe_join(root, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn eviction_keeps_blobs_of_roots_in_use_and_drops_the_oldest() {
        let dir = tempfile::tempdir().unwrap();
        let cache = FileCache::open(dir.path(), 10, 10, Vec::new()).unwrap();
        let put = |name: &str, bytes: &[u8], age_s: u64| {
            let d = blake3::hash(name.as_bytes()).to_hex().to_string();
            let p = cache.blob_path(&d);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, bytes).unwrap();
            let t = std::time::SystemTime::now() - std::time::Duration::from_secs(age_s);
            std::fs::File::options()
                .write(true)
                .open(&p)
                .unwrap()
                .set_modified(t)
                .unwrap();
            (d, p)
        };
        let (a, pa) = put("a", b"12345678", 300);
        let (b, pb_) = put("b", b"12345678", 200);
        let (_, pc) = put("c", b"12345678", 100);
        let set = pb::FileSet {
            scene: "a".into(),
            files: vec![pb::FileEntry {
                path: "a".into(),
                digest: a.clone(),
                size: 8,
                mode: 0o644,
                shared: String::new(),
            }],
            mappings: vec![],
            missing: vec![],
        }
        .encode_to_vec();
        let (s, ps) = put("set", &set, 1000);
        std::fs::write(&ps, &set).unwrap();
        let _ = b;
        cache.in_use.lock().unwrap().insert(s, 1);
        let freed = cache.evict().unwrap();
        assert!(
            pa.is_file(),
            "a blob of a root in use is kept, though oldest"
        );
        assert!(ps.is_file(), "the file set in use is kept");
        assert!(
            !pb_.is_file(),
            "the least recently used free blob goes first"
        );
        assert!(freed >= 8);
        assert!(pc.is_file() || freed >= 16);
    }

    fn shared_entry(path: &str, at: &str, size: u64) -> pb::FileEntry {
        pb::FileEntry {
            path: path.into(),
            digest: String::new(),
            size,
            mode: 0o644,
            shared: at.into(),
        }
    }

    #[test]
    fn a_shared_entry_cannot_leave_the_share() {
        let dir = tempfile::tempdir().unwrap();
        let share = dir.path().join("srv/share");
        std::fs::create_dir_all(&share).unwrap();
        std::fs::write(share.join("wood.png"), b"wood").unwrap();
        let secret = dir.path().join("secret.txt");
        // A size no temporary folder's name holds, so that the check
        // below cannot find it there by chance.
        std::fs::write(&secret, vec![b'x'; 48_611]).unwrap();
        // A link inside the share that points out of it.
        std::os::unix::fs::symlink(&secret, share.join("out.png")).unwrap();
        let cache = FileCache::open(
            &dir.path().join("cache"),
            1 << 20,
            1 << 20,
            vec![("/mnt/projects".into(), share.clone())],
        )
        .unwrap();
        let root = dir.path().join("root");
        let good = shared_entry("tex/wood.png", "/mnt/projects/wood.png", 4);
        cache
            .link_shared(&good, &root.join("tex/wood.png"))
            .unwrap();
        assert_eq!(std::fs::read(root.join("tex/wood.png")).unwrap(), b"wood");
        let abs = secret.to_str().unwrap();
        let size = std::fs::metadata(&secret).unwrap().len();
        for (i, at) in [
            format!("/mnt/projects/{abs}"),
            format!(
                "/mnt/projects/../{}",
                secret.file_name().unwrap().to_str().unwrap()
            ),
            "/mnt/projects/out.png".to_string(),
            "/mnt/projects/./wood.png".to_string(),
        ]
        .iter()
        .enumerate()
        {
            let dest = root.join(format!("stolen{i}.png"));
            let err = cache
                .link_shared(&shared_entry("stolen.png", at, size), &dest)
                .unwrap_err()
                .to_string();
            assert!(err.contains("`stolen.png`"), "{at}: names the entry: {err}");
            assert!(
                !err.contains(&size.to_string()) && !err.contains("No such file"),
                "{at}: says nothing of this machine's files: {err}"
            );
            assert!(!dest.exists(), "{at}: nothing linked");
        }
    }

    #[test]
    fn copies_in_a_root_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("blob");
        std::fs::write(&src, b"12345678").unwrap();
        // Linking fails as it does once a blob's link count is spent.
        let spent =
            |_: &Path, _: &Path| Err(std::io::Error::from(std::io::ErrorKind::TooManyLinks));
        let a = dir.path().join("root/a.png");
        assert_eq!(place(&src, &a, 8, 10, spent).unwrap(), 8);
        assert_eq!(std::fs::read(&a).unwrap(), b"12345678");
        let b = dir.path().join("root/b.png");
        let err = place(&src, &b, 8, 10 - 8, spent).unwrap_err().to_string();
        assert!(err.contains("--max-root-gib"), "{err}");
        assert!(!b.exists());
        // Links cost no budget.
        let c = dir.path().join("root/c.png");
        assert_eq!(
            place(&src, &c, 8, 0, |a, b| std::fs::hard_link(a, b)).unwrap(),
            0
        );
    }

    #[test]
    fn copies_count_against_the_cache_bound() {
        let dir = tempfile::tempdir().unwrap();
        let cache = FileCache::open(dir.path(), 100, 100, Vec::new()).unwrap();
        let root = dir.path().join("roots/abc");
        std::fs::create_dir_all(root.join("files")).unwrap();
        std::fs::write(root.join(COPIED), "150").unwrap();
        assert_eq!(
            cache.evict().unwrap(),
            150,
            "a root of copies over the bound goes"
        );
        assert!(!root.exists());
    }
}
