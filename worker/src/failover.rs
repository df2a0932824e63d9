//! Several coordinator addresses, one active coordinator among them.
//!
//! `--coordinator http://a:7878,http://b:7878` (or `$TESSERA_COORDINATOR`),
//! or one DNS name with several addresses, gives a list. Calls go to the
//! address that answered last; when a call fails to connect, runs past its
//! deadline (see [`crate::deadline`]: a coordinator gone silent), or a
//! standby refuses it (its answer carries `tessera-role: standby`), the
//! next call goes to the next address. Callers already retry while the coordinator
//! is unavailable, so they find the active one within a retry or two;
//! [`crate::connect::find_active`] does that up front for one-shot commands.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::codegen::http;
use tonic::codegen::Service;
use tonic::transport::Channel;

use crate::error::Error;

/// The response metadata a standby coordinator marks its refusals with.
pub const ROLE_HEADER: &str = "tessera-role";

/// A channel per coordinator address, and which one to use now.
#[derive(Clone)]
pub struct Failover {
    channels: Arc<[Channel]>,
    /// The address of each channel, for messages.
    urls: Arc<[String]>,
    /// Shared by every channel made for the same address list, so a
    /// command's later connections start where the probe found the active one.
    current: Arc<AtomicUsize>,
    /// Per address: woken when a call to it runs past its deadline, so that
    /// every other call waiting on it gives up too and moves on.
    silenced: Arc<[tokio::sync::Notify]>,
}

impl Failover {
    /// One channel per address (`urls`, in order).
    pub fn new(channels: Vec<Channel>, urls: Vec<String>, key: &str) -> Self {
        static CURRENT: OnceLock<Mutex<HashMap<String, Arc<AtomicUsize>>>> = OnceLock::new();
        let current = CURRENT
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key.to_string())
            .or_default()
            .clone();
        let silenced = channels
            .iter()
            .map(|_| tokio::sync::Notify::new())
            .collect();
        Self {
            channels: channels.into(),
            urls: urls.into(),
            current,
            silenced,
        }
    }

    /// How many addresses there are.
    pub fn len(&self) -> usize {
        self.channels.len()
    }

    /// Whether there are none (never, for a channel made by `connect::channel`).
    pub fn is_empty(&self) -> bool {
        self.channels.is_empty()
    }
}

impl Service<http::Request<Body>> for Failover {
    type Response = http::Response<Body>;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Each call waits for its own channel's readiness.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let n = self.channels.len();
        let i = self.current.load(Ordering::SeqCst) % n;
        let mut channel = self.channels[i].clone();
        let current = self.current.clone();
        let urls = self.urls.clone();
        // Enforced here, not only by the channel: a call waiting for a
        // connection to a silent peer is timed too.
        let deadline = crate::deadline::of(req.headers());
        let silenced = self.silenced.clone();
        Box::pin(async move {
            let call = async {
                std::future::poll_fn(|cx| channel.poll_ready(cx)).await?;
                channel.call(req).await
            };
            // Registered before the call starts: another call to this
            // address that runs past its deadline ends this one too (a
            // result upload already on its way to a coordinator gone silent
            // would otherwise wait out its own, longer deadline there).
            let gone_silent = silenced[i].notified();
            let mut cut_short = false;
            let mut result: Result<Self::Response, Self::Error> = match deadline {
                Some(d) => tokio::select! {
                    r = tokio::time::timeout(d, call) => match r {
                        Ok(r) => r.map_err(Into::into),
                        Err(_) => Err(Box::new(tonic::TimeoutExpired(()))),
                    },
                    _ = gone_silent => {
                        cut_short = true;
                        Err(Box::new(tonic::TimeoutExpired(())))
                    }
                },
                None => call.await.map_err(Into::into),
            };
            // The channel times the call too, and its word may come first.
            if let (Some(d), Err(e)) = (deadline, &result) {
                if timed_out(e.as_ref()) {
                    let url = urls.get(i).map_or("?", String::as_str);
                    let next = if n > 1 {
                        format!("; trying {} next", urls[(i + 1) % n])
                    } else {
                        String::new()
                    };
                    let words = if cut_short {
                        format!("the coordinator at {url} went silent (another call to it ran past its deadline){next}")
                    } else {
                        format!("the coordinator at {url} did not answer within {d:?}{next}")
                    };
                    tracing::warn!("{words}");
                    result = Err(tonic::Status::deadline_exceeded(words).into());
                    if !cut_short {
                        silenced[i].notify_waiters();
                    }
                }
            }
            let move_on = match &result {
                Err(_) => true,
                Ok(r) => r
                    .headers()
                    .get(ROLE_HEADER)
                    .is_some_and(|v| v.as_bytes() == b"standby"),
            };
            if move_on && n > 1 {
                let _ =
                    current.compare_exchange(i, (i + 1) % n, Ordering::SeqCst, Ordering::SeqCst);
            }
            result
        })
    }
}

/// Whether `e` (or what caused it) is a call running past its deadline.
fn timed_out(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(e);
    while let Some(e) = source {
        if e.is::<tonic::TimeoutExpired>() {
            return true;
        }
        source = e.source();
    }
    false
}

/// The addresses a `--coordinator` value stands for: its comma-separated
/// URLs, each DNS name with several addresses of one family expanded to one
/// URL per address (with the name kept for TLS). Returns (URL, name for TLS).
pub fn addresses(spec: &str) -> Result<Vec<(String, Option<String>)>, Error> {
    addresses_with(spec, |host, port| {
        (host, port)
            .to_socket_addrs()
            .map(|a| a.collect())
            .unwrap_or_default()
    })
}

/// [`addresses`] with the name resolution given.
fn addresses_with(
    spec: &str,
    resolve: impl Fn(&str, u16) -> Vec<SocketAddr>,
) -> Result<Vec<(String, Option<String>)>, Error> {
    let mut out = Vec::new();
    for url in spec.split(',').map(str::trim).filter(|u| !u.is_empty()) {
        let uri: http::Uri = url.parse().map_err(|_| Error::Address(url.to_string()))?;
        let (Some(scheme), Some(host), Some(port)) = (uri.scheme_str(), uri.host(), uri.port_u16())
        else {
            out.push((url.to_string(), None));
            continue;
        };
        if host.trim_matches(['[', ']']).parse::<IpAddr>().is_ok() {
            out.push((url.to_string(), None));
            continue;
        }
        let resolved = resolve(host, port);
        let v4: Vec<&SocketAddr> = resolved.iter().filter(|a| a.is_ipv4()).collect();
        let v6: Vec<&SocketAddr> = resolved.iter().filter(|a| a.is_ipv6()).collect();
        // `localhost` is 127.0.0.1 and ::1, one server: only several
        // addresses of one family are taken for several coordinators.
        let many = if v4.len() > 1 {
            v4
        } else if v6.len() > 1 {
            v6
        } else {
            Vec::new()
        };
        if many.is_empty() {
            out.push((url.to_string(), None));
        } else {
            for a in many {
                out.push((format!("{scheme}://{a}"), Some(host.to_string())));
            }
        }
    }
    if out.is_empty() {
        return Err(Error::Address(spec.to_string()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_list_is_split_and_addresses_stay_as_given() {
        let a = addresses("http://127.0.0.1:1, http://127.0.0.2:2,").unwrap();
        assert_eq!(
            a,
            vec![
                ("http://127.0.0.1:1".to_string(), None),
                ("http://127.0.0.2:2".to_string(), None)
            ]
        );
        // localhost: one server on two families, kept as one name.
        assert_eq!(addresses("http://localhost:7878").unwrap().len(), 1);
        assert!(addresses(" , ").is_err());
    }

    #[test]
    fn a_name_with_several_addresses_is_several_coordinators() {
        let resolve = |host: &str, port: u16| -> Vec<SocketAddr> {
            match host {
                "farm.example" => vec![
                    SocketAddr::from(([10, 0, 0, 1], port)),
                    SocketAddr::from(([10, 0, 0, 2], port)),
                    SocketAddr::from(([0, 0, 0, 0, 0, 0, 0, 1], port)),
                ],
                _ => vec![SocketAddr::from(([10, 0, 0, 9], port))],
            }
        };
        let a = addresses_with("https://farm.example:7878", resolve).unwrap();
        assert_eq!(
            a,
            vec![
                (
                    "https://10.0.0.1:7878".to_string(),
                    Some("farm.example".to_string())
                ),
                (
                    "https://10.0.0.2:7878".to_string(),
                    Some("farm.example".to_string())
                ),
            ]
        );
        // One address: the name stays as given.
        let one = addresses_with("http://coord-a.example:7878", resolve).unwrap();
        assert_eq!(one, vec![("http://coord-a.example:7878".to_string(), None)]);
    }

    #[tokio::test]
    async fn a_silent_address_is_left_when_a_call_runs_past_its_deadline() {
        // Both accept connections (the kernel does) and never answer.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let (a, b) = (
            format!("http://{}", silent.local_addr().unwrap()),
            format!("http://{}", other.local_addr().unwrap()),
        );
        let access = crate::connect::Access {
            url: format!("{a},{b}"),
            ..Default::default()
        };
        let conn =
            crate::connect::channel_with_deadline(&access, Duration::from_millis(300)).unwrap();
        let mut blobs = tessera_proto::blobs_client::BlobsClient::new(conn);
        let ask = || tessera_proto::MissingBlobsRequest { digests: vec![] };
        let started = std::time::Instant::now();
        let err = blobs.missing_blobs(ask()).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::DeadlineExceeded, "{err:?}");
        assert!(
            err.message()
                .contains(&format!("the coordinator at {a} did not answer within"))
                && err.message().contains(&format!("trying {b} next")),
            "{err:?}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        // The next call goes to the next address; a call's own deadline wins.
        let err = blobs
            .missing_blobs(crate::deadline::request(ask(), Duration::from_millis(100)))
            .await
            .unwrap_err();
        assert!(
            err.message().contains(&format!(
                "the coordinator at {b} did not answer within 100ms"
            )),
            "{err:?}"
        );
    }
}
