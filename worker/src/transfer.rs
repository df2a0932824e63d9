//! Moving blobs to and from a coordinator: streamed in 1 MiB chunks, hashed
//! with blake3 on the way. Used by workers (scenes in, frames out) and by the
//! CLI (scenes out, frames in). A small result is read whole instead
//! ([`read_small`]) and travels inside the worker's Complete call.

use std::path::Path;

use crate::connect::Conn;
use tessera_proto as pb;
use tokio::io::AsyncWriteExt;

use crate::error::Error;

/// Chunk size for uploads.
const CHUNK: usize = 1 << 20;

/// The blake3 digest (hex) and size of a file.
pub async fn hash_file(path: &Path) -> Result<(String, u64), Error> {
    let hashed = read_small(path, None).await?;
    Ok((hashed.digest, hashed.size))
}

/// A file hashed, with its bytes when it was small enough to keep.
#[derive(Debug)]
pub struct Hashed {
    /// Its blake3 digest (hex).
    pub digest: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its bytes, when it holds at most the bytes asked to keep.
    pub bytes: Option<Vec<u8>>,
}

/// Hashes `path`, keeping its bytes when it holds at most `keep` bytes (a
/// result small enough to send inside Complete). The file is read once:
/// the bytes kept are the bytes hashed, even if it changes meanwhile.
pub async fn read_small(path: &Path, keep: Option<u64>) -> Result<Hashed, Error> {
    use std::io::Read;
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let cannot_read = |e| Error::io(format!("cannot read {}", path.display()), e);
        let mut hasher = blake3::Hasher::new();
        let file = std::fs::File::open(&path)
            .map_err(|e| Error::io(format!("cannot open {}", path.display()), e))?;
        // Wide reads: blake3 hashes many 1 KiB chunks at once (SIMD lanes).
        let mut reader = std::io::BufReader::with_capacity(1 << 18, file);
        let mut head = Vec::new();
        if let Some(keep) = keep {
            // One byte past the limit tells a file too large to keep.
            (&mut reader)
                .take(keep.saturating_add(1))
                .read_to_end(&mut head)
                .map_err(cannot_read)?;
            hasher.update(&head);
        }
        let rest = std::io::copy(&mut reader, &mut hasher).map_err(cannot_read)?;
        let size = head.len() as u64 + rest;
        let small = keep.is_some_and(|keep| size <= keep);
        Ok(Hashed {
            digest: hasher.finalize().to_hex().to_string(),
            size,
            bytes: small.then_some(head),
        })
    })
    .await
    .expect("hashing task")
}

/// Uploads `path` unless the coordinator already has `digest`. Returns the
/// number of bytes sent (0 when it was already there).
pub async fn upload_file(
    blobs: &mut pb::blobs_client::BlobsClient<Conn>,
    path: &Path,
    digest: &str,
    size: u64,
) -> Result<u64, Error> {
    let missing = blobs
        .missing_blobs(pb::MissingBlobsRequest {
            digests: vec![digest.to_string()],
        })
        .await?
        .into_inner()
        .missing;
    if missing.is_empty() {
        return Ok(0);
    }
    put_file(blobs, path, digest, size).await
}

/// Uploads `path` as blob `digest` (of `size` bytes) without asking first
/// whether the coordinator has it. Returns the bytes sent.
pub async fn put_file(
    blobs: &mut pb::blobs_client::BlobsClient<Conn>,
    path: &Path,
    digest: &str,
    size: u64,
) -> Result<u64, Error> {
    let file = std::fs::File::open(path)
        .map_err(|e| Error::io(format!("cannot open {}", path.display()), e))?;
    let (tx, rx) = tokio::sync::mpsc::channel::<pb::BlobChunk>(4);
    let digest_owned = digest.to_string();
    let display = path.display().to_string();
    // Plain reads on a blocking thread, straight into each chunk's buffer:
    // one copy out of the page cache, and no hop to the runtime per chunk.
    let reader = tokio::task::spawn_blocking(move || {
        use std::io::Read;
        let mut file = file;
        let mut first = true;
        loop {
            let mut buf = Vec::with_capacity(CHUNK);
            let n = (&mut file)
                .take(CHUNK as u64)
                .read_to_end(&mut buf)
                .map_err(|e| Error::io(format!("cannot read {display}"), e))?;
            if n == 0 && !first {
                break;
            }
            let chunk = pb::BlobChunk {
                digest: if first {
                    digest_owned.clone()
                } else {
                    String::new()
                },
                size,
                data: buf,
            };
            first = false;
            if tx.blocking_send(chunk).is_err() || n < CHUNK {
                break;
            }
        }
        Ok::<(), Error>(())
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    let sent = blobs
        .put_blob(crate::deadline::request(
            stream,
            crate::deadline::upload(size),
        ))
        .await;
    reader.await.expect("upload reader")?;
    sent?;
    Ok(size)
}

/// Downloads blob `digest` to `dest` (written to a temporary file beside it,
/// verified, then renamed). A blob the disk has no room for is refused as
/// [`Error::NoSpace`] before its first byte is written, or when the disk
/// fills during the write; either way the temporary file is removed, so
/// nothing half-written is left under any name.
pub async fn download_file(
    blobs: &mut pb::blobs_client::BlobsClient<Conn>,
    digest: &str,
    dest: &Path,
) -> Result<u64, Error> {
    let dir = dest.parent().unwrap_or(Path::new("."));
    let tmp = tempfile::NamedTempFile::new_in(dir)
        .map_err(|e| Error::io(format!("cannot write to {}", dir.display()), e))?;
    let (file, tmp_path) = tmp.into_parts();
    let mut file = tokio::fs::File::from_std(file);
    let mut hasher = blake3::Hasher::new();
    let mut stream = blobs
        .get_blob(pb::GetBlobRequest {
            digest: digest.to_string(),
        })
        .await?
        .into_inner();
    let mut bytes = 0u64;
    let mut size = 0;
    let no_space = |needed: u64| Error::NoSpace {
        dir: dir.display().to_string(),
        what: format!("blob {}", &digest[..digest.len().min(12)]),
        needed,
        free: crate::disk::free_bytes(dir).unwrap_or(0),
        evicted: 0,
    };
    let written = |e: std::io::Error, size: u64| {
        if full(&e) {
            no_space(size)
        } else {
            Error::io(format!("cannot write {}", dest.display()), e)
        }
    };
    while let Some(chunk) = stream.message().await? {
        if bytes == 0 {
            size = chunk.size;
            let free = crate::disk::free_bytes(dir).unwrap_or(u64::MAX);
            if free < size.saturating_add(crate::disk::MARGIN) {
                return Err(no_space(size));
            }
        }
        hasher.update(&chunk.data);
        bytes += chunk.data.len() as u64;
        file.write_all(&chunk.data)
            .await
            .map_err(|e| written(e, size))?;
    }
    file.flush().await.map_err(|e| written(e, size))?;
    file.sync_all().await.map_err(|e| written(e, size))?;
    drop(file);
    let got = hasher.finalize().to_hex().to_string();
    if got != digest {
        return Err(Error::Corrupt {
            expected: digest.to_string(),
            got,
        });
    }
    tmp_path
        .persist(dest)
        .map_err(|e| Error::io(format!("cannot write {}", dest.display()), e.error))?;
    Ok(bytes)
}

/// Whether a write failed because the disk is full.
fn full(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::StorageFull || e.raw_os_error() == Some(libc::ENOSPC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn read_small_keeps_the_bytes_of_a_file_within_the_limit_only() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, len: usize| {
            let path = dir.path().join(name);
            let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            std::fs::write(&path, &bytes).unwrap();
            (path, blake3::hash(&bytes).to_hex().to_string(), bytes)
        };
        for (len, keep, kept) in [
            (0, Some(0), true),
            (10, Some(10), true),
            (11, Some(10), false),
            (3 << 20, Some(1 << 20), false),
            (10, None, false),
        ] {
            let (path, digest, bytes) = file(&format!("f{len}-{keep:?}"), len);
            let h = read_small(&path, keep).await.unwrap();
            assert_eq!((h.digest.as_str(), h.size), (digest.as_str(), len as u64));
            assert_eq!(h.bytes, kept.then_some(bytes), "{len} bytes, keep {keep:?}");
            assert_eq!(hash_file(&path).await.unwrap(), (digest, len as u64));
        }
    }
}
