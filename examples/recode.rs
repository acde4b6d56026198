//! Reads replication lines on stdin and prints each one re-encoded by the
//! crate, or `ERR <reason>`; blank lines are echoed blank.
//!
//! With `--typed`, each RDATA row is also decoded into its stream's typed
//! row and the line is re-encoded from that typed value, so a capture can be
//! checked row by row; other commands behave as without the flag.
//!
//! Check the codec against a capture of real traffic:
//!
//! ```text
//! cargo run --release --example recode < capture.txt > recoded.txt
//! diff capture.txt recoded.txt
//! ```

use std::io::{self, BufRead, Write};

use bytes::Bytes;
use synapse_replication::streams;
use synapse_replication::wire::{Command, is_blank};

fn main() -> io::Result<()> {
    let typed = match std::env::args().nth(1).as_deref() {
        None => false,
        Some("--typed") => true,
        Some(other) => {
            eprintln!("usage: recode [--typed] < lines\nunknown argument {other:?}");
            std::process::exit(2);
        }
    };
    let stdin = io::stdin().lock();
    let mut out = io::BufWriter::new(io::stdout().lock());
    for line in stdin.split(b'\n') {
        let line = line?;
        if is_blank(&line) {
            out.write_all(b"\n")?;
            continue;
        }
        match recode(Bytes::from(line), typed) {
            Ok(encoded) => out.write_all(&encoded)?,
            Err(error) => write!(out, "ERR {error}")?,
        }
        out.write_all(b"\n")?;
    }
    out.flush()
}

fn recode(line: Bytes, typed: bool) -> Result<Bytes, Box<dyn std::error::Error>> {
    let command = match Command::decode(line)? {
        Some(Command::Rdata(mut rdata)) if typed => {
            rdata.row = streams::recode(&rdata)?;
            Command::Rdata(rdata)
        }
        Some(command) => command,
        None => return Ok(Bytes::new()),
    };
    Ok(command.to_bytes()?)
}
