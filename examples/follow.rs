//! Follows a Synapse deployment over its Redis, on tokio, and prints every
//! row as its stream's typed row.
//!
//! ```text
//! cargo run --example follow -- homeserver.json [NAME]
//! cargo run --example follow -- --redis HOST:PORT --server-name NAME [NAME]
//! ```
//!
//! `homeserver.json` is Synapse's configuration as JSON (its `redis`,
//! `stream_writers`, `instance_map`...); the second form makes one with
//! just a Redis and a server name. NAME is this process's instance name
//! (`rust_follower`). Missed rows are fetched from the writers over
//! Synapse's HTTP replication listener (`--features http-catch-up`).

use std::error::Error;
use synapse_replication::config::SynapseConfig;

use synapse_replication::positions::FollowerEvent;
use synapse_replication::session::RedisEvent;
use synapse_replication::streams::Row;
use synapse_replication::transport::{RedisClient, TokioRuntime};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (synapse, name) = match args.as_slice() {
        [flag, redis, flag2, server_name, name @ ..]
            if flag == "--redis" && flag2 == "--server-name" =>
        {
            let (host, port) = redis.rsplit_once(':').ok_or("--redis HOST:PORT")?;
            let config = serde_json::json!({
                "server_name": server_name,
                "redis": {"enabled": true, "host": host, "port": port.parse::<u16>()?},
            });
            (SynapseConfig::from_value(config)?, name.first())
        }
        [path, name @ ..] if !path.starts_with('-') => (
            SynapseConfig::from_json(&std::fs::read_to_string(path)?)?,
            name.first(),
        ),
        _ => {
            return Err(
                "usage: follow (CONFIG.json | --redis HOST:PORT --server-name NAME) [NAME]".into(),
            );
        }
    };
    let name = name.map_or("rust_follower", String::as_str);

    let runtime = TokioRuntime::current().ok_or("not inside a tokio runtime")?;
    let mut client = RedisClient::follow(runtime, &synapse, name)?;

    while let Some(event) = client.next_event().await {
        match event {
            RedisEvent::Follower(FollowerEvent::Rows {
                stream,
                writer,
                token,
                rows,
                ..
            }) => {
                for row in &rows {
                    match Row::decode(&stream, row) {
                        Ok(row) => println!("{stream} {writer} {token} {row:?}"),
                        Err(error) => println!("{stream} {writer} {token} (undecoded: {error})"),
                    }
                }
            }
            RedisEvent::Command(command) => println!("{}", command.kind()),
            other => println!("{other}"),
        }
    }
    Ok(())
}
