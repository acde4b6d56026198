//! Synapse's account-data writer, in Rust: the process Synapse's others
//! hand every account-data change to (`stream_writers: {account_data:
//! [rust_account_data]}`, with its address in `instance_map`).
//!
//! ```text
//! cargo run --example account_data_writer --features postgres,http-server,http-catch-up -- \
//!     --config homeserver.json --instance rust_account_data --listen 127.0.0.1:9110
//! ```
//!
//! `--config` is Synapse's configuration as JSON (`server_name`, `redis`,
//! `instance_map`, `stream_writers`, `worker_replication_secret`,
//! `database`); `--listen` is where it serves, normally its `instance_map`
//! address. It:
//!
//! - serves Synapse's six account-data calls
//!   (`/_synapse/replication/{add,remove}_user_account_data`,
//!   `{add,remove}_room_account_data`, `{add,remove}_tag`), writing the
//!   rows Synapse's writer writes, with ids from `account_data_sequence`,
//!   `ignored_users` and its cache invalidations for
//!   `m.ignored_user_list`, and its row of `stream_positions` after each
//!   change; each answers `max_stream_id`;
//! - publishes the `account_data` rows and its `caches` rows on Redis as a
//!   writer of both streams, announcing both positions on every
//!   connection and `REPLICATE`;
//! - answers `get_repl_stream_updates/account_data` and `.../caches` (its
//!   own rows) from the tables, as Synapse's writer does, for the
//!   processes that missed rows.
//!
//! A restart (even after SIGKILL) goes on above every id used before: the
//! ids are the database's, and the start reads them back as Synapse's
//! `_load_current_ids` does. SIGTERM stops it gracefully (see
//! `writer::Running::stop`).

pub mod writer;

use std::process::ExitCode;

use async_signal::{Signal, Signals};
use futures::StreamExt;
use serde_json::Value;
use synapse_replication::config::SynapseConfig;

const USAGE: &str =
    "usage: account_data_writer --config FILE.json --instance NAME --listen HOST:PORT";

fn main() -> ExitCode {
    match run(std::env::args().skip(1)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("account_data_writer: {error}\n{USAGE}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the writer with `args` (the command line without the program's
/// name) until SIGTERM.
pub fn run(mut args: impl Iterator<Item = String>) -> Result<(), Box<dyn std::error::Error>> {
    let mut flags = std::collections::HashMap::new();
    while let Some(flag) = args.next() {
        if flag == "--help" || flag == "-h" {
            println!("{USAGE}");
            return Ok(());
        }
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        flags.insert(flag, value);
    }
    let flag = |name: &str| {
        flags
            .get(name)
            .cloned()
            .ok_or(format!("{name} is required"))
    };
    let (path, instance, listen) = (flag("--config")?, flag("--instance")?, flag("--listen")?);
    let text =
        std::fs::read_to_string(&path).map_err(|error| format!("reading {path}: {error}"))?;
    let config: Value =
        serde_json::from_str(&text).map_err(|error| format!("{path}: not JSON: {error}"))?;
    let synapse = SynapseConfig::from_value(config).map_err(|error| format!("{path}: {error}"))?;

    // Caught from before the writer starts, so that none is missed.
    let mut sigterm =
        Signals::new([Signal::Term]).map_err(|error| format!("catching SIGTERM: {error}"))?;
    smol::block_on(async {
        let running = writer::start(&synapse, &instance, &listen)
            .await
            .map_err(|error| error.to_string())?;
        eprintln!("account-data writer: replication on {}", running.addr);
        sigterm.next().await;
        eprintln!("account-data writer: SIGTERM, stopping");
        running.stop().await;
        Ok(())
    })
}
