//! `tessera-chaos`: renders a job through a farm on PostgreSQL and S3 with
//! two coordinators and four workers while injecting random faults, then
//! checks every frame and every acknowledged completion, and prints the
//! figures. See `tessera_tests::chaos` and `scripts/chaos.sh`.

use std::time::Duration;

use clap::Parser;
use tessera_tests::chaos::{run, Fault, Options};

/// A chaos run against a real farm.
#[derive(Parser)]
struct Args {
    /// How long faults are injected, in seconds.
    #[arg(long, default_value_t = 300)]
    seconds: u64,
    /// Frames of the animation job.
    #[arg(long, default_value_t = 200)]
    frames: u32,
    /// Frames of the tiled job (2x2 tiles each).
    #[arg(long, default_value_t = 8)]
    tiled_frames: u32,
    /// Workers.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Seed of the fault schedule: the same seed repeats a run's faults.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Faults to choose from, comma-separated (default: all).
    #[arg(long, value_delimiter = ',', value_parser = Fault::parse)]
    faults: Vec<Fault>,
    /// Keep the farm's files here (logs, outputs) instead of a temporary
    /// directory.
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
}

fn main() {
    let a = Args::parse();
    let opts = Options {
        duration: Duration::from_secs(a.seconds),
        frames: a.frames,
        tiled_frames: a.tiled_frames,
        workers: a.workers,
        seed: a.seed,
        faults: if a.faults.is_empty() {
            Fault::ALL.to_vec()
        } else {
            a.faults
        },
        dir: a.dir,
    };
    let report = run(&opts);
    println!("{report}");
    println!("chaos run passed: every frame exact, every acknowledged completion stored once");
}
