//! Results carried inside Complete: a worker sends a small result file's
//! bytes in `FrameOutput.data` instead of uploading it with PutBlob first,
//! which saves a round trip per frame. The bytes are checked against the
//! digest and size the output claims and stored through the blob store
//! before the result is recorded, so the rest of Complete finds them as it
//! finds uploaded blobs: stored by the results' sync thread and made
//! durable there, with the uploads, in one group sync
//! ([`Farm::results_durable`](crate::farm::Farm::results_durable)) before
//! the result's change is queued.

use tessera_proto as pb;

use crate::error::Error;
use crate::farm::Carried;

/// The largest result file accepted inline, in bytes (advertised in
/// `RegisterResponse.inline_result_max`). Small frames (tiles, previews,
/// test renders) save their PutBlob round trip; a larger file streams with
/// PutBlob, where it is never held whole in memory.
pub const INLINE_RESULT_MAX: u64 = 256 << 10;

/// The most inline bytes one Complete may carry, all its outputs together
/// (`RegisterResponse.inline_complete_max`). The Work service accepts
/// messages this much larger than `--max-message-mib`.
pub const INLINE_COMPLETE_MAX: u64 = 2 << 20;

/// Takes the inline bytes out of `outputs` (leaving them as outputs naming
/// blobs), refusing any over [`INLINE_RESULT_MAX`], all of them over
/// [`INLINE_COMPLETE_MAX`], or bytes whose length is not the claimed size.
/// Their digests are checked where they are stored, off the runtime
/// ([`Farm::results_durable`](crate::farm::Farm::results_durable)).
pub fn take(outputs: &mut [pb::FrameOutput]) -> Result<Vec<Carried>, Error> {
    let mut inline = Vec::new();
    let mut total = 0u64;
    for o in outputs.iter_mut() {
        let Some(bytes) = o.data.take() else {
            continue;
        };
        let what = match o.pass.as_str() {
            "" => format!("frame {}", o.frame),
            pass => format!("frame {} (pass {pass})", o.frame),
        };
        let len = bytes.len() as u64;
        if len > INLINE_RESULT_MAX {
            return Err(Error::invalid(format!(
                "{what}: {len} bytes sent inline, more than the {INLINE_RESULT_MAX} this coordinator accepts inline; upload the file with PutBlob and report its digest without data"
            )));
        }
        if len != o.size {
            return Err(Error::invalid(format!(
                "{what}: {len} bytes sent inline, but the output claims size {}; report the size of the bytes sent",
                o.size
            )));
        }
        total += len;
        if total > INLINE_COMPLETE_MAX {
            return Err(Error::invalid(format!(
                "the result carries more than {INLINE_COMPLETE_MAX} bytes inline, the most one Complete may; upload the larger files with PutBlob"
            )));
        }
        let digest = crate::adapters::convert::digest("digest", &o.digest)?;
        inline.push(Carried {
            what,
            digest,
            bytes,
        });
    }
    Ok(inline)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::Digest;

    fn output(frame: u32, bytes: &[u8]) -> pb::FrameOutput {
        pb::FrameOutput {
            frame,
            digest: Digest::of(bytes).to_hex(),
            ext: "png".into(),
            size: bytes.len() as u64,
            pass: String::new(),
            data: Some(bytes.to_vec()),
        }
    }

    #[test]
    fn take_leaves_outputs_naming_blobs() {
        let mut outputs = vec![
            output(1, b"one"),
            output(2, b""),
            pb::FrameOutput {
                data: None,
                ..output(3, b"uploaded")
            },
        ];
        let inline = take(&mut outputs).unwrap();
        assert!(outputs.iter().all(|o| o.data.is_none()));
        assert_eq!(
            Carried::digests(&inline),
            vec![Digest::of(b"one"), Digest::of(b"")],
            "an empty file travels inline too; an uploaded one does not"
        );
        assert!(inline.iter().all(|i| i.verify().is_ok()));
    }

    #[test]
    fn take_refuses_what_the_limits_or_the_size_do_not_allow() {
        let big = vec![7u8; INLINE_RESULT_MAX as usize + 1];
        let e = take(&mut [output(4, &big)]).unwrap_err().to_string();
        assert!(e.contains("frame 4") && e.contains("PutBlob"), "{e}");

        let most = vec![7u8; INLINE_RESULT_MAX as usize];
        let n = (INLINE_COMPLETE_MAX / INLINE_RESULT_MAX) as u32;
        let mut fit: Vec<_> = (0..n).map(|f| output(f, &most)).collect();
        assert_eq!(take(&mut fit).unwrap().len(), n as usize);
        let mut over: Vec<_> = (0..=n).map(|f| output(f, &most)).collect();
        let e = take(&mut over).unwrap_err().to_string();
        assert!(e.contains("one Complete"), "{e}");

        let mut short = output(5, b"abc");
        short.size = 4;
        let e = take(&mut [short]).unwrap_err().to_string();
        assert!(e.contains("frame 5") && e.contains("size 4"), "{e}");
    }

    #[test]
    fn bytes_that_do_not_hash_to_the_digest_are_refused() {
        let mut wrong = output(6, b"abc");
        wrong.pass = "Image0006.png".into();
        wrong.digest = Digest::of(b"abd").to_hex();
        let inline = take(&mut [wrong]).unwrap();
        let e = inline[0].verify().unwrap_err();
        assert!(matches!(e, Error::Invalid(_)));
        assert!(
            e.to_string().contains("frame 6 (pass Image0006.png)"),
            "{e}"
        );
    }
}
