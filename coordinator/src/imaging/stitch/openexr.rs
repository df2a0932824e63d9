//! Stitching OpenEXR tiles: single-part, flat, any channels and sample types.

use std::io::Cursor;

use super::{copy_inner, mixed, StitchError, TilePiece, EXR_MAGIC};
use crate::imaging::limits::{PixelLimit, MAX_CHANNELS};

/// A whole decoded OpenEXR file.
pub(super) type ExrImage =
    exr::image::Image<exr::image::Layers<exr::image::AnyChannels<exr::image::FlatSamples>>>;

/// An OpenEXR encoding: channel names and sample types, in file order.
pub(super) fn exr_format(channels: &exr::image::AnyChannels<exr::image::FlatSamples>) -> String {
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
    limit: PixelLimit,
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
    // No more channels than Blender writes, and no more samples than an RGBA
    // frame at the pixel limit: checked on the header, before any pixel.
    let count = header.channels.list.len();
    let pixels = (size.0 as u64).saturating_mul(size.1 as u64).max(1);
    let max = MAX_CHANNELS
        .min(usize::try_from(limit.max_area().saturating_mul(4) / pixels).unwrap_or(usize::MAX));
    if count > max {
        return Err(StitchError::TooManyChannels { tile, count, max });
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

/// Stitches OpenEXR tiles into a width x height frame.
pub(super) fn exr_stitch(
    limit: PixelLimit,
    width: u32,
    height: u32,
    tiles: &[TilePiece<'_>],
) -> Result<Vec<u8>, StitchError> {
    use exr::prelude::*;
    let pixels = width as usize * height as usize;
    let mut out_layer: Option<Layer<AnyChannels<FlatSamples>>> = None;
    let mut format = String::new();
    for piece in tiles {
        if !piece.bytes.starts_with(EXR_MAGIC) {
            return Err(mixed(piece, "OpenEXR"));
        }
        let layer = exr_decode(limit, piece)?;
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
