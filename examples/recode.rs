//! Reads replication lines on stdin and prints each one re-encoded by the
//! crate, or `ERR <reason>`; blank lines are echoed blank.
//!
//! Check the codec against a capture of real traffic:
//!
//! ```text
//! cargo run --release --example recode < capture.txt > recoded.txt
//! diff capture.txt recoded.txt
//! ```

use std::io::{self, BufRead, Write};

use bytes::Bytes;
use synapse_replication::wire::{Command, is_blank};

fn main() -> io::Result<()> {
    let stdin = io::stdin().lock();
    let mut out = io::BufWriter::new(io::stdout().lock());
    for line in stdin.split(b'\n') {
        let line = line?;
        if is_blank(&line) {
            out.write_all(b"\n")?;
            continue;
        }
        match Command::decode(Bytes::from(line)).map(|command| command.map(|c| c.to_bytes())) {
            Ok(Some(Ok(encoded))) => out.write_all(&encoded)?,
            Ok(Some(Err(error))) => write!(out, "ERR {error}")?,
            Ok(None) => {}
            Err(error) => write!(out, "ERR {error}")?,
        }
        out.write_all(b"\n")?;
    }
    out.flush()
}
