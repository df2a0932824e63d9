//! Unit tests of Blender runtimes: a job goes to a runtime that reads its
//! scene (by the version in the scene's header, or `--blender`), and a scene
//! no Blender of the farm reads is refused or waits with the versions named.

use super::tests::{fixture, sub, Fixture};
use super::*;
use crate::model::runtime::{Runtime, Version};

/// A scene blob saved by the Blender whose header starts `header`.
fn scene(f: &Fixture, header: &[u8]) -> Digest {
    let mut bytes = header.to_vec();
    bytes.extend_from_slice(b" scene ... ENDB");
    // The rest of the ENDB block header: 5.0's large block header is longer.
    let rest = if header.starts_with(b"BLENDER17") {
        28
    } else {
        20
    };
    bytes.extend_from_slice(&vec![0; rest]);
    let d = Digest::of(&bytes);
    f.blobs.put(d, &bytes).unwrap();
    d
}

fn runtime(v: &str, kind: &str, features: &[&str]) -> Runtime {
    Runtime {
        version: Version::parse(v).unwrap(),
        kind: kind.into(),
        path: format!("/opt/{v}"),
        features: features.iter().map(|s| s.to_string()).collect(),
        devices: Vec::new(),
    }
}

fn worker(f: &Fixture, name: &str, runtimes: Vec<Runtime>) -> WorkerId {
    f.farm
        .register(Registration {
            name: name.into(),
            slots: 1,
            runtimes,
            ..Default::default()
        })
        .unwrap()
        .0
}

#[test]
fn a_scene_goes_to_a_runtime_that_reads_it_and_the_lease_names_it() {
    let f = fixture();
    let old = worker(&f, "old", vec![runtime("3.4.1", "blender", &[])]);
    let new = worker(
        &f,
        "new",
        vec![runtime("4.5.15", "bpy", &["openimagedenoise"])],
    );
    let s45 = scene(&f, b"BLENDER-v405");
    let job = f.farm.submit(sub(s45, "1", 1)).unwrap();
    assert_eq!(
        f.farm.job(job).unwrap().job.requirements.blender,
        Some(crate::model::runtime::VersionReq::SameMajor(4, 5))
    );
    assert!(f.farm.try_lease(&old, &HashSet::new()).unwrap().is_none());
    let a = f.farm.try_lease(&new, &HashSet::new()).unwrap().unwrap();
    assert_eq!(a.lease.job, job);
    assert_eq!(a.blender.map(|v| v.to_string()).as_deref(), Some("4.5.15"));
    // A 3.4 scene: by default the 3.4 line (4.x would convert it); asked
    // for 4.5, it goes to 4.5.
    let by_default = f.farm.submit(sub(f.scene, "1", 1)).unwrap();
    assert!(f.farm.try_lease(&new, &HashSet::new()).unwrap().is_none());
    let a = f.farm.try_lease(&old, &HashSet::new()).unwrap().unwrap();
    assert_eq!(a.lease.job, by_default);
    assert_eq!(a.blender.map(|v| v.to_string()).as_deref(), Some("3.4.1"));
    let mut asked = sub(f.scene, "1", 1);
    asked.blender = "4.5".into();
    let asked = f.farm.submit(asked).unwrap();
    let second_new = worker(&f, "new2", vec![runtime("4.5.15", "bpy", &[])]);
    let a = f
        .farm
        .try_lease(&second_new, &HashSet::new())
        .unwrap()
        .unwrap();
    assert_eq!(a.lease.job, asked);
}

#[test]
fn a_worker_with_several_runtimes_renders_with_the_one_that_has_what_the_job_needs() {
    let f = fixture();
    let both = worker(
        &f,
        "both",
        vec![
            runtime("3.4.1", "blender", &[]),
            runtime("3.6.9", "bpy", &["openimagedenoise"]),
        ],
    );
    let mut denoised = sub(f.scene, "1", 1);
    denoised.features = vec!["openimagedenoise".into()];
    f.farm.submit(denoised).unwrap();
    let a = f.farm.try_lease(&both, &HashSet::new()).unwrap().unwrap();
    assert_eq!(a.blender.map(|v| v.to_string()).as_deref(), Some("3.6.9"));
    let plain = f.farm.submit(sub(f.scene, "1", 1)).unwrap();
    let a = f.farm.try_lease(&both, &HashSet::new()).unwrap().unwrap();
    assert_eq!(a.lease.job, plain);
    // The newest runtime that fits.
    assert_eq!(a.blender.map(|v| v.to_string()).as_deref(), Some("3.6.9"));
}

#[test]
fn a_scene_newer_than_every_blender_is_refused_and_an_unserved_job_waits_with_the_versions() {
    let f = fixture();
    worker(&f, "old", vec![runtime("3.4.1", "blender", &[])]);
    worker(&f, "new", vec![runtime("4.5.15", "bpy", &[])]);
    let s50 = scene(&f, b"BLENDER17-01v0500");
    let e = f.farm.submit(sub(s50, "1", 1)).unwrap_err().to_string();
    assert!(
        e.contains("saved by Blender 5.0, newer than every Blender on the farm (4.5.15, 3.4.1)")
            && e.contains("--blender 5.0"),
        "{e}"
    );
    let mut asked = sub(f.scene, "1", 1);
    asked.blender = ">=4.6".into();
    let waiting = f.farm.submit(asked).unwrap();
    assert_eq!(
        f.farm.job(waiting).unwrap().waiting.as_deref(),
        Some("waiting: no available worker with a Blender >=4.6 (the farm's Blenders: 4.5.15, 3.4.1)")
    );
    let mut bad = sub(f.scene, "1", 1);
    bad.blender = "latest".into();
    let e = f.farm.submit(bad).unwrap_err().to_string();
    assert!(
        e.contains("`latest` is not a Blender version requirement"),
        "{e}"
    );
}

#[test]
fn a_farm_without_workers_refuses_no_version() {
    let f = fixture();
    let s50 = scene(&f, b"BLENDER17-01v0500");
    let job = f.farm.submit(sub(s50, "1", 1)).unwrap();
    assert!(f
        .farm
        .job(job)
        .unwrap()
        .waiting
        .unwrap()
        .contains("Blender ^5.0 (the farm's Blenders: none)"));
}
