//! Two [`SynapseRig`]s federating over loopback, as PROTOCOL.md ("Two
//! homeservers federating on loopback") found works with Synapse 1.163.2:
//! server names with explicit ports (no `.well-known`, no SRV), a TLS
//! federation listener on a self-signed certificate made by `openssl`,
//! certificates not verified, no key servers, and the IP blocklist opened
//! for loopback.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use super::synapse::SynapseRig;

/// A port nobody listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("a free port")
}

/// A rig that federates: its server name is `<host>:<federation_port>`.
#[derive(Debug)]
pub struct FederatingRig {
    /// The rig (its `server_name` is `<host>:<federation_port>`).
    pub rig: SynapseRig,
    /// The TLS federation listener's port.
    pub federation_port: u16,
    /// The certificate and key (removed on drop).
    certs: PathBuf,
}

impl FederatingRig {
    /// Starts a rig named `<host>:<port>` (`host` is `127.0.0.1` or
    /// `localhost`: the certificate names it), with `extra` merged into
    /// its homeserver.yaml as [`SynapseRig::start_with`] does.
    pub fn start(host: &str, extra: &Value) -> FederatingRig {
        let federation_port = free_port();
        let server_name = format!("{host}:{federation_port}");
        let certs = std::env::temp_dir().join(format!(
            "synapse-fed-certs-{}-{federation_port}",
            std::process::id()
        ));
        std::fs::create_dir_all(&certs).expect("a directory for certificates");
        let (certificate, key) = self_signed(&certs, host);
        let mut config = json!({
            "tls_certificate_path": certificate,
            "tls_private_key_path": key,
            "federation_verify_certificates": false,
            // The rig turns federation off with an empty whitelist.
            "federation_domain_whitelist": null,
            // A peer named by a hostname is checked against both lists,
            // one named by an IP literal against the blocklist alone.
            "ip_range_whitelist": ["127.0.0.0/8", "::1/128"],
            "ip_range_blacklist": [],
            "federation_ip_range_blacklist": [],
        });
        merge(&mut config, extra);
        let listener = json!({
            "port": federation_port,
            "bind_addresses": ["127.0.0.1"],
            "type": "http",
            "tls": true,
            "resources": [{"names": ["federation"], "compress": false}],
        });
        let rig = SynapseRig::start_as(&server_name, &config, &[listener]);
        FederatingRig {
            rig,
            federation_port,
            certs,
        }
    }
}

impl Drop for FederatingRig {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.certs);
    }
}

/// `extra` merged into `base`, objects key by key (as rig.py merges).
fn merge(base: &mut Value, extra: &Value) {
    match (base, extra) {
        (Value::Object(base), Value::Object(extra)) => {
            for (key, value) in extra {
                match base.get_mut(key) {
                    Some(slot) if slot.is_object() && value.is_object() => merge(slot, value),
                    _ => {
                        base.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        (base, extra) => *base = extra.clone(),
    }
}

/// A self-signed certificate for `host` (an IP address or a DNS name) and
/// its key, in `dir`.
fn self_signed(dir: &Path, host: &str) -> (PathBuf, PathBuf) {
    let certificate = dir.join("federation.crt");
    let key = dir.join("federation.key");
    let san = if host.parse::<std::net::IpAddr>().is_ok() {
        format!("subjectAltName=IP:{host}")
    } else {
        format!("subjectAltName=DNS:{host}")
    };
    let output = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        ])
        .args(["-subj", &format!("/CN={host}"), "-addext", &san])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&certificate)
        .output()
        .expect("running openssl (apt-get install openssl)");
    assert!(
        output.status.success(),
        "openssl req failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    (certificate, key)
}
