//! A redis-server of the test's own, for integration tests.
//!
//! Each [`RedisServer`] runs its own `redis-server` process on a free
//! loopback port (never 6379), in its own temporary directory, with no
//! persistence, and kills it when dropped. Options add a Unix socket, TLS
//! (with certificates made by the `openssl` command line tool), a
//! `requirepass` password and ACL users. Control methods let tests cut
//! Redis off in the ways production does: [`RedisServer::restart`] (same
//! port), [`RedisServer::kill9`], [`RedisServer::stop_signal`] (SIGSTOP,
//! a hung server) and [`RedisServer::command`] for admin commands such as
//! `CLIENT KILL TYPE pubsub`.
//!
//! Needs `redis-server` (with TLS, as Debian's is) and `openssl` on PATH:
//! `apt-get install redis-server openssl`. Without them the tests panic
//! with that advice; they never skip.
//!
//! ```ignore
//! let server = RedisServer::options().unix_socket().requirepass("pw").start();
//! let reply = server.command(&["CONFIG", "GET", "maxclients"]);
//! ```

use std::io::{self, ErrorKind, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use synapse_replication::resp::{Credentials, Frame, RespDecoder, encode_auth, encode_command};

/// How long an admin command may take before it fails.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);

/// How long redis-server may take to start answering.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// A temporary directory, removed when dropped.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// A new empty directory under the system's temporary directory.
    pub fn new(label: &str) -> TempDir {
        static COUNT: AtomicU32 = AtomicU32::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.subsec_nanos());
        // Short: a Unix socket path must fit in 108 bytes.
        let path = std::env::temp_dir().join(format!(
            "sr-{label}-{}-{}-{nanos:x}",
            std::process::id(),
            COUNT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path)
            .unwrap_or_else(|error| panic!("creating {}: {error}", path.display()));
        TempDir(path)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Test certificates, made with the `openssl` CLI: a CA, a server
/// certificate it signed for `127.0.0.1` and `localhost`, a client
/// certificate it signed, and an unrelated second CA (that signed
/// nothing here), for "wrong CA" tests. All keys are P-256, PEM, PKCS#8.
#[derive(Debug)]
pub struct TestCerts {
    /// The CA certificate that signed the server and client certificates.
    pub ca: PathBuf,
    /// The server's certificate (SANs `IP:127.0.0.1`, `DNS:localhost`).
    pub server_cert: PathBuf,
    /// The server's key.
    pub server_key: PathBuf,
    /// A client certificate (extended key usage `clientAuth`).
    pub client_cert: PathBuf,
    /// The client certificate's key.
    pub client_key: PathBuf,
    /// A CA that signed none of the above.
    pub other_ca: PathBuf,
}

const OPENSSL_CONFIG: &str = "\
[req]
distinguished_name = dn
prompt = no

[dn]
CN = synapse-replication test

[v3_ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash

[v3_server]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1,DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid

[v3_client]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
";

impl TestCerts {
    /// Makes the certificates in `dir`.
    pub fn generate(dir: &Path) -> TestCerts {
        let config = dir.join("openssl.cnf");
        std::fs::write(&config, OPENSSL_CONFIG).expect("writing openssl.cnf");
        let file = |name: &str| dir.join(name);
        let certs = TestCerts {
            ca: file("ca.crt"),
            server_cert: file("server.crt"),
            server_key: file("server.key"),
            client_cert: file("client.crt"),
            client_key: file("client.key"),
            other_ca: file("other-ca.crt"),
        };
        let new_key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
        for (name, cert) in [("ca", &certs.ca), ("other-ca", &certs.other_ca)] {
            openssl(
                dir,
                &[&["req", "-x509", "-new", "-nodes"][..], &new_key[..]].concat(),
                &[
                    "-config",
                    path_str(&config),
                    "-extensions",
                    "v3_ca",
                    "-subj",
                    &format!("/CN=synapse-replication test {name}"),
                    "-days",
                    "2",
                    "-keyout",
                    path_str(&file(&format!("{name}.key"))),
                    "-out",
                    path_str(cert),
                ],
            );
        }
        for (name, cert, key, extensions) in [
            (
                "localhost",
                &certs.server_cert,
                &certs.server_key,
                "v3_server",
            ),
            ("client", &certs.client_cert, &certs.client_key, "v3_client"),
        ] {
            let request = file(&format!("{extensions}.csr"));
            openssl(
                dir,
                &[&["req", "-new", "-nodes"][..], &new_key[..]].concat(),
                &[
                    "-config",
                    path_str(&config),
                    "-subj",
                    &format!("/CN={name}"),
                    "-keyout",
                    path_str(key),
                    "-out",
                    path_str(&request),
                ],
            );
            openssl(
                dir,
                &["x509", "-req"],
                &[
                    "-in",
                    path_str(&request),
                    "-CA",
                    path_str(&certs.ca),
                    "-CAkey",
                    path_str(&file("ca.key")),
                    "-set_serial",
                    if extensions == "v3_server" { "2" } else { "3" },
                    "-days",
                    "2",
                    "-extfile",
                    path_str(&config),
                    "-extensions",
                    extensions,
                    "-out",
                    path_str(cert),
                ],
            );
        }
        certs
    }
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 temporary path")
}

/// Runs `openssl` with `head` then `tail` as arguments, in `dir`.
fn openssl(dir: &Path, head: &[&str], tail: &[&str]) {
    let output = Command::new("openssl")
        .args(head)
        .args(tail)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output();
    let output = match output {
        Ok(output) => output,
        Err(error) if error.kind() == ErrorKind::NotFound => panic!(
            "openssl is not on PATH: install it (e.g. `apt-get install openssl`) to run the \
             TLS tests"
        ),
        Err(error) => panic!("running openssl: {error}"),
    };
    assert!(
        output.status.success(),
        "openssl {} failed: {}",
        head.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// An ACL user to create on every start.
#[derive(Clone, Debug)]
struct AclUser {
    name: String,
    password: String,
    rules: Vec<String>,
}

/// How to start a [`RedisServer`]; from [`RedisServer::options`].
#[derive(Clone, Debug, Default)]
pub struct RedisServerOptions {
    args: Vec<String>,
    unix_socket: bool,
    tls: bool,
    tls_client_auth: bool,
    requirepass: Option<String>,
    users: Vec<AclUser>,
}

impl RedisServerOptions {
    /// Adds command line arguments (`["--maxclients", "10"]`).
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|arg| (*arg).to_owned()));
        self
    }

    /// Also listens on a Unix socket in the server's directory
    /// ([`RedisServer::unix_socket`]).
    pub fn unix_socket(mut self) -> Self {
        self.unix_socket = true;
        self
    }

    /// Listens with TLS only ([`RedisServer::tls_port`]; `--port 0`), with
    /// certificates from [`TestCerts`]; clients need not present one.
    /// Admin commands go through a Unix socket, which this turns on.
    pub fn tls(mut self) -> Self {
        self.tls = true;
        self.unix_socket = true;
        self
    }

    /// TLS, and clients must present a certificate the CA signed
    /// (`--tls-auth-clients yes`).
    pub fn tls_client_auth(mut self) -> Self {
        self.tls_client_auth = true;
        self.tls()
    }

    /// The `default` user's password (`--requirepass`).
    pub fn requirepass(mut self, password: &str) -> Self {
        self.requirepass = Some(password.to_owned());
        self
    }

    /// An ACL user with every permission.
    pub fn user(self, name: &str, password: &str) -> Self {
        self.user_with_rules(name, password, &["~*", "&*", "+@all"])
    }

    /// An ACL user with these ACL rules (`on` and the password are
    /// added).
    pub fn user_with_rules(mut self, name: &str, password: &str, rules: &[&str]) -> Self {
        self.users.push(AclUser {
            name: name.to_owned(),
            password: password.to_owned(),
            rules: rules.iter().map(|rule| (*rule).to_owned()).collect(),
        });
        self
    }

    /// Starts the server.
    pub fn start(self) -> RedisServer {
        RedisServer::start_with(self)
    }
}

/// A redis-server of our own, killed when dropped.
#[derive(Debug)]
pub struct RedisServer {
    options: RedisServerOptions,
    child: Option<Child>,
    /// The plaintext TCP port, 0 with TLS.
    port: u16,
    /// The TLS port, 0 without TLS.
    tls_port: u16,
    certs: Option<TestCerts>,
    /// Dropped last: the socket, the log and the certificates live there.
    dir: TempDir,
}

impl RedisServer {
    /// A plain server: TCP on a free loopback port, no password.
    pub fn start() -> RedisServer {
        RedisServer::options().start()
    }

    /// Options to start a server with.
    pub fn options() -> RedisServerOptions {
        RedisServerOptions::default()
    }

    fn start_with(options: RedisServerOptions) -> RedisServer {
        let dir = TempDir::new("redis");
        let certs = options.tls.then(|| TestCerts::generate(dir.path()));
        let mut server = RedisServer {
            options,
            child: None,
            port: 0,
            tls_port: 0,
            certs,
            dir,
        };
        for _attempt in 0..5 {
            // A port the OS says is free; redis-server may still lose a
            // race for it, and then exits, and we try another.
            let port = free_port();
            if server.options.tls {
                server.tls_port = port;
            } else {
                server.port = port;
            }
            if server.spawn() {
                return server;
            }
        }
        panic!(
            "redis-server did not start; its log:\n{}",
            server.log_tail()
        );
    }

    /// Starts the process on the ports chosen; false if it exited (lost
    /// its port).
    fn spawn(&mut self) -> bool {
        let mut command = Command::new("redis-server");
        command
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--dir", path_str(self.dir.path())])
            .args(["--logfile", path_str(&self.dir.path().join("redis.log"))]);
        if self.options.unix_socket {
            command
                .args(["--unixsocket", path_str(&self.socket_path())])
                .args(["--unixsocketperm", "700"]);
        }
        if let Some(certs) = &self.certs {
            let auth_clients = if self.options.tls_client_auth {
                "yes"
            } else {
                "no"
            };
            command
                .args(["--tls-port", &self.tls_port.to_string()])
                .args(["--tls-cert-file", path_str(&certs.server_cert)])
                .args(["--tls-key-file", path_str(&certs.server_key)])
                .args(["--tls-ca-cert-file", path_str(&certs.ca)])
                .args(["--tls-auth-clients", auth_clients]);
        }
        if let Some(password) = &self.options.requirepass {
            command.args(["--requirepass", password]);
        }
        command
            .args(&self.options.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = match command.spawn() {
            Ok(child) => child,
            Err(error) if error.kind() == ErrorKind::NotFound => panic!(
                "redis-server is not on PATH: install it (e.g. `apt-get install redis-server`) \
                 to run the Redis integration tests"
            ),
            Err(error) => panic!("starting redis-server: {error}"),
        };
        let pid = child.id();
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            if let Some(child) = &mut self.child {
                if let Ok(Some(_status)) = child.try_wait() {
                    self.child = None;
                    return false;
                }
            }
            // Up, and this process: not another test's server that won the
            // same port a moment before (this one then exits, and a test
            // that took the other would lose it when that test ends).
            // INFO answers while a dataset loads (a restart with an RDB
            // file), unlike PING.
            match self.try_command(&["INFO", "server"]) {
                Ok(Frame::BulkString(info)) if has_process_id(&info, pid) => {
                    self.create_users();
                    return true;
                }
                _ => {}
            }
            sleep(Duration::from_millis(20));
        }
        panic!(
            "redis-server did not answer INFO within {START_TIMEOUT:?}; its log:\n{}",
            self.log_tail()
        );
    }

    fn create_users(&self) {
        for user in &self.options.users {
            let password = format!(">{}", user.password);
            let mut args = vec!["ACL", "SETUSER", &user.name, "reset", "on", &password];
            args.extend(user.rules.iter().map(String::as_str));
            let reply = self.command(&args);
            assert_eq!(
                reply,
                Frame::SimpleString("OK".into()),
                "ACL SETUSER {}",
                user.name
            );
        }
    }

    /// The last lines of the server's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// The plaintext TCP port. Panics for a TLS server, which has none.
    pub fn port(&self) -> u16 {
        assert_ne!(self.port, 0, "a TLS server has no plaintext port");
        self.port
    }

    /// The TLS port. Panics for a server without TLS.
    pub fn tls_port(&self) -> u16 {
        assert_ne!(self.tls_port, 0, "the server was started without TLS");
        self.tls_port
    }

    /// `127.0.0.1:port` of the plaintext port.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port())
    }

    /// The Unix socket. Panics if the server has none.
    pub fn unix_socket(&self) -> PathBuf {
        assert!(
            self.options.unix_socket,
            "the server was started without a Unix socket"
        );
        self.socket_path()
    }

    fn socket_path(&self) -> PathBuf {
        self.dir.path().join("redis.sock")
    }

    /// The certificates. Panics for a server without TLS.
    pub fn certs(&self) -> &TestCerts {
        self.certs
            .as_ref()
            .expect("the server was started without TLS")
    }

    /// The server's directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The process id. Panics if the server is not running.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the server is not running").id()
    }

    /// Runs an admin command on a fresh connection (TCP, or the Unix
    /// socket for a TLS server), authenticated with `requirepass` if set,
    /// and returns its reply (which may be an error frame). Panics if the
    /// server does not answer within 10 s (as after [`Self::stop_signal`]).
    pub fn command(&self, args: &[&str]) -> Frame {
        self.try_command(args)
            .unwrap_or_else(|error| panic!("redis {args:?}: {error}"))
    }

    /// [`Self::command`], failing with an error instead of panicking.
    pub fn try_command(&self, args: &[&str]) -> io::Result<Frame> {
        let mut out = BytesMut::new();
        if let Some(password) = &self.options.requirepass {
            encode_auth(
                &mut out,
                &Credentials {
                    username: None,
                    password: password.as_bytes(),
                },
            );
        }
        let args: Vec<&[u8]> = args.iter().map(|arg| arg.as_bytes()).collect();
        encode_command(&mut out, &args);
        let mut connection = self.admin_connection()?;
        connection.write_all(&out)?;
        let mut decoder = RespDecoder::new();
        let mut buf = BytesMut::new();
        let mut replies = Vec::new();
        let wanted = if self.options.requirepass.is_some() {
            2
        } else {
            1
        };
        while replies.len() < wanted {
            match decoder.decode(&mut buf) {
                Ok(Some(frame)) => {
                    replies.push(frame);
                    continue;
                }
                Ok(None) => {}
                Err(error) => return Err(io::Error::new(ErrorKind::InvalidData, error)),
            }
            let mut chunk = [0; 4096];
            let n = connection.read(&mut chunk)?;
            if n == 0 {
                return Err(io::Error::new(
                    ErrorKind::UnexpectedEof,
                    "redis closed the admin connection",
                ));
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        if wanted == 2 && replies[0] != Frame::SimpleString("OK".into()) {
            return Err(io::Error::other(format!(
                "admin AUTH failed: {:?}",
                replies[0]
            )));
        }
        Ok(replies.pop().expect("a reply"))
    }

    fn admin_connection(&self) -> io::Result<Box<dyn ReadWrite>> {
        if self.port != 0 {
            let stream = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port))?;
            stream.set_read_timeout(Some(ADMIN_TIMEOUT))?;
            stream.set_write_timeout(Some(ADMIN_TIMEOUT))?;
            Ok(Box::new(stream))
        } else {
            let stream = UnixStream::connect(self.socket_path())?;
            stream.set_read_timeout(Some(ADMIN_TIMEOUT))?;
            stream.set_write_timeout(Some(ADMIN_TIMEOUT))?;
            Ok(Box::new(stream))
        }
    }

    /// Whether the process is running (it may be stopped by SIGSTOP).
    pub fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Shuts the server down with SIGTERM (clients see their connections
    /// closed) and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(child.id(), "TERM");
            let deadline = Instant::now() + START_TIMEOUT;
            loop {
                match child.try_wait() {
                    Ok(Some(_)) => return,
                    _ if Instant::now() > deadline => {
                        let _ = child.kill();
                        let _ = child.wait();
                        return;
                    }
                    _ => sleep(Duration::from_millis(10)),
                }
            }
        }
    }

    /// Kills the server with SIGKILL (no goodbye to clients) and waits for
    /// it to exit.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server if it runs, then starts it again on the same
    /// ports, socket and certificates, with the same users (its data is
    /// gone: there is no persistence, unless the test made an RDB file
    /// with `SAVE`, which it then loads, answering `-LOADING` meanwhile:
    /// this returns as soon as it answers). Panics if the port was taken
    /// in between.
    pub fn restart(&mut self) {
        self.stop();
        // The old listening socket can linger briefly; retry a little.
        for _attempt in 0..20 {
            if self.spawn() {
                return;
            }
            sleep(Duration::from_millis(50));
        }
        panic!(
            "redis-server did not start again on its port; its log:\n{}",
            self.log_tail()
        );
    }

    /// Whether the server is still loading its dataset (`loading:1` in
    /// `INFO persistence`, which Redis answers while loading).
    pub fn is_loading(&self) -> bool {
        let info = self.command(&["INFO", "persistence"]);
        info.as_bytes().is_some_and(|text| {
            text.split(|b| *b == b'\n')
                .any(|line| line.starts_with(b"loading:1"))
        })
    }

    /// Freezes the server with SIGSTOP: connections stay open, nothing
    /// answers (a hung server, or a network that drops everything).
    pub fn stop_signal(&self) {
        signal(self.pid(), "STOP");
    }

    /// Resumes a server frozen by [`Self::stop_signal`] (SIGCONT).
    pub fn cont_signal(&self) {
        signal(self.pid(), "CONT");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

trait ReadWrite: Read + Write {}

impl<T: Read + Write> ReadWrite for T {}

/// A loopback port that was free a moment ago, never 6379.
fn free_port() -> u16 {
    loop {
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|listener| listener.local_addr())
            .expect("a free loopback port")
            .port();
        if port != 6379 {
            return port;
        }
    }
}

/// Whether `INFO server`'s reply names `pid` as the server's process.
fn has_process_id(info: &[u8], pid: u32) -> bool {
    let line = format!("process_id:{pid}\r\n");
    info.windows(line.len())
        .any(|window| window == line.as_bytes())
}

/// Sends `SIG<name>` to `pid` with kill(1).
fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .unwrap_or_else(|error| panic!("running kill -{name}: {error}"));
    assert!(status.success(), "kill -{name} {pid} failed");
}
