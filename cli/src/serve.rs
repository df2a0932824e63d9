//! `tessera coordinator`: checks the options, then serves on sled, or
//! hands over to [`crate::ha`] for a PostgreSQL store.

use anyhow::{bail, Context, Result};

use crate::setup::{
    announce, bind, connection_limits, coordinator_config, is_postgres, open_blobs,
    say_admin_token, tls_files, warn_if_few_files,
};
use crate::shutdown::shutdown_signal;
use crate::CoordinatorArgs;

/// Runs a coordinator until SIGINT or SIGTERM.
pub async fn coordinator(args: CoordinatorArgs) -> Result<()> {
    warn_if_few_files();
    let limits = connection_limits(&args)?;
    let config = coordinator_config(&args)?;
    let tls = tls_files(&args)?;
    if !(args.preview_timeout.is_finite() && args.preview_timeout > 0.0) {
        bail!(
            "--preview-timeout {} is not a number of seconds; use more than 0",
            args.preview_timeout
        );
    }
    let ffmpeg = tessera_coordinator::imaging::video::Ffmpeg {
        program: args.ffmpeg.clone(),
        timeout: std::time::Duration::from_secs_f64(args.preview_timeout.min(86_400.0)),
    };
    match args.store.as_deref().map(str::trim) {
        Some(url) if is_postgres(url) => {
            return crate::ha::coordinator(&args, config, tls, ffmpeg).await;
        }
        None | Some("") | Some("sled") => {}
        Some(other) => bail!(
            "--store {other}: not a store; use sled (the default, in --data) or postgres://USER@HOST:PORT/DATABASE"
        ),
    }
    let blobs = open_blobs(&args, config.max_upload)?;
    let mut coord = tessera_coordinator::Coordinator::open_with_blobs(&args.data, config, blobs)
        .with_context(|| format!("cannot open the data directory {}", args.data.display()))?
        .with_ffmpeg(ffmpeg)
        .with_connection_limits(limits);
    say_admin_token(&coord);
    if let Some((cert, key)) = tls {
        coord = coord.with_tls(cert, key);
    }
    let (listener, http) = bind(&args).await?;
    announce(
        &args,
        listener.local_addr()?,
        http.as_ref().map(|h| h.local_addr()).transpose()?,
    );
    coord.serve(listener, http, shutdown_signal()).await?;
    Ok(())
}
