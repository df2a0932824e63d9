//! The coordinator's pixel limit, checked against what Blender will really
//! render.
//!
//! The coordinator checks `--max-pixels` at submit against the size the
//! client says the scene has, which a hostile client can leave out or
//! understate. The session's `ready` answer gives the scene's real output
//! size, read by Blender from the file; a scene past the limit the lease
//! carried is refused before any render, for every worker at once.

use crate::session_protocol::Ready;

use crate::blender::{RenderFailure, RenderRequest};
use crate::failure::Scope;

/// Whether a `width` x `height` image is past the limit `(w, h)`: more
/// pixels than `w * h`, or a side longer than the longer of `w` and `h` (the
/// coordinator's rule, so portrait and landscape fit alike).
pub fn over(width: u64, height: u64, (w, h): (u32, u32)) -> bool {
    width * height > u64::from(w) * u64::from(h) || width.max(height) > u64::from(w.max(h))
}

/// The failure for a scene whose output, as the session's `ready` answer
/// gives it, is past the limit the coordinator sent with the task.
pub fn refuse(ready: &Ready, req: &RenderRequest, log_tail: &str) -> Option<RenderFailure> {
    let limit = req.max_pixels?;
    let (width, height) = (ready.width, ready.height);
    over(width, height, limit).then(|| RenderFailure::Failed {
        reason: format!(
            "the scene's output is {width}x{height} pixels, as Blender reads it, over the coordinator's limit of {}x{} (--max-pixels); lower the resolution or resolution %, or ask the farm's admin to raise --max-pixels",
            limit.0, limit.1
        ),
        log_tail: log_tail.to_string(),
        scope: Scope::Everywhere,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_is_the_coordinators() {
        assert!(!over(4096, 4096, (4096, 4096)));
        assert!(
            over(8192, 2048, (4096, 4096)),
            "as many pixels, a longer side"
        );
        assert!(over(17_000, 100, (4096, 4096)), "a side past the longest");
        assert!(over(4097, 4096, (4096, 4096)), "more pixels");
        assert!(
            !over(4096, 8192, (8192, 4096)),
            "portrait fits a landscape limit"
        );
    }
}
