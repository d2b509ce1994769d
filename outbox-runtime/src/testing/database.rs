//! A fresh database per test on a real PostgreSQL server.
//!
//! The server is found once per process, in this order:
//! 1. `DATABASE_URL`, when set (any database on the server; the test databases are created
//!    next to it, so the role needs `CREATEDB`);
//! 2. `postgres://postgres@127.0.0.1:5432/postgres`, when something answers there;
//! 3. a throwaway server started from the locally installed PostgreSQL binaries (`initdb` and
//!    `postgres` on `PATH` or under `/usr/lib/postgresql/*/bin`), in a temporary directory.
//!
//! With none of these, [`TestDatabase::new`] panics with a message that says how to get one:
//! a test that needs PostgreSQL never passes silently without it.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgConnection, PgPool};
use tokio::sync::OnceCell;

const LOCAL_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

static SERVER: OnceCell<Server> = OnceCell::const_new();

/// The server the test databases live on.
#[derive(Debug)]
struct Server {
    admin: PgConnectOptions,
    /// Kept alive for the life of the process when we started the server ourselves.
    _throwaway: Option<Throwaway>,
}

/// A database of its own for one test, with the outbox schema applied.
///
/// Dropped databases are removed (`DROP DATABASE ... WITH (FORCE)`) unless
/// `OUTBOX_KEEP_TEST_DB` is set, which helps when reading what a failed test left behind.
#[derive(Debug)]
pub struct TestDatabase {
    pool: PgPool,
    name: String,
    options: PgConnectOptions,
    admin: PgConnectOptions,
}

impl TestDatabase {
    /// A new database with [`crate::migrate()`] applied; pool of 10 connections.
    pub async fn new() -> TestDatabase {
        Self::with_pool_size(10).await
    }

    /// A new database with [`crate::migrate()`] applied and a pool of `max_connections`.
    pub async fn with_pool_size(max_connections: u32) -> TestDatabase {
        let db = Self::empty(max_connections).await;
        crate::migrate(&db.pool)
            .await
            .expect("applying the outbox migrations to the test database");
        db
    }

    /// A new, empty database (no migrations applied).
    pub async fn empty(max_connections: u32) -> TestDatabase {
        let server = server().await;
        let name = format!("outbox_test_{}", uuid::Uuid::new_v4().simple());
        let mut admin = server
            .admin
            .connect()
            .await
            .unwrap_or_else(|e| panic!("connecting to the test PostgreSQL server: {e}"));
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut admin)
            .await
            .unwrap_or_else(|e| {
                panic!("creating test database {name}: {e} (the role needs CREATEDB)")
            });
        let _ = admin.close().await;
        let options = server.admin.clone().database(&name);
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options.clone())
            .await
            .unwrap_or_else(|e| panic!("connecting to test database {name}: {e}"));
        TestDatabase {
            pool,
            name,
            options,
            admin: server.admin.clone(),
        }
    }

    /// The pool of this database.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Connect options of this database (for extra, independent connections).
    pub fn connect_options(&self) -> &PgConnectOptions {
        &self.options
    }

    /// A URL for this database, for child processes (`DATABASE_URL=...`).
    pub fn url(&self) -> String {
        self.options.to_url_lossy().to_string()
    }

    /// The database name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A new connection outside the pool.
    pub async fn connect(&self) -> PgConnection {
        self.options
            .connect()
            .await
            .expect("connecting to the test database")
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        if std::env::var_os("OUTBOX_KEEP_TEST_DB").is_some() {
            return;
        }
        let admin = self.admin.clone();
        let name = self.name.clone();
        // Drop runs inside the test's runtime, where we cannot block on it: use a thread with
        // a runtime of its own. WITH (FORCE) ends sessions still open (child processes, pools).
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(rt) = rt {
                rt.block_on(async move {
                    if let Ok(mut conn) = admin.connect().await {
                        let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                            "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                        )))
                        .execute(&mut conn)
                        .await;
                    }
                });
            }
        })
        .join();
    }
}

/// The admin connect options of the test server (found once per process).
pub async fn server_options() -> PgConnectOptions {
    server().await.admin.clone()
}

async fn server() -> &'static Server {
    SERVER.get_or_init(find_server).await
}

async fn find_server() -> Server {
    if let Ok(url) = std::env::var("DATABASE_URL") {
        let admin = PgConnectOptions::from_str(&url)
            .unwrap_or_else(|e| panic!("DATABASE_URL `{url}` is not a PostgreSQL URL: {e}"));
        if let Err(e) = try_connect(&admin).await {
            panic!(
                "DATABASE_URL is set but PostgreSQL does not answer there: {e}. Start the server, or unset DATABASE_URL to use 127.0.0.1:5432 or a throwaway server."
            );
        }
        return Server {
            admin,
            _throwaway: None,
        };
    }
    let local = PgConnectOptions::from_str(LOCAL_URL).expect("static URL parses");
    if try_connect(&local).await.is_ok() {
        return Server {
            admin: local,
            _throwaway: None,
        };
    }
    match Throwaway::start().await {
        Ok(t) => Server {
            admin: t.options.clone(),
            _throwaway: Some(t),
        },
        Err(why) => panic!(
            "these tests need PostgreSQL and found none: DATABASE_URL is unset, nothing answers at 127.0.0.1:5432, \
             and no throwaway server could be started ({why}). Install PostgreSQL (Debian/Ubuntu: `apt-get install postgresql`; \
             macOS: `brew install postgresql`), start it, or set DATABASE_URL=postgres://user@host:port/db"
        ),
    }
}

async fn try_connect(options: &PgConnectOptions) -> Result<(), sqlx::Error> {
    let conn = tokio::time::timeout(Duration::from_secs(3), options.connect())
        .await
        .map_err(|_| sqlx::Error::PoolTimedOut)??;
    conn.close().await
}

/// A PostgreSQL server in a temporary directory, stopped when the process ends.
#[derive(Debug)]
struct Throwaway {
    dir: PathBuf,
    options: PgConnectOptions,
    child: std::process::Child,
}

impl Throwaway {
    async fn start() -> Result<Throwaway, String> {
        let bin = find_pg_bin().ok_or("no `initdb` on PATH or under /usr/lib/postgresql/*/bin")?;
        let dir = std::env::temp_dir().join(format!("outbox-pg-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        // PostgreSQL refuses to run as root; run it as the `postgres` user when we are root.
        let as_root = is_root();
        if as_root {
            let status = std::process::Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir)
                .status()
                .map_err(|e| e.to_string())?;
            if !status.success() {
                return Err(
                    "running as root and cannot hand the data directory to user `postgres`".into(),
                );
            }
        }
        let data = dir.join("data");
        let run = |program: &Path| {
            if as_root {
                let mut c = std::process::Command::new("runuser");
                c.args(["-u", "postgres", "--"]).arg(program);
                c
            } else {
                std::process::Command::new(program)
            }
        };
        let out = run(&bin.join("initdb"))
            .args(["-A", "trust", "-U", "postgres", "-D"])
            .arg(&data)
            .output()
            .map_err(|e| format!("initdb: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "initdb failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let port = free_port().map_err(|e| e.to_string())?;
        let child = run(&bin.join("postgres"))
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string(), "-h", "127.0.0.1", "-k"])
            .arg(&dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("starting postgres: {e}"))?;
        let options = PgConnectOptions::new()
            .host("127.0.0.1")
            .port(port)
            .username("postgres")
            .database("postgres");
        for _ in 0..100 {
            if try_connect(&options).await.is_ok() {
                return Ok(Throwaway {
                    dir,
                    options,
                    child,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err("the throwaway server did not accept connections within 10 s".into())
    }
}

impl Drop for Throwaway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn find_pg_bin() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>());
    let debian = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"));
    on_path
        .chain(debian)
        .find(|dir| dir.join("initdb").is_file() && dir.join("postgres").is_file())
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}
