//! Recognising Blender files by their first bytes, before anything is uploaded
//! or rendered.

/// How a `.blend` file is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlendKind {
    /// Plain: `BLENDER` then pointer size, endianness and a 3-digit version.
    Plain,
    /// gzip-compressed (Blender before 3.0).
    Gzip,
    /// zstd-compressed (Blender 3.0 and later).
    Zstd,
}

/// Why bytes are not a Blender file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotBlend {
    /// Too short to hold a header.
    #[error("is empty or truncated ({0} bytes); re-save it in Blender")]
    TooShort(usize),
    /// A header that is not Blender's.
    #[error("is not a Blender file (bad header); re-save it in Blender as a .blend file")]
    BadHeader,
    /// A plain .blend without its closing `ENDB` block: cut short.
    #[error("is truncated (no ENDB block at its end); copy or save it again")]
    Truncated,
}

/// Bytes of the file's end that [`check_end`] needs.
pub const TAIL: usize = 24;

/// Checks that a plain `.blend` ends with its `ENDB` block, given the file's
/// first bytes and its last [`TAIL`] bytes (or fewer, for a tiny file).
/// Compressed files are not checked here (their end is compressed too).
pub fn check_end(head: &[u8], tail: &[u8]) -> Result<(), NotBlend> {
    if sniff(head)? != BlendKind::Plain {
        return Ok(());
    }
    // The ENDB block header is code (4), length (4), old pointer (4 or 8),
    // SDNA index (4) and count (4): 24 bytes with 8-byte pointers, 20 with 4.
    let header = if head[7] == b'-' { 24 } else { 20 };
    if tail.len() < header || &tail[tail.len() - header..tail.len() - header + 4] != b"ENDB" {
        return Err(NotBlend::Truncated);
    }
    Ok(())
}

/// Looks at the first bytes of a file (12 are enough) and says what it is.
pub fn sniff(head: &[u8]) -> Result<BlendKind, NotBlend> {
    if head.starts_with(&[0x1f, 0x8b]) && head.len() >= 12 {
        return Ok(BlendKind::Gzip);
    }
    if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) && head.len() >= 12 {
        return Ok(BlendKind::Zstd);
    }
    if head.len() < 12 {
        return Err(NotBlend::TooShort(head.len()));
    }
    let ok = head.starts_with(b"BLENDER")
        && matches!(head[7], b'_' | b'-')
        && matches!(head[8], b'v' | b'V')
        && head[9..12].iter().all(u8::is_ascii_digit);
    if ok {
        Ok(BlendKind::Plain)
    } else {
        Err(NotBlend::BadHeader)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers() {
        assert_eq!(sniff(b"BLENDER-v304REND"), Ok(BlendKind::Plain));
        assert_eq!(sniff(b"BLENDER_V279xxxx"), Ok(BlendKind::Plain));
        assert_eq!(
            sniff(&[0x28, 0xb5, 0x2f, 0xfd, 0, 0, 0, 0, 0, 0, 0, 0]),
            Ok(BlendKind::Zstd)
        );
        assert_eq!(
            sniff(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
            Ok(BlendKind::Gzip)
        );
        assert_eq!(sniff(b""), Err(NotBlend::TooShort(0)));
        assert_eq!(sniff(b"BLENDER-v3"), Err(NotBlend::TooShort(10)));
        assert_eq!(sniff(b"BLENDER-x304...."), Err(NotBlend::BadHeader));
        assert_eq!(sniff(b"\x89PNG\r\n\x1a\n0000"), Err(NotBlend::BadHeader));
        assert!(NotBlend::BadHeader
            .to_string()
            .contains("re-save it in Blender"));
    }

    #[test]
    fn the_end_block() {
        let head = b"BLENDER-v304";
        let mut whole = b"....ENDB".to_vec();
        whole.extend_from_slice(&[0; 20]);
        assert_eq!(check_end(head, &whole[whole.len() - TAIL..]), Ok(()));
        assert_eq!(
            check_end(head, &whole[..whole.len() - 1]),
            Err(NotBlend::Truncated)
        );
        assert_eq!(check_end(head, b"ENDB"), Err(NotBlend::Truncated));
        let mut small = b"ENDB".to_vec();
        small.extend_from_slice(&[0; 16]);
        assert_eq!(check_end(b"BLENDER_v279", &small), Ok(()));
        assert_eq!(
            check_end(&[0x28, 0xb5, 0x2f, 0xfd, 0, 0, 0, 0, 0, 0, 0, 0], b""),
            Ok(())
        );
    }
}
