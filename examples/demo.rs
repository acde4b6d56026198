//! The crate's main demo: a writer and two followers, one of which is cut
//! off for a while and catches up. Needs nothing else running.
//!
//! ```text
//! cargo run --example demo
//! ```
//!
//! The main process (`master`) writes rows to the `caches` and `typing`
//! streams. `worker1` stays connected and sees every row live. `worker2`
//! loses its connection for a while (every command sent meanwhile is lost,
//! as Redis pub/sub loses them), reconnects, asks for positions
//! (`REPLICATE`), sees from the `POSITION`s that it missed rows, and fetches
//! exactly those from the writer's log. At the end both followers hold
//! exactly the writer's rows, in order, each once.
//!
//! The processes talk through an in-memory bus: every byte still goes
//! through the wire codec (encoded to Synapse's lines and decoded back), but
//! no socket is opened.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use synapse_replication::positions::{CatchUpPage, Follower, FollowerEvent, Writer};
use synapse_replication::wire::{Command, InstanceName, RawRow, StreamName, Token};
use synapse_replication::writers::StreamWriters;

type Log = BTreeMap<StreamName, Vec<(Token, RawRow)>>;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let registry = Arc::new(StreamWriters::default());
    let mut now = Instant::now();
    let master = InstanceName::master();

    let mut writer = Writer::new(master.clone(), registry.clone());
    let mut log = Log::new();
    let streams = [StreamName::Caches, StreamName::Typing];
    for stream in &streams {
        writer.advance(stream, Token(0))?;
        log.insert(stream.clone(), Vec::new());
    }

    let mut worker1 = Follower::new(InstanceName::from("worker1"), registry.clone());
    let mut worker2 = Follower::new(InstanceName::from("worker2"), registry.clone());
    let mut held1 = Log::new();
    let mut held2 = Log::new();
    for follower in [&mut worker1, &mut worker2] {
        follower.connected();
    }
    writer.connected(now);
    let mut worker2_online = true;

    println!("master writes caches and typing; worker1 and worker2 follow");
    for round in 1..=30_i64 {
        now += Duration::from_millis(100);
        if round == 10 {
            println!("round {round}: worker2 loses its connection");
            worker2.disconnected();
            worker2_online = false;
        }
        if round == 20 {
            println!("round {round}: worker2 reconnects and sends REPLICATE");
            worker2.connected();
            worker2_online = true;
            writer.handle_command(&Command::Replicate, now);
        }

        // The writer writes: a caches row every round, a typing batch of two
        // rows with one token every third round.
        let token = Token(round);
        let caches_row = row(&format!(
            r#"["get_user_by_id",["@user{round}:example.com"],{round}]"#
        ))?;
        let caches = log.get_mut(&StreamName::Caches).ok_or("no caches log")?;
        caches.push((token, caches_row.clone()));
        writer.write(&StreamName::Caches, token, [(token, caches_row)])?;
        if round % 3 == 0 {
            let rows = [
                row(&format!(
                    r#"["!room{round}:example.com",["@a:example.com"]]"#
                ))?,
                row(&format!(r#"["!other{round}:example.com",[]]"#))?,
            ];
            let typing = log.get_mut(&StreamName::Typing).ok_or("no typing log")?;
            typing.extend(rows.iter().map(|r| (token, r.clone())));
            writer.write(&StreamName::Typing, token, rows.map(|r| (token, r)))?;
        }

        // The bus: every command goes over the wire as Synapse's bytes.
        while let Some(command) = writer.poll_command() {
            let line = command.to_bytes()?;
            deliver(&mut worker1, &line)?;
            if worker2_online {
                deliver(&mut worker2, &line)?;
            }
        }
        drain("worker1", &mut worker1, &mut held1, &log, false)?;
        drain("worker2", &mut worker2, &mut held2, &log, true)?;
    }

    for (name, held) in [("worker1", &held1), ("worker2", &held2)] {
        for stream in &streams {
            let rows = held.get(stream).map_or(0, Vec::len);
            let expected = log.get(stream).map_or(0, Vec::len);
            println!("{name}: {stream}: {rows} rows, writer wrote {expected}");
        }
        if held != &log {
            return Err(format!("{name} does not hold exactly the writer's rows").into());
        }
    }
    println!("both followers hold exactly the writer's rows, in order, each once");
    Ok(())
}

fn row(json: &str) -> Result<RawRow, Box<dyn std::error::Error>> {
    Ok(RawRow::new(Bytes::copy_from_slice(json.as_bytes()))?)
}

fn deliver(follower: &mut Follower, line: &Bytes) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(command) = Command::decode(line.clone())? {
        follower.handle_command(command);
    }
    Ok(())
}

/// Applies what the follower hands over; serves catch-ups from the log.
fn drain(
    name: &str,
    follower: &mut Follower,
    held: &mut Log,
    log: &Log,
    verbose: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    while let Some(event) = follower.poll_event() {
        match event {
            FollowerEvent::Rows {
                stream,
                token,
                rows,
                source,
                ..
            } => {
                if verbose && source != synapse_replication::positions::RowSource::Live {
                    println!(
                        "{name}: {} caught-up rows of {stream} at token {token}",
                        rows.len()
                    );
                }
                let held = held.entry(stream).or_default();
                held.extend(rows.into_iter().map(|row| (token, row)));
            }
            FollowerEvent::CatchUp(request) => {
                println!(
                    "{name}: missed rows of {} between {} and {}: fetching them",
                    request.stream, request.from, request.to
                );
                let updates = log
                    .get(&request.stream)
                    .into_iter()
                    .flatten()
                    .filter(|(token, _)| *token > request.from && *token <= request.to)
                    .cloned()
                    .collect();
                let page = CatchUpPage {
                    updates,
                    upto: request.to,
                    limited: false,
                };
                follower.handle_catch_up(request.id, page)?;
            }
            _ => {}
        }
    }
    Ok(())
}
