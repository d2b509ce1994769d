//! A TCP proxy on loopback between a publisher (or consumer) and a broker, so a test can break
//! the network the way production breaks it without touching the machine's broker (other tests
//! use it): the broker going away and coming back, a connection that dies in the middle of a
//! batch, or a partition in which the broker's answers never arrive.
//!
//! The proxy reads the client's bytes through a [`Framing`] that knows where the broker
//! protocol's messages start, so a cut can fall exactly before a given message: every message
//! before it reached the broker whole, nothing after it did.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Finds, in the bytes a client sends, where each message the proxy can cut before starts.
pub trait Framing: Send + 'static {
    /// Called with each chunk in order; returns the offsets (within `chunk`) at which a
    /// countable message starts. A message whose start was in an earlier chunk is reported at
    /// offset 0 of the chunk where its counting byte is.
    fn starts(&mut self, chunk: &[u8]) -> Vec<usize>;
}

/// Not armed: [`Proxy::cut_before`] sets how many more messages may pass.
const DISARMED: i64 = -1;

struct Control {
    upstream: SocketAddr,
    /// Bumped to end every open connection.
    generation: watch::Sender<u64>,
    /// true while the broker's answers are held back.
    replies_held: watch::Sender<bool>,
    /// true while a cut that fell keeps its connection open (see [`Proxy::hold_cut`]).
    cut_held: watch::Sender<bool>,
    /// Messages that may still pass before the cut; [`DISARMED`] when no cut is armed.
    messages_left: AtomicI64,
    framing: Box<dyn Fn() -> Box<dyn Framing> + Send + Sync>,
    cuts: AtomicUsize,
    connections: AtomicUsize,
    /// true while every new connection is accepted and closed at once (see [`Proxy::refuse`]).
    refusing: AtomicBool,
}

/// A running proxy; see the [module docs](self). Stops when dropped.
pub struct Proxy {
    port: u16,
    control: Arc<Control>,
    accept: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Proxy {
    /// Listen on an ephemeral loopback port and forward to `upstream` (loopback only), reading
    /// the client's bytes with a fresh `framing()` per connection.
    pub async fn start(
        upstream: SocketAddr,
        framing: impl Fn() -> Box<dyn Framing> + Send + Sync + 'static,
    ) -> Proxy {
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
            generation: watch::Sender::new(0),
            replies_held: watch::Sender::new(false),
            cut_held: watch::Sender::new(false),
            messages_left: AtomicI64::new(DISARMED),
            framing: Box::new(framing),
            cuts: AtomicUsize::new(0),
            connections: AtomicUsize::new(0),
            refusing: AtomicBool::new(false),
        });
        let proxy = Proxy {
            port,
            control,
            accept: Mutex::new(None),
        };
        proxy.listen(listener);
        proxy
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The broker goes away: every open connection is closed and new ones are refused (nothing
    /// listens on the port) until [`Proxy::up`].
    pub fn down(&self) {
        if let Some(accept) = self.accept.lock().unwrap().take() {
            accept.abort();
        }
        self.close_all();
    }

    /// The broker goes away behind something that still accepts connections (a load balancer,
    /// a broker process that is starting): every open connection is closed, and every new one
    /// is accepted, counted in [`Proxy::connections`], and closed at once without reaching the
    /// broker, until [`Proxy::accept`]. Unlike [`Proxy::down`], each connection attempt of a
    /// client is seen, so a test can count them.
    pub fn refuse(&self) {
        self.control.refusing.store(true, Ordering::SeqCst);
        self.close_all();
    }

    /// Forward new connections to the broker again after [`Proxy::refuse`].
    pub fn accept(&self) {
        self.control.refusing.store(false, Ordering::SeqCst);
    }

    /// The broker is back on the same port.
    pub async fn up(&self) {
        // The port was ours a moment ago; another test could take it in between, which would
        // be a failure of this test, not a flake to hide.
        let listener = TcpListener::bind(("127.0.0.1", self.port))
            .await
            .unwrap_or_else(|e| panic!("re-binding the proxy port {}: {e}", self.port));
        self.listen(listener);
    }

    /// Close every open connection now (the proxy keeps accepting new ones).
    pub fn close_all(&self) {
        self.control.generation.send_modify(|g| *g += 1);
    }

    /// One-shot: let `n` more client messages (as the framing counts them) through, then close
    /// the connection right before the next one: the broker got the first `n` whole and
    /// nothing of the rest.
    pub fn cut_before(&self, n: usize) {
        self.control
            .messages_left
            .store(i64::try_from(n).unwrap(), Ordering::SeqCst);
    }

    /// Until [`Proxy::release_cut`], a cut that falls keeps its connection open: every message
    /// before it has been forwarded and nothing after it is, and the connection ends at the
    /// release. A test can then see the broker act on the messages before the cut, and only
    /// then end the connection: a broker that finds its connection closed may drop frames it
    /// received and had not processed yet, which would make "the broker got the first n" a
    /// race.
    pub fn hold_cut(&self) {
        self.control.cut_held.send_replace(true);
    }

    /// Close the connection a held cut kept open.
    pub fn release_cut(&self) {
        self.control.cut_held.send_replace(false);
    }

    /// Hold back everything the broker sends (its confirms, its acknowledgements) while still
    /// forwarding what the client sends: the broker acts, the client never hears of it.
    pub fn hold_replies(&self) {
        self.control.replies_held.send_replace(true);
    }

    /// Forward the broker's answers again (those held back first).
    pub fn release_replies(&self) {
        self.control.replies_held.send_replace(false);
    }

    /// How many connections [`Proxy::cut_before`] closed.
    pub fn cuts(&self) -> usize {
        self.control.cuts.load(Ordering::SeqCst)
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.control.connections.load(Ordering::SeqCst)
    }

    fn listen(&self, listener: TcpListener) {
        let control = Arc::clone(&self.control);
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                control.connections.fetch_add(1, Ordering::SeqCst);
                if control.refusing.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                tokio::spawn(serve(client, Arc::clone(&control)));
            }
        });
        *self.accept.lock().unwrap() = Some(accept);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.down();
        self.release_replies();
        self.release_cut();
    }
}

async fn serve(client: TcpStream, control: Arc<Control>) {
    let mut generation = control.generation.subscribe();
    let Ok(server) = TcpStream::connect(control.upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let framing = (control.framing)();
    // Whichever ends first ends the client's connection (its socket is dropped, closed).
    let cut = tokio::select! {
        cut = to_server(client_read, &mut server_write, &control, framing) => cut,
        () = to_client(&mut server_read, client_write, &control) => false,
        _ = generation.changed() => false,
    };
    if cut {
        // The broker gets an orderly end of stream right after the last whole message, as when
        // a client's process dies: it reads and acts on every byte it was sent. Dropping the
        // socket instead, with the broker's unread answers in its receive buffer, sends a reset,
        // and a reset can make the broker's kernel discard messages it had received but not yet
        // read, which is not the failure the tests mean to make. Bounded: a broker that keeps
        // the connection open is left after a while.
        let _ = server_write.shutdown().await;
        let drain = async {
            let mut buf = vec![0_u8; 64 * 1024];
            while matches!(server_read.read(&mut buf).await, Ok(n) if n > 0) {}
        };
        let _ = tokio::time::timeout(std::time::Duration::from_secs(10), drain).await;
    }
}

/// Forward the client's bytes to the broker until either side ends (false) or an armed cut
/// falls (true: everything before the cut was written).
async fn to_server(
    mut from: OwnedReadHalf,
    to: &mut OwnedWriteHalf,
    control: &Control,
    mut framing: Box<dyn Framing>,
) -> bool {
    let mut buf = vec![0_u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => n,
        };
        let mut forward = n;
        let mut cut = false;
        for start in framing.starts(&buf[..n]) {
            let left = control.messages_left.load(Ordering::SeqCst);
            if left == DISARMED {
                continue;
            }
            if left == 0 {
                control.messages_left.store(DISARMED, Ordering::SeqCst);
                control.cuts.fetch_add(1, Ordering::SeqCst);
                forward = start;
                cut = true;
                break;
            }
            control.messages_left.store(left - 1, Ordering::SeqCst);
        }
        if to.write_all(&buf[..forward]).await.is_err() {
            return false;
        }
        if cut {
            let _ = to.flush().await;
            let _ = control.cut_held.subscribe().wait_for(|held| !*held).await;
            return true;
        }
    }
}

async fn to_client(from: &mut OwnedReadHalf, mut to: OwnedWriteHalf, control: &Control) {
    let mut held = control.replies_held.subscribe();
    let mut buf = vec![0_u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // While replies are held, wait here: the bytes stay with the proxy.
        let _ = held.wait_for(|held| !*held).await;
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
