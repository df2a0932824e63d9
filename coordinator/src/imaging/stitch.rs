//! Stitching: assembling a frame, pixel for pixel, from tiles Blender rendered
//! with a crop border (see [`crate::model::tiles`]).
//!
//! Each tile image covers its `rendered` rectangle (the tile plus overscan);
//! only its `inner` rectangle is copied into the frame, so the overscan that
//! steadied adaptive sampling at the seams is thrown away. Samples are copied
//! bit for bit in the tiles' own encoding (PNG colour type and bit depth, EXR
//! channel names and sample types); nothing is converted or resampled.
//!
//! Sizes are checked before anything is allocated: the frame against the
//! coordinator's [`PixelLimit`], each tile's header (PNG `IHDR`, OpenEXR
//! header) against its expected size and channel count, before its pixels
//! are decoded. OpenEXR lives in `openexr`.

use std::borrow::Cow;
use std::fmt;
use std::io::Cursor;

use crate::imaging::limits::{PixelLimit, TooLarge};
use crate::model::tiles::Rect;
use openexr::exr_stitch;

/// One rendered tile handed to [`stitch`].
#[derive(Debug, Clone, Copy)]
pub struct TilePiece<'a> {
    /// The tile's own region of the frame: what it contributes.
    pub inner: Rect,
    /// The overscanned region the image covers; contains `inner`.
    pub rendered: Rect,
    /// The encoded image: a PNG or OpenEXR file.
    pub bytes: &'a [u8],
}

/// Why a frame could not be stitched. Tile-specific variants carry the tile's
/// `inner` rectangle (see [`StitchError::tile`]) so a caller can re-render it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StitchError {
    /// No tiles were given.
    #[error("no tiles to stitch a {width}x{height} frame from; render its tiles first")]
    NoTiles {
        /// Frame width.
        width: u32,
        /// Frame height.
        height: u32,
    },
    /// A tile's region is empty, leaves the frame or is not inside its rendered region.
    #[error(
        "tile at {},{} ({}x{}) with rendered region {} does not fit a {width}x{height} frame; \
         the inner region must be non-empty and lie inside both the rendered region and the frame",
        inner.x, inner.y, inner.w, inner.h, rendered
    )]
    BadRegion {
        /// The tile's inner region.
        inner: Rect,
        /// Its rendered region.
        rendered: Rect,
        /// Frame width.
        width: u32,
        /// Frame height.
        height: u32,
    },
    /// Two tiles claim the same pixels.
    #[error(
        "tiles at {},{} and {},{} overlap; give each pixel of the frame to exactly one tile",
        first.x, first.y, second.x, second.y
    )]
    Overlap {
        /// The earlier tile's inner region.
        first: Rect,
        /// The later tile's inner region.
        second: Rect,
    },
    /// The tiles leave part of the frame uncovered.
    #[error(
        "tiles leave {missing} pixels of the {width}x{height} frame uncovered; \
         stitch only when every tile of the grid has rendered"
    )]
    Gap {
        /// Uncovered pixels.
        missing: u64,
        /// Frame width.
        width: u32,
        /// Frame height.
        height: u32,
    },
    /// A tile's image is not the size of its rendered region.
    #[error(
        "tile at {},{} is {got_w}x{got_h} but should be {}x{}; \
         render it with the border from `tiles::blender_border` and crop to border on",
        tile.x, tile.y, rendered.w, rendered.h
    )]
    WrongSize {
        /// The tile's inner region.
        tile: Rect,
        /// The region its image should cover.
        rendered: Rect,
        /// The image's width.
        got_w: u32,
        /// The image's height.
        got_h: u32,
    },
    /// A tile is encoded differently from the first tile.
    #[error(
        "tile at {},{} is {found} but the first tile is {expected}; \
         render every tile of a frame with the same output format",
        tile.x, tile.y
    )]
    MixedFormats {
        /// The tile's inner region.
        tile: Rect,
        /// The first tile's format.
        expected: String,
        /// This tile's format.
        found: String,
    },
    /// A tile is neither PNG nor OpenEXR.
    #[error(
        "tile at {},{} is not a PNG or OpenEXR file; set the output format to PNG or OpenEXR to render tiles",
        tile.x, tile.y
    )]
    UnsupportedFormat {
        /// The tile's inner region.
        tile: Rect,
    },
    /// A PNG or OpenEXR variant stitching does not handle.
    #[error(
        "tile at {},{} is {what}, which stitching does not support; \
         use 8- or 16-bit grey/RGB/RGBA PNG or single-part flat OpenEXR",
        tile.x, tile.y
    )]
    UnsupportedVariant {
        /// The tile's inner region.
        tile: Rect,
        /// What was found.
        what: String,
    },
    /// A tile's file is damaged.
    #[error("tile at {},{} could not be decoded ({reason}); render the tile again", tile.x, tile.y)]
    Undecodable {
        /// The tile's inner region.
        tile: Rect,
        /// The decoder's complaint.
        reason: String,
    },
    /// Encoding the stitched frame failed.
    #[error("could not encode the stitched frame: {0}")]
    Encode(String),
    /// The frame is over the coordinator's pixel limit.
    #[error(transparent)]
    TooLarge(#[from] TooLarge),
    /// A tile carries more channels (or samples) than any frame may.
    #[error(
        "tile at {},{} has {count} channels, over the limit of {max} for its size; \
         render tiles as PNG or single-layer OpenEXR (RGBA)",
        tile.x, tile.y
    )]
    TooManyChannels {
        /// The tile's inner region.
        tile: Rect,
        /// Channels in its header.
        count: usize,
        /// The most it may have at its size.
        max: usize,
    },
}

impl StitchError {
    /// The inner region of the tile at fault, when one tile is; re-rendering
    /// it may help for [`StitchError::WrongSize`] and [`StitchError::Undecodable`].
    pub fn tile(&self) -> Option<Rect> {
        match self {
            Self::BadRegion { inner: tile, .. }
            | Self::Overlap { second: tile, .. }
            | Self::WrongSize { tile, .. }
            | Self::MixedFormats { tile, .. }
            | Self::UnsupportedFormat { tile }
            | Self::UnsupportedVariant { tile, .. }
            | Self::TooManyChannels { tile, .. }
            | Self::Undecodable { tile, .. } => Some(*tile),
            Self::NoTiles { .. } | Self::Gap { .. } | Self::Encode(_) | Self::TooLarge(_) => None,
        }
    }
}

const PNG_MAGIC: &[u8] = b"\x89PNG\r\n\x1a\n";
const EXR_MAGIC: &[u8] = &[0x76, 0x2f, 0x31, 0x01];

/// Assembles a width x height frame from tiles: copies each tile's inner
/// region out of its rendered image. Returns the encoded file bytes and the
/// extension ("png" or "exr"). Frames over the default [`PixelLimit`] are
/// refused; [`stitch_within`] takes the coordinator's own.
pub fn stitch(
    width: u32,
    height: u32,
    tiles: &[TilePiece<'_>],
) -> Result<(Vec<u8>, &'static str), StitchError> {
    stitch_within(PixelLimit::default(), width, height, tiles)
}

/// [`stitch`] with the frame (and so every tile) held to `limit` before
/// anything is decoded or allocated.
pub fn stitch_within(
    limit: PixelLimit,
    width: u32,
    height: u32,
    tiles: &[TilePiece<'_>],
) -> Result<(Vec<u8>, &'static str), StitchError> {
    limit.check("the frame", u64::from(width), u64::from(height))?;
    check_cover(width, height, tiles)?;
    let first = &tiles[0];
    if first.bytes.starts_with(PNG_MAGIC) {
        Ok((png_stitch(width, height, tiles)?, "png"))
    } else if first.bytes.starts_with(EXR_MAGIC) {
        Ok((exr_stitch(limit, width, height, tiles)?, "exr"))
    } else {
        Err(StitchError::UnsupportedFormat { tile: first.inner })
    }
}

/// Checks that the inner regions tile the frame exactly: each inside the
/// frame and its rendered region, none overlapping, their areas summing to
/// the frame's (disjoint and inside, so equal area means full cover).
fn check_cover(width: u32, height: u32, tiles: &[TilePiece<'_>]) -> Result<(), StitchError> {
    if tiles.is_empty() {
        return Err(StitchError::NoTiles { width, height });
    }
    let mut area = 0u64;
    for (i, t) in tiles.iter().enumerate() {
        // In u64 so that rectangles near u32::MAX cannot wrap; once the rendered
        // region is inside the frame, every edge fits a u32.
        let end = |r: Rect| {
            (
                u64::from(r.x) + u64::from(r.w),
                u64::from(r.y) + u64::from(r.h),
            )
        };
        let (inner_end, rendered_end) = (end(t.inner), end(t.rendered));
        let fits = t.inner.w > 0
            && t.inner.h > 0
            && rendered_end.0 <= u64::from(width)
            && rendered_end.1 <= u64::from(height)
            && t.inner.x >= t.rendered.x
            && t.inner.y >= t.rendered.y
            && inner_end.0 <= rendered_end.0
            && inner_end.1 <= rendered_end.1;
        if !fits {
            return Err(StitchError::BadRegion {
                inner: t.inner,
                rendered: t.rendered,
                width,
                height,
            });
        }
        if let Some(o) = tiles[..i].iter().find(|o| overlaps(o.inner, t.inner)) {
            return Err(StitchError::Overlap {
                first: o.inner,
                second: t.inner,
            });
        }
        area += u64::from(t.inner.w) * u64::from(t.inner.h);
    }
    let full = u64::from(width) * u64::from(height);
    if area < full {
        return Err(StitchError::Gap {
            missing: full - area,
            width,
            height,
        });
    }
    Ok(())
}

fn overlaps(a: Rect, b: Rect) -> bool {
    a.x < b.right() && b.x < a.right() && a.y < b.bottom() && b.y < a.bottom()
}

/// Copies `piece.inner` out of a row-major image covering `piece.rendered`
/// into a row-major frame `frame_w` wide; `per_px` elements per pixel.
fn copy_inner<T: Copy>(
    frame: &mut [T],
    frame_w: u32,
    src: &[T],
    piece: &TilePiece<'_>,
    per_px: usize,
) {
    let (inner, rendered) = (piece.inner, piece.rendered);
    let row_len = inner.w as usize * per_px;
    for row in inner.y..inner.bottom() {
        let s = ((row - rendered.y) as usize * rendered.w as usize
            + (inner.x - rendered.x) as usize)
            * per_px;
        let d = (row as usize * frame_w as usize + inner.x as usize) * per_px;
        frame[d..d + row_len].copy_from_slice(&src[s..s + row_len]);
    }
}

// ---- PNG ----

/// A PNG encoding, compared across tiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PngFormat {
    color: png::ColorType,
    depth: png::BitDepth,
}

impl PngFormat {
    fn bytes_per_pixel(self) -> usize {
        self.color.samples()
            * if self.depth == png::BitDepth::Sixteen {
                2
            } else {
                1
            }
    }
}

impl fmt::Display for PngFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let color = match self.color {
            png::ColorType::Grayscale => "grey",
            png::ColorType::GrayscaleAlpha => "grey+alpha",
            png::ColorType::Rgb => "RGB",
            png::ColorType::Rgba => "RGBA",
            png::ColorType::Indexed => "indexed",
        };
        write!(f, "PNG ({color}, {}-bit)", self.depth as u8)
    }
}

/// A decoded PNG tile and the colour metadata worth carrying to the frame.
struct PngTile {
    format: PngFormat,
    data: Vec<u8>,
    srgb: Option<png::SrgbRenderingIntent>,
    gamma: Option<png::ScaledFloat>,
    chromaticities: Option<png::SourceChromaticities>,
    icc: Option<Vec<u8>>,
    trns: Option<Vec<u8>>,
    pixel_dims: Option<png::PixelDimensions>,
}

fn png_decode(piece: &TilePiece<'_>) -> Result<PngTile, StitchError> {
    let tile = piece.inner;
    let bad = |e: png::DecodingError| StitchError::Undecodable {
        tile,
        reason: e.to_string(),
    };
    // Allow what the expected size needs at the widest pixel (16-bit RGBA), no more,
    // so a damaged header cannot make us allocate gigabytes.
    let need = u64::from(piece.rendered.w) * u64::from(piece.rendered.h) * 8 + (1 << 20);
    let limits = png::Limits {
        bytes: usize::try_from(need).unwrap_or(usize::MAX),
    };
    let mut decoder = png::Decoder::new_with_limits(Cursor::new(piece.bytes), limits);
    decoder.set_transformations(png::Transformations::IDENTITY);
    let mut reader = decoder.read_info().map_err(bad)?;
    let info = reader.info();
    let (got_w, got_h) = (info.width, info.height);
    if (got_w, got_h) != (piece.rendered.w, piece.rendered.h) {
        return Err(StitchError::WrongSize {
            tile,
            rendered: piece.rendered,
            got_w,
            got_h,
        });
    }
    let format = PngFormat {
        color: info.color_type,
        depth: info.bit_depth,
    };
    let supported_depth = matches!(format.depth, png::BitDepth::Eight | png::BitDepth::Sixteen);
    if format.color == png::ColorType::Indexed
        || !supported_depth
        || info.animation_control.is_some()
    {
        let what = if info.animation_control.is_some() {
            "an animated PNG".to_string()
        } else {
            format.to_string()
        };
        return Err(StitchError::UnsupportedVariant { tile, what });
    }
    let (srgb, gamma, chromaticities) = (info.srgb, info.source_gamma, info.source_chromaticities);
    let icc = info.icc_profile.as_ref().map(|p| p.to_vec());
    // A grey or RGB colour key: part of how the samples read, so it travels too.
    let trns = info.trns.as_ref().map(|t| t.to_vec());
    let pixel_dims = info.pixel_dims;
    let size = reader
        .output_buffer_size()
        .ok_or_else(|| StitchError::Undecodable {
            tile,
            reason: "image too large".into(),
        })?;
    let mut data = vec![0; size];
    let out = reader.next_frame(&mut data).map_err(bad)?;
    data.truncate(out.buffer_size());
    let expect = piece.rendered.w as usize * piece.rendered.h as usize * format.bytes_per_pixel();
    if data.len() != expect {
        return Err(StitchError::Undecodable {
            tile,
            reason: format!("{} bytes of pixels, expected {expect}", data.len()),
        });
    }
    Ok(PngTile {
        format,
        data,
        srgb,
        gamma,
        chromaticities,
        icc,
        trns,
        pixel_dims,
    })
}

fn png_stitch(width: u32, height: u32, tiles: &[TilePiece<'_>]) -> Result<Vec<u8>, StitchError> {
    let mut frame: Vec<u8> = Vec::new();
    let mut first: Option<PngTile> = None;
    for piece in tiles {
        if !piece.bytes.starts_with(PNG_MAGIC) {
            return Err(mixed(piece, "PNG"));
        }
        let mut tile = png_decode(piece)?;
        let format = first.as_ref().map_or(tile.format, |f| f.format);
        if tile.format != format {
            return Err(StitchError::MixedFormats {
                tile: piece.inner,
                expected: format.to_string(),
                found: tile.format.to_string(),
            });
        }
        let per_px = format.bytes_per_pixel();
        if frame.is_empty() {
            frame = vec![0; width as usize * height as usize * per_px];
        }
        copy_inner(&mut frame, width, &tile.data, piece, per_px);
        if first.is_none() {
            tile.data = Vec::new();
            first = Some(tile);
        }
    }
    let Some(meta) = first else {
        return Err(StitchError::NoTiles { width, height });
    };
    let mut info = png::Info::with_size(width, height);
    info.color_type = meta.format.color;
    info.bit_depth = meta.format.depth;
    info.srgb = meta.srgb;
    info.source_gamma = meta.gamma;
    info.source_chromaticities = meta.chromaticities;
    info.icc_profile = meta.icc.map(Cow::Owned);
    info.trns = meta.trns.map(Cow::Owned);
    info.pixel_dims = meta.pixel_dims;
    let enc = |e: png::EncodingError| StitchError::Encode(e.to_string());
    let mut out = Vec::new();
    let mut encoder = png::Encoder::with_info(&mut out, info).map_err(enc)?;
    // The frame is on the job's critical path (nothing is delivered until
    // it is stitched): fdeflate with adaptive filters encodes a 1920x1080
    // frame several times faster than the default zlib level, at about the
    // light compression Blender itself gives PNGs (15 %).
    encoder.set_compression(png::Compression::Fast);
    let mut writer = encoder.write_header().map_err(enc)?;
    writer.write_image_data(&frame).map_err(enc)?;
    writer.finish().map_err(enc)?;
    Ok(out)
}

/// The error for a tile whose container differs from the first tile's.
fn mixed(piece: &TilePiece<'_>, expected: &str) -> StitchError {
    let found = if piece.bytes.starts_with(PNG_MAGIC) {
        "PNG"
    } else if piece.bytes.starts_with(EXR_MAGIC) {
        "OpenEXR"
    } else {
        return StitchError::UnsupportedFormat { tile: piece.inner };
    };
    StitchError::MixedFormats {
        tile: piece.inner,
        expected: expected.to_string(),
        found: found.to_string(),
    }
}

#[cfg(test)]
mod determinism_tests;
mod openexr;
#[cfg(test)]
mod tests;
