//! The coordinator under load from the load generator (`tessera_tests::load`):
//! a burst of concurrent completions from fake workers over real gRPC, cut
//! by SIGKILL. Acknowledged means stored: every completion the coordinator
//! answered Ok before it died is a done task after it restarts, and its
//! result's bytes are whole under their address in the blob store, whether
//! they came inline in the Complete call or by PutBlob before it.

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use tessera_proto::TaskState;
use tessera_tests::load::setup::{put_blob, submit, task_states, worker_tokens};
use tessera_tests::load::{Fleet, FleetConfig, Target};
use tessera_tests::*;

/// Tasks in the job: enough that the kill lands long before the end.
const TASKS: u32 = 4000;

#[test]
fn every_acknowledged_completion_survives_a_sigkill_mid_burst() {
    survives_a_sigkill_mid_burst(false);
}

#[test]
fn every_acknowledged_uploaded_result_survives_a_sigkill_mid_burst() {
    survives_a_sigkill_mid_burst(true);
}

/// A burst of completions cut by SIGKILL; with `uploaded`, every result is
/// uploaded with PutBlob before its Complete, else carried inside it.
fn survives_a_sigkill_mid_burst(uploaded: bool) {
    let scene = std::fs::read(scene(&["--kind", "still", "--frames", "1"])).unwrap();
    let dir = scratch();
    let data = dir.path().join("data");
    let mut coord = Coordinator::start(&data, "127.0.0.1:0", &[]);
    let target = Target {
        url: coord.url.clone(),
        admin_token: coord.admin_token(),
        metrics: None,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let minute = Duration::from_secs(60);
    // 50 fake workers x 2 slots, no render time: nearly every slot is always
    // in an Upload or a Complete, so Completes are always in flight.
    let (job, fleet) = rt.block_on(async {
        let tokens = worker_tokens(&target, 1).await.unwrap();
        let digest = put_blob(&target.url, &target.admin_token, scene)
            .await
            .unwrap();
        let (job, _) = submit(&target, &digest, TASKS, minute).await.unwrap();
        let cfg = FleetConfig {
            workers: 50,
            slots: 2,
            render: Duration::ZERO,
            render_jitter: 0.0,
            progress_every: Duration::from_secs(1),
            lease_wait: Duration::from_secs(2),
            scene: digest,
            result_bytes: 64,
            put_blob: uploaded,
            lease_ahead: true,
        };
        (
            job,
            Fleet::start(&target.url, &tokens, cfg, minute)
                .await
                .unwrap(),
        )
    });
    let rec = fleet.recorder.clone();
    let start = Instant::now();
    let in_flight = loop {
        let n = rec.completes_in_flight.load(Relaxed);
        if rec.acked_count() >= u64::from(TASKS / 5) && n >= 10 {
            break n;
        }
        assert!(
            start.elapsed() < minute,
            "{} completions acknowledged in a minute ({n} in flight); last error: {:?}\n{}",
            rec.acked_count(),
            rec.last_error(),
            coord.proc.log()
        );
        std::thread::sleep(Duration::from_millis(1));
    };
    coord.proc.kill9();
    let rec = rt.block_on(fleet.stop());
    let acked = rec.acked();
    assert!(
        acked.len() < TASKS as usize * 9 / 10,
        "the kill came too late: {} of {TASKS} completions were acknowledged; make the job longer",
        acked.len()
    );

    let coord = Coordinator::start(&data, &coord.addr, &[]);
    let states = rt.block_on(task_states(&target, job)).unwrap_or_else(|e| {
        panic!("reading the job back: {e}\n{}", coord.proc.log());
    });
    assert_eq!(states.len(), TASKS as usize);
    let lost: Vec<_> = acked
        .iter()
        .filter(|a| a.job != job || states[a.task as usize] != TaskState::Done)
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged completions were not done after the restart \
         (killed with {in_flight} Completes in flight), e.g. leases {:?}",
        lost.len(),
        acked.len(),
        lost.iter().take(5).map(|a| &a.lease).collect::<Vec<_>>()
    );
    // The results' bytes: uploads wait off their address until the group
    // commit that stores their record makes them durable, and a restart
    // clears what waited, so a result missing here was acknowledged early.
    let blobs = data.join("blobs");
    let broken: Vec<String> = acked
        .iter()
        .flat_map(|a| &a.outputs)
        .filter(|d| {
            let bytes = std::fs::read(blobs.join(&d[..2]).join(&d[2..]));
            !matches!(bytes, Ok(b) if blake3::hash(&b).to_hex().as_str() == d.as_str())
        })
        .cloned()
        .collect();
    assert!(
        broken.is_empty(),
        "{} acknowledged results are missing or damaged in {} after the restart, e.g. {:?}",
        broken.len(),
        blobs.display(),
        &broken[..broken.len().min(3)]
    );
    assert!(acked.iter().all(|a| !a.outputs.is_empty()));
    let inline = rec.inline_results.load(Relaxed);
    if uploaded {
        assert_eq!(
            inline, 0,
            "results went inline despite FleetConfig::put_blob"
        );
    } else {
        assert!(
            inline >= acked.len() as u64 && rec.put_blob.all().is_empty(),
            "{inline} results inline for {} acknowledged completions; the coordinator should accept 64-byte results inline",
            acked.len()
        );
    }
    let done = states.iter().filter(|s| **s == TaskState::Done).count();
    assert!(
        done >= acked.len(),
        "{done} done, {} acknowledged",
        acked.len()
    );
    eprintln!(
        "{} completions acknowledged before the kill ({in_flight} in flight), {done} tasks done after the restart",
        acked.len()
    );
}
