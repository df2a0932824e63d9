//! One behaviour for every [`MetaStore`]: the cases every store must pass.
//!
//! The coordinator's unit tests run them against [`super::MemoryStore`] and
//! [`super::SledStore`]; `tests/tests/postgres.rs` runs them against
//! [`super::PgStore`] on a real PostgreSQL server. A failed case panics with
//! the case's name.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::{ArchivedJob, ArchivedSummary, MetaStore, Record};
use crate::auth::{Role, UserRecord};
use crate::digest::Digest;
use crate::error::Error;
use crate::model::job::{Job, JobId, JobState};
use crate::model::task::{FrameOutput, Task, TaskState};
use crate::model::worker::{WorkerId, WorkerRecord};

/// Opens the stores the cases run against.
pub trait Opener {
    /// A fresh, empty store for the case named `case`.
    fn fresh(&mut self, case: &str) -> Result<Arc<dyn MetaStore>, Error>;
    /// The store of `case` opened again; the case has dropped every handle
    /// to it first.
    fn reopen(&mut self, case: &str) -> Result<Arc<dyn MetaStore>, Error>;
}

type Case = fn(&mut dyn Opener, &str);

/// Every case, by name.
pub const CASES: &[(&str, Case)] = &[
    ("records_survive_reopen", records_survive_reopen),
    ("last_write_in_a_batch_wins", last_write_in_a_batch_wins),
    ("orphan_tasks_are_dropped", orphan_tasks_are_dropped),
    ("grants_are_a_set", grants_are_a_set),
    ("users_come_and_go", users_come_and_go),
    (
        "archive_keeps_summary_and_outputs",
        archive_keeps_summary_and_outputs,
    ),
    (
        "delete_forgets_and_spends_the_id",
        delete_forgets_and_spends_the_id,
    ),
    (
        "stitched_frames_attach_sorted",
        stitched_frames_attach_sorted,
    ),
    ("purge_frees_tasks_and_frames", purge_frees_tasks_and_frames),
];

/// Runs every case, each on a fresh store.
pub fn run_all(opener: &mut dyn Opener) {
    for (name, case) in CASES {
        case(opener, name);
    }
}

fn open(o: &mut dyn Opener, case: &str, fresh: bool) -> Arc<dyn MetaStore> {
    let r = if fresh { o.fresh(case) } else { o.reopen(case) };
    r.unwrap_or_else(|e| panic!("{case}: cannot open the store: {e}"))
}

fn write(s: &dyn MetaStore, case: &str, records: &[Record<'_>]) {
    s.write(records)
        .unwrap_or_else(|e| panic!("{case}: write failed: {e}"));
}

/// A job record for the cases.
pub fn job(id: u64) -> Job {
    Job {
        id: JobId(id),
        scene: Digest::of(b"scene"),
        scene_name: "s.blend".into(),
        frames: "1-2".into(),
        frame_count: 2,
        chunk: 1,
        priority: 0,
        max_attempts: 3,
        task_count: 2,
        state: JobState::Queued,
        message: String::new(),
        created_ms: 1,
        finished_ms: None,
        grid: crate::model::tiles::Grid::WHOLE,
        overscan: 0,
        width: 0,
        height: 0,
        stitched: Default::default(),
        requirements: Default::default(),
        failures_by_worker: Default::default(),
        owner: "alice".into(),
        file_set: None,
        missing_files: Vec::new(),
        // Pipeline fields round-trip like the rest.
        after: Vec::new(),
        max_cost: Some(12.5),
        capacity: crate::model::usage::CapacityPref::OnDemandOnly,
        started: true,
        preview: Default::default(),
        verify: 0.25,
        warnings: vec!["driver `x` needs auto-run Python".into()],
    }
}

fn worker(id: &str) -> WorkerRecord {
    WorkerRecord {
        id: WorkerId(id.into()),
        name: format!("host-{id}"),
        slots: 2,
        device: "cpu".into(),
        blender_version: "Blender 3.4.1".into(),
        cpu_cores: 8,
        registered_ms: 5,
        last_seen_ms: 6,
        tasks_done: 3,
        tasks_failed: 1,
        gpus: Vec::new(),
        slot_caps: Vec::new(),
        tags: vec!["studio".into()],
        memory_bytes: 1 << 30,
        notes: Vec::new(),
        features: Vec::new(),
        runtimes: Vec::new(),
        owner: "render".into(),
        price_per_hour: 2.1,
        capacity: crate::model::usage::Capacity::Spot,
        untrusted: true,
        suspect: Vec::new(),
    }
}

fn user(name: &str, role: Role) -> UserRecord {
    UserRecord {
        name: name.into(),
        role,
        token_hash: format!("hash-of-{name}"),
        created_ms: 9,
    }
}

fn frame(f: u32) -> FrameOutput {
    FrameOutput {
        frame: f,
        digest: Digest::of(format!("frame {f}").as_bytes()),
        ext: "png".into(),
        size: 100 + u64::from(f),
        pass: String::new(),
    }
}

fn as_json<T: serde::Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).expect("records serialise")
}

fn records_survive_reopen(o: &mut dyn Opener, case: &str) {
    {
        let s = open(o, case, true);
        let j = job(7);
        let t0 = Task::new(JobId(7), 0, vec![1]);
        let mut t1 = Task::new(JobId(7), 1, vec![2]);
        t1.lease(&WorkerId("w1".into()), 1000, 30_000)
            .expect("a queued task leases");
        write(
            &*s,
            case,
            &[
                Record::Task(&t1),
                Record::Task(&t0),
                Record::Worker(&worker("w1")),
                Record::User(&user("alice", Role::User)),
                Record::Job(&j),
            ],
        );
    }
    let s = open(o, case, false);
    let snap = s.load().unwrap_or_else(|e| panic!("{case}: load: {e}"));
    assert_eq!(snap.jobs.len(), 1, "{case}");
    assert_eq!(snap.jobs[&JobId(7)], job(7), "{case}: the job as written");
    let tasks = &snap.tasks[&JobId(7)];
    assert_eq!(
        tasks.iter().map(|t| t.index).collect::<Vec<_>>(),
        vec![0, 1],
        "{case}: tasks sorted by index"
    );
    assert!(
        matches!(&tasks[1].state, TaskState::Leased { worker, expires_ms: 31_000, .. } if worker.0 == "w1"),
        "{case}: the lease is stored: {:?}",
        tasks[1].state
    );
    assert_eq!(
        as_json(&snap.workers[&WorkerId("w1".into())]),
        as_json(&worker("w1")),
        "{case}"
    );
    assert_eq!(
        as_json(&snap.users["alice"]),
        as_json(&user("alice", Role::User)),
        "{case}"
    );
    assert_eq!(snap.next_job, 0, "{case}: nothing deleted yet");
}

fn last_write_in_a_batch_wins(o: &mut dyn Opener, case: &str) {
    let s = open(o, case, true);
    let mut a = job(1);
    let mut b = a.clone();
    a.priority = 1;
    b.priority = 2;
    let t = Task::new(JobId(1), 0, vec![1]);
    let mut t2 = t.clone();
    t2.failures = 2;
    write(
        &*s,
        case,
        &[
            Record::Job(&a),
            Record::Task(&t),
            Record::Task(&t2),
            Record::Job(&b),
            Record::User(&user("bob", Role::User)),
            Record::RemoveUser("bob"),
        ],
    );
    let snap = s.load().unwrap_or_else(|e| panic!("{case}: load: {e}"));
    assert_eq!(snap.jobs[&JobId(1)].priority, 2, "{case}");
    assert_eq!(snap.tasks[&JobId(1)].len(), 1, "{case}");
    assert_eq!(snap.tasks[&JobId(1)][0].failures, 2, "{case}");
    assert!(!snap.users.contains_key("bob"), "{case}: removed last");
}

fn orphan_tasks_are_dropped(o: &mut dyn Opener, case: &str) {
    let s = open(o, case, true);
    write(&*s, case, &[Record::Task(&Task::new(JobId(8), 0, vec![1]))]);
    let snap = s.load().unwrap_or_else(|e| panic!("{case}: load: {e}"));
    assert!(snap.tasks.is_empty(), "{case}: a task without its job");
}

fn grants_are_a_set(o: &mut dyn Opener, case: &str) {
    let (a, b) = (Digest::of(b"a"), Digest::of(b"b"));
    {
        let s = open(o, case, true);
        write(
            &*s,
            case,
            &[Record::Grant("alice", a), Record::Grant("bob.b-1", b)],
        );
        write(&*s, case, &[Record::Grant("alice", a)]);
    }
    let s = open(o, case, false);
    let want: BTreeSet<(String, Digest)> =
        [("alice".to_string(), a), ("bob.b-1".to_string(), b)].into();
    assert_eq!(
        s.load().unwrap_or_else(|e| panic!("{case}: {e}")).grants,
        want,
        "{case}"
    );
}

fn users_come_and_go(o: &mut dyn Opener, case: &str) {
    let s = open(o, case, true);
    write(
        &*s,
        case,
        &[
            Record::User(&user("root", Role::Admin)),
            Record::User(&user("carol", Role::Worker)),
        ],
    );
    write(&*s, case, &[Record::RemoveUser("carol")]);
    let snap = s.load().unwrap_or_else(|e| panic!("{case}: {e}"));
    assert_eq!(
        snap.users.keys().cloned().collect::<Vec<_>>(),
        vec!["root".to_string()],
        "{case}"
    );
    assert_eq!(snap.users["root"].role, Role::Admin, "{case}");
}

fn archived(id: u64) -> ArchivedJob {
    let mut j = job(id);
    j.state = JobState::Done;
    ArchivedJob {
        summary: ArchivedSummary {
            job: j,
            counts: Default::default(),
            usage: Default::default(),
        },
        blobs: vec![Digest::of(b"scene"), frame(1).digest],
        outputs: vec![frame(1), frame(2)],
    }
}

fn archive_keeps_summary_and_outputs(o: &mut dyn Opener, case: &str) {
    {
        let s = open(o, case, true);
        let j = job(3);
        write(
            &*s,
            case,
            &[
                Record::Job(&j),
                Record::Task(&Task::new(JobId(3), 0, vec![1])),
            ],
        );
        write(&*s, case, &[Record::Archive(&archived(3))]);
    }
    let s = open(o, case, false);
    let snap = s.load().unwrap_or_else(|e| panic!("{case}: {e}"));
    assert!(snap.jobs.is_empty(), "{case}: the job record went");
    assert!(snap.tasks.is_empty(), "{case}: its tasks are ignored");
    let a = &snap.archived[&JobId(3)];
    assert_eq!(a.summary.job.state, JobState::Done, "{case}");
    assert_eq!(a.blobs, archived(3).blobs, "{case}");
    assert!(a.outputs.is_empty(), "{case}: outputs are read on demand");
    let one = s
        .load_archived(JobId(3))
        .unwrap_or_else(|e| panic!("{case}: {e}"))
        .unwrap_or_else(|| panic!("{case}: archived job 3 is there"));
    assert_eq!(one.summary.job.id, JobId(3), "{case}");
    assert!(
        s.load_archived(JobId(4))
            .unwrap_or_else(|e| panic!("{case}: {e}"))
            .is_none(),
        "{case}"
    );
    assert_eq!(
        s.archived_outputs(JobId(3))
            .unwrap_or_else(|e| panic!("{case}: {e}")),
        vec![frame(1), frame(2)],
        "{case}"
    );
    assert!(
        s.archived_outputs(JobId(4))
            .unwrap_or_else(|e| panic!("{case}: {e}"))
            .is_empty(),
        "{case}"
    );
}

fn delete_forgets_and_spends_the_id(o: &mut dyn Opener, case: &str) {
    {
        let s = open(o, case, true);
        write(&*s, case, &[Record::Job(&job(5)), Record::Job(&job(2))]);
        write(&*s, case, &[Record::Archive(&archived(9))]);
        write(
            &*s,
            case,
            &[Record::Delete(JobId(5)), Record::Delete(JobId(9))],
        );
        // A lower id deleted later never lowers the next id.
        write(&*s, case, &[Record::Delete(JobId(2))]);
    }
    let s = open(o, case, false);
    let snap = s.load().unwrap_or_else(|e| panic!("{case}: {e}"));
    assert!(snap.jobs.is_empty(), "{case}");
    assert!(snap.archived.is_empty(), "{case}");
    assert_eq!(snap.next_job, 10, "{case}: ids of deleted jobs are spent");
    assert!(
        s.archived_outputs(JobId(9))
            .unwrap_or_else(|e| panic!("{case}: {e}"))
            .is_empty(),
        "{case}"
    );
}

fn stitched_frames_attach_sorted(o: &mut dyn Opener, case: &str) {
    {
        let s = open(o, case, true);
        let mut j = job(4);
        // The job's own copy is never what is stored.
        j.stitched = Arc::new(vec![frame(7)]);
        write(
            &*s,
            case,
            &[
                Record::Job(&j),
                Record::Stitched(j.id, &frame(9)),
                Record::Stitched(j.id, &frame(5)),
                Record::Stitched(JobId(99), &frame(1)),
            ],
        );
    }
    let s = open(o, case, false);
    let snap = s.load().unwrap_or_else(|e| panic!("{case}: {e}"));
    let frames: Vec<u32> = snap.jobs[&JobId(4)]
        .stitched
        .iter()
        .map(|f| f.frame)
        .collect();
    assert_eq!(frames, vec![5, 9], "{case}: records of their own, sorted");
}

fn purge_frees_tasks_and_frames(o: &mut dyn Opener, case: &str) {
    let s = open(o, case, true);
    let j = job(6);
    write(
        &*s,
        case,
        &[
            Record::Job(&j),
            Record::Task(&Task::new(JobId(6), 0, vec![1])),
            Record::Task(&Task::new(JobId(6), 1, vec![2])),
            Record::Stitched(j.id, &frame(1)),
            Record::Job(&job(7)),
            Record::Task(&Task::new(JobId(7), 0, vec![1])),
        ],
    );
    write(&*s, case, &[Record::Delete(JobId(6))]);
    s.purge_tasks(JobId(6))
        .unwrap_or_else(|e| panic!("{case}: purge: {e}"));
    // Written again under the same id, the job has no leftovers.
    write(&*s, case, &[Record::Job(&j)]);
    let snap = s.load().unwrap_or_else(|e| panic!("{case}: {e}"));
    assert!(!snap.tasks.contains_key(&JobId(6)), "{case}: tasks purged");
    assert!(
        snap.jobs[&JobId(6)].stitched.is_empty(),
        "{case}: frames purged"
    );
    assert_eq!(snap.tasks[&JobId(7)].len(), 1, "{case}: other jobs kept");
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::store::{MemoryStore, SledStore};

    /// Memory stores by case; reopening returns the same one.
    #[derive(Default)]
    struct MemoryOpener(BTreeMap<String, Arc<MemoryStore>>);

    impl Opener for MemoryOpener {
        fn fresh(&mut self, case: &str) -> Result<Arc<dyn MetaStore>, Error> {
            let s = Arc::new(MemoryStore::default());
            self.0.insert(case.into(), s.clone());
            Ok(s)
        }
        fn reopen(&mut self, case: &str) -> Result<Arc<dyn MetaStore>, Error> {
            Ok(self.0[case].clone())
        }
    }

    /// Sled stores under one directory, a database per case.
    struct SledOpener(tempfile::TempDir);

    impl Opener for SledOpener {
        fn fresh(&mut self, case: &str) -> Result<Arc<dyn MetaStore>, Error> {
            Ok(Arc::new(SledStore::open(&self.0.path().join(case))?))
        }
        fn reopen(&mut self, case: &str) -> Result<Arc<dyn MetaStore>, Error> {
            self.fresh(case)
        }
    }

    #[test]
    fn the_store_suite_passes_on_memory() {
        run_all(&mut MemoryOpener::default());
    }

    #[test]
    fn the_store_suite_passes_on_sled() {
        run_all(&mut SledOpener(tempfile::tempdir().unwrap()));
    }
}
