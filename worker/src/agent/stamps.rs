//! A rendered file made reproducible before it is hashed: Blender's volatile
//! stamps taken out ([`crate::metadata`]) and turned into the frame's render
//! statistics, which travel with the result instead.

use std::path::Path;

use tessera_proto as pb;

use crate::metadata;

/// Strips the stamps of `path` in place and returns its statistics (zeros
/// where Blender said nothing). A file that cannot be edited is uploaded as
/// Blender wrote it, with a warning: its digest then differs from another
/// worker's, which verification would report. With `corrupt` (tests only), one
/// pixel of a PNG is changed afterwards.
pub(super) async fn settle(path: &Path, frame: u32, corrupt: bool) -> pb::FrameStats {
    let owned = path.to_path_buf();
    let done = tokio::task::spawn_blocking(move || settle_blocking(&owned, corrupt)).await;
    let fields = match done {
        Ok(Ok(fields)) => fields,
        Ok(Err(e)) => {
            tracing::warn!(file = %path.display(), "frame kept as Blender wrote it: {e}");
            Vec::new()
        }
        Err(e) => {
            tracing::warn!(file = %path.display(), "frame kept as Blender wrote it: {e}");
            Vec::new()
        }
    };
    let s = metadata::stats(&fields);
    pb::FrameStats {
        frame,
        render_ms: s.render_ms.unwrap_or(0),
        sync_ms: s.sync_ms.unwrap_or(0),
        samples: s.samples.unwrap_or(0),
        memory_peak_bytes: s.memory_peak_bytes.unwrap_or(0),
        tile: None,
    }
}

fn settle_blocking(path: &Path, corrupt: bool) -> Result<metadata::Fields, String> {
    let fields = metadata::strip_file(path).map_err(|e| e.to_string())?;
    #[cfg(not(feature = "test-hooks"))]
    let _ = corrupt;
    #[cfg(feature = "test-hooks")]
    if corrupt && path.extension().is_some_and(|e| e == "png") {
        let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
        let bad = crate::corrupt::corrupt_png_pixel(&bytes)?;
        std::fs::write(path, bad).map_err(|e| e.to_string())?;
        tracing::warn!(file = %path.display(), "TEST ONLY: changed one pixel (--test-corrupt-pixel)");
    }
    Ok(fields)
}
