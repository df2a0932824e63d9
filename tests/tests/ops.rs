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

/// The metric families a live coordinator's /metrics declares, with a
/// histogram's `_bucket`, `_sum` and `_count` series.
fn exported(metrics_url: &str, token: &str) -> std::collections::BTreeSet<String> {
    let (status, body) = http_get_as(metrics_url, Some(token));
    assert!(status.contains("200"), "{status}: {body}");
    let mut names = std::collections::BTreeSet::new();
    for line in body.lines() {
        let mut words = line.split_whitespace();
        if let (Some("#"), Some("TYPE"), Some(name), Some(kind)) =
            (words.next(), words.next(), words.next(), words.next())
        {
            names.insert(name.to_string());
            if kind == "histogram" {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
        }
    }
    names
}

/// The `tessera_*` names an expression uses.
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("tessera_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

/// Every expression of the Grafana dashboard's panels, with its panel's title.
fn dashboard_queries() -> Vec<(String, String)> {
    let text =
        std::fs::read_to_string(root().join("scripts/monitoring/grafana-dashboard.json")).unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut out = Vec::new();
    let mut stack: Vec<&serde_json::Value> = dash["panels"].as_array().unwrap().iter().collect();
    while let Some(p) = stack.pop() {
        if let Some(inner) = p["panels"].as_array() {
            stack.extend(inner);
        }
        if p["type"] == "row" {
            continue;
        }
        let title = p["title"].as_str().unwrap().to_string();
        let targets = p["targets"].as_array().map(Vec::as_slice).unwrap_or(&[]);
        assert!(!targets.is_empty(), "panel {title:?} has no query");
        for t in targets {
            out.push((title.clone(), t["expr"].as_str().unwrap().to_string()));
        }
    }
    out
}

/// The alert rules' expressions (the `expr:` lines of alerts.yml).
fn alert_queries() -> Vec<String> {
    let text = std::fs::read_to_string(root().join("scripts/monitoring/alerts.yml")).unwrap();
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("expr:"))
        .map(|e| e.trim().to_string())
        .collect()
}

/// Every query of the Grafana dashboard and of the alert rules names a
/// metric that a live coordinator's /metrics exports.
#[test]
fn dashboard_and_alerts_query_metrics_the_coordinator_exports() {
    let dir = scratch();
    let coord = Coordinator::start(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &["--http", "127.0.0.1:0"],
    );
    let names = exported(coord.metrics.as_ref().unwrap(), &coord.admin_token());
    assert!(
        names.contains("tessera_gpu_temperature_celsius"),
        "{names:?}"
    );
    let queries = dashboard_queries();
    let titles: std::collections::BTreeSet<_> = queries.iter().map(|(t, _)| t.as_str()).collect();
    // What the issue asks the dashboard to cover.
    for panel in [
        "Slots by state",
        "Desired slots by class",
        "Queue depth",
        "Completions per second",
        "GPU utilisation",
        "GPU temperature",
        "GPU memory used",
        "ECC errors per day",
        "Job progress",
        "Job cost",
        "Spot preemptions",
    ] {
        assert!(titles.contains(panel), "no {panel:?} panel in {titles:?}");
    }
    let mut checked = 0;
    for (title, expr) in &queries {
        let used = metric_names(expr);
        assert!(
            !used.is_empty(),
            "panel {title:?}: {expr} names no tessera metric"
        );
        for name in used {
            assert!(
                names.contains(&name),
                "panel {title:?}: {name} is not exported; /metrics has {names:?}"
            );
            checked += 1;
        }
    }
    let alerts = alert_queries();
    assert_eq!(alerts.len(), 10, "one rule per threshold: {alerts:?}");
    for expr in &alerts {
        for name in metric_names(expr) {
            assert!(
                names.contains(&name),
                "alert {expr}: {name} is not exported"
            );
            checked += 1;
        }
    }
    println!(
        "{checked} metric names in {} panel queries and {} alert rules, all exported",
        queries.len(),
        alerts.len()
    );
}

/// A free TCP port on loopback.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Percent-encodes a query parameter.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A real Prometheus (Debian's package) scrapes a real coordinator with a
/// token, loads the alert rules, and answers every dashboard query.
#[test]
fn prometheus_scrapes_the_farm_with_a_token() {
    if which("prometheus").is_none() && std::env::var_os("TESSERA_REQUIRE_SERVERS").is_none() {
        eprintln!("skipped: prometheus is not installed (scripts/test.sh installs Debian's prometheus package)");
        return;
    }
    let dir = scratch();
    let coord = Coordinator::start(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &["--http", "127.0.0.1:0"],
    );
    let metrics = coord.metrics.clone().unwrap();
    let target = metrics
        .trim_start_matches("http://")
        .trim_end_matches("/metrics")
        .to_string();
    // Prometheus reads its token from a file, as scripts/prometheus.yml says.
    let out = cli_ok(
        &coord.url,
        &["users", "add", "prometheus", "--role", "user"],
    );
    let token_file = dir.path().join("prometheus.token");
    std::fs::write(&token_file, out.trim()).unwrap();
    // A worker with a declared GPU and its telemetry, so GPU series exist.
    let telemetry = dir.path().join("telemetry.json");
    std::fs::write(
        &telemetry,
        r#"[{"utilization_pct": 55, "memory_used_bytes": 1000000000, "temperature_c": 71, "power_w": 180.5, "ecc_errors": 2, "ecc_uncorrected": 1}]"#,
    )
    .unwrap();
    let _worker = worker_with(
        &coord.url,
        dir.path(),
        "gpu-box",
        &[
            "--fake-gpu",
            "RTX A6000:48",
            "--fake-telemetry",
            telemetry.to_str().unwrap(),
            "--telemetry-interval",
            "0.5",
        ],
    );
    // The shipped scrape configuration, pointed at this coordinator and token.
    let shipped = std::fs::read_to_string(root().join("scripts/prometheus.yml")).unwrap();
    let config = shipped
        .replace("scrape_interval: 15s", "scrape_interval: 1s")
        .replace("evaluation_interval: 15s", "evaluation_interval: 1s")
        .replace(
            "/etc/prometheus/tessera.token",
            token_file.to_str().unwrap(),
        )
        .replace("127.0.0.1:7879", &target)
        .replace(
            "scripts/monitoring/alerts.yml",
            root()
                .join("scripts/monitoring/alerts.yml")
                .to_str()
                .unwrap(),
        );
    assert!(
        config.contains(&target) && config.contains(token_file.to_str().unwrap()),
        "{config}"
    );
    let config_path = dir.path().join("prometheus.yml");
    std::fs::write(&config_path, config).unwrap();
    let port = free_port();
    let log = dir.path().join("prometheus.log");
    let _prom = Proc {
        child: Command::new("prometheus")
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
        log: log.clone(),
    };
    let api = format!("http://127.0.0.1:{port}/api/v1");
    let query = |q: &str| -> serde_json::Value {
        let url = format!("{api}/query?query={}", encode(q));
        serde_json::from_str(&get_body(&url)).unwrap_or_default()
    };
    let gpu_seen = eventually(Duration::from_secs(60), || {
        query("tessera_gpu_temperature_celsius")["data"]["result"]
            .as_array()
            .is_some_and(|r| !r.is_empty())
    });
    assert!(
        gpu_seen,
        "Prometheus never stored the farm's GPU series:\n{}",
        std::fs::read_to_string(&log).unwrap()
    );
    let r = query("tessera_gpu_temperature_celsius");
    let series = &r["data"]["result"][0];
    assert_eq!(series["metric"]["name"], "RTX A6000", "{r}");
    assert_eq!(series["value"][1], "71", "{r}");
    // Uncorrected ECC errors travel apart from the sum, for their alert.
    let r = query("tessera_gpu_ecc_uncorrected_errors");
    assert_eq!(r["data"]["result"][0]["value"][1], "1", "{r}");
    let r = query("tessera_gpu_ecc_errors");
    assert_eq!(r["data"]["result"][0]["value"][1], "2", "{r}");
    let up = query("up");
    assert_eq!(
        up["data"]["result"][0]["value"][1], "1",
        "the scrape with the token succeeds: {up}"
    );
    // Every dashboard query is valid PromQL that this Prometheus answers.
    for (title, expr) in dashboard_queries() {
        let r = query(&expr);
        assert_eq!(r["status"], "success", "panel {title:?}: {expr}: {r}");
    }
    // The alert rules loaded and evaluate without error.
    let loaded = eventually(Duration::from_secs(20), || {
        let v: serde_json::Value =
            serde_json::from_str(&get_body(&format!("{api}/rules"))).unwrap_or_default();
        v["data"]["groups"].as_array().is_some_and(|g| g.len() == 2)
    });
    assert!(
        loaded,
        "the rules did not load:\n{}",
        std::fs::read_to_string(&log).unwrap()
    );
    let rules: serde_json::Value =
        serde_json::from_str(&get_body(&format!("{api}/rules"))).unwrap();
    let all: Vec<&serde_json::Value> = rules["data"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .collect();
    assert_eq!(all.len(), 10, "{rules}");
    let healthy = eventually(Duration::from_secs(20), || {
        let v: serde_json::Value =
            serde_json::from_str(&get_body(&format!("{api}/rules"))).unwrap_or_default();
        v["data"]["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap())
            .all(|r| r["health"] == "ok")
    });
    assert!(
        healthy,
        "a rule does not evaluate: {}",
        get_body(&format!("{api}/rules"))
    );
    // Without the token, /metrics refuses Prometheus.
    let (status, _) = http_get(&metrics);
    assert!(status.contains("401"), "{status}");
}

/// The body of a GET as HTTP/1.0, so a large answer comes whole rather
/// than chunked (Prometheus chunks its rule list).
fn get_body(url: &str) -> String {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://").expect("an http:// URL");
    let (host, path) = rest.split_once('/').unwrap();
    let Ok(mut s) = std::net::TcpStream::connect(host) else {
        return String::new();
    };
    write!(s, "GET /{path} HTTP/1.0\r\nHost: {host}\r\n\r\n").unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

/// The path of a program on PATH.
fn which(program: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(program))
            .find(|p| p.is_file())
    })
}

/// `--log-format json`: one task is followed across the coordinator's and
/// the worker's logs by its job, task and lease fields.
#[test]
fn json_logs_follow_one_task_across_coordinator_and_worker() {
    let dir = scratch();
    let coord = Coordinator::start(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &["--log-format", "json"],
    );
    let worker = worker_with(
        &coord.url,
        dir.path(),
        "json-logs",
        &["--log-format", "json", "--slots", "1", "--device", "cpu"],
    );
    let scene = scene(&[]);
    submit_wait(&coord.url, &scene, "1", &dir.path().join("out"));
    let lines = |log: String| -> Vec<serde_json::Value> {
        // Lines for a person (the admin token's note) are plain text.
        log.lines()
            .filter(|l| l.starts_with('{'))
            .map(|l| {
                serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}"))
            })
            .collect()
    };
    let coord_lines = lines(coord.proc.log());
    let leased = coord_lines
        .iter()
        .find(|l| l["fields"]["message"] == "task leased")
        .unwrap_or_else(|| panic!("no `task leased` line: {coord_lines:?}"));
    let fields = &leased["fields"];
    let (job, task, lease) = (&fields["job"], &fields["task"], &fields["lease"]);
    assert!(
        job.is_string() && task.is_u64() && lease.is_string(),
        "{leased}"
    );
    assert!(fields["worker"].is_string(), "{leased}");
    assert!(
        coord_lines
            .iter()
            .any(|l| l["fields"]["message"] == "task result received"
                && l["fields"]["lease"] == *lease),
        "the coordinator logs the result under the same lease"
    );
    // The worker's lines of that task carry the same job, task and lease.
    // Its `task done` follows the coordinator's answer, so it may be
    // written just after the job has ended: wait for it.
    let of_lease = |lines: &[serde_json::Value]| -> Vec<serde_json::Value> {
        lines
            .iter()
            .filter(|l| l["span"]["lease"] == *lease)
            .cloned()
            .collect()
    };
    let said = |of_task: &[serde_json::Value], m: &str| {
        of_task.iter().any(|l| l["fields"]["message"] == m)
    };
    assert!(
        eventually(Duration::from_secs(10), || {
            let of_task = of_lease(&lines(worker.log()));
            said(&of_task, "task started") && said(&of_task, "task done")
        }),
        "{:?}",
        lines(worker.log())
    );
    let of_task = of_lease(&lines(worker.log()));
    for l in &of_task {
        assert_eq!(l["span"]["job"].to_string(), job.as_str().unwrap(), "{l}");
        assert_eq!(l["span"]["task"], *task, "{l}");
        assert_eq!(l["span"]["worker"], fields["worker"], "{l}");
    }
}
