//! decode -> encode -> decode is stable: whatever decodes, encodes to a line
//! that decodes to the same command and encodes to the same bytes.

use bytes::Bytes;
use synapse_replication::wire::Command;

/// Runs one input through the checks; panics where one fails.
pub fn check(data: &[u8]) {
    let Ok(Some(first)) = Command::decode(Bytes::copy_from_slice(data)) else {
        return;
    };
    // Decoding is at least as strict as encoding, so whatever decodes can
    // be written back.
    let line = first.to_bytes().expect("a decoded command encodes");
    let second = Command::decode(line.clone())
        .expect("an encoded line decodes")
        .expect("an encoded line is not blank");
    assert_eq!(first, second);
    assert_eq!(second.to_bytes().expect("encodes again"), line);
}
