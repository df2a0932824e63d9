//! The Tessera worker: leases tasks from a coordinator and renders them with
//! Blender.
//!
//! # Layout
//! - [`agent`]: registration and the per-slot lease loop.
//! - [`connect`]: one channel to the coordinator(s): address list, token, TLS, deadline.
//! - [`failover`]: several coordinator addresses, moving on from a silent or standby one.
//! - [`deadline`]: every call's deadline, and how long each kind of call gets.
//! - [`blender`]: render requests and results, the `Renderer` trait, reading Blender's output.
//! - [`slots`]: one slot per GPU, CPU slots, declared GPUs for tests.
//! - [`session`]: Blender sessions, warm per job and slot (or one per task).
//! - [`verify`]: whether a frame is one Blender really rendered for the task.
//! - [`failure`]: who could fix a failed render (the failure's scope), and how.
//! - [`isolation`]: Blender's command line and environment; hiding the worker's memory.
//! - [`scene_python`]: stored Python Blender did not run (auto-run off), as job warnings.
//! - [`metadata`]: Blender's volatile stamps taken out of images, read into render stats.
//! - [`passes`]: extra outputs of a frame (File Output nodes) and their names.
//! - [`cache`]: the scene cache, keyed by blake3 digest.
//! - [`disk`]: free space on the worker's disks, and the margin downloads leave.
//! - [`capabilities`]: the names of what a Blender can render (denoiser, OSL, EEVEE).
//! - [`runtime`]: Blender runtimes (a binary, or the `bpy` module): running, installing, probing.
//! - `corrupt`: TESTS ONLY (feature `test-hooks`): a worker that changes one pixel of its frames.
//! - [`fileset`]: job roots built from file sets, and the bounded file cache.
//! - [`transfer`]: streaming blobs to and from a coordinator (also used by the CLI).
//! - [`gpu`]: probing the machine's GPUs (Vulkan) and their telemetry (NVML).
//! - [`image_size`]: reading image sizes from PNG and OpenEXR headers.
//! - [`error`]: the worker's error type.

pub mod agent;
pub mod blender;
pub mod cache;
pub mod capabilities;
pub mod connect;
#[cfg(feature = "test-hooks")]
pub mod corrupt;
pub mod deadline;
pub mod disk;
pub mod error;
pub mod failover;
pub mod failure;
pub mod fileset;
pub mod gpu;
pub mod image_size;
pub mod isolation;
pub mod metadata;
pub mod output_size;
pub mod passes;
pub mod runtime;
pub mod scene_python;
pub mod session;
pub mod session_protocol;
pub mod slots;
pub mod transfer;
pub mod verify;

pub use error::Error;
