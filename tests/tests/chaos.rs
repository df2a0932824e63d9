//! The short chaos run (about a minute of faults): see
//! `tessera_tests::chaos`. `scripts/chaos.sh` runs the long one.

use std::time::Duration;

use tessera_tests::chaos::{run, Options};

#[test]
fn a_farm_under_a_minute_of_faults_keeps_every_acknowledged_frame() {
    if tessera_tests::postgres::PgServer::start_or_skip("chaos").is_none()
        || tessera_tests::s3::s3_or_skip("chaos").is_none()
    {
        return;
    }
    let report = run(&Options {
        duration: Duration::from_secs(60),
        frames: 60,
        tiled_frames: 4,
        seed: 7,
        ..Options::default()
    });
    eprintln!("{report}");
    assert!(
        report.injected.values().sum::<u32>() >= 5,
        "a minute of chaos injects faults: {report}"
    );
}
