//! Headless Chromium driven over the Chrome DevTools Protocol, through
//! `--remote-debugging-pipe` (JSON messages ended by NUL on file
//! descriptors 3 and 4), so no WebSocket client or driver crate is needed.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The chromium binary: `$TESSERA_CHROMIUM`, else `chromium` on the PATH.
pub fn chromium() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("TESSERA_CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("chromium"))
            .find(|p| p.is_file())
    })
}

/// A headless browser with one page.
pub struct Browser {
    child: Child,
    to: ChildStdin,
    from: Receiver<Value>,
    next: u64,
    session: String,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Browser {
    /// Starts chromium with a fresh profile under `dir` and opens a page of
    /// `width` x `height` CSS pixels.
    pub fn start(binary: &Path, dir: &Path, width: u32, height: u32) -> Self {
        let profile = dir.join("chromium-profile");
        let log = std::fs::File::create(dir.join("chromium.log")).unwrap();
        // The pipe protocol reads fd 3 and writes fd 4: map them onto the
        // child's stdin and stdout.
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(r#"exec "$0" "$@" 3<&0 4>&1 0</dev/null 1>&2"#)
            .arg(binary)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--hide-scrollbars",
                "--remote-debugging-pipe",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg(format!("--window-size={width},{height}"))
            .arg("about:blank")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("chromium starts");
        let to = child.stdin.take().unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, from) = channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(out);
            let mut buf = Vec::new();
            while r.read_until(0, &mut buf).is_ok_and(|n| n > 0) {
                if buf.last() == Some(&0) {
                    buf.pop();
                }
                if let Ok(v) = serde_json::from_slice::<Value>(&buf) {
                    if tx.send(v).is_err() {
                        return;
                    }
                }
                buf.clear();
            }
        });
        let mut b = Self {
            child,
            to,
            from,
            next: 0,
            session: String::new(),
        };
        let target = b.call("Target.createTarget", json!({"url": "about:blank"}));
        let attached = b.call(
            "Target.attachToTarget",
            json!({"targetId": target["targetId"], "flatten": true}),
        );
        b.session = attached["sessionId"].as_str().unwrap().to_string();
        b.call("Page.enable", json!({}));
        b.call("Runtime.enable", json!({}));
        b.viewport(width, height);
        b
    }

    /// Sends a command (to the page once attached) and waits for its answer.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        self.try_call(method, params)
            .unwrap_or_else(|e| panic!("{method} failed: {e}"))
    }

    /// [`Browser::call`], with chromium's error as an `Err` instead of a
    /// panic.
    fn try_call(&mut self, method: &str, params: Value) -> Result<Value, Value> {
        self.next += 1;
        let id = self.next;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if !self.session.is_empty() {
            msg["sessionId"] = json!(self.session);
        }
        let mut bytes = msg.to_string().into_bytes();
        bytes.push(0);
        self.to.write_all(&bytes).unwrap();
        self.to.flush().unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline
                .checked_duration_since(Instant::now())
                .unwrap_or_else(|| panic!("chromium did not answer {method}"));
            let v = self
                .from
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("chromium did not answer {method}"));
            if v["id"] == json!(id) {
                if let Some(e) = v.get("error") {
                    return Err(e.clone());
                }
                return Ok(v["result"].clone());
            }
        }
    }

    /// Sets the page's size in CSS pixels.
    pub fn viewport(&mut self, width: u32, height: u32) {
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 700}),
        );
    }

    /// Opens `url` in the page.
    pub fn goto(&mut self, url: &str) {
        self.call("Page.navigate", json!({"url": url}));
    }

    /// Evaluates `js` in the page (awaiting a promise) and returns its value.
    pub fn eval(&mut self, js: &str) -> Value {
        self.try_eval(js)
            .unwrap_or_else(|e| panic!("Runtime.evaluate failed: {e}"))
    }

    /// [`Browser::eval`], with chromium's error as an `Err`: a page that
    /// navigates while `js` runs (a sign-in's redirect) ends the evaluation
    /// with "Inspected target navigated or closed".
    fn try_eval(&mut self, js: &str) -> Result<Value, Value> {
        let r = self.try_call(
            "Runtime.evaluate",
            json!({"expression": js, "returnByValue": true, "awaitPromise": true}),
        )?;
        if let Some(e) = r.get("exceptionDetails") {
            panic!("{js} threw: {e}");
        }
        Ok(r["result"]["value"].clone())
    }

    /// Waits until `js` is true in the page; false on timeout. An
    /// evaluation that the page's navigation cut short counts as not yet.
    pub fn wait_for(&mut self, js: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let guarded =
            format!("(() => {{ try {{ return !!({js}); }} catch (e) {{ return false; }} }})()");
        while Instant::now() < deadline {
            match self.try_eval(&guarded) {
                Ok(Value::Bool(true)) => return true,
                Ok(_) => {}
                Err(e) if navigated(&e) => {}
                Err(e) => panic!("Runtime.evaluate failed: {e}"),
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        false
    }

    /// Opens `url` (a dashboard page behind sign-in), signs in with
    /// `token` through the form, and waits until the dashboard opens.
    pub fn sign_in(&mut self, url: &str, token: &str) {
        self.goto(url);
        assert!(
            self.wait_for("document.querySelector('#login')", Duration::from_secs(20)),
            "no sign-in form"
        );
        let submit = format!(
            "document.getElementById('token').value = {}; document.getElementById('login').requestSubmit(); true",
            json!(token)
        );
        if let Err(e) = self.try_eval(&submit) {
            assert!(navigated(&e), "Runtime.evaluate failed: {e}");
        }
        assert!(
            self.wait_for("location.pathname === '/'", Duration::from_secs(20)),
            "sign-in failed: {}",
            self.eval("document.body.innerText")
        );
    }

    /// Saves a PNG screenshot of the page.
    pub fn screenshot(&mut self, path: &Path) {
        use base64::Engine;
        let r = self.call("Page.captureScreenshot", json!({"format": "png"}));
        let png = base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().unwrap())
            .unwrap();
        std::fs::write(path, png).unwrap();
    }
}

/// Whether chromium's error says the page navigated (or its document was
/// replaced) while a command ran, so that trying again is right.
fn navigated(error: &Value) -> bool {
    let message = error["message"].as_str().unwrap_or_default();
    [
        "navigated or closed",
        "Execution context was destroyed",
        "Cannot find context",
    ]
    .iter()
    .any(|m| message.contains(m))
}
