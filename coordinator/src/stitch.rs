//! Stitching: assembling a frame, pixel for pixel, from tiles Blender rendered
//! with a crop border (see [`crate::tiles`]).
//!
//! Each tile image covers its `rendered` rectangle (the tile plus overscan);
//! only its `inner` rectangle is copied into the frame, so the overscan that
//! steadied adaptive sampling at the seams is thrown away. Samples are copied
//! bit for bit in the tiles' own encoding (PNG colour type and bit depth, EXR
//! channel names and sample types); nothing is converted or resampled.

use std::borrow::Cow;
use std::fmt;
use std::io::Cursor;

use crate::tiles::Rect;

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
            | Self::Undecodable { tile, .. } => Some(*tile),
            Self::NoTiles { .. } | Self::Gap { .. } | Self::Encode(_) => None,
        }
    }
}

const PNG_MAGIC: &[u8] = b"\x89PNG\r\n\x1a\n";
const EXR_MAGIC: &[u8] = &[0x76, 0x2f, 0x31, 0x01];

/// Assembles a width x height frame from tiles: copies each tile's inner
/// region out of its rendered image. Returns the encoded file bytes and the
/// extension ("png" or "exr").
pub fn stitch(
    width: u32,
    height: u32,
    tiles: &[TilePiece<'_>],
) -> Result<(Vec<u8>, &'static str), StitchError> {
    check_cover(width, height, tiles)?;
    let first = &tiles[0];
    if first.bytes.starts_with(PNG_MAGIC) {
        Ok((png_stitch(width, height, tiles)?, "png"))
    } else if first.bytes.starts_with(EXR_MAGIC) {
        Ok((exr_stitch(width, height, tiles)?, "exr"))
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
    let mut writer = png::Encoder::with_info(&mut out, info)
        .map_err(enc)?
        .write_header()
        .map_err(enc)?;
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

// ---- OpenEXR ----

type ExrImage =
    exr::image::Image<exr::image::Layers<exr::image::AnyChannels<exr::image::FlatSamples>>>;

/// An OpenEXR encoding: channel names and sample types, in file order.
fn exr_format(channels: &exr::image::AnyChannels<exr::image::FlatSamples>) -> String {
    use exr::image::FlatSamples;
    let list: Vec<String> = channels
        .list
        .iter()
        .map(|c| {
            let ty = match c.sample_data {
                FlatSamples::F16(_) => "half",
                FlatSamples::F32(_) => "float",
                FlatSamples::U32(_) => "uint",
            };
            format!("{}:{ty}", c.name)
        })
        .collect();
    format!("OpenEXR ({})", list.join(","))
}

fn exr_decode(
    piece: &TilePiece<'_>,
) -> Result<exr::image::Layer<exr::image::AnyChannels<exr::image::FlatSamples>>, StitchError> {
    use exr::prelude::*;
    let tile = piece.inner;
    let bad = |e: exr::error::Error| StitchError::Undecodable {
        tile,
        reason: e.to_string(),
    };
    let unsupported = |what: &str| StitchError::UnsupportedVariant {
        tile,
        what: what.to_string(),
    };
    // Read the header alone first: refuse the wrong size before allocating pixels.
    let meta = MetaData::read_from_buffered(Cursor::new(piece.bytes), false).map_err(bad)?;
    let [header] = meta.headers.as_slice() else {
        return Err(unsupported("a multi-part OpenEXR"));
    };
    if header.deep {
        return Err(unsupported("a deep OpenEXR"));
    }
    let size = header.layer_size;
    if (size.0, size.1) != (piece.rendered.w as usize, piece.rendered.h as usize) {
        return Err(StitchError::WrongSize {
            tile,
            rendered: piece.rendered,
            got_w: u32::try_from(size.0).unwrap_or(u32::MAX),
            got_h: u32::try_from(size.1).unwrap_or(u32::MAX),
        });
    }
    if header
        .channels
        .list
        .iter()
        .any(|c| c.sampling != Vec2(1, 1))
    {
        return Err(unsupported("a subsampled OpenEXR"));
    }
    let image: ExrImage = read()
        .no_deep_data()
        .largest_resolution_level()
        .all_channels()
        .all_layers()
        .all_attributes()
        .non_parallel()
        .from_buffered(Cursor::new(piece.bytes))
        .map_err(bad)?;
    let mut layers = image.layer_data.into_iter();
    match (layers.next(), layers.next()) {
        (Some(layer), None) => Ok(layer),
        _ => Err(unsupported("a multi-part OpenEXR")),
    }
}

fn exr_stitch(width: u32, height: u32, tiles: &[TilePiece<'_>]) -> Result<Vec<u8>, StitchError> {
    use exr::prelude::*;
    let pixels = width as usize * height as usize;
    let mut out_layer: Option<Layer<AnyChannels<FlatSamples>>> = None;
    let mut format = String::new();
    for piece in tiles {
        if !piece.bytes.starts_with(EXR_MAGIC) {
            return Err(mixed(piece, "OpenEXR"));
        }
        let layer = exr_decode(piece)?;
        let tile_format = exr_format(&layer.channel_data);
        let frame = match &mut out_layer {
            Some(frame) => {
                if tile_format != format {
                    return Err(StitchError::MixedFormats {
                        tile: piece.inner,
                        expected: format,
                        found: tile_format,
                    });
                }
                frame
            }
            None => {
                format = tile_format;
                // The frame takes the first tile's channels (zeroed, full size), encoding
                // attributes and standard metadata; custom attributes (Blender's per-render
                // stamps such as render time) describe one tile, so they are dropped.
                let list = layer
                    .channel_data
                    .list
                    .iter()
                    .map(|c| AnyChannel {
                        name: c.name.clone(),
                        sample_data: match c.sample_data {
                            FlatSamples::F16(_) => FlatSamples::F16(vec![f16::ZERO; pixels]),
                            FlatSamples::F32(_) => FlatSamples::F32(vec![0.0; pixels]),
                            FlatSamples::U32(_) => FlatSamples::U32(vec![0; pixels]),
                        },
                        quantize_linearly: c.quantize_linearly,
                        sampling: Vec2(1, 1),
                    })
                    .collect();
                let mut attributes = layer.attributes.clone();
                attributes.layer_position = Vec2(0, 0);
                attributes.other.clear();
                out_layer.insert(Layer::new(
                    (width as usize, height as usize),
                    attributes,
                    Encoding {
                        compression: Compression::ZIP16,
                        blocks: Blocks::ScanLines,
                        line_order: LineOrder::Increasing,
                    },
                    AnyChannels { list },
                ))
            }
        };
        for (dst, src) in frame
            .channel_data
            .list
            .iter_mut()
            .zip(&layer.channel_data.list)
        {
            match (&mut dst.sample_data, &src.sample_data) {
                (FlatSamples::F16(d), FlatSamples::F16(s)) => copy_inner(d, width, s, piece, 1),
                (FlatSamples::F32(d), FlatSamples::F32(s)) => copy_inner(d, width, s, piece, 1),
                (FlatSamples::U32(d), FlatSamples::U32(s)) => copy_inner(d, width, s, piece, 1),
                // The formats matched, so the sample types do; refuse rather than panic.
                _ => return Err(mixed(piece, "OpenEXR")),
            }
        }
    }
    let Some(layer) = out_layer else {
        return Err(StitchError::NoTiles { width, height });
    };
    let image = Image::from_layer(layer);
    let mut out = Cursor::new(Vec::new());
    image
        .write()
        .non_parallel()
        .to_buffered(&mut out)
        .map_err(|e| StitchError::Encode(e.to_string()))?;
    Ok(out.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tiles::{split, with_overscan, Grid};
    use exr::prelude::{self as x, ReadChannels, ReadLayers, WritableImage};
    use proptest::prelude::*;

    fn encode_png(w: u32, h: u32, format: PngFormat, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut enc = png::Encoder::new(&mut out, w, h);
        enc.set_color(format.color);
        enc.set_depth(format.depth);
        let mut writer = enc.write_header().unwrap();
        writer.write_image_data(data).unwrap();
        writer.finish().unwrap();
        out
    }

    fn decode_png(bytes: &[u8]) -> (u32, u32, PngFormat, Vec<u8>) {
        let mut reader = png::Decoder::new(Cursor::new(bytes)).read_info().unwrap();
        let mut data = vec![0; reader.output_buffer_size().unwrap()];
        reader.next_frame(&mut data).unwrap();
        let info = reader.info();
        let format = PngFormat {
            color: info.color_type,
            depth: info.bit_depth,
        };
        (info.width, info.height, format, data)
    }

    /// Cuts `rect` out of a row-major image `w` wide.
    fn crop<T: Copy>(full: &[T], w: u32, rect: Rect, per_px: usize) -> Vec<T> {
        let mut out = Vec::new();
        for row in rect.y..rect.bottom() {
            let s = (row as usize * w as usize + rect.x as usize) * per_px;
            out.extend_from_slice(&full[s..s + rect.w as usize * per_px]);
        }
        out
    }

    /// A full image whose every byte differs from its neighbours.
    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    /// The tiles of a grid with overscan, each encoded by `encode` from the full image.
    fn pieces(w: u32, h: u32, grid: Grid, overscan: u32) -> Vec<(Rect, Rect)> {
        split(w, h, grid, 64)
            .unwrap()
            .into_iter()
            .map(|t| (t, with_overscan(t, overscan, w, h)))
            .collect()
    }

    fn png_round_trip(w: u32, h: u32, format: PngFormat, grid: Grid, overscan: u32) {
        let per_px = format.bytes_per_pixel();
        let full = pattern(w as usize * h as usize * per_px);
        let rects = pieces(w, h, grid, overscan);
        let files: Vec<Vec<u8>> = rects
            .iter()
            .map(|&(_, r)| encode_png(r.w, r.h, format, &crop(&full, w, r, per_px)))
            .collect();
        let tiles: Vec<TilePiece<'_>> = rects
            .iter()
            .zip(&files)
            .map(|(&(inner, rendered), bytes)| TilePiece {
                inner,
                rendered,
                bytes,
            })
            .collect();
        let (bytes, ext) = stitch(w, h, &tiles).unwrap();
        assert_eq!(ext, "png");
        let (got_w, got_h, got_format, data) = decode_png(&bytes);
        assert_eq!((got_w, got_h, got_format), (w, h, format));
        assert!(
            data == full,
            "{format} {grid} overscan {overscan}: pixels differ"
        );
    }

    #[test]
    fn png_tiles_stitch_back_to_the_full_image() {
        use png::{BitDepth::*, ColorType::*};
        for (color, depth) in [
            (Rgb, Eight),
            (Rgb, Sixteen),
            (Rgba, Eight),
            (Rgba, Sixteen),
            (Grayscale, Eight),
            (GrayscaleAlpha, Sixteen),
        ] {
            let format = PngFormat { color, depth };
            png_round_trip(321, 239, format, Grid { cols: 4, rows: 3 }, 16);
            png_round_trip(64, 48, format, Grid { cols: 3, rows: 2 }, 0);
            png_round_trip(5, 3, format, Grid::WHOLE, 16);
        }
    }

    /// An RGBA layer covering `rect` of a frame whose samples depend on the frame position.
    fn exr_layer(half: bool, rect: Rect) -> x::Layer<x::AnyChannels<x::FlatSamples>> {
        let channels = ["R", "G", "B", "A"]
            .iter()
            .enumerate()
            .map(|(c, name)| {
                let value = |i: usize| {
                    let (px, py) = (
                        (i % rect.w as usize) as u32 + rect.x,
                        (i / rect.w as usize) as u32 + rect.y,
                    );
                    (px * 3 + py * 1000 + c as u32) as f32 / 7.0
                };
                let n = rect.w as usize * rect.h as usize;
                let samples = if half {
                    x::FlatSamples::F16((0..n).map(|i| x::f16::from_f32(value(i))).collect())
                } else {
                    x::FlatSamples::F32((0..n).map(value).collect())
                };
                x::AnyChannel::new(*name, samples)
            })
            .collect();
        x::Layer::new(
            (rect.w as usize, rect.h as usize),
            x::LayerAttributes::default(),
            x::Encoding::SMALL_LOSSLESS,
            x::AnyChannels::sort(channels),
        )
    }

    fn encode_exr(layer: x::Layer<x::AnyChannels<x::FlatSamples>>) -> Vec<u8> {
        let mut out = Cursor::new(Vec::new());
        x::Image::from_layer(layer)
            .write()
            .non_parallel()
            .to_buffered(&mut out)
            .unwrap();
        out.into_inner()
    }

    #[test]
    fn exr_tiles_stitch_back_to_the_full_image() {
        for half in [false, true] {
            let (w, h) = (321, 239);
            let frame = Rect { x: 0, y: 0, w, h };
            let files: Vec<(Rect, Rect, Vec<u8>)> = pieces(w, h, Grid { cols: 4, rows: 3 }, 16)
                .into_iter()
                .map(|(inner, r)| (inner, r, encode_exr(exr_layer(half, r))))
                .collect();
            let tiles: Vec<TilePiece<'_>> = files
                .iter()
                .map(|(inner, rendered, bytes)| TilePiece {
                    inner: *inner,
                    rendered: *rendered,
                    bytes,
                })
                .collect();
            let (bytes, ext) = stitch(w, h, &tiles).unwrap();
            assert_eq!(ext, "exr");
            let meta = x::MetaData::read_from_buffered(Cursor::new(&bytes), false).unwrap();
            assert_eq!(meta.headers[0].compression, x::Compression::ZIP16);
            let image: ExrImage = x::read()
                .no_deep_data()
                .largest_resolution_level()
                .all_channels()
                .all_layers()
                .all_attributes()
                .from_buffered(Cursor::new(&bytes))
                .unwrap();
            let got = &image.layer_data[0];
            assert_eq!(got.size, x::Vec2(w as usize, h as usize));
            let want = exr_layer(half, frame);
            assert_eq!(
                exr_format(&got.channel_data),
                exr_format(&want.channel_data)
            );
            assert!(
                got.channel_data == want.channel_data,
                "half {half}: samples differ"
            );
        }
    }

    /// Two 80x60 tiles side by side, 8-bit RGB, no overscan.
    fn two_tiles() -> ([Rect; 2], [Vec<u8>; 2]) {
        let format = PngFormat {
            color: png::ColorType::Rgb,
            depth: png::BitDepth::Eight,
        };
        let rects = [
            Rect {
                x: 0,
                y: 0,
                w: 80,
                h: 60,
            },
            Rect {
                x: 80,
                y: 0,
                w: 80,
                h: 60,
            },
        ];
        let files =
            rects.map(|r| encode_png(r.w, r.h, format, &pattern(r.w as usize * r.h as usize * 3)));
        (rects, files)
    }

    fn piece(r: Rect, bytes: &[u8]) -> TilePiece<'_> {
        TilePiece {
            inner: r,
            rendered: r,
            bytes,
        }
    }

    #[test]
    fn refuses_a_tile_of_the_wrong_size() {
        let (rects, files) = two_tiles();
        let wide = encode_png(
            81,
            60,
            PngFormat {
                color: png::ColorType::Rgb,
                depth: png::BitDepth::Eight,
            },
            &pattern(81 * 60 * 3),
        );
        let err = stitch(
            160,
            60,
            &[piece(rects[0], &files[0]), piece(rects[1], &wide)],
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("tile at 80,0 is 81x60 but should be 80x60;"),
            "{err}"
        );
        assert_eq!(err.tile(), Some(rects[1]));
    }

    #[test]
    fn refuses_gaps_overlaps_and_strays() {
        let (rects, files) = two_tiles();
        let err = stitch(160, 60, &[piece(rects[0], &files[0])]).unwrap_err();
        assert!(
            matches!(err, StitchError::Gap { missing: 4800, .. }),
            "{err}"
        );
        let err = stitch(
            160,
            60,
            &[piece(rects[0], &files[0]), piece(rects[0], &files[1])],
        )
        .unwrap_err();
        assert!(matches!(err, StitchError::Overlap { .. }), "{err}");
        let err = stitch(
            150,
            60,
            &[piece(rects[0], &files[0]), piece(rects[1], &files[1])],
        )
        .unwrap_err();
        assert!(matches!(err, StitchError::BadRegion { .. }), "{err}");
        let mut stray = piece(rects[1], &files[1]);
        stray.inner.x = 79;
        let err = stitch(160, 60, &[piece(rects[0], &files[0]), stray]).unwrap_err();
        assert!(matches!(err, StitchError::BadRegion { .. }), "{err}");
        let mut huge = piece(rects[1], &files[1]);
        huge.inner.w = u32::MAX;
        huge.rendered.w = u32::MAX;
        let err = stitch(160, 60, &[piece(rects[0], &files[0]), huge]).unwrap_err();
        assert!(matches!(err, StitchError::BadRegion { .. }), "{err}");
        let err = stitch(160, 60, &[]).unwrap_err();
        assert!(matches!(err, StitchError::NoTiles { .. }), "{err}");
    }

    #[test]
    fn refuses_mixed_unsupported_and_damaged_files() {
        let (rects, files) = two_tiles();
        let deep = encode_png(
            80,
            60,
            PngFormat {
                color: png::ColorType::Rgb,
                depth: png::BitDepth::Sixteen,
            },
            &pattern(80 * 60 * 6),
        );
        let err = stitch(
            160,
            60,
            &[piece(rects[0], &files[0]), piece(rects[1], &deep)],
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "tile at 80,0 is PNG (RGB, 16-bit) but the first tile is PNG (RGB, 8-bit); \
             render every tile of a frame with the same output format"
        );
        let exr = encode_exr(exr_layer(false, rects[1]));
        let err = stitch(
            160,
            60,
            &[piece(rects[0], &files[0]), piece(rects[1], &exr)],
        )
        .unwrap_err();
        assert!(matches!(err, StitchError::MixedFormats { .. }), "{err}");
        let jpeg = [0xff, 0xd8, 0xff, 0xe0, 0, 0];
        let err = stitch(
            160,
            60,
            &[piece(rects[0], &jpeg), piece(rects[1], &files[1])],
        )
        .unwrap_err();
        assert!(
            matches!(err, StitchError::UnsupportedFormat { .. }),
            "{err}"
        );
        let cut = &files[1][..files[1].len() / 2];
        let err = stitch(160, 60, &[piece(rects[0], &files[0]), piece(rects[1], cut)]).unwrap_err();
        assert!(matches!(err, StitchError::Undecodable { .. }), "{err}");
        assert_eq!(err.tile(), Some(rects[1]));
        let cut = &exr[..exr.len() / 2];
        let err = stitch(80, 60, &[piece(rects[0], cut)]).unwrap_err();
        assert!(matches!(err, StitchError::Undecodable { .. }), "{err}");
        let wrong = encode_exr(exr_layer(
            true,
            Rect {
                x: 0,
                y: 0,
                w: 80,
                h: 61,
            },
        ));
        let err = stitch(80, 60, &[piece(rects[0], &wrong)]).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("tile at 0,0 is 80x61 but should be 80x60;"),
            "{err}"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn any_grid_and_overscan_round_trips(
            w in 1u32..90, h in 1u32..90, cols in 1u32..6, rows in 1u32..6, overscan in 0u32..20,
        ) {
            prop_assume!(cols <= w && rows <= h);
            let format = PngFormat { color: png::ColorType::Rgba, depth: png::BitDepth::Sixteen };
            png_round_trip(w, h, format, Grid { cols, rows }, overscan);
        }
    }
}
