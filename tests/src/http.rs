//! A small blocking HTTP/1.1 client for the coordinator's JSON API, and a
//! reader of its Server-Sent Events: enough for the end-to-end tests, with
//! no HTTP crate in the test build.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// An HTTP answer.
#[derive(Debug)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// Header names (lowercase) and values.
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked.
    pub body: Vec<u8>,
}

impl Response {
    /// The body as JSON (panics with the body when it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "HTTP {} body is not JSON ({e}): {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

fn split(url: &str) -> (String, String) {
    let rest = url.strip_prefix("http://").expect("an http:// URL");
    rest.split_once('/')
        .map_or((rest.to_string(), "/".to_string()), |(h, p)| {
            (h.to_string(), format!("/{p}"))
        })
}

fn send_head(
    url: &str,
    method: &str,
    token: Option<&str>,
    headers: &[(&str, &str)],
    body_len: Option<usize>,
) -> TcpStream {
    let (host, path) = split(url);
    let mut s = TcpStream::connect(&host).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    if let Some(t) = token {
        head.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(n) = body_len {
        head.push_str(&format!("Content-Length: {n}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    s
}

fn read_head(r: &mut impl BufRead) -> (u16, Vec<(String, String)>) {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {line:?}"));
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line).unwrap();
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_lowercase(), v.trim().to_string()));
        }
    }
    (status, headers)
}

fn chunked(headers: &[(String, String)]) -> bool {
    headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"))
}

/// Reads one chunk of a chunked body; None at its end.
fn read_chunk(r: &mut impl BufRead) -> std::io::Result<Option<Vec<u8>>> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
        .map_err(|e| std::io::Error::other(format!("bad chunk size {line:?}: {e}")))?;
    if size == 0 {
        return Ok(None);
    }
    let mut data = vec![0; size + 2];
    r.read_exact(&mut data)?;
    data.truncate(size);
    Ok(Some(data))
}

/// One request; `body` is sent with its Content-Length unless `headers`
/// name one (to claim a size without sending it).
pub fn request(
    method: &str,
    url: &str,
    token: Option<&str>,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Response {
    let claims = headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-length"));
    let len = (!claims && (method != "GET" || !body.is_empty())).then_some(body.len());
    let mut s = send_head(url, method, token, headers, len);
    // The server may answer (413, 400) before reading the body.
    let _ = s.write_all(body);
    let mut r = BufReader::new(s);
    let (status, headers) = read_head(&mut r);
    let mut out = Vec::new();
    if chunked(&headers) {
        while let Ok(Some(c)) = read_chunk(&mut r) {
            out.extend(c);
        }
    } else {
        let _ = r.read_to_end(&mut out);
    }
    Response {
        status,
        headers,
        body: out,
    }
}

/// `GET` with a token.
pub fn get(url: &str, token: &str) -> Response {
    request("GET", url, Some(token), &[], &[])
}

/// `POST` of JSON with a token.
pub fn post(url: &str, token: &str, body: &serde_json::Value) -> Response {
    request(
        "POST",
        url,
        Some(token),
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    )
}

/// An open Server-Sent Events stream.
pub struct Events {
    reader: BufReader<TcpStream>,
    pending: String,
    is_chunked: bool,
}

impl Events {
    /// Opens `GET url` as an event stream (panics unless it answers 200).
    pub fn open(url: &str, token: &str) -> Self {
        let s = send_head(
            url,
            "GET",
            Some(token),
            &[("Accept", "text/event-stream")],
            None,
        );
        let mut reader = BufReader::new(s);
        let (status, headers) = read_head(&mut reader);
        assert_eq!(status, 200, "the event stream answered {status}");
        Self {
            reader,
            pending: String::new(),
            is_chunked: chunked(&headers),
        }
    }

    /// The next event (name, JSON data) within `timeout`; None when none came.
    pub fn next(&mut self, timeout: Duration) -> Option<(String, serde_json::Value)> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(end) = self.pending.find("\n\n") {
                let block: String = self.pending.drain(..end + 2).collect();
                let mut name = String::from("message");
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        name = v.trim().to_string();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim_start());
                    }
                }
                if data.is_empty() {
                    continue; // a keep-alive comment
                }
                return Some((name, serde_json::from_str(&data).unwrap()));
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            self.reader
                .get_ref()
                .set_read_timeout(Some(left.max(Duration::from_millis(10))))
                .unwrap();
            let got = if self.is_chunked {
                read_chunk(&mut self.reader).ok().flatten()
            } else {
                let mut buf = vec![0; 8192];
                match self.reader.read(&mut buf) {
                    Ok(n) if n > 0 => Some(buf[..n].to_vec()),
                    _ => None,
                }
            };
            match got {
                Some(bytes) => self.pending.push_str(&String::from_utf8_lossy(&bytes)),
                None => return None,
            }
        }
    }
}
