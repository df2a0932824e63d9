//! Connecting to a coordinator: its address list, bearer token, TLS and
//! default deadline make one lazy channel ([`Conn`]) that the worker and the
//! CLI call through; which errors are worth a retry; and, for one-shot
//! commands, finding the active coordinator among several addresses.
//!
//! Below everything that talks to a coordinator (transfers, caches, the
//! lease loop); knows nothing of what is sent over it.

use std::time::Duration;

use tonic::transport::Endpoint;
use tonic::Code;

use crate::error::Error;

/// How to reach a coordinator: its URL, a bearer token, and for `https://`
/// URLs the CA certificate (PEM) that signed the coordinator's certificate.
#[derive(Debug, Clone, Default)]
pub struct Access {
    /// `http://host:port` or `https://host:port`.
    pub url: String,
    /// The bearer token, if any.
    pub token: Option<String>,
    /// CA certificate (PEM) for TLS.
    pub ca: Option<Vec<u8>>,
}

/// Adds `authorization: Bearer <token>` to every call, and a deadline to
/// every call that has none (see [`crate::deadline`]).
#[derive(Clone)]
pub struct Bearer {
    token: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    deadline: Duration,
}

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.token {
            req.metadata_mut().insert("authorization", v.clone());
        }
        if !req.metadata().contains_key("grpc-timeout") {
            req.set_timeout(self.deadline);
        }
        Ok(req)
    }
}

/// A connection to a coordinator (the active one of several addresses, see
/// [`crate::failover`]), with its token.
pub type Conn = tonic::service::interceptor::InterceptedService<crate::failover::Failover, Bearer>;

/// Connects lazily: the channel reconnects by itself after the coordinator
/// restarts, and moves on to the next address when one is down, silent or
/// standby. Calls without a deadline of their own get
/// [`crate::deadline::CLIENT_CALL`].
pub fn channel(access: &Access) -> Result<Conn, Error> {
    channel_with_deadline(access, crate::deadline::CLIENT_CALL)
}

/// [`channel`] whose calls get `deadline` unless they set their own.
pub fn channel_with_deadline(access: &Access, deadline: Duration) -> Result<Conn, Error> {
    let mut channels = Vec::new();
    let mut urls = Vec::new();
    for (url, tls_name) in crate::failover::addresses(&access.url)? {
        channels.push(endpoint(&url, tls_name.as_deref(), access)?.connect_lazy());
        urls.push(url);
    }
    let bearer = match &access.token {
        Some(t) => Some(format!("Bearer {}", t.trim()).parse().map_err(|_| {
            Error::Tls("the token has characters a header cannot carry; copy it again".into())
        })?),
        None => None,
    };
    Ok(tonic::service::interceptor::InterceptedService::new(
        crate::failover::Failover::new(channels, urls, &access.url),
        Bearer {
            token: bearer,
            deadline,
        },
    ))
}

/// The endpoint of one coordinator address; `tls_name` is the host name its
/// certificate carries when `url` names an address.
fn endpoint(url: &str, tls_name: Option<&str>, access: &Access) -> Result<Endpoint, Error> {
    let mut endpoint = Endpoint::from_shared(url.to_string())
        .map_err(|_| Error::Address(url.to_string()))?
        .connect_timeout(Duration::from_secs(5))
        // A connection that goes silent (a partition that drops packets)
        // is closed when its pings go unanswered, ending streams on it too.
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true)
        .tcp_nodelay(true)
        // HTTP/2's default 64 KiB windows cap blob transfers at a few
        // round trips per window; wide windows let 1 MiB chunks stream.
        .initial_stream_window_size(Some(8 << 20))
        .initial_connection_window_size(Some(32 << 20));
    if url.starts_with("https://") {
        let ca = access.ca.as_ref().ok_or_else(|| {
            Error::Tls(format!(
                "{url} uses TLS; pass --ca with the certificate that signed the coordinator's"
            ))
        })?;
        let mut tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(ca));
        if let Some(name) = tls_name {
            tls = tls.domain_name(name);
        }
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| Error::Tls(e.to_string()))?;
    }
    Ok(endpoint)
}

/// Whether an error may go away by itself (coordinator down or restarting).
pub fn transient(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable
            | Code::Unknown
            | Code::Cancelled
            | Code::DeadlineExceeded
            | Code::Aborted
            | Code::Internal
            | Code::ResourceExhausted
    )
}

/// Points `conn`'s address list at a coordinator that is not standby:
/// asks each address in turn (a cheap call that any token may make) until
/// one answers other than "standby" or "unreachable". Best effort: callers
/// still report what the next real call says.
pub async fn find_active(conn: Conn, addresses: usize) {
    if addresses < 2 {
        return;
    }
    let mut blobs = tessera_proto::blobs_client::BlobsClient::new(conn);
    for _ in 0..addresses * 2 {
        // A deadline on the request (not a timeout around it), so that a
        // silent address is passed over like an unreachable one.
        let probe = crate::deadline::request(
            tessera_proto::MissingBlobsRequest { digests: vec![] },
            Duration::from_secs(5),
        );
        match blobs.missing_blobs(probe).await {
            Ok(_) => return,
            Err(s)
                if !matches!(
                    s.code(),
                    tonic::Code::Unavailable
                        | tonic::Code::DeadlineExceeded
                        | tonic::Code::Cancelled
                ) =>
            {
                return
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}
