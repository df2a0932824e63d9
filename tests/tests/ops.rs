//! Running a farm day to day: config files, alert rules, the Grafana
//! dashboard and a real Prometheus, against real coordinator and worker
//! processes.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use tessera_tests::*;

/// Starts `tessera coordinator ARGS` and returns it with the first lines it
/// prints (its gRPC address, then its metrics URL when it serves HTTP).
fn coordinator_with(dir: &Path, args: &[&str], lines: usize) -> (Proc, Vec<String>) {
    let log = dir.join("coordinator.log");
    let mut child = Command::new(tessera())
        .arg("coordinator")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut out = Vec::new();
    for _ in 0..lines {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        out.push(line.trim().to_string());
    }
    // Keep the pipe drained so the coordinator never blocks on stdout.
    std::thread::spawn(move || std::io::copy(&mut reader, &mut std::io::sink()));
    (Proc { child, log }, out)
}

/// Runs `tessera ARGS` in `dir` (a coordinator that does start makes its
/// data there) without the caller's farm in its environment.
fn run(dir: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(tessera())
        .args(args)
        .current_dir(dir)
        .env_remove("TESSERA_TOKEN")
        .env_remove("TESSERA_STORE")
        .env_remove("TESSERA_COORDINATOR")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A coordinator and a worker run from config files: the file's options take
/// effect, a flag overrides the file, and the worker's token comes from a
/// file named in its config.
#[test]
fn coordinator_and_worker_run_from_config_files() {
    let dir = scratch();
    let data = dir.path().join("data");
    let conf = dir.path().join("coordinator.toml");
    // Port 1 cannot be bound by an unprivileged test or is taken: the flag's
    // port 0 must win for the coordinator to start at all.
    std::fs::write(
        &conf,
        format!(
            "# a coordinator\nlisten = \"127.0.0.1:1\"\ndata = {:?}\nhttp = \"127.0.0.1:0\"\nlease_ttl = 20\nmax-tiles = 64\n",
            data.to_str().unwrap()
        ),
    )
    .unwrap();
    let (mut coord, lines) = coordinator_with(
        dir.path(),
        &[
            "--config",
            conf.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ],
        2,
    );
    assert!(
        lines[0].starts_with("tessera coordinator listening on 127.0.0.1:")
            && !lines[0].ends_with(":1"),
        "the flag's --listen wins over the file's: {lines:?}\n{}",
        coord.log()
    );
    // `http` came only from the file: the metrics endpoint is up.
    let metrics = lines[1]
        .strip_prefix("tessera coordinator metrics on ")
        .unwrap_or_else(|| panic!("the file's http = ... took effect: {lines:?}"))
        .to_string();
    let admin = std::fs::read_to_string(data.join("admin.token"))
        .expect("the file's data = ... is the data directory")
        .trim()
        .to_string();
    let (status, body) = http_get_as(&metrics, Some(&admin));
    assert!(status.contains("200"), "{status}");
    assert!(body.contains("tessera_workers"), "{body}");
    let addr = lines[0].rsplit(' ').next().unwrap().to_string();
    let url = format!("http://{addr}");

    // A worker token, in a file named by the worker's config.
    let out = Command::new(tessera())
        .args(["users", "add", "w", "--role", "worker"])
        .env("TESSERA_COORDINATOR", &url)
        .env("TESSERA_TOKEN", &admin)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token_path = dir.path().join("worker.token");
    std::fs::write(&token_path, &out.stdout).unwrap();
    let wconf = dir.path().join("worker.toml");
    std::fs::write(
        &wconf,
        format!(
            "coordinator = {url:?}\ntoken-file = {:?}\nname = \"from-file\"\nslots = 1\nthreads = 1\ndevice = \"cpu\"\ntag = [\"studio\", \"night\"]\ncache = {:?}\n",
            token_path.to_str().unwrap(),
            dir.path().join("cache").to_str().unwrap()
        ),
    )
    .unwrap();
    let wlog = dir.path().join("worker.log");
    let mut worker = Proc {
        child: Command::new(tessera())
            .args([
                "worker",
                "--config",
                wconf.to_str().unwrap(),
                "--name",
                "from-flag",
            ])
            .env_remove("TESSERA_TOKEN")
            .env_remove("TESSERA_COORDINATOR")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&wlog).unwrap())
            .spawn()
            .unwrap(),
        log: wlog,
    };
    let mut seen = None;
    let joined = eventually(Duration::from_secs(60), || {
        let out = Command::new(tessera())
            .args(["workers", "--json"])
            .env("TESSERA_COORDINATOR", &url)
            .env("TESSERA_TOKEN", &admin)
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        seen = v.as_array().and_then(|a| a.first().cloned());
        seen.is_some()
    });
    assert!(
        joined,
        "the worker joined with its file's token:\n{}",
        worker.log()
    );
    let w = seen.unwrap();
    assert_eq!(w["name"], "from-flag", "the flag's --name wins: {w}");
    assert_eq!(w["tags"], serde_json::json!(["studio", "night"]), "{w}");
    assert_eq!(w["slots"], 1, "{w}");
    worker.kill9();
    coord.kill9();
}

/// A mistake in a config file stops the service with the file, the line,
/// the key and what to write instead.
#[test]
fn config_file_mistakes_name_key_line_and_fix() {
    let dir = scratch();
    let conf = dir.path().join("c.toml");
    let cases = [
        (
            "listen = \"127.0.0.1:0\"\n\nlease-tll = 30\n",
            ":3: unknown key `lease-tll` for `tessera coordinator`; valid keys:",
        ),
        (
            "lease-ttl = \"30s\"\n",
            ":1: `lease-ttl` must be a number, not a string",
        ),
        (
            "http = 7879\n",
            ":1: `http` must be a quoted string, not a number",
        ),
        (
            "allow-plaintext = \"yes\"\n",
            ":1: `allow-plaintext` must be true or false",
        ),
        (
            "max-pixels = \"huge\"\n",
            ":1: invalid value 'huge' for '--max-pixels",
        ),
        (
            "token = \"secret\"\n",
            ":1: a token cannot be written in a config file",
        ),
        ("listen = \n", "is not valid TOML"),
    ];
    for (text, expected) in cases {
        std::fs::write(&conf, text).unwrap();
        let (ok, _, err) = run(
            dir.path(),
            &["coordinator", "--config", conf.to_str().unwrap()],
        );
        assert!(!ok, "{text:?} was accepted");
        assert!(
            err.contains(expected) && err.contains("c.toml"),
            "{text:?}: expected {expected:?} in:\n{err}"
        );
    }
    // The list of valid keys is the flags' own names.
    std::fs::write(&conf, "nope = 1\n").unwrap();
    let (_, _, err) = run(
        dir.path(),
        &["coordinator", "--config", conf.to_str().unwrap()],
    );
    for key in [
        "lease-ttl",
        "max-gpu-temp",
        "tls-cert",
        "store",
        "log-format",
    ] {
        assert!(err.contains(key), "{key} missing from: {err}");
    }
    let (ok, _, err) = run(dir.path(), &["worker", "--config", "/nonexistent/w.toml"]);
    assert!(
        !ok && err.contains("cannot read the config file /nonexistent/w.toml"),
        "{err}"
    );
}

/// `tessera config print` shows each option's value and source, in
/// precedence order flag > environment > file > default, with secrets hidden.
#[test]
fn config_print_shows_sources_and_hides_secrets() {
    let dir = scratch();
    let conf = dir.path().join("c.toml");
    std::fs::write(
        &conf,
        "lease-ttl = 12.5\nmax-tiles = 9\nstore = \"postgres://tessera:hunter2@db.example/farm\"\nblobs = \"/srv/from-file\"\n",
    )
    .unwrap();
    let out = Command::new(tessera())
        .args(["config", "print", "coordinator", "--config"])
        .arg(&conf)
        .args(["--max-tiles", "4"])
        .env("TESSERA_BLOBS", "/srv/from-env")
        .env_remove("TESSERA_STORE")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let line = |key: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{key} =")))
            .unwrap_or_else(|| panic!("no {key} in:\n{text}"))
            .to_string()
    };
    let file = conf.display().to_string();
    assert!(
        line("lease-ttl").contains("12.5") && line("lease-ttl").contains(&format!("file {file}:1")),
        "{text}"
    );
    assert!(
        line("max-tiles").contains("= 4") && line("max-tiles").ends_with("# flag"),
        "{text}"
    );
    assert!(
        line("blobs").contains("/srv/from-env") && line("blobs").contains("env $TESSERA_BLOBS"),
        "{text}"
    );
    assert!(
        line("max-gpu-temp").contains("= 90") && line("max-gpu-temp").ends_with("# default"),
        "{text}"
    );
    assert!(
        !text.contains("hunter2"),
        "the store's password is shown:\n{text}"
    );
    assert!(
        line("store").contains("postgres://tessera:<redacted>@db.example/farm"),
        "{text}"
    );
    // The output is itself a config file the coordinator accepts.
    let again = dir.path().join("printed.toml");
    std::fs::write(&again, &text).unwrap();
    let (ok, reprinted, err) = run(
        dir.path(),
        &[
            "config",
            "print",
            "coordinator",
            "--config",
            again.to_str().unwrap(),
        ],
    );
    assert!(ok, "{err}");
    assert!(reprinted.contains("max-tiles = 4"), "{reprinted}");

    // A token given in the environment is shown as redacted, never as itself.
    let out = Command::new(tessera())
        .args(["config", "print", "worker"])
        .env("TESSERA_TOKEN", "s3cr3t-token")
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(!text.contains("s3cr3t-token"), "{text}");
    assert!(text.contains("token = \"<redacted>\""), "{text}");
}

/// The example files the systemd units use are valid configs.
#[test]
fn systemd_units_use_valid_config_files() {
    let dir = scratch();
    for (role, unit, file) in [
        (
            "coordinator",
            "tessera-coordinator.service",
            "coordinator.toml",
        ),
        ("worker", "tessera-worker.service", "worker.toml"),
    ] {
        let systemd = root().join("scripts/systemd");
        let unit = std::fs::read_to_string(systemd.join(unit)).unwrap();
        assert!(
            unit.contains(&format!("tessera {role} --config /etc/tessera/{file}")),
            "{role}'s unit starts from its config file"
        );
        let (ok, text, err) = run(
            dir.path(),
            &[
                "config",
                "print",
                role,
                "--config",
                systemd.join(file).to_str().unwrap(),
            ],
        );
        assert!(ok, "scripts/systemd/{file}: {err}");
        assert!(
            text.contains(&format!("/{file}:")),
            "{file} sets options:\n{text}"
        );
    }
}
