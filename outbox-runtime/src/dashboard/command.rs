//! `outbox dashboard`: its arguments, and serving until Ctrl-C.

use std::io::Write;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

use clap::Args;
use sqlx::PgPool;

use super::{DEFAULT_LISTEN, DashboardConfig, TOKEN_ENV, VIEWER_TOKEN_ENV};
use crate::generate::CompiledEvent;

/// The arguments of `outbox dashboard`.
#[derive(Debug, Args)]
pub(crate) struct DashboardArgs {
    /// Address to listen on, `host:port` (an IP or a name, resolved). Loopback unless a token
    /// is set: the dashboard refuses to listen elsewhere without one.
    #[arg(long, default_value = DEFAULT_LISTEN)]
    pub listen: String,
    /// Outbox table (repeatable); default: `outbox` and every table the events name.
    #[arg(long = "table")]
    pub tables: Vec<String>,
    /// Enables the actions (retry, purge), which must present it; reading needs it too (or the
    /// viewer token). Without it the dashboard is read-only. At least 32 random characters,
    /// for example `openssl rand -hex 32`.
    #[arg(long, env = TOKEN_ENV, hide_env_values = true)]
    pub token: Option<String>,
    /// A second token that reads every view and runs no action (checked like --token).
    #[arg(long, env = VIEWER_TOKEN_ENV, hide_env_values = true)]
    pub viewer_token: Option<String>,
    /// A host name the dashboard answers to besides its address and `localhost` (repeatable):
    /// the name operators open it by. Requests naming another host are refused (DNS rebinding).
    /// The name given to --listen is allowed by itself.
    #[arg(long = "allow-host")]
    pub allow_hosts: Vec<String>,
    /// Show event payloads in the event view (they can hold personal data).
    #[arg(long)]
    pub show_payloads: bool,
}

impl DashboardArgs {
    /// The configuration and the addresses `--listen` resolves to, or what is wrong with the
    /// arguments (checked before connecting).
    pub(crate) fn config(
        &self,
        tables: Vec<String>,
        events: &[CompiledEvent],
    ) -> Result<(DashboardConfig, Vec<SocketAddr>), String> {
        let (addresses, name) = resolve_listen(&self.listen)?;
        let token = self.token.clone().filter(|t| !t.is_empty());
        let viewer_token = self.viewer_token.clone().filter(|t| !t.is_empty());
        // A name is loopback only if everything it resolves to is.
        let loopback = addresses.iter().all(|a| a.ip().is_loopback());
        if token.is_none() && viewer_token.is_none() && !loopback {
            let resolved = match &name {
                Some(_) => {
                    let all: Vec<String> = addresses.iter().map(ToString::to_string).collect();
                    format!(" (resolved to {})", all.join(", "))
                }
                None => String::new(),
            };
            return Err(format!(
                "refusing to listen on {}{resolved} without a token: anyone who can reach that address could read the outbox. \
                 Listen on loopback (the default, {DEFAULT_LISTEN}), or set --token / {TOKEN_ENV} \
                 (a token of 32 or more random characters, for example `openssl rand -hex 32`)",
                self.listen,
            ));
        }
        let config = DashboardConfig::new()
            .with_tables(tables)
            .and_then(|c| c.with_token(token))
            .and_then(|c| c.with_viewer_token(viewer_token))
            .and_then(|c| c.with_allowed_hosts(self.allow_hosts.iter().chain(&name)))
            .map_err(|e| e.to_string())?
            .with_payloads_shown(self.show_payloads)
            .with_events(events.to_vec())
            .with_audit_on_stderr(true);
        Ok((config, addresses))
    }
}

/// The addresses `listen` (`host:port`) resolves to, and its host when that is a name (which
/// the dashboard then answers to).
fn resolve_listen(listen: &str) -> Result<(Vec<SocketAddr>, Option<String>), String> {
    let wrong = |why: String| {
        format!(
            "--listen {}: {why}; give host:port, like {DEFAULT_LISTEN} or localhost:8089",
            crate::contract::shown(listen)
        )
    };
    let Some((host, port)) = listen.rsplit_once(':') else {
        return Err(wrong("no port".to_owned()));
    };
    if port.parse::<u16>().is_err() {
        return Err(wrong(format!(
            "`{}` is not a port number",
            crate::contract::shown(port)
        )));
    }
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let name = (bare.parse::<IpAddr>().is_err()).then(|| bare.to_owned());
    // The system resolver, blocking: once, at start, before anything else runs.
    let addresses: Vec<SocketAddr> = listen
        .to_socket_addrs()
        .map_err(|e| wrong(format!("cannot resolve it ({e})")))?
        .collect();
    if addresses.is_empty() {
        return Err(wrong("it resolves to no address".to_owned()));
    }
    Ok((addresses, name))
}

/// Bind (the first of `listen` that binds), print the address, serve until Ctrl-C.
pub(crate) async fn run_command(
    pool: PgPool,
    listen: &[SocketAddr],
    config: DashboardConfig,
    out: &mut (dyn Write + Send),
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await.map_err(|e| {
        let shown: Vec<String> = listen.iter().map(ToString::to_string).collect();
        std::io::Error::new(
            e.kind(),
            format!("cannot listen on {}: {e}", shown.join(" or ")),
        )
    })?;
    let address = listener.local_addr()?;
    let mode = if config.has_token() {
        "actions enabled; reading and each action need the token"
    } else if config.needs_token_to_read() {
        "view-only: reading needs the viewer token"
    } else {
        "read-only: no token"
    };
    let _ = writeln!(
        out,
        "dashboard: http://{address}/ ({mode}); Ctrl-C stops it"
    );
    let _ = out.flush();
    super::serve(listener, pool, config, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
}
