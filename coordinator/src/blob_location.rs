//! Where a coordinator keeps its blobs, from `--blobs`: a local directory
//! (shared by an active and a standby coordinator, e.g. on one volume), or
//! by default `DATA/blobs`.

use std::path::Path;
use std::sync::Arc;

use crate::blob_store::{BlobStore, FsBlobStore};
use crate::error::Error;

/// Opens the blob store `spec` names (empty: `data_dir/blobs`), refusing
/// uploads over `max_blob` bytes.
pub fn open(spec: &str, data_dir: &Path, max_blob: u64) -> Result<Arc<dyn BlobStore>, Error> {
    if spec.is_empty() {
        return Ok(Arc::new(FsBlobStore::open(
            &data_dir.join("blobs"),
            max_blob,
        )?));
    }
    if let Some((scheme, _)) = spec.split_once("://") {
        return Err(Error::invalid(format!(
            "--blobs {spec}: {scheme}:// storage is not supported by this build; give a local directory"
        )));
    }
    Ok(Arc::new(FsBlobStore::open(Path::new(spec), max_blob)?))
}
