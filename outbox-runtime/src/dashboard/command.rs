//! `outbox dashboard`: its arguments, and serving until Ctrl-C.

use std::io::Write;
use std::net::SocketAddr;

use clap::Args;
use sqlx::PgPool;

use super::{DEFAULT_LISTEN, DashboardConfig, TOKEN_ENV};
use crate::generate::CompiledEvent;

/// The arguments of `outbox dashboard`.
#[derive(Debug, Args)]
pub(crate) struct DashboardArgs {
    /// Address to listen on. Loopback unless a token is set: the dashboard refuses to listen
    /// elsewhere without one.
    #[arg(long, default_value = DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// Outbox table (repeatable); default: `outbox` and every table the events name.
    #[arg(long = "table")]
    pub tables: Vec<String>,
    /// Enables the actions (retry, purge), which must present it. Without it the dashboard is
    /// read-only.
    #[arg(long, env = TOKEN_ENV, hide_env_values = true)]
    pub token: Option<String>,
    /// Show event payloads in the event view (they can hold personal data).
    #[arg(long)]
    pub show_payloads: bool,
}

impl DashboardArgs {
    /// The configuration, or what is wrong with the arguments (checked before connecting).
    pub(crate) fn config(
        &self,
        tables: Vec<String>,
        events: &[CompiledEvent],
    ) -> Result<DashboardConfig, String> {
        let token = self.token.clone().filter(|t| !t.is_empty());
        if token.is_none() && !self.listen.ip().is_loopback() {
            return Err(format!(
                "refusing to listen on {} without a token: anyone who can reach that address could read the outbox. \
                 Listen on loopback (the default, {DEFAULT_LISTEN}), or set --token / {TOKEN_ENV}",
                self.listen
            ));
        }
        DashboardConfig::new()
            .with_tables(tables)
            .map(|c| {
                c.with_token(token)
                    .with_payloads_shown(self.show_payloads)
                    .with_events(events.to_vec())
                    .with_audit_on_stderr(true)
            })
            .map_err(|e| e.to_string())
    }
}

/// Bind, print the address, serve until Ctrl-C.
pub(crate) async fn run_command(
    pool: PgPool,
    listen: SocketAddr,
    config: DashboardConfig,
    out: &mut (dyn Write + Send),
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {listen}: {e}")))?;
    let address = listener.local_addr()?;
    let mode = if config.has_token() {
        "actions enabled, each needs the token"
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
