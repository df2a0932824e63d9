//! Warm Blender sessions end to end: one Blender process serves many renders
//! of a job, with output identical to plain renders.

use std::time::Duration;

use serde_json::json;
use tessera_tests::*;

const LONG: Duration = Duration::from_secs(300);

#[test]
fn one_session_renders_frames_and_tiles_of_a_job_in_one_process_exactly() {
    let scene = scene(&[
        "--kind",
        "anim",
        "--width",
        "64",
        "--height",
        "48",
        "--samples",
        "16",
        "--adaptive",
        "--frames",
        "3",
    ]);
    let dir = scratch();
    let coord = Coordinator::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let w = worker(&coord.url, dir.path(), "a");
    let whole = dir.path().join("whole");
    cli_ok(
        &coord.url,
        &[
            "submit",
            scene.to_str().unwrap(),
            "--frames",
            "1-3",
            "--wait",
            "-o",
            whole.to_str().unwrap(),
        ],
    );
    let tiled = dir.path().join("tiled");
    cli_ok(
        &coord.url,
        &[
            "submit",
            scene.to_str().unwrap(),
            "--frames",
            "1-3",
            "--tiles",
            "2x1",
            "--wait",
            "-o",
            tiled.to_str().unwrap(),
        ],
    );

    let log = w.log();
    let started = pids_in_log(&log, "Blender session started");
    assert_eq!(started.len(), 2, "one session per job:\n{log}");
    let job1: Vec<u32> = pids_in_log(&log, "rendered in warm session job=1");
    let job2: Vec<u32> = pids_in_log(&log, "rendered in warm session job=2");
    assert_eq!(job1.len(), 3, "three frames:\n{log}");
    assert_eq!(job2.len(), 6, "three frames of two tiles:\n{log}");
    assert!(
        job1.iter().all(|p| *p == started[0]),
        "job 1 in one process:\n{log}"
    );
    assert!(
        job2.iter().all(|p| *p == started[1]),
        "job 2 in one process:\n{log}"
    );
    // Job 1's session closed as soon as the job ended, before job 2 began.
    assert!(
        log.contains("ending Blender session: its job ended job=1"),
        "{log}"
    );

    let refs = dir.path().join("refs");
    reference(&scene, 1, 3, &refs);
    for n in 1..=3 {
        let want = refs.join(format!("ref_{n:04}.png"));
        assert_same_pixels(&whole.join(format!("frame_{n:04}.png")), &want);
        assert_same_pixels(&tiled.join(format!("frame_{n:04}.png")), &want);
    }
}

#[test]
fn a_killed_blender_fails_or_requeues_its_task_and_the_slot_starts_afresh() {
    let scene = scene(&[
        "--kind",
        "anim",
        "--width",
        "160",
        "--height",
        "120",
        "--samples",
        "64",
        "--frames",
        "6",
    ]);
    let dir = scratch();
    let coord = Coordinator::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let w = worker(&coord.url, dir.path(), "a");
    let job = submit(&coord.url, &scene, &["--frames", "1-6"]);
    wait_for(&coord.url, job, LONG, "a first frame", |j| {
        j["frames_done"].as_u64().unwrap() >= 1
    });
    let first = pids_in_log(&w.log(), "Blender session started")[0];
    assert!(process_alive(first));
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &first.to_string()])
        .status();
    let done = wait_for(&coord.url, job, LONG, "the job to end", |j| {
        j["state"] == "done" || j["state"] == "failed"
    });
    assert_eq!(done["state"], "done", "{done:#}");
    assert_eq!(done["frames_done"], 6);
    let log = w.log();
    let started = pids_in_log(&log, "Blender session started");
    assert!(
        started.len() >= 2 && started[1] != first,
        "a fresh session after the kill:\n{log}"
    );
}

#[test]
fn a_scene_with_a_missing_texture_fails_naming_the_file() {
    let scene = scene(&[
        "--kind",
        "still",
        "--missing-texture",
        "/nonexistent/textures/wood_diffuse.png",
        "--frames",
        "1",
    ]);
    let dir = scratch();
    let coord = Coordinator::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let _w = worker(&coord.url, dir.path(), "a");
    // The submit itself refuses, naming the file and how the scene refers to it.
    let refused = cli(
        &coord.url,
        &["submit", scene.to_str().unwrap(), "--frames", "1-3"],
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.contains("/nonexistent/textures/wood_diffuse.png") && stderr.contains("MissingTex"),
        "{stderr}"
    );
    // Submitted anyway, the session is the last line of defence: Blender
    // would render magenta and exit 0, the worker fails the job instead.
    let job = submit(&coord.url, &scene, &["--frames", "1-3", "--allow-missing"]);
    let failed = wait_for(&coord.url, job, LONG, "the job to end", |j| {
        j["state"] == "failed" || j["state"] == "done"
    });
    assert_eq!(
        failed["state"], "failed",
        "Blender would render magenta and exit 0: {failed:#}"
    );
    let message = failed["message"].as_str().unwrap();
    assert!(
        message.contains("/nonexistent/textures/wood_diffuse.png"),
        "{message}"
    );
    assert!(
        message.contains("cannot be rendered anywhere"),
        "no retries for a missing file: {message}"
    );
}

#[test]
fn cancelling_a_job_ends_its_sessions_on_every_worker_within_seconds() {
    let scene = scene(&[
        "--kind",
        "anim",
        "--width",
        "64",
        "--height",
        "48",
        "--samples",
        "8",
        "--frames",
        "40",
    ]);
    let dir = scratch();
    let coord = Coordinator::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let a = worker(&coord.url, dir.path(), "a");
    let b = worker(&coord.url, dir.path(), "b");
    let job = submit(&coord.url, &scene, &["--frames", "1-40"]);
    assert!(
        eventually(LONG, || {
            !pids_in_log(&a.log(), "Blender session started").is_empty()
                && !pids_in_log(&b.log(), "Blender session started").is_empty()
        }),
        "both workers start a session"
    );
    let pids: Vec<u32> = [&a, &b]
        .iter()
        .flat_map(|w| pids_in_log(&w.log(), "Blender session started"))
        .collect();
    assert!(pids.iter().any(|p| process_alive(*p)));
    cli_ok(&coord.url, &["cancel", &job.to_string()]);
    assert!(
        eventually(Duration::from_secs(5), || pids
            .iter()
            .all(|p| !process_alive(*p))),
        "sessions still running 5 s after the cancel: {pids:?}\na:\n{}\nb:\n{}",
        a.log(),
        b.log()
    );
    let status = status(&coord.url, job);
    assert_eq!(status["state"], "canceled");
}

/// `blender/session.py` started as the worker starts it (`-- --reply-fd 3`,
/// fd 3 a pipe read here, Blender's stdout apart), answering a clear `error`
/// to each malformed command, with the command's id when it had one, and
/// rendering the next good command: no Python traceback, no exit.
#[test]
fn session_py_answers_malformed_commands_with_clear_errors_and_keeps_serving() {
    use std::io::{BufRead, BufReader, Write};
    let scene = tiny_scene("still", 1, 1);
    let dir = scratch();
    let log = dir.path().join("blender.log");
    let script = root().join("blender/session.py");
    let mut child = std::process::Command::new("bash")
        .arg("-c")
        // fd 3: the replies, onto this test's pipe; Blender's stdout to the log.
        .arg(r#"exec "$@" 3>&1 1>&2"#)
        .arg("bash")
        .arg(blender())
        .args(["-b", "--factory-startup", "--disable-autoexec"])
        .arg(&scene)
        .args(["--python-exit-code", "3", "--python"])
        .arg(&script)
        .args(["--", "--reply-fd", "3", "--cycles-device", "CPU"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut replies = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = || -> serde_json::Value {
        let line = replies
            .next()
            .unwrap_or_else(|| {
                panic!(
                    "the session ended:\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                )
            })
            .unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    };
    assert_eq!(next()["event"], "ready");
    let out = dir.path().join("out");
    let out = out.to_str().unwrap();
    let malformed: [(String, serde_json::Value, &[&str]); 10] = [
        ("render frame 1".into(), json!(null), &["bad JSON command"]),
        ("[1, 2]".into(), json!(null), &["must be a JSON object"]),
        (
            r#"{"cmd": "paint", "id": 1}"#.into(),
            json!(1),
            &["unknown cmd \"paint\"", "the commands are quit, render"],
        ),
        (
            // Only a spare session opens a scene, as its first line.
            json!({"cmd": "open", "scene": "/x.blend", "scene_python": false}).to_string(),
            json!(null),
            &["unknown cmd \"open\"", "the commands are quit, render"],
        ),
        (
            json!({"cmd": "render", "id": 2, "output_dir": out}).to_string(),
            json!(2),
            &["render: missing field 'frame' (an integer)"],
        ),
        (
            json!({"cmd": "render", "id": 3, "frame": "one", "output_dir": out}).to_string(),
            json!(3),
            &["render: 'frame' must be an integer, got \"one\""],
        ),
        (
            json!({"cmd": "render", "id": 4, "frame": 1, "output_dir": "out"}).to_string(),
            json!(4),
            &["'output_dir' must be an absolute path"],
        ),
        (
            json!({"cmd": "render", "id": 5, "frame": 1, "output_dir": out, "tile": {"border": [0, 1]}})
                .to_string(),
            json!(5),
            &["'tile' must be null or {border:"],
        ),
        (
            json!({"cmd": "render", "id": 6, "frame": 1, "output_dir": out, "colour": "red"})
                .to_string(),
            json!(6),
            &["unknown field(s) 'colour'", "it takes id, frame, output_dir, threads, tile"],
        ),
        (
            json!({"cmd": "render", "id": "seven", "frame": 1, "output_dir": out}).to_string(),
            json!(null),
            &["'id' must be a non-negative integer"],
        ),
    ];
    for (line, id, words) in malformed {
        writeln!(stdin, "{line}").unwrap();
        let reply = next();
        assert_eq!(reply["event"], "error", "{line}: {reply}");
        assert_eq!(reply["id"], id, "{line}: {reply}");
        let error = reply["error"].as_str().unwrap();
        for w in words {
            assert!(error.contains(w), "{line}: {error:?} does not say {w:?}");
        }
        assert!(!error.contains('\n'), "one line: {error:?}");
    }
    // Still serving: a good command renders.
    let good = json!({"cmd": "render", "id": 10, "frame": 1, "output_dir": out, "threads": 1, "tile": null});
    writeln!(stdin, "{good}").unwrap();
    let done = loop {
        let r = next();
        if r["event"] != "progress" {
            break r;
        }
    };
    assert_eq!(done["event"], "done", "{done}");
    assert_eq!(done["id"], 10);
    assert!(std::path::Path::new(done["path"].as_str().unwrap()).is_file());
    writeln!(stdin, r#"{{"cmd": "quit"}}"#).unwrap();
    let status = child.wait().unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "{status}:\n{text}");
    assert!(!text.contains("Traceback"), "a traceback:\n{text}");
    // The end of the load's output marked once on stdout and once on
    // stderr, after what Blender printed while loading (C's buffered
    // stdout included), before anything a render printed: the worker reads
    // up to the marks instead of waiting a fixed time.
    let mark = "\u{1b}tessera-loaded\n";
    assert_eq!(text.matches(mark).count(), 2, "two marks:\n{text}");
    let read = text.find("Read blend").expect("Blender says what it read");
    let first = text.find(mark).unwrap();
    assert!(read < first, "the load's output before the marks:\n{text}");
    assert!(
        !text[..text.rfind(mark).unwrap()].contains("Fra:1"),
        "a render's output after the marks:\n{text}"
    );
}

/// A spare session (started with no scene) whose first line is not a
/// readable `open`, or names a file Blender cannot read, exits with status
/// 1 and says why, as a failed load from the command line does.
#[test]
fn a_spare_session_that_cannot_open_its_scene_exits_1_saying_why() {
    use std::io::Write;
    let dir = scratch();
    let missing = dir.path().join("missing.blend");
    let cases = [
        (
            json!({"cmd": "render", "id": 1, "frame": 1, "output_dir": "/o"}).to_string(),
            "Error: a spare session's first line must be `open`: unknown cmd \"render\"; the commands are open",
        ),
        (
            json!({"cmd": "open", "scene": "relative.blend", "scene_python": false}).to_string(),
            "open: 'scene' must be an absolute path",
        ),
        (
            json!({"cmd": "open", "scene": missing, "scene_python": false}).to_string(),
            "Error: Cannot read file",
        ),
    ];
    for (line, says) in cases {
        let mut child = std::process::Command::new(blender())
            .args(["-b", "--factory-startup", "--disable-autoexec"])
            .args(["--python-exit-code", "3", "--python"])
            .arg(root().join("blender/session.py"))
            .args(["--", "--reply-fd", "2", "--spare"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        writeln!(child.stdin.take().unwrap(), "{line}").unwrap();
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{line}:\n{text}");
        assert!(
            text.contains(says),
            "{line}: does not say {says:?}:\n{text}"
        );
        assert!(!text.contains("Traceback"), "{line}:\n{text}");
    }
}

/// The processes whose parent is `pid`.
fn children(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let child: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).ok()?;
        // pid (comm) state ppid ...: the comm may hold spaces.
        let ppid: u32 = stat
            .rsplit(')')
            .next()?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        (ppid == pid && process_alive(child)).then_some(child)
    })
    .collect()
}

#[test]
fn an_idle_slot_keeps_a_spare_blender_that_renders_the_next_jobs_first_task_exactly() {
    let scene = scene(&[
        "--kind",
        "anim",
        "--width",
        "64",
        "--height",
        "48",
        "--samples",
        "16",
        "--frames",
        "2",
    ]);
    let dir = scratch();
    let coord = Coordinator::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let mut w = worker(&coord.url, dir.path(), "a");
    let spares = |w: &Proc| pids_in_log(&w.log(), "spare Blender started");
    // Before any job, the idle slot has a Blender of its own, waiting.
    assert!(
        eventually(Duration::from_secs(30), || !spares(&w).is_empty()),
        "no spare Blender on the idle slot:\n{}",
        w.log()
    );
    let first = spares(&w)[0];
    assert_eq!(children(w.child.id()), vec![first], "{}", w.log());

    let out = |n: u32| dir.path().join(format!("out{n}"));
    let submit_wait = |frame: &str, to: &std::path::Path| {
        let (scene, to) = (scene.to_str().unwrap(), to.to_str().unwrap());
        cli_ok(
            &coord.url,
            &["submit", scene, "--frames", frame, "--wait", "-o", to],
        );
    };
    submit_wait("1", &out(1));
    let log = w.log();
    let started = pids_in_log(&log, "Blender session started");
    assert_eq!(
        started,
        vec![first],
        "the spare took the job's scene:\n{log}"
    );
    assert!(log.contains("spare=true"), "{log}");

    // The job's session ends with the job; a new spare takes its place once
    // the slot has been idle a while, and serves the next job.
    assert!(
        eventually(Duration::from_secs(30), || spares(&w).len() == 2
            && !process_alive(first)),
        "no second spare, or the first session still runs:\n{}",
        w.log()
    );
    let second = spares(&w)[1];
    assert_ne!(second, first);
    submit_wait("2", &out(2));
    let started = pids_in_log(&w.log(), "Blender session started");
    assert_eq!(started, vec![first, second], "{}", w.log());

    let refs = dir.path().join("refs");
    reference(&scene, 1, 2, &refs);
    for n in 1..=2 {
        assert_same_pixels(
            &out(n).join(format!("frame_{n:04}.png")),
            &refs.join(format!("ref_{n:04}.png")),
        );
    }
    w.term();
    assert!(
        eventually(Duration::from_secs(20), || !w.alive()),
        "{}",
        w.log()
    );
    assert!(
        eventually(Duration::from_secs(5), || !spares(&w)
            .into_iter()
            .any(process_alive)),
        "a spare Blender outlived its worker"
    );

    // With --no-spare-blender, an idle slot holds no process.
    let mut bare = worker_with(&coord.url, dir.path(), "b", &["--no-spare-blender"]);
    assert!(
        eventually(Duration::from_secs(30), || bare
            .log()
            .contains("registered")),
        "{}",
        bare.log()
    );
    // A spare would start before the worker registers, and again once its
    // slot had been idle for a second: none comes in three.
    assert!(
        !eventually(Duration::from_secs(3), || {
            !children(bare.child.id()).is_empty() || !spares(&bare).is_empty()
        }),
        "{}",
        bare.log()
    );
    bare.kill9();
}

#[test]
fn with_fresh_process_each_task_gets_a_blender_started_while_the_last_one_rendered() {
    let scene = scene(&[
        "--kind",
        "anim",
        "--width",
        "64",
        "--height",
        "48",
        "--samples",
        "16",
        "--frames",
        "3",
    ]);
    let dir = scratch();
    let coord = Coordinator::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let w = worker_with(&coord.url, dir.path(), "a", &["--fresh-process"]);
    let out = dir.path().join("out");
    let (scene_arg, out_arg) = (scene.to_str().unwrap(), out.to_str().unwrap());
    cli_ok(
        &coord.url,
        &[
            "submit", scene_arg, "--frames", "1-3", "--chunk", "1", "--wait", "-o", out_arg,
        ],
    );
    let log = w.log();
    let started = pids_in_log(&log, "Blender session started");
    let mut distinct = started.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(
        (started.len(), distinct.len()),
        (3, 3),
        "one Blender per task:\n{log}"
    );
    // Each task's Blender was a spare: the first started with the worker,
    // each later one while the task before it rendered.
    assert_eq!(log.matches("spare=true").count(), 3, "{log}");
    let line_of = |what: &str, pid: u32| {
        log.lines()
            .position(|l| l.contains(what) && l.contains(&format!("pid={pid}")))
            .unwrap_or_else(|| panic!("no {what:?} line for pid {pid}:\n{log}"))
    };
    for pair in started.windows(2) {
        assert!(
            line_of("spare Blender started", pair[1])
                < line_of("rendered in warm session", pair[0]),
            "Blender {} started only after task of {} rendered:\n{log}",
            pair[1],
            pair[0]
        );
    }
    let refs = dir.path().join("refs");
    reference(&scene, 1, 3, &refs);
    for n in 1..=3 {
        assert_same_pixels(
            &out.join(format!("frame_{n:04}.png")),
            &refs.join(format!("ref_{n:04}.png")),
        );
    }
}

#[test]
fn a_slot_moving_to_another_job_finds_its_blender_started_while_the_last_task_rendered() {
    let scene_a = scene(&[
        "--kind",
        "anim",
        "--width",
        "64",
        "--height",
        "48",
        "--samples",
        "16",
        "--frames",
        "2",
    ]);
    let scene_b = scene(&["--kind", "still", "--width", "64", "--height", "48"]);
    let dir = scratch();
    let coord = Coordinator::start(&dir.path().join("data"), "127.0.0.1:0", &[]);
    // Both jobs wait before the worker comes: its one slot renders one,
    // then the other, leasing the other's task ahead while it renders.
    let a = submit(&coord.url, &scene_a, &["--frames", "1-2", "--chunk", "1"]);
    let b = submit(&coord.url, &scene_b, &["--frames", "1"]);
    let w = worker(&coord.url, dir.path(), "a");
    for job in [a, b] {
        let done = wait_for(&coord.url, job, Duration::from_secs(120), "the job", |j| {
            j["state"] == "done" || j["state"] == "failed"
        });
        assert_eq!(done["state"], "done", "{done:#}\n{}", w.log());
    }
    let log = w.log();
    // A session for each job the slot moved to (two or three: the order of
    // the two jobs' tasks is the coordinator's), each in a Blender started
    // before its task: the first with the worker, each later one while the
    // task before it rendered, when the next task was leased ahead.
    let started = pids_in_log(&log, "Blender session started");
    assert!(started.len() >= 2, "{log}");
    assert_eq!(
        log.matches("spare=true").count(),
        started.len(),
        "a Blender started only when its task came:\n{log}"
    );
    assert!(!log.contains("asks for another Blender"), "{log}");
    fetch_exact(&coord.url, b, &scene_b, 1..=1, dir.path());
}
