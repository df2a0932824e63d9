use super::*;
use crate::digest::Digest;

fn cand(worker: &str, bytes: &[&str]) -> Candidate {
    Candidate {
        worker: WorkerId(worker.into()),
        blender: "Blender 3.4.1".into(),
        outputs: bytes
            .iter()
            .enumerate()
            .map(|(i, b)| FrameOutput {
                frame: i as u32 + 1,
                digest: Digest::of(b.as_bytes()),
                ext: "png".into(),
                size: b.len() as u64,
                pass: String::new(),
            })
            .collect(),
        stats: Vec::new(),
    }
}

#[test]
fn two_equal_results_agree_and_one_waits() {
    assert_eq!(resolve(&[]), Resolution::NeedMore);
    assert_eq!(resolve(&[cand("a", &["x"])]), Resolution::NeedMore);
    assert_eq!(
        resolve(&[cand("a", &["x", "y"]), cand("b", &["x", "y"])]),
        Resolution::Agreed {
            agreeing: vec![0, 1],
            odd: vec![]
        }
    );
}

#[test]
fn outputs_compare_whatever_their_order() {
    let mut b = cand("b", &["x", "y"]);
    b.outputs.reverse();
    assert!(matches!(
        resolve(&[cand("a", &["x", "y"]), b]),
        Resolution::Agreed { .. }
    ));
}

#[test]
fn a_mismatch_needs_a_third_worker_which_finds_the_odd_one() {
    let a = cand("a", &["x", "y"]);
    let bad = cand("bad", &["x", "Y"]);
    assert_eq!(resolve(&[a.clone(), bad.clone()]), Resolution::Disputed);
    // The third agrees with the first: the second is odd, wherever it is.
    let c = cand("c", &["x", "y"]);
    assert_eq!(
        resolve(&[a.clone(), bad.clone(), c.clone()]),
        Resolution::Agreed {
            agreeing: vec![0, 2],
            odd: vec![1]
        }
    );
    assert_eq!(
        resolve(&[bad.clone(), a.clone(), c.clone()]),
        Resolution::Agreed {
            agreeing: vec![1, 2],
            odd: vec![0]
        }
    );
    // No two agree: more workers, up to MAX_RENDERS, then it cannot be settled.
    let all: Vec<Candidate> = (0..MAX_RENDERS)
        .map(|i| cand(&format!("w{i}"), &[&format!("v{i}")]))
        .collect();
    assert_eq!(resolve(&all[..3]), Resolution::Disputed);
    assert_eq!(resolve(&all), Resolution::Unsettled);
}

#[test]
fn sampling_is_reproducible_and_near_its_fraction() {
    let job = JobId(42);
    let pick = |seed: u64, fraction: f64| -> Vec<u32> {
        (0..2000)
            .filter(|&t| sampled(seed, job, t, 2000, fraction))
            .collect()
    };
    assert_eq!(pick(1, 0.05), pick(1, 0.05), "same seed, same choice");
    assert_ne!(pick(1, 0.05), pick(2, 0.05), "another seed, another choice");
    let n = pick(1, 0.05).len();
    assert!((60..=140).contains(&n), "{n} of 2000 at 5 %");
    assert_eq!(pick(1, 1.0).len(), 2000);
    assert!(pick(1, 0.0).is_empty());
    assert!(!sampled(1, job, 0, 0, 0.5));
}

#[test]
fn every_job_with_verify_gets_at_least_one_task() {
    for id in 1..200 {
        for tasks in [1, 2, 7] {
            let n = (0..tasks)
                .filter(|&t| sampled(DEFAULT_SEED, JobId(id), t, tasks, 1e-9))
                .count();
            assert!(n >= 1, "job {id} of {tasks} tasks has none");
        }
    }
}

#[test]
fn untrusted_sampling_has_no_anchor() {
    let n = (0..1000)
        .filter(|&t| sampled_untrusted(DEFAULT_SEED, JobId(1), t, 0.0))
        .count();
    assert_eq!(n, 0);
    let n = (0..1000)
        .filter(|&t| sampled_untrusted(DEFAULT_SEED, JobId(1), t, 0.5))
        .count();
    assert!((400..=600).contains(&n), "{n}");
}

#[test]
fn fractions_outside_zero_to_one_are_refused() {
    assert_eq!(check_fraction("verify", 0.05).unwrap(), 0.05);
    for bad in [-0.1, 1.5, f64::NAN, f64::INFINITY] {
        let e = check_fraction("verify", bad).unwrap_err().to_string();
        assert!(e.contains("from 0 to 1"), "{e}");
    }
}
