//! Shared by the broker publisher tests (`tests/publish_amqp.rs`, `tests/publish_kafka.rs`):
//! the brokers on this machine, a TCP proxy to break connections to them ([`proxy`]), and the
//! framings that let the proxy cut a connection right before a given publish.
#![allow(dead_code)] // Each test file uses a different part of this module.

pub mod proxy;

use std::net::SocketAddr;
use std::time::Duration;

use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use lapin::{Channel, Connection};
use outbox_runtime::publish::amqp;

use proxy::{Framing, Proxy};

// --- RabbitMQ -----------------------------------------------------------------------------

/// The RabbitMQ of the tests: `AMQP_URL`, or guest/guest on 127.0.0.1:5672.
pub fn amqp_url() -> String {
    std::env::var("AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

/// The broker's address, for a proxy in front of it.
pub async fn amqp_addr() -> SocketAddr {
    let url = amqp_url();
    let authority = url
        .split("://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .expect("AMQP_URL has a host");
    let host_port = authority.rsplit('@').next().unwrap();
    tokio::net::lookup_host(host_port)
        .await
        .expect("resolving the RabbitMQ address")
        .next()
        .expect("the RabbitMQ host resolves")
}

/// `amqp_url()` pointed at a proxy on `port` instead of the broker.
pub async fn amqp_url_via(port: u16) -> String {
    let url = amqp_url();
    let addr = amqp_addr().await;
    url.replacen(
        &format!("{}:{}", addr.ip(), addr.port()),
        &format!("127.0.0.1:{port}"),
        1,
    )
}

/// A connection of the test itself (to look at queues), not through any proxy. Panics with how
/// to start RabbitMQ: these tests never pass without a real broker.
pub async fn rabbit() -> Connection {
    let url = amqp_url();
    let connect = Connection::connect(&url, amqp::connection_properties());
    match tokio::time::timeout(Duration::from_secs(10), connect).await {
        Ok(Ok(connection)) => connection,
        Ok(Err(e)) => panic!(
            "the AMQP tests need RabbitMQ at {} and cannot connect: {e}. Start it (`.ci/run` does: \
             /etc/init.d/rabbitmq-server start) or set AMQP_URL",
            outbox_runtime::publish::redact::shown_url(&url)
        ),
        Err(_) => panic!(
            "the AMQP tests need RabbitMQ at {}, which did not answer within 10 s",
            outbox_runtime::publish::redact::shown_url(&url)
        ),
    }
}

/// Messages ready in `queue`.
pub async fn queue_len(channel: &Channel, queue: &str) -> u32 {
    channel
        .queue_declare(
            queue,
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("the test queue exists")
        .message_count()
}

/// A proxy in front of RabbitMQ that can cut before a given `basic.publish`.
pub async fn amqp_proxy() -> Proxy {
    Proxy::start(amqp_addr().await, || Box::new(AmqpPublishes::default())).await
}

/// The AMQP 0-9-1 framing of a client's bytes: the 8-byte protocol header, then frames of
/// `type (1) channel (2) size (4) payload (size) end (1)`. Counts `basic.publish` method
/// frames (type 1, class 60, method 40): a publish is that frame, then its content header and
/// body frames, so a cut before the next publish leaves every earlier message whole.
#[derive(Debug)]
pub struct AmqpPublishes {
    /// Bytes of the protocol header still to pass.
    preamble: usize,
    /// The first bytes of the current frame (up to its class and method).
    head: Vec<u8>,
    /// Bytes of the current frame to pass without looking.
    skip: usize,
}

impl Default for AmqpPublishes {
    fn default() -> Self {
        AmqpPublishes {
            preamble: 8,
            head: Vec::with_capacity(11),
            skip: 0,
        }
    }
}

const FRAME_METHOD: u8 = 1;
const BASIC_CLASS: u16 = 60;
const BASIC_PUBLISH: u16 = 40;

impl Framing for AmqpPublishes {
    fn starts(&mut self, chunk: &[u8]) -> Vec<usize> {
        let mut starts = Vec::new();
        // Where the current frame began in this chunk (None: in an earlier one).
        let mut head_at = None;
        let mut i = 0;
        while i < chunk.len() {
            if self.preamble > 0 {
                let n = self.preamble.min(chunk.len() - i);
                self.preamble -= n;
                i += n;
                continue;
            }
            if self.skip > 0 {
                let n = self.skip.min(chunk.len() - i);
                self.skip -= n;
                i += n;
                continue;
            }
            if self.head.is_empty() {
                head_at = Some(i);
            }
            self.head.push(chunk[i]);
            i += 1;
            let size = |head: &[u8]| u32::from_be_bytes(head[3..7].try_into().unwrap()) as usize;
            if self.head.len() == 7 && (self.head[0] != FRAME_METHOD || size(&self.head) < 4) {
                self.skip = size(&self.head) + 1;
                self.head.clear();
            } else if self.head.len() == 11 {
                let class = u16::from_be_bytes([self.head[7], self.head[8]]);
                let method = u16::from_be_bytes([self.head[9], self.head[10]]);
                if class == BASIC_CLASS && method == BASIC_PUBLISH {
                    starts.push(head_at.unwrap_or(0));
                }
                self.skip = size(&self.head) - 4 + 1;
                self.head.clear();
            }
        }
        starts
    }
}

/// A broker outage of `outage` through `proxy`, which accepts and closes every connection
/// meanwhile (so each attempt is counted): 40 events are enqueued as it begins and each is
/// waited on until its handler failed `min_failures` times; the outage then lasts its full
/// length whatever the deliveries do. Returns the connection attempts counted during it, the
/// events, and their queue rows at its end; the proxy accepts again on return.
pub async fn outage_of(
    pool: &sqlx::PgPool,
    proxy: &Proxy,
    outage: Duration,
    min_failures: i32,
) -> (usize, Vec<uuid::Uuid>, Vec<crate::adapters_support::Row>) {
    use crate::adapters_support::{enqueue, row, wait_until};
    proxy.refuse();
    let outage_began = tokio::time::Instant::now();
    let connections_before = proxy.connections();
    let mut during = Vec::new();
    for _ in 0..40 {
        during.push(enqueue(pool, "during", 1000).await.0);
    }
    wait_until(
        "every event enqueued during the outage tried and retried",
        outage,
        || async {
            for id in &during {
                if row(pool, *id).await.handler_failures < min_failures {
                    return false;
                }
            }
            true
        },
    )
    .await;
    tokio::time::sleep_until(outage_began + outage).await;
    let attempts = proxy.connections() - connections_before;
    let mut rows = Vec::new();
    for id in &during {
        rows.push(row(pool, *id).await);
    }
    proxy.accept();
    eprintln!("connection attempts during the {outage:?} outage: {attempts}");
    (attempts, during, rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Frames split at every possible point are counted alike.
    #[test]
    fn publishes_are_found_across_chunk_boundaries() {
        let frame = |kind: u8, payload: &[u8]| {
            let mut f = vec![kind, 0, 1];
            f.extend_from_slice(&(payload.len() as u32).to_be_bytes());
            f.extend_from_slice(payload);
            f.push(0xCE);
            f
        };
        let publish = frame(1, &[0, 60, 0, 40, 0, 0, 1, b'x']);
        let header = frame(2, &[0, 60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        let body = frame(3, b"{}");
        let other = frame(1, &[0, 85, 0, 10, 0]);
        let mut stream = b"AMQP\x00\x00\x09\x01".to_vec();
        for _ in 0..3 {
            stream.extend(&other);
            stream.extend(&publish);
            stream.extend(&header);
            stream.extend(&body);
        }
        let first_publish = 8 + other.len();
        for split in 0..stream.len() {
            let mut framing = AmqpPublishes::default();
            let (a, b) = stream.split_at(split);
            let found = framing.starts(a).len() + framing.starts(b).len();
            assert_eq!(found, 3, "split at {split}");
        }
        assert_eq!(AmqpPublishes::default().starts(&stream)[0], first_publish);
    }
}

// --- Kafka (tansu) ------------------------------------------------------------------------

/// Where `.ci/run` installs the tansu broker (`cargo install` into a cache outside the clone).
pub const TANSU_DEFAULT: &str = "/var/cache/outbox-ci/tansu/bin/tansu";

/// The tansu binary: `TANSU_BIN`, else where `.ci/run` installs it. Panics with how to get it:
/// these tests never pass without a real broker.
pub fn tansu_bin() -> std::path::PathBuf {
    let path = std::env::var("TANSU_BIN").unwrap_or_else(|_| TANSU_DEFAULT.to_owned());
    let path = std::path::PathBuf::from(path);
    assert!(
        path.is_file(),
        "the Kafka tests need the tansu broker at {} (a Kafka-protocol broker in Rust): run `.ci/run`, \
         which installs it once, or `cargo install tansu --version 0.6.0 --locked --no-default-features \
         --features dynostore --root /var/cache/outbox-ci/tansu`, or set TANSU_BIN",
        path.display()
    );
    path
}

/// A tansu broker process of one test, with in-memory storage, listening on a loopback port of
/// its own; killed (SIGKILL) when dropped.
pub struct Tansu {
    child: std::process::Child,
    port: u16,
    advertised: u16,
}

impl Tansu {
    /// Start a broker that advertises its own address.
    pub async fn start() -> Tansu {
        let port = crate::adapters_support::closed_port();
        Tansu::spawn(port, port).await
    }

    /// Start a broker behind a proxy: clients bootstrap through the proxy, and the broker
    /// advertises the proxy's address, so every connection of theirs goes through it.
    pub async fn behind_proxy() -> (Tansu, Proxy) {
        let port = crate::adapters_support::closed_port();
        let upstream: SocketAddr = ([127, 0, 0, 1], port).into();
        let proxy = Proxy::start(upstream, || Box::new(KafkaProduces::default())).await;
        let tansu = Tansu::spawn(port, proxy.port()).await;
        (tansu, proxy)
    }

    async fn spawn(port: u16, advertised: u16) -> Tansu {
        let child = std::process::Command::new(tansu_bin())
            .arg("broker")
            .arg("--listener-url")
            .arg(format!("tcp://127.0.0.1:{port}"))
            .arg("--advertised-listener-url")
            .arg(format!("tcp://127.0.0.1:{advertised}"))
            .arg("--storage-engine")
            .arg("memory://tansu/")
            .arg("--cluster-id")
            .arg(format!("outbox-test-{port}"))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("starting tansu");
        let mut tansu = Tansu {
            child,
            port,
            advertised,
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return tansu;
            }
            if let Ok(Some(status)) = tansu.child.try_wait() {
                panic!("tansu exited before listening on 127.0.0.1:{port}: {status}");
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "tansu did not listen on 127.0.0.1:{port} within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The bootstrap address clients use (the proxy's when behind one).
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.advertised)
    }

    /// The broker's own port.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for Tansu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The Kafka framing of a client's bytes: requests of `size (4) api_key (2) ...`. Counts
/// Produce requests (api key 0): a cut before the next one leaves every earlier request whole.
#[derive(Debug, Default)]
pub struct KafkaProduces {
    /// The first bytes of the current request (its size and api key).
    head: Vec<u8>,
    /// Bytes of the current request to pass without looking.
    skip: usize,
}

const PRODUCE: i16 = 0;

impl Framing for KafkaProduces {
    fn starts(&mut self, chunk: &[u8]) -> Vec<usize> {
        let mut starts = Vec::new();
        let mut head_at = None;
        let mut i = 0;
        while i < chunk.len() {
            if self.skip > 0 {
                let n = self.skip.min(chunk.len() - i);
                self.skip -= n;
                i += n;
                continue;
            }
            if self.head.is_empty() {
                head_at = Some(i);
            }
            self.head.push(chunk[i]);
            i += 1;
            if self.head.len() == 6 {
                let size = i32::from_be_bytes(self.head[0..4].try_into().unwrap());
                let api_key = i16::from_be_bytes([self.head[4], self.head[5]]);
                if api_key == PRODUCE {
                    starts.push(head_at.unwrap_or(0));
                }
                self.skip = usize::try_from(size).unwrap_or(0).saturating_sub(2);
                self.head.clear();
            }
        }
        starts
    }
}

#[cfg(test)]
mod kafka_framing_tests {
    use super::*;

    #[test]
    fn produce_requests_are_found_across_chunk_boundaries() {
        let request = |api_key: i16, body: &[u8]| {
            let mut r = ((body.len() + 2) as i32).to_be_bytes().to_vec();
            r.extend_from_slice(&api_key.to_be_bytes());
            r.extend_from_slice(body);
            r
        };
        let mut stream = Vec::new();
        for _ in 0..3 {
            stream.extend(request(18, &[0, 3, 0, 0, 0, 1]));
            stream.extend(request(0, &[0, 9, 0, 0, 0, 2, 0, 0, 0, 0]));
        }
        for split in 0..stream.len() {
            let mut framing = KafkaProduces::default();
            let (a, b) = stream.split_at(split);
            assert_eq!(
                framing.starts(a).len() + framing.starts(b).len(),
                3,
                "split at {split}"
            );
        }
        assert_eq!(KafkaProduces::default().starts(&stream)[0], 12);
    }
}
