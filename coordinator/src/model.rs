//! The domain model: the records the farm keeps (jobs, tasks, workers, what
//! their attempts cost, verification) and the value types they are made of
//! (frame sets, tile grids, hardware requirements, Blender runtimes, file
//! sets, preview settings). Pure data and the rules of their lifecycles: no
//! I/O, no locks, nothing above it (the farm, stores, adapters) is named here.

pub mod fileset;
pub mod frames;
pub mod hardware;
pub mod ids;
pub mod job;
pub mod output;
pub mod preview;
pub mod runtime;
pub mod task;
pub mod tiles;
pub mod usage;
pub mod verify;
pub mod worker;
