//! Frame thumbnails for the dashboard and the add-on: a PNG or OpenEXR frame
//! scaled down (box filter) to a small 8-bit PNG. Decoding and the
//! tone-mapping of EXR frames (linear light, often above 1.0) live in
//! [`crate::imaging::frame_image`], shared with the preview videos.

use crate::error::Error;
use crate::imaging::frame_image::{self, Pixels};
use crate::imaging::limits::PixelLimit;

/// The largest thumbnail side accepted (`?thumb=N`).
pub const MAX_SIDE: u32 = 1024;

/// A PNG thumbnail of the frame `bytes` (`ext` is `png` or `exr`), at most
/// `side` pixels wide and high (never larger than the frame).
pub fn thumbnail(bytes: &[u8], ext: &str, side: u32, limit: PixelLimit) -> Result<Vec<u8>, Error> {
    let side = side.clamp(1, MAX_SIDE);
    let image = match ext {
        "png" | "exr" => frame_image::decode(bytes, ext, limit)?,
        other => {
            return Err(Error::invalid(format!(
                "cannot make a thumbnail of a .{other} frame; fetch it whole without ?thumb"
            )))
        }
    };
    let small = shrink(&image, side);
    encode(&small)
}

/// Averages boxes of pixels so the longer side is at most `side`.
fn shrink(image: &Pixels, side: u32) -> Pixels {
    let (w, h) = (image.width.max(1), image.height.max(1));
    let longest = w.max(h);
    if longest <= side || image.rgba.is_empty() {
        return image.clone();
    }
    let nw = (u64::from(w) * u64::from(side) / u64::from(longest)).max(1) as u32;
    let nh = (u64::from(h) * u64::from(side) / u64::from(longest)).max(1) as u32;
    let mut rgba = Vec::with_capacity(nw as usize * nh as usize * 4);
    for y in 0..nh {
        let (y0, y1) = (y * h / nh, ((y + 1) * h / nh).max(y * h / nh + 1));
        for x in 0..nw {
            let (x0, x1) = (x * w / nw, ((x + 1) * w / nw).max(x * w / nw + 1));
            let mut sum = [0f32; 4];
            for sy in y0..y1 {
                for sx in x0..x1 {
                    let i = (sy as usize * w as usize + sx as usize) * 4;
                    for (s, v) in sum.iter_mut().zip(&image.rgba[i..i + 4]) {
                        // NaN and infinities (a broken render) count as black.
                        *s += if v.is_finite() { *v } else { 0.0 };
                    }
                }
            }
            let n = ((y1 - y0) * (x1 - x0)) as f32;
            rgba.extend(sum.iter().map(|s| s / n));
        }
    }
    Pixels {
        width: nw,
        height: nh,
        rgba,
        linear: image.linear,
    }
}

fn encode(image: &Pixels) -> Result<Vec<u8>, Error> {
    let mut px = Vec::with_capacity(image.rgba.len());
    for p in image.rgba.chunks_exact(4) {
        px.extend_from_slice(&frame_image::display_rgba(p, image.linear));
    }
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, image.width.max(1), image.height.max(1));
    enc.set_color(png::ColorType::Rgba);
    enc.set_depth(png::BitDepth::Eight);
    let fail = |e: png::EncodingError| Error::invalid(format!("cannot encode a thumbnail: {e}"));
    let mut writer = enc.write_header().map_err(fail)?;
    writer.write_image_data(&px).map_err(fail)?;
    writer.finish().map_err(fail)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn png_of(w: u32, h: u32, color: png::ColorType, px: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut enc = png::Encoder::new(&mut out, w, h);
        enc.set_color(color);
        enc.set_depth(png::BitDepth::Eight);
        let mut wr = enc.write_header().unwrap();
        wr.write_image_data(px).unwrap();
        wr.finish().unwrap();
        out
    }

    fn decoded(png_bytes: &[u8]) -> (u32, u32, Vec<u8>) {
        let mut r = png::Decoder::new(Cursor::new(png_bytes))
            .read_info()
            .unwrap();
        let mut buf = vec![0; r.output_buffer_size().unwrap()];
        let info = r.next_frame(&mut buf).unwrap();
        assert_eq!(info.color_type, png::ColorType::Rgba);
        buf.truncate(info.buffer_size());
        (info.width, info.height, buf)
    }

    #[test]
    fn a_png_frame_shrinks_keeping_its_aspect_and_colour() {
        let (w, h) = (40, 20);
        let px: Vec<u8> = (0..w * h).flat_map(|_| [200u8, 100, 50]).collect();
        let frame = png_of(w, h, png::ColorType::Rgb, &px);
        let thumb = thumbnail(&frame, "png", 10, PixelLimit::default()).unwrap();
        let (tw, th, data) = decoded(&thumb);
        assert_eq!((tw, th), (10, 5));
        assert_eq!(&data[..4], &[200, 100, 50, 255]);
    }

    #[test]
    fn a_small_frame_is_not_enlarged() {
        let frame = png_of(3, 2, png::ColorType::Grayscale, &[0, 128, 255, 0, 128, 255]);
        let (tw, th, data) =
            decoded(&thumbnail(&frame, "png", 256, PixelLimit::default()).unwrap());
        assert_eq!((tw, th), (3, 2));
        assert_eq!(&data[4..8], &[128, 128, 128, 255]);
    }

    #[test]
    fn an_exr_frame_is_tone_mapped_not_black_nor_clipped() {
        use exr::prelude::*;
        let (w, h) = (16usize, 8usize);
        // Dim linear light (0.05) on the left, very bright (20.0) on the right.
        let image = Image::from_channels(
            (w, h),
            SpecificChannels::rgba(|p: Vec2<usize>| {
                let v = if p.0 < w / 2 { 0.05f32 } else { 20.0 };
                (v, v, v, 1.0f32)
            }),
        );
        let mut bytes = Vec::new();
        image.write().to_buffered(Cursor::new(&mut bytes)).unwrap();
        let thumb = thumbnail(&bytes, "exr", 8, PixelLimit::default()).unwrap();
        let (tw, th, data) = decoded(&thumb);
        assert_eq!((tw, th), (8, 4));
        let dim = data[0];
        let bright = data[(tw as usize - 1) * 4];
        assert!(dim > 40, "dim light must stay visible, got {dim}");
        assert!(
            bright > dim && bright < 255,
            "bright light must not clip: {bright}"
        );
    }

    #[test]
    fn garbage_is_a_clear_error_not_a_panic() {
        for ext in ["png", "exr"] {
            let e = thumbnail(b"not an image", ext, 64, PixelLimit::default()).unwrap_err();
            assert!(e.to_string().contains("not a readable"), "{e}");
        }
        let e = thumbnail(b"x", "tiff", 64, PixelLimit::default()).unwrap_err();
        assert!(e.to_string().contains(".tiff"), "{e}");
    }
}
