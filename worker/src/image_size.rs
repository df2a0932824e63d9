//! Reading an image's pixel size from its header (PNG and OpenEXR), to check
//! that a tile came out exactly as large as asked.

use std::path::Path;

/// Width and height of a PNG or OpenEXR file, or why they could not be read.
pub fn image_size(path: &Path) -> Result<(u32, u32), String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        return png_size(&bytes)
            .ok_or_else(|| format!("{} has a broken PNG header", path.display()));
    }
    if bytes.starts_with(&[0x76, 0x2f, 0x31, 0x01]) {
        return exr_size(&bytes)
            .ok_or_else(|| format!("{} has a broken OpenEXR header", path.display()));
    }
    Err(format!(
        "{} is neither PNG nor OpenEXR; tiles need one of those formats",
        path.display()
    ))
}

fn png_size(b: &[u8]) -> Option<(u32, u32)> {
    // Signature (8), chunk length (4), "IHDR" (4), width (4), height (4).
    if b.get(12..16)? != b"IHDR" {
        return None;
    }
    let w = u32::from_be_bytes(b.get(16..20)?.try_into().ok()?);
    let h = u32::from_be_bytes(b.get(20..24)?.try_into().ok()?);
    Some((w, h))
}

fn exr_size(b: &[u8]) -> Option<(u32, u32)> {
    // Magic (4), version (4), then attributes: name\0 type\0 size(i32 LE) value,
    // ending with an empty name. dataWindow is a box2i: xmin ymin xmax ymax.
    let mut i = 8;
    loop {
        let name_end = i + b.get(i..)?.iter().position(|&c| c == 0)?;
        if name_end == i {
            return None;
        }
        let name = &b[i..name_end];
        let type_end = name_end + 1 + b.get(name_end + 1..)?.iter().position(|&c| c == 0)?;
        let size_at = type_end + 1;
        let size = i32::from_le_bytes(b.get(size_at..size_at + 4)?.try_into().ok()?) as usize;
        let value = b.get(size_at + 4..size_at + 4 + size)?;
        if name == b"dataWindow" && size == 16 {
            let n = |k: usize| i32::from_le_bytes(value[4 * k..4 * k + 4].try_into().unwrap());
            let (x0, y0, x1, y1) = (n(0), n(1), n(2), n(3));
            return Some((
                (x1 - x0 + 1).try_into().ok()?,
                (y1 - y0 + 1).try_into().ok()?,
            ));
        }
        i = size_at + 4 + size;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn png_header() {
        let mut b = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
        b.extend_from_slice(&321u32.to_be_bytes());
        b.extend_from_slice(&239u32.to_be_bytes());
        assert_eq!(png_size(&b), Some((321, 239)));
        assert_eq!(png_size(&b[..20]), None);
    }

    #[test]
    fn exr_header() {
        let mut b = vec![0x76, 0x2f, 0x31, 0x01, 2, 0, 0, 0];
        let attr = |b: &mut Vec<u8>, name: &str, ty: &str, value: &[u8]| {
            b.extend_from_slice(name.as_bytes());
            b.push(0);
            b.extend_from_slice(ty.as_bytes());
            b.push(0);
            b.extend_from_slice(&(value.len() as i32).to_le_bytes());
            b.extend_from_slice(value);
        };
        attr(&mut b, "compression", "compression", &[3]);
        let window: Vec<u8> = [0i32, 0, 80, 59]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        attr(&mut b, "dataWindow", "box2i", &window);
        b.push(0);
        assert_eq!(exr_size(&b), Some((81, 60)));
        assert_eq!(exr_size(&b[..30]), None);
    }
}
