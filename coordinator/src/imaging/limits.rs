//! Size limits on images, checked before anything is allocated for them.
//!
//! A scene's resolution (percentage applied) is checked at submit, and every
//! frame and tile again in [`crate::imaging::stitch`] before a pixel is decoded, so a
//! lying submitter or a damaged tile header cannot make the coordinator
//! allocate gigabytes.

use std::fmt;
use std::str::FromStr;

/// Most channels an OpenEXR tile may carry (Blender's single-layer output
/// has at most five: RGBA and Z).
pub const MAX_CHANNELS: usize = 64;

/// The largest image accepted, given as `WxH` (`--max-pixels`): an image may
/// have at most `W * H` pixels and neither side may exceed the larger of `W`
/// and `H`, so `8192x4096` accepts portrait and landscape alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PixelLimit {
    /// The `W` of `WxH`.
    pub width: u32,
    /// The `H` of `WxH`.
    pub height: u32,
}

impl Default for PixelLimit {
    fn default() -> Self {
        Self {
            width: 16384,
            height: 16384,
        }
    }
}

/// An image over the [`PixelLimit`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{what} is {width}x{height} pixels, over the coordinator's limit of {limit} (--max-pixels); \
     lower the resolution or resolution %, or ask the farm's admin to raise --max-pixels"
)]
pub struct TooLarge {
    /// What was measured (`the scene's output`, `tile at 0,0`).
    pub what: String,
    /// Its width.
    pub width: u64,
    /// Its height.
    pub height: u64,
    /// The limit it broke.
    pub limit: PixelLimit,
}

impl PixelLimit {
    /// Most pixels in one image.
    pub fn max_area(self) -> u64 {
        u64::from(self.width) * u64::from(self.height)
    }

    /// The longest side allowed.
    pub fn max_side(self) -> u64 {
        u64::from(self.width.max(self.height))
    }

    /// Checks a `width` x `height` image; `what` names it in the error.
    pub fn check(self, what: &str, width: u64, height: u64) -> Result<(), TooLarge> {
        let fits = width <= self.max_side()
            && height <= self.max_side()
            && width.saturating_mul(height) <= self.max_area();
        if fits {
            Ok(())
        } else {
            Err(TooLarge {
                what: what.to_string(),
                width,
                height,
                limit: self,
            })
        }
    }
}

impl fmt::Display for PixelLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}", self.width, self.height)
    }
}

/// Text that is not a `WxH` pixel limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a pixel limit; give WIDTHxHEIGHT, e.g. 16384x16384")]
pub struct BadPixelLimit(pub String);

impl FromStr for PixelLimit {
    type Err = BadPixelLimit;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || BadPixelLimit(s.chars().take(40).collect());
        let (w, h) = s.trim().split_once(['x', 'X']).ok_or_else(bad)?;
        let number = |n: &str| -> Result<u32, BadPixelLimit> {
            let n = n.trim();
            if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            n.parse().ok().filter(|&v| v > 0).ok_or_else(bad)
        };
        Ok(Self {
            width: number(w)?,
            height: number(h)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sides_and_area_are_capped_either_way_round() {
        let limit: PixelLimit = "8192x4096".parse().unwrap();
        assert!(limit.check("x", 8192, 4096).is_ok());
        assert!(limit.check("x", 4096, 8192).is_ok(), "portrait fits too");
        assert!(limit.check("x", 5000, 5000).is_ok());
        assert!(limit.check("x", 6000, 6000).is_err(), "over the area");
        assert!(limit.check("x", 8193, 1).is_err(), "over the side");
        assert!(limit.check("x", u64::MAX, u64::MAX).is_err());
        let err = PixelLimit::default()
            .check("the scene's output", 20000, 20000)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("the scene's output is 20000x20000 pixels, over the coordinator's limit of 16384x16384 (--max-pixels);"),
            "{err}"
        );
    }

    #[test]
    fn parsing() {
        assert_eq!(
            "16384X16384".parse::<PixelLimit>().unwrap(),
            PixelLimit::default()
        );
        for bad in [
            "",
            "16384",
            "0x5",
            "x5",
            "5x",
            "-1x5",
            "99999999999x1",
            "a x b",
        ] {
            assert!(bad.parse::<PixelLimit>().is_err(), "{bad}");
        }
    }
}
