//! `HttpCatchUp` against a writer whose `instance_map` entry says
//! `tls: true`: an HTTPS server (Python's `http.server` wrapped in `ssl`,
//! with certificates made by openssl) answers Synapse's catch-up endpoint.
//! The right CA fetches the page; another CA fails closed.

#![cfg(all(
    feature = "http-catch-up",
    feature = "tls",
    feature = "runtime-smol",
    unix
))]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{self, Child, Stdio};
use std::sync::Arc;

use bytes::Bytes;
use common::redis_server::{TempDir, TestCerts};
use synapse_replication::config::{StreamWriters, TlsConfig};
use synapse_replication::positions::{CatchUpRequest, Follower, FollowerEvent};
use synapse_replication::transport::{CatchUpSource, HttpCatchUp, HttpCatchUpError, SmolRuntime};
use synapse_replication::wire::{Command, InstanceName, StreamName, Token};

/// Answers the catch-up endpoint over TLS when the bearer token is right,
/// 403 otherwise; prints its port, then serves until killed.
const SERVER: &str = r#"
import http.server, json, ssl, sys
cert, key = sys.argv[1], sys.argv[2]
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = (self.path.startswith("/_synapse/replication/get_repl_stream_updates/events/")
              and "from_token=4&upto_token=6" in self.path
              and self.headers.get("Authorization") == "Bearer s3cret")
        body = json.dumps({"updates": [[5, ["ev", 1]], [6, ["ev", 2]]], "upto_token": 6,
                           "limited": False}, separators=(",", ":")).encode() if ok else b"{}"
        self.send_response(200 if ok else 403)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(cert, key)
server.socket = context.wrap_socket(server.socket, server_side=True)
print(server.server_address[1], flush=True)
server.serve_forever()
"#;

struct HttpsServer {
    child: Child,
    port: u16,
}

impl HttpsServer {
    fn start(certs: &TestCerts) -> HttpsServer {
        let mut child = process::Command::new("python3")
            .args(["-c", SERVER])
            .arg(&certs.server_cert)
            .arg(&certs.server_key)
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs the HTTPS server");
        let stdout = child.stdout.take().expect("its stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("the server's port");
        let port = line.trim().parse().expect("a port number");
        HttpsServer { child, port }
    }
}

impl Drop for HttpsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn source(port: u16, ca: &std::path::Path) -> HttpCatchUp<SmolRuntime> {
    let writers = StreamWriters::from_json(&format!(
        r#"{{"instance_map": {{"main": {{"host": "127.0.0.1", "port": {port}, "tls": true}}}}}}"#
    ))
    .expect("an instance_map");
    let mut tls = TlsConfig::default();
    tls.ca_file = Some(ca.to_owned());
    HttpCatchUp::new(SmolRuntime, Arc::new(writers), Some("s3cret".to_owned())).with_tls(tls)
}

/// The request a follower at events 4 makes when master announces 6.
fn request() -> CatchUpRequest {
    let registry = StreamWriters::default();
    let mut follower = Follower::new(InstanceName::from("worker"), Arc::new(registry));
    follower
        .set_position(&StreamName::Events, &InstanceName::master(), Token(4))
        .expect("a position");
    follower.connected();
    let line = Bytes::from_static(b"POSITION events master 6 6");
    let command = Command::decode(line).expect("valid").expect("a command");
    follower.handle_command(command);
    while let Some(event) = follower.poll_event() {
        if let FollowerEvent::CatchUp(request) = event {
            return request;
        }
    }
    panic!("no catch-up asked for");
}

#[test]
fn https_writers_are_fetched_with_the_right_ca_only() {
    let dir = TempDir::new("https");
    let certs = TestCerts::generate(dir.path());
    let server = HttpsServer::start(&certs);

    let page =
        smol::block_on(source(server.port, &certs.ca).fetch(request())).expect("a page over HTTPS");
    assert_eq!(page.upto, Token(6));
    assert!(!page.limited);
    let rows: Vec<(Token, &str)> = page
        .updates
        .iter()
        .map(|(token, row)| (*token, row.as_str()))
        .collect();
    assert_eq!(
        rows,
        vec![(Token(5), r#"["ev",1]"#), (Token(6), r#"["ev",2]"#)]
    );

    // Another CA: the handshake fails, nothing is fetched.
    let error = smol::block_on(source(server.port, &certs.other_ca).fetch(request()))
        .expect_err("a certificate from an untrusted CA");
    let error = error.downcast::<HttpCatchUpError>().expect("a typed error");
    assert!(
        matches!(*error, HttpCatchUpError::Connect { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("certificate"), "{error}");
}
