//! Blender runtimes: the Blenders a worker offers (a `blender` binary, or
//! the official `bpy` module from PyPI), the version a job asks for, and
//! which runtime of a worker serves a job.
//!
//! A job asks for the version its scene was saved with (read from the
//! `.blend` header at submit): that major.minor or newer within the same
//! major, because Blender reads older files of its own major faithfully but
//! crashes on, or refuses, files of a newer one. `--blender 4.5` or
//! `--blender ">=4.2"` says it outright.

use serde::{Deserialize, Serialize};

use crate::error::Error;

/// A Blender version, `major.minor.patch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Version {
    /// 4 in 4.5.15.
    pub major: u16,
    /// 5 in 4.5.15.
    pub minor: u16,
    /// 15 in 4.5.15 (0 when not given).
    pub patch: u16,
}

impl Version {
    /// Reads `4.5.15`, `4.5`, `Blender 4.5.15 LTS` or `3.4.1`: the first
    /// word that is a version.
    pub fn parse(s: &str) -> Option<Self> {
        s.split_whitespace().find_map(|w| {
            let mut parts = w.split('.').map(|p| p.parse::<u16>().ok());
            let major = parts.next()??;
            let minor = parts.next()??;
            let patch = match parts.next() {
                Some(p) => p?,
                None => 0,
            };
            parts.next().is_none().then_some(Self {
                major,
                minor,
                patch,
            })
        })
    }

    /// `4.5`, for messages about lines of Blender.
    pub fn line(self) -> String {
        format!("{}.{}", self.major, self.minor)
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Which Blender versions may render a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum VersionReq {
    /// `4.5`: that line only (any patch release).
    Line(u16, u16),
    /// `>=4.2`: that line or any newer one.
    AtLeast(u16, u16),
    /// `^4.2`: that line or newer within the same major (what a scene saved
    /// by 4.2 needs, unless said otherwise).
    SameMajor(u16, u16),
}

impl VersionReq {
    /// Parses `4.5`, `>=4.2`, `^4.2` (also with a patch number, which is
    /// ignored: patch releases of a line render alike).
    pub fn parse(s: &str) -> Result<Self, Error> {
        let s = s.trim();
        let bad = || {
            Error::invalid(format!(
                "`{s}` is not a Blender version requirement; use e.g. 4.5 (that line), >=4.2 (it or newer) or ^4.2 (it or newer within 4.x)"
            ))
        };
        let (make, rest): (fn(u16, u16) -> Self, &str) = if let Some(r) = s.strip_prefix(">=") {
            (Self::AtLeast, r)
        } else if let Some(r) = s.strip_prefix('^') {
            (Self::SameMajor, r)
        } else {
            (Self::Line, s.strip_prefix('=').unwrap_or(s))
        };
        let v = Version::parse(rest.trim()).ok_or_else(bad)?;
        Ok(make(v.major, v.minor))
    }

    /// What a scene saved by `major.minor` needs.
    pub fn saved_by(major: u16, minor: u16) -> Self {
        Self::SameMajor(major, minor)
    }

    /// Whether Blender `v` satisfies it.
    pub fn matches(self, v: Version) -> bool {
        let at_least = |ma: u16, mi: u16| (v.major, v.minor) >= (ma, mi);
        match self {
            Self::Line(ma, mi) => (v.major, v.minor) == (ma, mi),
            Self::AtLeast(ma, mi) => at_least(ma, mi),
            Self::SameMajor(ma, mi) => v.major == ma && at_least(ma, mi),
        }
    }
}

impl std::fmt::Display for VersionReq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Line(a, b) => write!(f, "{a}.{b}"),
            Self::AtLeast(a, b) => write!(f, ">={a}.{b}"),
            Self::SameMajor(a, b) => write!(f, "^{a}.{b}"),
        }
    }
}

/// One Blender a worker offers, as it reported it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Runtime {
    /// Its version.
    pub version: Version,
    /// `blender` (a binary) or `bpy` (the Python module).
    pub kind: String,
    /// The executable (Blender, or the Python of the module's venv).
    pub path: String,
    /// What it renders (see [`crate::model::hardware::FEATURES`]).
    pub features: Vec<String>,
    /// GPU devices Cycles found in it ("OPTIX NVIDIA H200").
    #[serde(default)]
    pub devices: Vec<String>,
}

impl Runtime {
    /// `4.5.15 (bpy)`, for lists.
    pub fn describe(&self) -> String {
        format!("{} ({})", self.version, self.kind)
    }
}

/// The versions in `runtimes`, newest first, without repeats: `4.5.15, 3.4.1`.
pub fn versions<'a>(runtimes: impl IntoIterator<Item = &'a Runtime>) -> String {
    let mut v: Vec<Version> = runtimes.into_iter().map(|r| r.version).collect();
    v.sort_unstable_by(|a, b| b.cmp(a));
    v.dedup();
    if v.is_empty() {
        return "none".into();
    }
    v.iter()
        .map(Version::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        Version::parse(s).unwrap()
    }

    #[test]
    fn versions_are_read_from_what_blender_prints() {
        assert_eq!(v("4.5.15"), v("Blender 4.5.15 LTS"));
        assert_eq!(v("3.4"), v("3.4.0"));
        assert_eq!(v("Blender 3.4.1").to_string(), "3.4.1");
        assert!(Version::parse("Blender").is_none());
        assert!(Version::parse("4").is_none());
        assert!(Version::parse("4.5.1.2").is_none());
    }

    #[test]
    fn requirements_match_lines_and_majors() {
        let line = VersionReq::parse("4.5").unwrap();
        assert!(
            line.matches(v("4.5.15")) && !line.matches(v("4.4.3")) && !line.matches(v("5.0.0"))
        );
        let at_least = VersionReq::parse(">=4.2").unwrap();
        assert!(at_least.matches(v("4.2.0")) && at_least.matches(v("5.0.1")));
        assert!(!at_least.matches(v("3.6.9")));
        let saved = VersionReq::saved_by(3, 4);
        assert!(saved.matches(v("3.4.1")) && saved.matches(v("3.6.0")));
        assert!(!saved.matches(v("4.5.15")) && !saved.matches(v("3.3.0")));
        assert_eq!(
            VersionReq::parse("^4.2.3").unwrap(),
            VersionReq::SameMajor(4, 2)
        );
        for bad in ["", "four", ">=", "4", "<4.2"] {
            let e = VersionReq::parse(bad).unwrap_err().to_string();
            assert!(e.contains("use e.g. 4.5"), "{e}");
        }
        for req in ["4.5", ">=4.2", "^3.4"] {
            assert_eq!(VersionReq::parse(req).unwrap().to_string(), req);
        }
    }
}
