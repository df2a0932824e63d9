//! Job file sets: every file a scene needs, as one content-addressed blob
//! (an encoded `FileSet` message) whose entries are blobs too.
//!
//! The job's root mirrors the artist's folders from the deepest folder that
//! holds the scene and every file it uses, so relative (`//`) paths resolve
//! unchanged on a worker; absolute paths are listed as mappings, which the
//! worker's Blender session rewrites at load. The coordinator checks a file
//! set at submit: every path is plain and relative, every entry is stored,
//! and the scene is one of the entries.

use std::collections::HashSet;

use prost::Message;
use tessera_proto as pb;

use crate::digest::Digest;
use crate::error::Error;

/// Most files in one file set.
pub const MAX_FILES: usize = 1_000_000;

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
            if !f.shared.starts_with('/') && !is_windows_absolute(&f.shared) {
                return Err(Error::invalid(format!(
                    "`{}` in the file set is on shared storage but its path `{}` is not absolute",
                    f.path, f.shared
                )));
            }
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
    if plain {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "`{}` is not a plain relative path for a file-set entry; paths are \"/\"-separated, under the job root, without \".\" or \"..\"",
            path.escape_debug()
        )))
    }
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
}
