//! TESTS ONLY: a worker that lies. `tessera worker --test-corrupt-pixel`
//! changes one pixel of every PNG frame it renders, after Blender wrote it
//! and before it is hashed, so that end-to-end tests can check that frame
//! verification catches a worker whose frames differ from everyone else's.
//! Never use it on a real farm: its frames are wrong on purpose. Compiled
//! only with the `test-hooks` feature.

/// Inverts the top bit of the first sample of the first pixel of a PNG and
/// encodes it again (same colour type and depth, no text chunks).
pub fn corrupt_png_pixel(bytes: &[u8]) -> Result<Vec<u8>, String> {
    let mut decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    decoder.set_transformations(png::Transformations::IDENTITY);
    let mut reader = decoder.read_info().map_err(|e| e.to_string())?;
    let size = reader
        .output_buffer_size()
        .ok_or("the PNG is too large to decode")?;
    let mut pixels = vec![0; size];
    let frame = reader.next_frame(&mut pixels).map_err(|e| e.to_string())?;
    pixels.truncate(frame.buffer_size());
    let first = pixels.first_mut().ok_or("the PNG has no pixels")?;
    *first ^= 0x80;
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, frame.width, frame.height);
    encoder.set_color(frame.color_type);
    encoder.set_depth(frame.bit_depth);
    let mut writer = encoder.write_header().map_err(|e| e.to_string())?;
    writer
        .write_image_data(&pixels)
        .map_err(|e| e.to_string())?;
    writer.finish().map_err(|e| e.to_string())?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pixels(bytes: &[u8]) -> Vec<u8> {
        let mut r = png::Decoder::new(std::io::Cursor::new(bytes))
            .read_info()
            .unwrap();
        let mut buf = vec![0; r.output_buffer_size().unwrap()];
        let n = r.next_frame(&mut buf).unwrap().buffer_size();
        buf.truncate(n);
        buf
    }

    #[test]
    fn exactly_one_sample_changes() {
        let png = include_bytes!("../fixtures/stamped_a.png");
        let bad = corrupt_png_pixel(png).unwrap();
        let (a, b) = (pixels(png), pixels(&bad));
        assert_eq!(a.len(), b.len());
        let differing: Vec<usize> = (0..a.len()).filter(|&i| a[i] != b[i]).collect();
        assert_eq!(differing, [0]);
        assert!(corrupt_png_pixel(b"not a png").is_err());
    }
}
