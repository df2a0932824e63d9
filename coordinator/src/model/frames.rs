//! Frame sets: the `1-250`, `1-100x2`, `1,5,10-20` syntax, and chunking into tasks.

use std::fmt;

/// Why a frame set was refused. Each message names the problem and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameSetError {
    /// Nothing was given.
    #[error("frame set is empty; give frames like `1-250`, `7` or `1,5,10-20`")]
    Empty,
    /// A part is not a number, a range or a stepped range.
    #[error("`{0}` is not a frame, range or stepped range; use `7`, `1-250` or `1-100x2`")]
    Syntax(String),
    /// A range that runs backwards.
    #[error("range `{0}` runs backwards; write the lower frame first, e.g. `1-250`")]
    Reversed(String),
    /// A step of zero.
    #[error("range `{0}` has a step of 0; use a step of 1 or more, e.g. `1-100x2`")]
    ZeroStep(String),
    /// More frames than the coordinator accepts in one job. Frames are
    /// counted as listed, before repeats are merged, so that a set is never
    /// expanded past the limit.
    #[error("frame set lists {count} frames, over the limit of {max}; split it into several jobs (a frame listed twice counts twice)")]
    TooMany {
        /// Frames the set lists (repeats counted).
        count: u64,
        /// The configured maximum.
        max: u64,
    },
}

/// A parsed, validated set of frame numbers in ascending order, without repeats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameSet {
    frames: Vec<u32>,
}

impl FrameSet {
    /// Parses `spec`, refusing sets that list more than `max` frames.
    ///
    /// Time and memory are linear in the text plus `max`: every part is
    /// counted before any is expanded, and parsing stops at the first part
    /// that takes the count over `max`. So `"1-50000,"` repeated to 4 MiB is
    /// refused at its third part instead of being expanded part by part.
    pub fn parse(spec: &str, max: u64) -> Result<Self, FrameSetError> {
        let mut listed = 0u64;
        let runs = runs(spec, |count| {
            listed = listed.saturating_add(count);
            if listed > max {
                Err(FrameSetError::TooMany { count: listed, max })
            } else {
                Ok(())
            }
        })?;
        let mut frames = Vec::with_capacity(usize::try_from(listed).unwrap_or(0));
        for (start, end, step) in runs {
            frames.extend((start..=end).step_by(step as usize));
        }
        frames.sort_unstable();
        frames.dedup();
        Ok(Self { frames })
    }

    /// Checks the syntax of `spec` without expanding it, whatever its size;
    /// returns how many frames it lists (repeats counted). For clients, which
    /// do not know the coordinator's limit.
    pub fn check(spec: &str) -> Result<u64, FrameSetError> {
        let mut listed = 0u64;
        runs(spec, |count| {
            listed = listed.saturating_add(count);
            Ok(())
        })?;
        Ok(listed)
    }

    /// The frames, ascending.
    pub fn frames(&self) -> &[u32] {
        &self.frames
    }

    /// Number of frames.
    pub fn len(&self) -> usize {
        self.frames.len()
    }

    /// Always false for a parsed set; present for API symmetry.
    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Splits the frames into tasks of at most `chunk` frames each (`chunk` >= 1).
    pub fn chunks(&self, chunk: u32) -> Vec<Vec<u32>> {
        let chunk = chunk.max(1) as usize;
        self.frames.chunks(chunk).map(<[u32]>::to_vec).collect()
    }
}

impl fmt::Display for FrameSet {
    /// Writes the set back in compact form (`1-5,7,9-10`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut i = 0;
        while i < self.frames.len() {
            let start = self.frames[i];
            let mut j = i;
            while j + 1 < self.frames.len() && self.frames[j + 1] == self.frames[j] + 1 {
                j += 1;
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if j == i {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{}", self.frames[j])?;
            }
            i = j + 1;
        }
        Ok(())
    }
}

/// The (start, end, step) of every part of `spec`, in order, calling `count`
/// with each part's frame count before the next part is read.
fn runs(
    spec: &str,
    mut count: impl FnMut(u64) -> Result<(), FrameSetError>,
) -> Result<Vec<(u32, u32, u32)>, FrameSetError> {
    let spec = spec.trim();
    if spec.is_empty() {
        return Err(FrameSetError::Empty);
    }
    let mut runs = Vec::new();
    for part in spec.split(',') {
        let (start, end, step) = parse_part(part.trim())?;
        count(u64::from(end - start) / u64::from(step) + 1)?;
        runs.push((start, end, step));
    }
    Ok(runs)
}

fn parse_part(part: &str) -> Result<(u32, u32, u32), FrameSetError> {
    let syntax = || FrameSetError::Syntax(part.to_string());
    if part.is_empty() {
        return Err(syntax());
    }
    let (range, step) = match part.split_once(['x', 'X']) {
        Some((range, step)) => (range, Some(step)),
        None => (part, None),
    };
    let number = |s: &str| -> Result<u32, FrameSetError> {
        let s = s.trim();
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(syntax());
        }
        s.parse().map_err(|_| syntax())
    };
    let (start, end) = match range.split_once('-') {
        Some((a, b)) => (number(a)?, number(b)?),
        None if step.is_some() => return Err(syntax()),
        None => {
            let n = number(range)?;
            (n, n)
        }
    };
    let step = match step {
        Some(s) => number(s)?,
        None => 1,
    };
    if step == 0 {
        return Err(FrameSetError::ZeroStep(part.to_string()));
    }
    if end < start {
        return Err(FrameSetError::Reversed(part.to_string()));
    }
    Ok((start, end, step))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse(s: &str) -> Result<Vec<u32>, FrameSetError> {
        FrameSet::parse(s, 10_000).map(|f| f.frames)
    }

    #[test]
    fn single_range_step_and_list() {
        assert_eq!(parse("7").unwrap(), vec![7]);
        assert_eq!(parse("1-5").unwrap(), vec![1, 2, 3, 4, 5]);
        assert_eq!(parse("1-10x3").unwrap(), vec![1, 4, 7, 10]);
        assert_eq!(parse("1,5,10-12").unwrap(), vec![1, 5, 10, 11, 12]);
        assert_eq!(parse(" 3 , 1 ").unwrap(), vec![1, 3]);
        assert_eq!(parse("0").unwrap(), vec![0]);
    }

    #[test]
    fn overlapping_parts_are_merged() {
        assert_eq!(parse("1-3,2-4").unwrap(), vec![1, 2, 3, 4]);
    }

    #[test]
    fn bad_sets_are_refused_with_the_reason() {
        assert_eq!(parse(""), Err(FrameSetError::Empty));
        assert_eq!(parse("  "), Err(FrameSetError::Empty));
        assert_eq!(parse("10-1"), Err(FrameSetError::Reversed("10-1".into())));
        assert_eq!(
            parse("1-10x0"),
            Err(FrameSetError::ZeroStep("1-10x0".into()))
        );
        for bad in [
            "a",
            "1-",
            "-1",
            "1,,2",
            "1-2-3",
            "5x2",
            "1.5",
            "1-10x",
            "+3",
            "99999999999",
        ] {
            assert!(matches!(parse(bad), Err(FrameSetError::Syntax(_))), "{bad}");
        }
        assert!(matches!(
            FrameSet::parse("1-4000000000", 10_000),
            Err(FrameSetError::TooMany { max: 10_000, .. })
        ));
        assert!(matches!(
            FrameSet::parse("1-6,10-16", 10),
            Err(FrameSetError::TooMany { .. })
        ));
    }

    #[test]
    fn a_huge_repetitive_set_is_refused_without_expanding_it() {
        // 4 MiB of overlapping ranges: expanding each part cost minutes.
        let part = "1-50000,";
        let spec = part.repeat((4 << 20) / part.len());
        assert!(spec.len() > (4 << 20) - part.len());
        assert_eq!(
            FrameSet::parse(&spec, 100_000),
            Err(FrameSetError::TooMany {
                count: 150_000,
                max: 100_000
            })
        );
        // A client checks the syntax of all of it, expanding nothing.
        let listed = FrameSet::check(spec.trim_end_matches(',')).unwrap();
        assert_eq!(listed, 50_000 * (spec.len() / part.len()) as u64);
        // Repeats within the limit are merged.
        assert_eq!(
            parse("1-3,".repeat(1000).trim_end_matches(',')).unwrap(),
            vec![1, 2, 3]
        );
    }

    #[test]
    fn check_finds_the_same_errors_as_parse() {
        for bad in ["", "1-", "5-1", "1-9x0", "a,1"] {
            assert_eq!(FrameSet::check(bad).err(), parse(bad).err(), "{bad}");
        }
        assert_eq!(FrameSet::check("1-4000000000").unwrap(), 4_000_000_000);
    }

    #[test]
    fn errors_say_what_to_do() {
        let msg = parse("10-1").unwrap_err().to_string();
        assert!(
            msg.contains("backwards") && msg.contains("lower frame first"),
            "{msg}"
        );
    }

    #[test]
    fn chunking_keeps_order_and_covers_every_frame() {
        let set = FrameSet::parse("1-7", 100).unwrap();
        assert_eq!(set.chunks(3), vec![vec![1, 2, 3], vec![4, 5, 6], vec![7]]);
        assert_eq!(set.chunks(1).len(), 7);
        assert_eq!(set.chunks(0).len(), 7);
        assert_eq!(set.chunks(100), vec![set.frames().to_vec()]);
    }

    #[test]
    fn display_is_compact() {
        assert_eq!(
            FrameSet::parse("1-5,7,9,10", 100).unwrap().to_string(),
            "1-5,7,9-10"
        );
    }

    proptest! {
        #[test]
        fn stepped_ranges_match_a_naive_expansion(start in 0u32..500, len in 0u32..500, step in 1u32..20) {
            let end = start + len;
            let got = parse(&format!("{start}-{end}x{step}")).unwrap();
            let want: Vec<u32> = (start..=end).step_by(step as usize).collect();
            prop_assert_eq!(got, want);
        }

        #[test]
        fn display_round_trips(frames in proptest::collection::btree_set(0u32..300, 1..60)) {
            let list: Vec<String> = frames.iter().map(u32::to_string).collect();
            let set = FrameSet::parse(&list.join(","), 10_000).unwrap();
            let again = FrameSet::parse(&set.to_string(), 10_000).unwrap();
            prop_assert_eq!(set.frames(), again.frames());
            prop_assert_eq!(set.frames().to_vec(), frames.into_iter().collect::<Vec<_>>());
        }

        #[test]
        fn parser_never_panics(s in "[0-9x,\\- ]{0,24}") {
            let _ = FrameSet::parse(&s, 1000);
        }

        #[test]
        fn chunks_partition_the_set(frames in proptest::collection::btree_set(0u32..300, 1..60), chunk in 1u32..10) {
            let list: Vec<String> = frames.iter().map(u32::to_string).collect();
            let set = FrameSet::parse(&list.join(","), 10_000).unwrap();
            let chunks = set.chunks(chunk);
            prop_assert!(chunks.iter().all(|c| !c.is_empty() && c.len() <= chunk as usize));
            prop_assert_eq!(chunks.concat(), set.frames().to_vec());
        }
    }
}
