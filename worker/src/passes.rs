//! Extra outputs of a frame ("passes"): files the scene's compositor File
//! Output nodes wrote, which the session points into the task's
//! `passes/<node>/` folder. They travel as `FrameOutput`s whose `pass` is the
//! file's path relative to that folder, e.g. `File Output/Image0001.png`, and
//! `tessera fetch` writes them under `<out>/passes/`.
//!
//! A pass name comes from a scene, so it is checked before it names a file on
//! any disk: relative, no `..`, no empty or dot-only parts.

use std::path::{Path, PathBuf};

/// Longest pass name accepted, in bytes.
pub const MAX_NAME: usize = 255;

/// Why a pass name is refused, or Ok when it may name a file under a folder.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(format!(
            "pass name `{name}` must be 1 to {MAX_NAME} bytes long"
        ));
    }
    if name.starts_with('/') || name.contains('\\') || name.contains('\0') {
        return Err(format!("pass name `{name}` is not a relative path"));
    }
    let parts: Vec<&str> = name.split('/').collect();
    if parts.len() > 8 {
        return Err(format!("pass name `{name}` has more than 8 folders"));
    }
    if parts
        .iter()
        .any(|p| p.is_empty() || p.chars().all(|c| c == '.') || p.chars().any(char::is_control))
    {
        return Err(format!(
            "pass name `{name}` has an empty, `.` or `..` part, or a control character"
        ));
    }
    Ok(())
}

/// Where pass `name` goes under `dir` (`dir/passes/name`), once checked.
pub fn destination(dir: &Path, name: &str) -> Result<PathBuf, String> {
    check_name(name)?;
    Ok(dir.join("passes").join(name))
}

/// The file extension of a pass, lowercase, for the protocol (`bin` when it has none).
pub fn extension(name: &str) -> String {
    Path::new(name)
        .extension()
        .and_then(|e| e.to_str())
        .filter(|e| !e.is_empty() && e.len() <= 8 && e.bytes().all(|b| b.is_ascii_alphanumeric()))
        .map_or_else(|| "bin".to_string(), str::to_ascii_lowercase)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_stay_under_their_folder() {
        for ok in [
            "File Output/Image0001.png",
            "Image0001.png",
            "a/b/c.exr",
            "x..y.png",
        ] {
            assert_eq!(check_name(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "../x.png",
            "a/../../x",
            "a//b",
            "./x",
            "a\\b",
            "a/\u{7}/b",
            "...",
            "a/b/c/d/e/f/g/h/i",
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_name(&"x".repeat(MAX_NAME + 1)).is_err());
        assert_eq!(
            destination(Path::new("/out"), "n/Image0001.png").unwrap(),
            PathBuf::from("/out/passes/n/Image0001.png")
        );
        assert!(destination(Path::new("/out"), "../../x").is_err());
    }

    #[test]
    fn extensions() {
        assert_eq!(extension("n/Image0001.PNG"), "png");
        assert_eq!(extension("n/0001.exr"), "exr");
        assert_eq!(extension("n/noext"), "bin");
    }
}
