//! Who may reach the dashboard at all: the `Host` a request names, and the token its reads carry.
//!
//! Every request, the page included, must name the dashboard in its `Host` header by the
//! address it listens on, by `localhost` when it listens on loopback, or by a name it was given
//! ([`super::DashboardConfig::with_allowed_hosts`]). That is the defence against DNS
//! rebinding: a page on `http://attacker.example:8089/` whose name an attacker re-points at
//! 127.0.0.1 is same-origin with itself in the browser, not with the dashboard, and every
//! request it sends says `Host: attacker.example:8089`. An address given as an IP literal
//! involves no DNS and cannot be rebound, so a dashboard that listens on every interface
//! (`0.0.0.0`, `::`) answers to any IP literal, and so does one mounted in a service's own app
//! (which does not tell it its address), besides `localhost` and the allowed names.
//!
//! With a token configured (the action token, the viewer token, or both), every route but the
//! page and its two static files needs one of them in `Authorization: Bearer <token>`: the
//! viewer token reads, the action token reads and acts. Without any token the reads are open,
//! which the `outbox dashboard` command allows on loopback only.
//!
//! Tokens are checked when configured: at least [`MIN_TOKEN_CHARS`] printable characters that
//! do not look made up by hand (see [`check_token_strength`]).

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use super::{ApiError, Dashboard};

/// The shortest token the dashboard accepts.
pub const MIN_TOKEN_CHARS: usize = 32;

/// Estimated bits a token must carry (its length times the Shannon entropy of its characters'
/// frequencies). The estimate undercounts short random strings: 32 random hexadecimal digits
/// (a UUID's) score 116 on average and under 80 in fewer than one in a million draws;
/// `openssl rand -hex 32` scores about 250. A token of a few characters used over and over
/// stays below. It cannot tell a phrase from random characters, hence the advice to generate.
const MIN_TOKEN_BITS: f64 = 80.0;

/// How to make a good token, appended to every refusal.
const TOKEN_ADVICE: &str =
    "use 32 or more random characters, for example the output of `openssl rand -hex 32`";

/// Why `token` is too weak to guard the dashboard, if it is: it travels in a header and is
/// compared whole, so it must be printable ASCII without spaces; it must be long enough that
/// guessing is hopeless, and it must not look typed (a repeated character or piece, a run like
/// `abcdef...`, few distinct characters).
pub(crate) fn check_token_strength(token: &str) -> Result<(), String> {
    let weak = |why: String| {
        Err(format!(
            "the dashboard token is too weak: {why}; {TOKEN_ADVICE}"
        ))
    };
    if let Some(bad) = token.chars().find(|c| !c.is_ascii_graphic()) {
        return weak(format!(
            "it holds {bad:?}, and a token must be printable ASCII without spaces"
        ));
    }
    let chars: Vec<u8> = token.bytes().collect();
    if chars.len() < MIN_TOKEN_CHARS {
        return weak(format!(
            "it has {} characters, fewer than {MIN_TOKEN_CHARS}",
            chars.len()
        ));
    }
    if let Some(period) =
        (1..=chars.len() / 2).find(|&p| chars.iter().zip(&chars[p..]).all(|(a, b)| a == b))
    {
        return weak(format!("it repeats a piece of {period} character(s)"));
    }
    let steps = chars
        .windows(2)
        .filter(|w| w[0].abs_diff(w[1]) <= 1)
        .count();
    if steps * 2 > chars.len() - 1 {
        return weak(
            "most of its neighbouring characters are equal or consecutive (like `aaaa` or `abcd`)"
                .to_owned(),
        );
    }
    let bits = estimated_bits(&chars);
    if bits < MIN_TOKEN_BITS {
        return weak(format!(
            "it carries about {bits:.0} bits by the frequencies of its characters, fewer than {MIN_TOKEN_BITS:.0}"
        ));
    }
    Ok(())
}

/// Length times the Shannon entropy of the characters' frequencies in `bytes`.
fn estimated_bits(bytes: &[u8]) -> f64 {
    let mut counts = [0usize; 256];
    for &b in bytes {
        counts[usize::from(b)] += 1;
    }
    let n = bytes.len() as f64;
    let per_char: f64 = counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = c as f64 / n;
            -p * p.log2()
        })
        .sum();
    per_char * n
}

/// Constant-time comparison of the presented token with the configured one (compared as
/// SHA-256 digests, so neither the length nor a matching prefix shows in the timing).
pub(crate) fn token_matches(presented: &str, expected: &str) -> bool {
    let a = Sha256::digest(presented.as_bytes());
    let b = Sha256::digest(expected.as_bytes());
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// The token in `Authorization: Bearer <token>`, if the request carries one.
pub(crate) fn presented_token(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

/// What a request may do, decided by [`require_token`] and handed to the handlers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// No token is configured: reading is open, acting is off.
    Open,
    /// The viewer token: reading only.
    Viewer,
    /// The action token: reading and acting.
    Actions,
}

/// Which token `presented` is, if it is one of the configured ones.
pub(crate) fn access_of(d: &Dashboard, presented: Option<&str>) -> Option<Access> {
    let presented = presented?;
    // Both compared, so the timing does not tell which one matched.
    let action = d
        .config
        .token
        .as_deref()
        .is_some_and(|t| token_matches(presented, t));
    let viewer = d
        .config
        .viewer_token
        .as_deref()
        .is_some_and(|t| token_matches(presented, t));
    if action {
        Some(Access::Actions)
    } else if viewer {
        Some(Access::Viewer)
    } else {
        None
    }
}

/// Middleware of the `api/` routes: with a token configured, a request must carry one.
pub(crate) async fn require_token(
    State(d): State<Arc<Dashboard>>,
    mut request: Request,
    next: Next,
) -> Response {
    let access = if d.config.token.is_none() && d.config.viewer_token.is_none() {
        Access::Open
    } else {
        let presented = presented_token(request.headers());
        match access_of(&d, presented) {
            Some(access) => access,
            None if presented.is_none() => {
                return ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "this dashboard needs its token to show anything: paste it into the token field \
                     (sent as `Authorization: Bearer <token>`)",
                )
                .into_response();
            }
            None => {
                return ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "the token is wrong: use the one the dashboard was started with",
                )
                .into_response();
            }
        }
    };
    request.extensions_mut().insert(access);
    next.run(request).await
}

/// The host part of a `Host` header (or an authority), without the port, lower-cased and
/// without a trailing dot; an IPv6 literal without its brackets.
fn host_part(authority: &str) -> String {
    let host = if let Some(rest) = authority.strip_prefix('[') {
        rest.split(']').next().unwrap_or_default()
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
            _ => authority,
        }
    };
    host.trim_end_matches('.').to_ascii_lowercase()
}

/// Whether a request naming `authority` in its `Host` is meant for this dashboard (see the
/// module's documentation). `bound` is the address it listens on, when it serves itself.
fn host_allowed(authority: &str, bound: Option<IpAddr>, names: &[String]) -> bool {
    let host = host_part(authority);
    if names.contains(&host) {
        return true;
    }
    let anywhere = bound.is_none_or(|ip| ip.is_unspecified());
    if let Ok(ip) = host.parse::<IpAddr>() {
        return anywhere || bound == Some(ip);
    }
    host == "localhost" && (anywhere || bound.is_some_and(|ip| ip.is_loopback()))
}

/// Middleware of every route: refuse a request whose `Host` does not name this dashboard.
pub(crate) async fn check_host(
    State(d): State<Arc<Dashboard>>,
    request: Request,
    next: Next,
) -> Response {
    let authority = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
        .or_else(|| request.uri().authority().map(|a| a.as_str().to_owned()));
    let Some(authority) = authority else {
        return ApiError::new(
            StatusCode::BAD_REQUEST,
            "the request has no Host header: send the dashboard's address as its Host",
        )
        .into_response();
    };
    if host_allowed(&authority, d.config.bound, &d.config.allowed_hosts) {
        return next.run(request).await;
    }
    let known = match d.config.bound {
        Some(ip) if !ip.is_unspecified() => format!("its address {ip}"),
        _ => "an IP address".to_owned(),
    };
    ApiError::new(
        StatusCode::FORBIDDEN,
        format!(
            "this dashboard does not answer to the host `{}`: open it by {known}{}, or start it with \
             --allow-host {} (DashboardConfig::with_allowed_hosts) if that name is really its own",
            crate::contract::shown(&host_part(&authority)),
            if d.config.bound.is_none_or(|ip| ip.is_loopback() || ip.is_unspecified()) {
                " or localhost"
            } else {
                ""
            },
            crate::contract::shown(&host_part(&authority)),
        ),
    )
    .into_response()
}

/// Validate a name given to [`super::DashboardConfig::with_allowed_hosts`]; returns it as it is
/// compared (lower case, no trailing dot).
pub(crate) fn allowed_host_name(name: &str) -> Result<String, String> {
    let host = name.trim().trim_end_matches('.').to_ascii_lowercase();
    let ok = !host.is_empty()
        && (host.parse::<IpAddr>().is_ok()
            || host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.'));
    if ok {
        Ok(host)
    } else {
        Err(format!(
            "`{}` is not a host name: give a name like ops.example.com (no scheme, no port)",
            crate::contract::shown(name)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_match_only_when_equal() {
        assert!(token_matches("s3cret", "s3cret"));
        assert!(!token_matches("s3cre", "s3cret"));
        assert!(!token_matches("", "s3cret"));
        assert!(!token_matches("s3cret ", "s3cret"));
    }

    #[test]
    fn host_parts() {
        assert_eq!(host_part("127.0.0.1:8089"), "127.0.0.1");
        assert_eq!(host_part("[::1]:8089"), "::1");
        assert_eq!(host_part("LocalHost.:80"), "localhost");
        assert_eq!(host_part("example.com"), "example.com");
    }
}
