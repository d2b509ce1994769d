//! A TCP proxy on loopback between a worker's pool and PostgreSQL, so a test can break the
//! network the way production breaks it: a partition (nothing gets through either way, and
//! nothing is closed either), or a connection that dies after the server committed a statement
//! but before the client read the answer.
//!
//! Every connection of a pool built with [`Proxy::pool`] goes through the proxy; the test keeps
//! its own direct pool to look at the database while the worker cannot reach it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Per connection: how far [`Proxy::lose_reply_to`] got.
const FORWARDING: u8 = 0;
/// The statement was parsed on this connection; its execution (a Bind) comes next.
const ARMED: u8 = 1;
/// The execution was forwarded; its answer is being thrown away.
const LOSING: u8 = 2;

/// The server's ReadyForQuery message header ('Z', length 5): the end of its answer to one
/// statement in the extended protocol, sent after the statement committed.
const READY_FOR_QUERY: &[u8] = b"Z\0\0\0\x05";

#[derive(Debug)]
struct Control {
    upstream: SocketAddr,
    /// true while partitioned.
    black_hole: watch::Sender<bool>,
    /// One-shot: the next client message containing these bytes has its answer thrown away.
    lose_reply_to: Mutex<Option<Vec<u8>>>,
    replies_lost: AtomicUsize,
}

/// A running proxy; stops accepting when dropped (open connections end with their peers).
#[derive(Debug)]
pub struct Proxy {
    port: u16,
    control: Arc<Control>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listen on an ephemeral loopback port and forward to the server of `options`, which must
    /// be on loopback too.
    pub async fn start(options: &PgConnectOptions) -> Proxy {
        let upstream = tokio::net::lookup_host((options.get_host(), options.get_port()))
            .await
            .expect("resolving the test server's address")
            .next()
            .expect("the test server's host resolves");
        assert!(
            upstream.ip().is_loopback(),
            "the proxy only forwards to loopback, not to {upstream}"
        );
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding the proxy");
        let port = listener.local_addr().unwrap().port();
        let control = Arc::new(Control {
            upstream,
            black_hole: watch::Sender::new(false),
            lose_reply_to: Mutex::new(None),
            replies_lost: AtomicUsize::new(0),
        });
        let shared = Arc::clone(&control);
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(serve(client, Arc::clone(&shared)));
            }
        });
        Proxy {
            port,
            control,
            accept,
        }
    }

    /// A pool of `size` connections to the database of `options`, every one through the proxy,
    /// unencrypted (the proxy reads the protocol to find the statement whose answer it loses).
    pub async fn pool(&self, options: &PgConnectOptions, size: u32) -> PgPool {
        let through_proxy = options
            .clone()
            .host("127.0.0.1")
            .port(self.port)
            .ssl_mode(PgSslMode::Disable);
        PgPoolOptions::new()
            .max_connections(size)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(through_proxy)
            .await
            .expect("connecting through the proxy")
    }

    /// Partition: stop forwarding in both directions without closing anything. Bytes wait in
    /// the proxy and the socket buffers; new connections are accepted but get no answer.
    pub fn black_hole(&self) {
        self.control.black_hole.send_replace(true);
    }

    /// End the partition: everything held back is forwarded.
    pub fn heal(&self) {
        self.control.black_hole.send_replace(false);
    }

    /// One-shot: the next statement whose text contains `needle` runs, but its answer never
    /// arrives. sqlx first parses a statement (Parse, with the text) and then executes it
    /// (Bind, Execute, Sync) in a second round trip; the parse goes through, the execution is
    /// forwarded, the server's whole answer to it (up to ReadyForQuery, i.e. after the commit)
    /// is read and thrown away, and the connection is closed: the client sees its connection
    /// die with the statement's outcome unknown, although the server committed it. The statement
    /// must not have been prepared on that connection before (its text is sent only once).
    pub fn lose_reply_to(&self, needle: &[u8]) {
        *self.control.lose_reply_to.lock().unwrap() = Some(needle.to_vec());
    }

    /// How many answers [`Proxy::lose_reply_to`] threw away.
    pub fn replies_lost(&self) -> usize {
        self.control.replies_lost.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        // Nothing may stay stuck in a partition after the test.
        self.heal();
    }
}

/// Wait until no partition is in force.
async fn open(control: &Control) {
    let mut rx = control.black_hole.subscribe();
    let _ = rx.wait_for(|partitioned| !*partitioned).await;
}

async fn serve(client: TcpStream, control: Arc<Control>) {
    open(&control).await;
    let Ok(server) = TcpStream::connect(control.upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let lose_next_reply = AtomicU8::new(FORWARDING);
    // Whichever direction ends first ends the connection: both sockets are dropped (closed).
    tokio::select! {
        () = to_server(client_read, server_write, &control, &lose_next_reply) => {}
        () = to_client(server_read, client_write, &control, &lose_next_reply) => {}
    }
}

async fn to_server(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    control: &Control,
    lose_next_reply: &AtomicU8,
) {
    let mut buf = vec![0_u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        open(control).await;
        if lose_next_reply.load(Ordering::SeqCst) == ARMED && buf[0] == b'B' {
            lose_next_reply.store(LOSING, Ordering::SeqCst);
        } else {
            let mut trigger = control.lose_reply_to.lock().unwrap();
            if let Some(needle) = trigger.as_deref() {
                if buf[..n].windows(needle.len()).any(|w| w == needle) {
                    *trigger = None;
                    lose_next_reply.store(ARMED, Ordering::SeqCst);
                }
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

async fn to_client(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    control: &Control,
    lose_next_reply: &AtomicU8,
) {
    let mut buf = vec![0_u8; 64 * 1024];
    let mut thrown_away = Vec::new();
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        open(control).await;
        if lose_next_reply.load(Ordering::SeqCst) == LOSING {
            thrown_away.extend_from_slice(&buf[..n]);
            if thrown_away
                .windows(READY_FOR_QUERY.len())
                .any(|w| w == READY_FOR_QUERY)
            {
                control.replies_lost.fetch_add(1, Ordering::SeqCst);
                // Returning closes the connection with the answer unread.
                return;
            }
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
