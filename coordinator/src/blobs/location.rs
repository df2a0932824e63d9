//! Where a coordinator keeps its blobs: `--blobs SPEC` (or `$TESSERA_BLOBS`).
//!
//! - nothing: `DATA/blobs`, a directory beside the metadata (the default);
//! - a path: that directory ([`FsBlobStore`]);
//! - `s3://bucket/prefix`: an S3-compatible bucket ([`S3BlobStore`]), with
//!   the endpoint and credentials of the standard AWS environment variables
//!   or the AWS config files. It is checked at once, so a coordinator with a
//!   wrong bucket, bad credentials or an unreachable endpoint refuses to start.

use std::path::Path;
use std::sync::Arc;

use crate::blobs::s3::S3BlobStore;
use crate::blobs::{BlobStore, FsBlobStore};
use crate::error::Error;

/// Opens the blob store `spec` names (empty: `data_dir/blobs`), refusing
/// uploads over `max_blob` bytes.
pub fn open(spec: &str, data_dir: &Path, max_blob: u64) -> Result<Arc<dyn BlobStore>, Error> {
    let spec = spec.trim();
    if spec.is_empty() {
        return Ok(Arc::new(
            FsBlobStore::open(&data_dir.join("blobs"), max_blob)?.in_data_dir(data_dir),
        ));
    }
    if spec.starts_with("s3://") {
        return Ok(Arc::new(S3BlobStore::open(spec, max_blob)?));
    }
    if let Some((scheme, _)) = spec.split_once("://") {
        return Err(Error::invalid(format!(
            "--blobs {spec}: {scheme}:// is not a blob store Tessera knows; give a directory or s3://bucket/prefix"
        )));
    }
    Ok(Arc::new(FsBlobStore::open(Path::new(spec), max_blob)?))
}

/// A short description of `spec` for logs: where the blobs are.
pub fn describe(spec: &str, data_dir: &Path) -> String {
    match spec.trim() {
        "" => data_dir.join("blobs").display().to_string(),
        s => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::Digest;

    #[test]
    fn a_directory_or_the_default_opens_a_file_store() {
        let dir = tempfile::tempdir().unwrap();
        let d = Digest::of(b"x");
        let default = open("", dir.path(), 1 << 20).unwrap();
        default.put(d, b"x").unwrap();
        default.make_durable().unwrap();
        assert!(dir.path().join("blobs").join(&d.to_hex()[..2]).is_dir());
        let elsewhere = dir.path().join("elsewhere");
        let store = open(elsewhere.to_str().unwrap(), dir.path(), 1 << 20).unwrap();
        assert!(!store.contains(&d));
        store.put(d, b"x").unwrap();
        store.make_durable().unwrap();
        assert!(elsewhere.join(&d.to_hex()[..2]).is_dir());
    }

    #[test]
    fn unknown_schemes_and_bad_buckets_are_refused_with_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let e = open("gs://bucket/x", dir.path(), 1).err().unwrap();
        assert!(e.to_string().contains("s3://bucket/prefix"), "{e}");
        let e = open("s3://No_Such", dir.path(), 1).err().unwrap();
        assert!(e.to_string().contains("bucket name"), "{e}");
    }
}
