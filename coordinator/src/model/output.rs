//! What a task delivers: its rendered frames and passes, as blobs.

use serde::{Deserialize, Serialize};

use crate::digest::Digest;

/// One rendered frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrameOutput {
    /// Frame number.
    pub frame: u32,
    /// Its blob.
    pub digest: Digest,
    /// File extension without the dot.
    pub ext: String,
    /// Size in bytes.
    pub size: u64,
    /// Empty for the frame itself; for an extra output (a File Output
    /// node's pass), its file name relative to the task's output folder.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pass: String,
}
