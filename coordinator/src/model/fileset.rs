//! Job file sets: every file a scene needs, as one content-addressed blob
//! (an encoded `FileSet` message) whose entries are blobs too.
//!
//! The job's root mirrors the artist's folders from the deepest folder that
//! holds the scene and every file it uses, so relative (`//`) paths resolve
//! unchanged on a worker; absolute paths are listed as mappings, which the
//! worker's Blender session rewrites at load. The coordinator checks a file
//! set at submit: every path is plain and relative and can be made on a
//! worker's disk, every shared path is absolute and normalised, no blob is
//! repeated past what a scene can use, every entry is stored, and the scene
//! is one of the entries. Refusing here blames the submitter; a worker that
//! failed such a set would blame itself and pass it round the farm.

use std::collections::{HashMap, HashSet};

use prost::Message;
use tessera_proto as pb;

use crate::digest::Digest;
use crate::error::Error;

/// Most files in one file set.
pub const MAX_FILES: usize = 1_000_000;

/// Most entries of one file set with the same content. Workers hard-link
/// repeats to one blob, and a file system allows about 65,000 links per
/// file; past that a root would be copies, so a set that repeats one file
/// more than any scene uses is refused rather than amplified on disk.
pub const MAX_COPIES: usize = 10_000;

/// Longest name of one path part: the limit of common file systems (ext4,
/// XFS, APFS, NTFS), so every worker can create every entry.
pub const MAX_NAME_BYTES: usize = 255;

/// What the coordinator keeps of a checked file set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSetInfo {
    /// The scene's path under the job root.
    pub scene: String,
    /// The blob of every entry that is not on shared storage, in order.
    pub blobs: Vec<Digest>,
    /// Files the submitter did not have, with how the scene refers to them.
    pub missing: Vec<String>,
}

/// Decodes and checks a file set blob of a job whose scene is `scene`.
pub fn check(bytes: &[u8], scene: &Digest) -> Result<(pb::FileSet, FileSetInfo), Error> {
    let set = pb::FileSet::decode(bytes).map_err(|e| {
        Error::invalid(format!(
            "the file set is not a valid FileSet message ({e}); submit with `tessera submit`, which builds it"
        ))
    })?;
    if set.files.len() > MAX_FILES {
        return Err(Error::invalid(format!(
            "the file set lists {} files, over the limit of {MAX_FILES}; pack or merge files, or split the scene",
            set.files.len()
        )));
    }
    let mut seen = HashSet::new();
    let mut blobs = Vec::with_capacity(set.files.len());
    let mut scene_found = false;
    for f in &set.files {
        check_path(&f.path)?;
        if !seen.insert(f.path.as_str()) {
            return Err(Error::invalid(format!(
                "the file set lists `{}` twice; list each file once",
                f.path
            )));
        }
        if !f.shared.is_empty() {
            if f.path == set.scene {
                return Err(Error::invalid(
                    "the scene itself cannot be on shared storage in a file set; it is always uploaded",
                ));
            }
            check_shared(&f.path, &f.shared)?;
            continue;
        }
        let d: Digest = f.digest.parse().map_err(|_| {
            Error::invalid(format!(
                "`{}` in the file set has a malformed digest",
                f.path
            ))
        })?;
        scene_found |= f.path == set.scene && d == *scene;
        blobs.push(d);
    }
    check_conflicts(&seen)?;
    check_copies(&set.files, &blobs)?;
    if !scene_found {
        return Err(Error::invalid(format!(
            "the file set does not list the scene `{}` with digest {scene}; rebuild it with `tessera submit`",
            set.scene
        )));
    }
    for m in &set.mappings {
        check_path(&m.to)?;
        if !m.from.starts_with('/') && !is_windows_absolute(&m.from) {
            return Err(Error::invalid(format!(
                "the file set maps `{}`, which is not an absolute path",
                m.from
            )));
        }
    }
    let info = FileSetInfo {
        scene: set.scene.clone(),
        blobs,
        missing: set.missing.iter().take(1000).cloned().collect(),
    };
    Ok((set, info))
}

/// Refuses a path that is not plain, relative and "/"-separated.
pub fn check_path(path: &str) -> Result<(), Error> {
    let plain = !path.is_empty()
        && path.len() <= 4096
        && !path.starts_with('/')
        && !path.contains('\\')
        && !path.contains('\0')
        && path
            .split('/')
            .all(|p| !p.is_empty() && p != "." && p != "..");
    if let Some(long) = path.split('/').find(|p| p.len() > MAX_NAME_BYTES) {
        return Err(Error::invalid(format!(
            "`{}` in the file set has a name of {} bytes, over the file-system limit of {MAX_NAME_BYTES}; rename the file or folder `{}`",
            path.escape_debug(),
            long.len(),
            long.escape_debug()
        )));
    }
    if plain {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "`{}` is not a plain relative path for a file-set entry; paths are \"/\"-separated, under the job root, without \".\" or \"..\"",
            path.escape_debug()
        )))
    }
}

/// Refuses a shared-storage path that is not absolute and normalised. A
/// worker finds the file by stripping one of its `--path-map` prefixes, so
/// `//`, `.` or `..` after the prefix could name a file outside the share.
fn check_shared(path: &str, shared: &str) -> Result<(), Error> {
    let rest = if let Some(r) = shared.strip_prefix('/') {
        Some(r)
    } else if is_windows_absolute(shared) {
        Some(&shared[3..])
    } else {
        None
    };
    let Some(rest) = rest else {
        return Err(Error::invalid(format!(
            "`{path}` in the file set is on shared storage but its path `{}` is not absolute",
            shared.escape_debug()
        )));
    };
    let normal = shared.len() <= 4096
        && !shared.contains('\0')
        && rest
            .split(['/', '\\'])
            .all(|p| !p.is_empty() && p != "." && p != "..");
    if normal {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "`{path}` in the file set is on shared storage at `{}`, which is not a normalised absolute path (no empty, \".\" or \"..\" parts); list the file by its real path under the share",
            shared.escape_debug()
        )))
    }
}

/// Refuses a set in which one path is both a file and a folder: no worker
/// could make both, and each would fail the task as its own fault.
fn check_conflicts(paths: &HashSet<&str>) -> Result<(), Error> {
    for path in paths {
        let mut p = *path;
        while let Some((parent, _)) = p.rsplit_once('/') {
            if paths.contains(parent) {
                return Err(Error::invalid(format!(
                    "`{parent}` in the file set is both a file and a folder (`{path}` is under it); a job root cannot hold both: rename one"
                )));
            }
            p = parent;
        }
    }
    Ok(())
}

/// Refuses a set that repeats one blob more than [`MAX_COPIES`] times.
fn check_copies(files: &[pb::FileEntry], blobs: &[Digest]) -> Result<(), Error> {
    let mut counts: HashMap<&Digest, usize> = HashMap::new();
    for d in blobs {
        *counts.entry(d).or_default() += 1;
    }
    let Some((d, n)) = counts.into_iter().find(|(_, n)| *n > MAX_COPIES) else {
        return Ok(());
    };
    let hex = d.to_hex();
    let first = files
        .iter()
        .find(|f| f.digest == hex)
        .map_or("?", |f| f.path.as_str());
    Err(Error::invalid(format!(
        "the file set lists the same file (blake3 {hex}, first as `{first}`) {n} times, over the limit of {MAX_COPIES} copies of one file; no scene uses that many: list it once and refer to it from the scene"
    )))
}

fn is_windows_absolute(p: &str) -> bool {
    let b = p.as_bytes();
    b.len() >= 3 && b[0].is_ascii_alphabetic() && b[1] == b':' && (b[2] == b'\\' || b[2] == b'/')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(path: &str, bytes: &[u8]) -> pb::FileEntry {
        pb::FileEntry {
            path: path.into(),
            digest: Digest::of(bytes).to_hex(),
            size: bytes.len() as u64,
            mode: 0o644,
            shared: String::new(),
        }
    }

    fn set(scene: &str, files: Vec<pb::FileEntry>) -> Vec<u8> {
        pb::FileSet {
            scene: scene.into(),
            files,
            mappings: vec![pb::PathMapping {
                from: "/mnt/assets/wood.png".into(),
                to: "mnt/assets/wood.png".into(),
            }],
            missing: Vec::new(),
        }
        .encode_to_vec()
    }

    #[test]
    fn a_good_file_set_is_accepted() {
        let scene = Digest::of(b"scene");
        let bytes = set(
            "shots/a.blend",
            vec![
                entry("shots/a.blend", b"scene"),
                entry("shots/tex/c.png", b"c"),
            ],
        );
        let (_, info) = check(&bytes, &scene).unwrap();
        assert_eq!(info.scene, "shots/a.blend");
        assert_eq!(info.blobs.len(), 2);
    }

    #[test]
    fn escaping_duplicate_and_foreign_entries_are_refused() {
        let scene = Digest::of(b"scene");
        for bad in ["../etc/passwd", "/etc/passwd", "a/./b", "a//b", "a\\b", ""] {
            let bytes = set(
                "a.blend",
                vec![entry("a.blend", b"scene"), entry(bad, b"x")],
            );
            let err = check(&bytes, &scene).unwrap_err();
            assert!(matches!(err, Error::Invalid(_)), "{bad}: {err}");
        }
        let twice = set(
            "a.blend",
            vec![entry("a.blend", b"scene"), entry("a.blend", b"scene")],
        );
        assert!(check(&twice, &scene)
            .unwrap_err()
            .to_string()
            .contains("twice"));
        let other = set("a.blend", vec![entry("a.blend", b"another scene")]);
        assert!(check(&other, &scene)
            .unwrap_err()
            .to_string()
            .contains("does not list the scene"));
        assert!(check(b"\xff\xff\xff", &scene).is_err());
    }

    fn shared(path: &str, at: &str) -> pb::FileEntry {
        pb::FileEntry {
            path: path.into(),
            digest: String::new(),
            size: 1,
            mode: 0o644,
            shared: at.into(),
        }
    }

    #[test]
    fn shared_paths_that_are_not_normalised_are_refused() {
        let scene = Digest::of(b"scene");
        let ok = set(
            "a.blend",
            vec![
                entry("a.blend", b"scene"),
                shared("tex/w.png", "/mnt/projects/tex/w.png"),
            ],
        );
        assert!(check(&ok, &scene).is_ok());
        for bad in [
            "/mnt/projects//etc/hostname",
            "/mnt/projects/../../etc/hostname",
            "/mnt/projects/./x.png",
            "/mnt/projects/",
            "mnt/projects/x.png",
            "C:\\proj\\..\\x.png",
        ] {
            let bytes = set(
                "a.blend",
                vec![entry("a.blend", b"scene"), shared("w.png", bad)],
            );
            let err = check(&bytes, &scene).unwrap_err().to_string();
            assert!(err.contains("`w.png`"), "{bad}: names the entry: {err}");
        }
    }

    #[test]
    fn paths_no_worker_can_make_are_refused() {
        let scene = Digest::of(b"scene");
        let both = set(
            "a.blend",
            vec![
                entry("a.blend", b"scene"),
                entry("tex", b"t"),
                entry("tex/w.png", b"w"),
            ],
        );
        let err = check(&both, &scene).unwrap_err().to_string();
        assert!(
            err.contains("`tex` in the file set is both a file and a folder"),
            "{err}"
        );
        let long = format!("tex/{}.png", "n".repeat(300));
        let bytes = set(
            "a.blend",
            vec![entry("a.blend", b"scene"), entry(&long, b"w")],
        );
        let err = check(&bytes, &scene).unwrap_err().to_string();
        assert!(
            err.contains("a name of 304 bytes, over the file-system limit of 255"),
            "{err}"
        );
    }

    #[test]
    fn one_file_repeated_past_what_a_scene_uses_is_refused_with_the_count() {
        let scene = Digest::of(b"scene");
        let mut files = vec![entry("a.blend", b"scene")];
        files.extend((0..MAX_COPIES).map(|i| entry(&format!("t/{i}.png"), b"same")));
        assert!(check(&set("a.blend", files.clone()), &scene).is_ok());
        files.push(entry("t/more.png", b"same"));
        let err = check(&set("a.blend", files), &scene)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("10001 times, over the limit of 10000"),
            "{err}"
        );
        assert!(err.contains("first as `t/0.png`"), "{err}");
    }
}
