//! Harness for end-to-end tests: real `tessera` processes, real Blender,
//! real files.
//!
//! Every process is started on loopback with port 0 or a port it reports, in
//! temporary directories, and killed when its handle drops.
//!
//! * [`fake_coordinator`]: a fake coordinator for tests of the worker's side.
//! * [`load`]: the load generator behind `tessera-load` and
//!   `scripts/bench-coordinator.sh`: fake workers and clients driving a
//!   real coordinator over gRPC.
//! * [`s3`]: a real S3 server (SeaweedFS) for the S3 blob store's tests.
//! * [`postgres`]: a real PostgreSQL server in a temporary directory.
//! * [`proxy`]: a real TCP proxy that can go silent (a network partition)
//!   or hold every byte a while (latency).
//! * [`netns`]: network namespaces the test makes, with a veth link to the
//!   host that it can cut silently or make lossy (iptables).

pub mod browser;
pub mod chaos;
pub mod fake_coordinator;
pub mod http;
pub mod load;
pub mod netns;
pub mod postgres;
pub mod proxy;
pub mod s3;
pub mod tmpfs;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The `tessera` binary with its test hooks (feature `test-hooks`: the
/// worker's `--fail-first-render`, `--test-corrupt-pixel`, `--fake-gpu` and
/// `--fake-telemetry`), built once per test process: a `cargo build` or
/// `cargo test` without the feature may have left one without them.
pub fn tessera() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map_or_else(|| root().join("target"), PathBuf::from);
        let mut build = Command::new(env!("CARGO"));
        build
            .args(["build", "-q", "-p", "tessera-cli", "--bin", "tessera"])
            .args(["--features", "test-hooks"])
            .current_dir(root());
        // Cargo sets these for the test; ring's build script reruns when one
        // changes, which would rebuild the TLS stack here and again in the
        // next `cargo test`.
        for (key, _) in std::env::vars_os() {
            let k = key.to_string_lossy();
            if k.starts_with("CARGO_PKG_")
                || k.starts_with("CARGO_MANIFEST_")
                || k.starts_with("CARGO_BIN_")
                || [
                    "CARGO_CRATE_NAME",
                    "CARGO_PRIMARY_PACKAGE",
                    "CARGO_TARGET_TMPDIR",
                ]
                .contains(&k.as_ref())
            {
                build.env_remove(&key);
            }
        }
        let status = build.status().expect("cargo runs");
        assert!(status.success(), "building tessera failed");
        let bin = target.join("debug").join("tessera");
        assert_test_hooks(&bin);
        bin
    })
    .clone()
}

/// Fails with what to do when `bin` lacks the test hooks the end-to-end
/// tests use (clap refuses an unknown flag before it reads `--help`).
fn assert_test_hooks(bin: &Path) {
    let out = Command::new(bin)
        .args(["worker", "--fail-first-render", "--test-corrupt-pixel"])
        .args(["--fake-gpu", "X:1", "--fake-telemetry", "t.json", "--help"])
        .output()
        .expect("tessera runs");
    assert!(
        out.status.success(),
        "{} was built without the test hooks the end-to-end tests use ({}); build it with `cargo build -p tessera-cli --features test-hooks` (scripts/test.sh does)",
        bin.display(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// The Blender executable (`$TESSERA_BLENDER` or `blender`).
pub fn blender() -> PathBuf {
    std::env::var_os("TESSERA_BLENDER").map_or_else(|| PathBuf::from("blender"), PathBuf::from)
}

/// A CA, and a server certificate for `localhost` and 127.0.0.1 signed by
/// it, made with openssl in `dir` (PEM files).
pub struct TlsFiles {
    /// The CA's certificate.
    pub ca: PathBuf,
    /// The server's certificate.
    pub cert: PathBuf,
    /// The server's key.
    pub key: PathBuf,
}

/// Makes [`TlsFiles`] in `dir`.
pub fn tls_files(dir: &Path) -> TlsFiles {
    let (ca, ca_key) = (dir.join("ca.pem"), dir.join("ca.key"));
    let (cert, key, csr) = (
        dir.join("cert.pem"),
        dir.join("key.pem"),
        dir.join("req.csr"),
    );
    let ext = dir.join("ext.cnf");
    std::fs::write(&ext, "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n").unwrap();
    let p = |x: &PathBuf| x.to_str().unwrap().to_string();
    for args in [
        vec![
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=Tessera test CA",
            "-keyout",
            &p(&ca_key),
            "-out",
            &p(&ca),
        ],
        vec![
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            &p(&key),
            "-out",
            &p(&csr),
        ],
        vec![
            "x509",
            "-req",
            "-in",
            &p(&csr),
            "-CA",
            &p(&ca),
            "-CAkey",
            &p(&ca_key),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &p(&ext),
            "-out",
            &p(&cert),
        ],
    ] {
        openssl(dir, &args);
    }
    TlsFiles { ca, cert, key }
}

/// Runs `openssl ARGS` in `dir`, asserting that it succeeded.
pub fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl runs");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A scratch directory that lives as long as the test.
pub fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("tessera-test-")
        .tempdir()
        .unwrap()
}

/// Builds a scene with `tests/blender/make_scene.py` (once per distinct argument list
/// per test process) and returns its path.
pub fn scene(args: &[&str]) -> PathBuf {
    type Made = Vec<(Vec<String>, PathBuf)>;
    static SCENES: OnceLock<Mutex<Made>> = OnceLock::new();
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    let key: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let scenes = SCENES.get_or_init(|| Mutex::new(Vec::new()));
    let mut scenes = scenes.lock().unwrap();
    if let Some((_, p)) = scenes.iter().find(|(k, _)| *k == key) {
        return p.clone();
    }
    let dir = DIR.get_or_init(scratch);
    let out = dir.path().join(format!("scene{}.blend", scenes.len()));
    make_scene(&out, args);
    scenes.push((key, out.clone()));
    out
}

/// The smallest scene the tests render: 32x24 pixels of `kind` (`still` or
/// `anim`) at `samples` samples, `frames` frames long (built once per test
/// process, like [`scene`]).
pub fn tiny_scene(kind: &str, samples: u32, frames: u32) -> PathBuf {
    scene(&[
        "--kind",
        kind,
        "--width",
        "32",
        "--height",
        "24",
        "--samples",
        &samples.to_string(),
        "--frames",
        &frames.to_string(),
    ])
}

/// Builds a scene with `tests/blender/make_scene.py` and Debian's Blender at `out`.
pub fn make_scene(out: &Path, args: &[&str]) {
    let result = Command::new(blender())
        .args([
            "-b",
            "--factory-startup",
            "--python-exit-code",
            "2",
            "--python",
        ])
        .arg(root().join("tests/blender/make_scene.py"))
        .arg("--")
        .arg("--out")
        .arg(out)
        .args(args)
        .output()
        .expect("blender runs (install it: apt-get install blender)");
    assert!(
        result.status.success() && out.is_file(),
        "make_scene.py {args:?} failed:\n{}",
        String::from_utf8_lossy(&result.stdout)
    );
}

/// Kills `pids` when this test process exits: for a farm a test file shares
/// from a static, which is never dropped.
pub fn reap_at_exit(pids: &[u32]) -> Child {
    let list: Vec<String> = pids.iter().map(u32::to_string).collect();
    let script = format!(
        "tail --pid={} -f /dev/null; kill -9 {} 2>/dev/null",
        std::process::id(),
        list.join(" ")
    );
    Command::new("sh")
        .args(["-c", &script])
        .spawn()
        .expect("sh runs")
}

/// Renders frames `start..=end` of `scene` directly with Blender, one process,
/// the way a user would without a farm: `dir/ref_NNNN.ext`.
pub fn reference(scene: &Path, start: u32, end: u32, dir: &Path) {
    let out = Command::new(blender())
        .arg("-b")
        .arg(scene)
        .arg("-o")
        .arg(dir.join("ref_####"))
        .args(["-s", &start.to_string(), "-e", &end.to_string(), "-a"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "reference render failed:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// Decoded pixels of a PNG: (width, height, colour type, bit depth, bytes).
pub fn png_pixels(path: &Path) -> (u32, u32, String, Vec<u8>) {
    let decoder = png::Decoder::new(BufReader::new(
        std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    ));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    buf.truncate(info.buffer_size());
    (
        info.width,
        info.height,
        format!("{:?}/{:?}", info.color_type, info.bit_depth),
        buf,
    )
}

/// Asserts two PNGs hold the same pixels (their metadata may differ).
pub fn assert_same_pixels(a: &Path, b: &Path) {
    let (wa, ha, ca, pa) = png_pixels(a);
    let (wb, hb, cb, pb) = png_pixels(b);
    assert_eq!(
        (wa, ha, &ca),
        (wb, hb, &cb),
        "{} vs {}",
        a.display(),
        b.display()
    );
    let differing = pa.iter().zip(&pb).filter(|(x, y)| x != y).count();
    assert_eq!(
        differing,
        0,
        "{} and {} differ in {differing} bytes",
        a.display(),
        b.display()
    );
}

/// A child process killed on drop, with its log in a file.
pub struct Proc {
    /// The child.
    pub child: Child,
    /// Its combined log.
    pub log: PathBuf,
}

impl Proc {
    /// Kills it with SIGKILL and reaps it.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM.
    pub fn term(&self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether it is still running.
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().map(|s| s.is_none()).unwrap_or(false)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A coordinator process.
pub struct Coordinator {
    /// The process.
    pub proc: Proc,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    /// `http://127.0.0.1:PORT/metrics` when started with `--http`.
    pub metrics: Option<String>,
}

impl Coordinator {
    /// Starts a coordinator on `listen` (e.g. `127.0.0.1:0`) over `data`.
    pub fn start(data: &Path, listen: &str, extra: &[&str]) -> Self {
        Self::start_env(data, listen, extra, &[])
    }

    /// [`start`](Self::start) with these environment variables (e.g. an S3
    /// server's, see [`s3::S3Server::env`]).
    pub fn start_env(data: &Path, listen: &str, extra: &[&str], env: &[(&str, String)]) -> Self {
        let log = data.with_extension(format!("coordinator-{}.log", unique()));
        std::fs::create_dir_all(data).unwrap();
        // `--tls-ca-for-tests CA` is the harness's own (the CA clients
        // trust); it is not passed on.
        let mut passed: Vec<&str> = Vec::new();
        let mut skip = false;
        for (i, a) in extra.iter().enumerate() {
            if skip {
                skip = false;
            } else if *a == "--tls-ca-for-tests" {
                skip = i + 1 < extra.len();
            } else {
                passed.push(a);
            }
        }
        let mut child = Command::new(tessera())
            .args(["coordinator", "--listen", listen, "--data"])
            .arg(data)
            .args(&passed)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let metrics = extra.contains(&"--http").then(|| {
            let mut m = String::new();
            reader.read_line(&mut m).unwrap();
            m.trim()
                .trim_start_matches("tessera coordinator metrics on ")
                .to_string()
        });
        let addr = line
            .trim()
            .strip_prefix("tessera coordinator listening on ")
            .unwrap_or_else(|| {
                panic!(
                    "coordinator did not start: {line:?}\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                )
            })
            .to_string();
        // With TLS, clients must name the host the certificate was made for.
        let tls_cert = extra
            .iter()
            .position(|a| *a == "--tls-ca-for-tests")
            .map(|i| std::path::PathBuf::from(extra[i + 1]));
        let url = match &tls_cert {
            Some(_) => format!("https://localhost:{}", addr.rsplit(':').next().unwrap()),
            None => format!("http://{addr}"),
        };
        if let Some(cert) = &tls_cert {
            cas().lock().unwrap().insert(url.clone(), cert.clone());
        }
        let admin = std::fs::read_to_string(data.join("admin.token"))
            .expect("the coordinator writes its admin token on first start")
            .trim()
            .to_string();
        // A worker token, made once per data directory and kept beside it.
        let worker_file = data.with_extension("worker-token");
        let worker = match std::fs::read_to_string(&worker_file) {
            Ok(t) => t.trim().to_string(),
            Err(_) => {
                let out = Command::new(tessera())
                    .args(["users", "add", "workers", "--role", "worker"])
                    .env("TESSERA_COORDINATOR", &url)
                    .env("TESSERA_TOKEN", &admin)
                    .envs(tls_cert.iter().map(|c| ("TESSERA_CA", c)))
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "users add: {}\ncoordinator log:\n{}",
                    String::from_utf8_lossy(&out.stderr),
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
                let t = String::from_utf8(out.stdout).unwrap().trim().to_string();
                std::fs::write(&worker_file, &t).unwrap();
                t
            }
        };
        tokens()
            .lock()
            .unwrap()
            .insert(url.clone(), (admin, worker));
        Self {
            url,
            addr,
            metrics,
            proc: Proc { child, log },
        }
    }

    /// The admin token.
    pub fn admin_token(&self) -> String {
        tokens().lock().unwrap()[&self.url].0.clone()
    }
}

/// CA certificates of the TLS coordinators started by this process, by URL.
fn cas() -> &'static Mutex<std::collections::HashMap<String, std::path::PathBuf>> {
    static CAS: OnceLock<Mutex<std::collections::HashMap<String, std::path::PathBuf>>> =
        OnceLock::new();
    CAS.get_or_init(Default::default)
}

/// Tokens of the coordinators started by this process, by URL: (admin, worker).
fn tokens() -> &'static Mutex<std::collections::HashMap<String, (String, String)>> {
    static TOKENS: OnceLock<Mutex<std::collections::HashMap<String, (String, String)>>> =
        OnceLock::new();
    TOKENS.get_or_init(Default::default)
}

/// Makes `alias` (e.g. `http://a,http://b`, several coordinators of one
/// farm) use these tokens: (admin, worker).
pub fn set_tokens(alias: &str, admin: &str, worker: &str) {
    tokens()
        .lock()
        .unwrap()
        .insert(alias.to_string(), (admin.to_string(), worker.to_string()));
}

fn token_for(url: &str, worker: bool) -> Option<String> {
    tokens()
        .lock()
        .unwrap()
        .get(url)
        .map(|(a, w)| if worker { w.clone() } else { a.clone() })
}

/// Runs a client command against `url` with an explicit token (None: no token at all).
pub fn cli_as(url: &str, token: Option<&str>, args: &[&str]) -> Output {
    let mut cmd = Command::new(tessera());
    cmd.args(args)
        .env("TESSERA_COORDINATOR", url)
        .env_remove("TESSERA_TOKEN")
        .env("XDG_CONFIG_HOME", "/nonexistent")
        .stdin(Stdio::null());
    if let Some(t) = token {
        cmd.env("TESSERA_TOKEN", t);
    }
    if let Some(ca) = cas().lock().unwrap().get(url) {
        cmd.env("TESSERA_CA", ca);
    }
    cmd.output().unwrap()
}

fn unique() -> u64 {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Starts a worker with one slot of one thread.
pub fn worker(url: &str, dir: &Path, name: &str) -> Proc {
    let log = dir.join(format!("worker-{name}.log"));
    let mut cmd = Command::new(tessera());
    let child = worker_args(&mut cmd, url, dir, name)
        .env("TESSERA_TOKEN", token_for(url, true).unwrap_or_default())
        .envs(
            cas()
                .lock()
                .unwrap()
                .get(url)
                .map(|c| ("TESSERA_CA", c.clone())),
        )
        .stdout(std::fs::File::create(dir.join(format!("worker-{name}.out"))).unwrap())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    Proc { child, log }
}

/// Runs a client command against `url`, as the coordinator's admin.
pub fn cli(url: &str, args: &[&str]) -> Output {
    cli_as(url, token_for(url, false).as_deref(), args)
}

/// Runs a client command that must succeed; returns its stdout.
pub fn cli_ok(url: &str, args: &[&str]) -> String {
    let out = cli(url, args);
    assert!(
        out.status.success(),
        "tessera {args:?} failed:\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `tessera status JOB --json`.
pub fn status(url: &str, job: u64) -> serde_json::Value {
    serde_json::from_str(&cli_ok(url, &["status", &job.to_string(), "--json"])).unwrap()
}

/// Polls `cond` on the job's status until it holds or `timeout` passes.
pub fn wait_for(
    url: &str,
    job: u64,
    timeout: Duration,
    what: &str,
    cond: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let out = cli(url, &["status", &job.to_string(), "--json"]);
        if out.status.success() {
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            if cond(&v) {
                return v;
            }
            assert!(
                start.elapsed() < timeout,
                "timed out waiting for {what}; job is {v:#}"
            );
        } else {
            assert!(
                start.elapsed() < timeout,
                "timed out waiting for {what}; status failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Every channel of an OpenEXR file's first layer as f32, by channel name.
pub fn exr_channels(path: &Path) -> (u32, u32, Vec<(String, Vec<f32>)>) {
    use exr::prelude::*;
    let image = read()
        .no_deep_data()
        .largest_resolution_level()
        .all_channels()
        .first_valid_layer()
        .all_attributes()
        .from_file(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let size = image.layer_data.size;
    let channels = image
        .layer_data
        .channel_data
        .list
        .iter()
        .map(|c| (c.name.to_string(), c.sample_data.values_as_f32().collect()))
        .collect();
    (size.width() as u32, size.height() as u32, channels)
}

/// Process ids named `pid=N` on log lines containing `what`.
pub fn pids_in_log(log: &str, what: &str) -> Vec<u32> {
    log.lines()
        .filter(|l| l.contains(what))
        .filter_map(|l| {
            l.split("pid=")
                .nth(1)?
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

/// Whether a process is still running (and not a zombie).
pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
        Err(_) => false,
    }
}

/// Polls `cond` until it holds or `timeout` passes; returns whether it held.
pub fn eventually(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    cond()
}

/// A plain HTTP GET on loopback; returns (status line, body).
pub fn http_get(url: &str) -> (String, String) {
    http_get_as(url, None)
}

/// A plain HTTP GET on loopback with a bearer token; returns (status line, body).
pub fn http_get_as(url: &str, token: Option<&str>) -> (String, String) {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://").expect("an http:// URL");
    let (host, path) = rest
        .split_once('/')
        .map_or((rest, "/".to_string()), |(h, p)| (h, format!("/{p}")));
    let mut s = std::net::TcpStream::connect(host).unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\n{auth}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    )
}

/// Starts a worker with extra arguments (one slot of one thread by default).
pub fn worker_with(url: &str, dir: &Path, name: &str, extra: &[&str]) -> Proc {
    let cache = dir.join(format!("cache-{name}"));
    let log = dir.join(format!("worker-{name}.log"));
    let child = Command::new(tessera())
        .args([
            "worker",
            "--coordinator",
            url,
            "--name",
            name,
            "--threads",
            "1",
            "--cache",
        ])
        .arg(&cache)
        .args(extra)
        .env("TESSERA_TOKEN", token_for(url, true).unwrap_or_default())
        .envs(
            cas()
                .lock()
                .unwrap()
                .get(url)
                .map(|c| ("TESSERA_CA", c.clone())),
        )
        .stdout(std::fs::File::create(dir.join(format!("worker-{name}.out"))).unwrap())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    Proc { child, log }
}

/// The worker token of the coordinator at `url`.
pub fn worker_token(url: &str) -> String {
    token_for(url, true).expect("a coordinator started by this test process")
}

/// Adds the arguments of a test worker (one slot of one thread, CPU, its
/// cache under `dir`) that reaches `url` as `name` to `cmd`.
pub fn worker_args<'c>(cmd: &'c mut Command, url: &str, dir: &Path, name: &str) -> &'c mut Command {
    cmd.args([
        "worker",
        "--coordinator",
        url,
        "--name",
        name,
        "--slots",
        "1",
        "--threads",
        "1",
        "--device",
        "cpu",
        "--cache",
    ])
    .arg(dir.join(format!("cache-{name}")))
}

/// Starts a worker (one slot of one thread) with extra arguments and extra
/// environment variables, without `TESSERA_TOKEN`: the token must come from
/// the arguments (e.g. `--token-file`).
pub fn worker_env(url: &str, dir: &Path, name: &str, extra: &[&str], env: &[(&str, &str)]) -> Proc {
    let log = dir.join(format!("worker-{name}.log"));
    let mut cmd = Command::new(tessera());
    let child = worker_args(&mut cmd, url, dir, name)
        .args(extra)
        .env_remove("TESSERA_TOKEN")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join(format!("worker-{name}.out"))).unwrap())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    Proc { child, log }
}

/// `tessera workers --json`, by worker name.
pub fn workers_by_name(url: &str) -> std::collections::HashMap<String, serde_json::Value> {
    let v: serde_json::Value = serde_json::from_str(&cli_ok(url, &["workers", "--json"])).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|w| (w["name"].as_str().unwrap().to_string(), w.clone()))
        .collect()
}

/// `tessera submit SCENE ARGS...` as the admin; returns the job id.
pub fn submit(url: &str, scene: &Path, args: &[&str]) -> u64 {
    let mut all = vec!["submit", scene.to_str().unwrap()];
    all.extend_from_slice(args);
    cli_ok(url, &all)
        .trim()
        .parse()
        .expect("submit prints the job id")
}

/// Builds one of `tests/blender/make_asset_scenes.py`'s cases under `dir`; returns the scene.
pub fn asset_scene(dir: &Path, case: &str) -> PathBuf {
    let out = dir.join(case);
    let result = std::process::Command::new(blender())
        .args([
            "-b",
            "--factory-startup",
            "--python-exit-code",
            "2",
            "--python",
        ])
        .arg(root().join("tests/blender/make_asset_scenes.py"))
        .args(["--", "--dir"])
        .arg(&out)
        .args(["--case", case])
        .output()
        .expect("blender runs");
    assert!(
        result.status.success(),
        "make_asset_scenes.py {case} failed:\n{}",
        String::from_utf8_lossy(&result.stdout)
    );
    let scene = match case {
        "absolute" => out.join("project/scene.blend"),
        "library" | "linked-absolute" => out.join("shots/shot.blend"),
        _ => out.join("scene.blend"),
    };
    assert!(scene.is_file(), "{}", scene.display());
    scene
}

/// The file names in `dir`, sorted.
pub fn frames_of(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Asserts that `out/frame_NNNN.png` equals `refs/ref_NNNN.png` pixel for
/// pixel for every frame in `frames`.
pub fn assert_matches_reference(out: &Path, refs: &Path, frames: std::ops::RangeInclusive<u32>) {
    for f in frames {
        assert_same_pixels(
            &out.join(format!("frame_{f:04}.png")),
            &refs.join(format!("ref_{f:04}.png")),
        );
    }
}

/// Fetches job `job` into `dir/out-JOB`, renders `frames` of `scene` with
/// plain Blender into `dir/refs-JOB`, and asserts they are the same pixels.
pub fn fetch_exact(
    url: &str,
    job: u64,
    scene: &Path,
    frames: std::ops::RangeInclusive<u32>,
    dir: &Path,
) {
    let out = dir.join(format!("out-{job}"));
    cli_ok(
        url,
        &["fetch", &job.to_string(), "-o", out.to_str().unwrap()],
    );
    let refs = dir.join(format!("refs-{job}"));
    reference(scene, *frames.start(), *frames.end(), &refs);
    assert_matches_reference(&out, &refs, frames);
}

/// `tessera submit SCENE --frames FRAMES --wait -o OUT`: asserts that it
/// succeeded and returns what it said on standard error.
pub fn submit_wait(url: &str, scene: &Path, frames: &str, out: &Path) -> String {
    submit_wait_with(url, scene, frames, out, &[])
}

/// [`submit_wait`] with more arguments for `submit`.
pub fn submit_wait_with(
    url: &str,
    scene: &Path,
    frames: &str,
    out: &Path,
    more: &[&str],
) -> String {
    let mut args = vec![
        "submit",
        scene.to_str().unwrap(),
        "--frames",
        frames,
        "--wait",
        "-o",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(more);
    let submitted = cli(url, &args);
    let stderr = String::from_utf8_lossy(&submitted.stderr).into_owned();
    assert!(submitted.status.success(), "submit failed: {stderr}");
    stderr
}

/// The `bpy` runtime (Blender 4.5 as a Python module) the suite renders
/// with beside Debian's Blender: the newest `bpy-4.5.*` venv under
/// `$TESSERA_RUNTIMES` (or `~/.cache/tessera/runtimes`), as `scripts/test.sh`
/// installs it with `tessera blender install 4.5`. None (with the reason
/// printed) when it is not installed; a panic when `$TESSERA_REQUIRE_BPY` says
/// it must be.
pub fn bpy_python() -> Option<PathBuf> {
    let dir = runtimes_dir();
    let mut found: Vec<PathBuf> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("bpy-4.5."))
                && p.join("bin/python").is_file()
        })
        .collect();
    found.sort();
    let python = found.pop().map(|p| p.join("bin/python"));
    if python.is_none() {
        let why = format!(
            "no bpy 4.5 runtime under {}; install it with `tessera blender install 4.5` (scripts/test.sh does)",
            dir.display()
        );
        assert!(std::env::var_os("TESSERA_REQUIRE_BPY").is_none(), "{why}");
        eprintln!("skipped: {why}");
    }
    python
}

/// Where `bpy` runtimes are installed: `$TESSERA_RUNTIMES`, else
/// `~/.cache/tessera/runtimes`.
pub fn runtimes_dir() -> PathBuf {
    std::env::var_os("TESSERA_RUNTIMES").map_or_else(
        || {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/tessera/runtimes")
        },
        PathBuf::from,
    )
}

/// Runs a Blender-side script of the repo in the `bpy` module at `python`,
/// as the worker does (through `blender/bpy_run.py`).
pub fn bpy_command(python: &Path, script: &Path, scene: Option<&Path>) -> Command {
    let mut cmd = Command::new(python);
    cmd.arg("-I")
        .arg(root().join("blender/bpy_run.py"))
        .arg("--script")
        .arg(script);
    if let Some(s) = scene {
        cmd.arg("--scene").arg(s);
    }
    cmd.arg("--");
    cmd
}

/// Builds a scene with `tests/blender/make_scene.py` in the `bpy` module at
/// `python` (so that Blender 4.5 saves it) into `out`.
pub fn bpy_scene(python: &Path, out: &Path, args: &[&str]) {
    let result = bpy_command(python, &root().join("tests/blender/make_scene.py"), None)
        .arg("--out")
        .arg(out)
        .args(args)
        .output()
        .unwrap();
    assert!(
        result.status.success() && out.is_file(),
        "make_scene.py {args:?} in bpy failed:\n{}{}",
        String::from_utf8_lossy(&result.stdout),
        String::from_utf8_lossy(&result.stderr)
    );
}

/// Renders frames `start..=end` of `scene` directly in the `bpy` module at
/// `python`, the way a user would script it (open the file, render the
/// animation): `dir/ref_NNNN.png`.
pub fn bpy_reference(python: &Path, scene: &Path, start: u32, end: u32, dir: &Path) {
    let code = format!(
        "import bpy; bpy.ops.wm.open_mainfile(filepath={scene:?}, load_ui=False, use_scripts=False); \
         s = bpy.context.scene; s.frame_start = {start}; s.frame_end = {end}; \
         s.render.filepath = {out:?}; bpy.ops.render.render(animation=True)",
        scene = scene.to_str().unwrap(),
        out = dir.join("ref_####").to_str().unwrap(),
    );
    let out = Command::new(python)
        .args(["-I", "-c", &code])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "bpy reference render failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The admin token (written by the first coordinator to start) and a new
/// worker token, registered for every URL in `urls`.
pub fn farm_tokens(data: &Path, url: &str, urls: &[&str]) -> (String, String) {
    let admin = std::fs::read_to_string(data.join("admin.token"))
        .expect("the first coordinator writes the admin token")
        .trim()
        .to_string();
    let out = cli_as(
        url,
        Some(&admin),
        &["users", "add", "workers", "--role", "worker"],
    );
    assert!(
        out.status.success(),
        "users add: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let worker = String::from_utf8(out.stdout).unwrap().trim().to_string();
    for u in urls {
        set_tokens(u, &admin, &worker);
    }
    (admin, worker)
}

/// The leases whose results the coordinator acknowledged, from the
/// workers' `task done` lines: `JOB.TASK.GRANT` with how many times.
pub fn acknowledged(logs: &[String]) -> std::collections::BTreeMap<String, usize> {
    let mut n = std::collections::BTreeMap::new();
    for log in logs {
        for line in log.lines().filter(|l| l.contains("task done")) {
            if let Some(lease) = line.split("lease=").nth(1) {
                let lease = lease.split_whitespace().next().unwrap_or("").to_string();
                *n.entry(lease).or_default() += 1;
            }
        }
    }
    n
}

/// Files under a blob store's `tmp/` (`blobs/tmp`) that are not a second
/// name of a blob in place: uploads cut off or never made durable. A blob
/// the store linked into place keeps its name there (`DIGEST.xxxx`, the same
/// file) until a later sync covers the link, so those do not count.
pub fn partial_blob_files(blobs: &Path) -> Vec<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(blobs.join("tmp")) else {
        return Vec::new();
    };
    entries
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let Some((hex, _)) = name.split_once('.').filter(|(h, _)| h.len() == 64) else {
                return true;
            };
            let placed = blobs.join(&hex[..2]).join(&hex[2..]);
            match (std::fs::metadata(p), std::fs::metadata(&placed)) {
                (Ok(a), Ok(b)) => (a.dev(), a.ino()) != (b.dev(), b.ino()),
                // Tidied away meanwhile.
                (Err(e), _) if e.kind() == std::io::ErrorKind::NotFound => false,
                _ => true,
            }
        })
        .collect()
}
