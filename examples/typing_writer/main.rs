//! Synapse's typing writer, in Rust: a process Synapse's own processes
//! follow (`stream_writers: {typing: [rust_typing]}`) and catch up from.
//!
//! ```text
//! cargo run --example typing_writer --features http-server,http-catch-up -- \
//!     --server-name example.com --instance rust_typing \
//!     --redis 127.0.0.1:6379 --listen 127.0.0.1:9100 --client-listen 127.0.0.1:9101 \
//!     --homeserver http://127.0.0.1:8008 --secret "$REPLICATION_SECRET" \
//!     --admin-token "$ADMIN_TOKEN" --state /var/lib/rust_typing/state.json
//! # or: --config homeserver.json (Synapse's config, as JSON) --instance ... --listen ... --client-listen ... --homeserver ...
//! ```
//!
//! It serves, on `--client-listen`:
//! - `PUT /_matrix/client/{v3,r0,unstable}/rooms/{roomId}/typing/{userId}`
//!   (route it there from the reverse proxy), checking the access token
//!   (`/account/whoami`) and the membership (`joined_members`) against the
//!   homeserver's client API, with Synapse's timeouts (30 s by default,
//!   at most 120 s, checked every 5 s). A token the homeserver accepts is
//!   remembered for 5 s by a keyed hash (never the token itself); an
//!   unknown one is not remembered at all. At most 1024 tokens and 1024
//!   memberships are remembered at once, so that made-up tokens or room
//!   ids cost the homeserver a lookup each, never this process memory;
//!
//! and on `--listen` (its `instance_map` address), apart, so that the
//! public route's clients never take the slots Synapse's processes need
//! there:
//! - `GET /_synapse/replication/get_repl_stream_updates/typing/...`, the
//!   catch-up Synapse's processes make (its `instance_map` address), from
//!   an in-memory history answered per room as Synapse's writer answers;
//! - `POST /_synapse/replication/fed_send_edu/m.typing/<txn_id>`: the
//!   typing of remote users, which the Synapse process that received a
//!   federation transaction forwards to the typing writer (and fails the
//!   whole transaction unless it is answered 200). As Synapse's writer
//!   does, it applies an EDU only if the user is of the sending server and
//!   both that server and this one are in the room, starts typing for 60 s
//!   (remote servers repeat it), answers a retried txn id without applying
//!   it again (for 30 minutes), and answers 200 even when it ignores one;
//!   malformed requests get Synapse's JSON errors. The servers in a room
//!   come from Synapse's PostgreSQL when `--config` has a `database`
//!   section (built with the `postgres` feature; Synapse's own
//!   `get_current_hosts_in_room` query), else from the admin API
//!   (`/_synapse/admin/v1/rooms/{roomId}/members`) with `--admin-token`, a
//!   server admin's access token; with neither, remote typing is answered
//!   but not applied. Outbound typing needs
//!   nothing here: Synapse's federation sender sends it from the rows.
//!
//! and publishes `typing` rows (`[room_id, [user_id, ...]]`, one token per
//! change) over Redis, announcing its position on every connection and
//! `REPLICATE`.
//!
//! # Restarts: tokens never go backwards
//!
//! Synapse's writer starts its typing tokens again from 0: its followers
//! then drop every row at or below the token they last saw, and a client
//! whose `since` is higher misses typing until the tokens pass it. This
//! one does not. A run starts at `max(saved + 1, ms since the Unix
//! epoch)`, `saved` the last token of the previous run, from `--state
//! FILE`. That file (JSON: the token and the rooms with someone typing)
//! is replaced, written beside it and renamed, on every change. At start,
//! before serving, each room it lists gets a row `[room, []]` at the next
//! tokens (Synapse's followers keep a room's typing until a row replaces
//! it), and the first connection announces `POSITION typing <instance>
//! <cur> <cur>`: followers at an older token fetch `(old, cur]` and get
//! those rows; the next change is followed at once.
//!
//! Without `--state` (or with the file lost), the clock alone keeps the
//! tokens above the old run's, if the old run made at most one change
//! per millisecond on average since it started and the clock has not
//! stepped back. Rooms it left shown typing then stay shown until someone
//! types there again, or until Synapse forgets the room (each follower
//! drops rooms without a typing change for ten minutes: 10 to 20 minutes
//! later). The file is not synced to disk: a power loss is a lost file.
//! Tokens about 1.7e12 are fine for Synapse: they are Python ints, kept
//! in no database column (sync tokens are text), below 2^53 for clients.

mod writer;

use std::process::ExitCode;

use serde_json::{Value, json};
use synapse_replication::config::SynapseConfig;

const USAGE: &str = "usage: typing_writer [--config FILE.json] [--server-name NAME] \
--instance NAME [--redis HOST:PORT] --listen HOST:PORT --client-listen HOST:PORT \
--homeserver http://HOST:PORT \
[--secret SECRET] [--admin-token TOKEN] [--state FILE]";

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("typing_writer: {error}\n{USAGE}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut flags = std::collections::HashMap::new();
    while let Some(flag) = args.next() {
        if flag == "--help" || flag == "-h" {
            println!("{USAGE}");
            return Ok(());
        }
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        flags.insert(flag, value);
    }
    let flag = |name: &str| flags.get(name).cloned();
    let instance = flag("--instance").ok_or("--instance is required")?;
    let listen = flag("--listen").ok_or("--listen is required")?;
    let client_listen = flag("--client-listen").ok_or("--client-listen is required")?;
    let homeserver = flag("--homeserver").ok_or("--homeserver is required")?;

    let mut config: Value = match flag("--config") {
        Some(path) => serde_json::from_str(&std::fs::read_to_string(path)?)?,
        None => json!({}),
    };
    if let Some(name) = flag("--server-name") {
        config["server_name"] = json!(name);
    }
    if let Some(redis) = flag("--redis") {
        let (host, port) = redis.rsplit_once(':').ok_or("--redis is HOST:PORT")?;
        config["redis"] = json!({"enabled": true, "host": host, "port": port.parse::<u16>()?});
    }
    if let Some(secret) = flag("--secret") {
        config["worker_replication_secret"] = json!(secret);
    }
    // This process writes typing, at its listener.
    let (host, port) = listen.rsplit_once(':').ok_or("--listen is HOST:PORT")?;
    config["stream_writers"]["typing"] = json!([instance]);
    config["instance_map"][&instance] = json!({"host": host, "port": port.parse::<u16>()?});
    let synapse = SynapseConfig::from_value(config)?;

    smol::block_on(async {
        let running = writer::start(
            writer::Options {
                synapse,
                instance,
                homeserver,
                admin_token: flag("--admin-token"),
                state: flag("--state").map(std::path::PathBuf::from),
            },
            &listen,
            &client_listen,
        )
        .await?;
        eprintln!(
            "typing writer: replication on {}, client API on {}",
            running.addr, running.client_addr
        );
        futures::future::pending::<()>().await;
        Ok(())
    })
}
