//! RESP decoding of arbitrary bytes: never panics, and checks properties.
//!
//! The first two bytes choose where to split the rest (as two reads); the
//! third chooses the caps, from the defaults to tight ones, so the limit
//! paths are exercised too. Then:
//! - decoding whole and decoding in two reads give the same frames and end
//!   the same way (same error kind, or the same bytes left over);
//! - every decoded frame re-encodes, and decodes back to itself;
//! - `decode_pubsub` gives what `Incoming::from_frame` makes of `decode`;
//! - the subscriber's path (`decode_message_on` for a few channels, then
//!   `decode_pubsub`) gives what `decode_pubsub` gives;
//! - `decode_bytes` agrees with `decode`.

use bytes::{Bytes, BytesMut};
use synapse_replication::resp::{
    Channels, Frame, Incoming, Limits, Message, RespDecoder, RespError,
};

#[derive(Clone, Debug, PartialEq)]
enum End {
    Pending(usize),
    Failed(std::mem::Discriminant<RespError>),
}

fn run<T>(
    reads: &[&[u8]],
    limits: Limits,
    mut decode: impl FnMut(&mut RespDecoder, &mut BytesMut) -> Result<Option<T>, RespError>,
) -> (Vec<T>, End) {
    let mut decoder = RespDecoder::with_limits(limits);
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    for read in reads {
        buf.extend_from_slice(read);
        loop {
            let before = buf.len();
            match decode(&mut decoder, &mut buf) {
                Ok(Some(item)) => out.push(item),
                Ok(None) => {
                    assert_eq!(buf.len(), before, "Ok(None) consumed input");
                    break;
                }
                Err(error) => {
                    assert_eq!(buf.len(), before, "an error consumed input");
                    return (out, End::Failed(std::mem::discriminant(&error)));
                }
            }
        }
    }
    (out, End::Pending(buf.len()))
}

fn with_offsets(input: &[u8], limits: Limits) -> (Vec<Frame>, End) {
    let mut rest = Bytes::copy_from_slice(input);
    let mut decoder = RespDecoder::with_limits(limits);
    let mut out = Vec::new();
    loop {
        match decoder.decode_bytes(&rest) {
            Ok(Some((frame, used))) => {
                out.push(frame);
                rest = rest.slice(used..);
            }
            Ok(None) => return (out, End::Pending(rest.len())),
            Err(error) => return (out, End::Failed(std::mem::discriminant(&error))),
        }
    }
}

/// Runs one input through the checks; panics where one fails.
pub fn check(data: &[u8]) {
    let [a, b, caps, input @ ..] = data else {
        return;
    };
    let limits = match caps % 5 {
        0 => Limits::new(),
        1 => Limits::new()
            .with_max_depth(3)
            .with_max_elements(4)
            .with_max_bulk_len(16),
        2 => Limits::new().with_max_line_len(8).with_max_frame_len(48),
        // Under the length of `message`: the fast paths must stand aside.
        3 => Limits::new().with_max_bulk_len(5),
        _ => Limits::new().with_max_depth(0),
    };
    let split = usize::from(u16::from_le_bytes([*a, *b])) % (input.len() + 1);
    let (first, second) = input.split_at(split);

    let whole = run(&[input], limits, RespDecoder::decode);
    let halves = run(&[first, second], limits, RespDecoder::decode);
    assert_eq!(whole, halves, "split at {split}");

    let pubsub = run(&[first, second], limits, RespDecoder::decode_pubsub);
    let classified: Vec<Incoming> = whole.0.iter().cloned().map(Incoming::from_frame).collect();
    assert_eq!(pubsub, (classified, whole.1.clone()));

    let channels = Channels::new([
        Bytes::from_static(b"ch"),
        Bytes::from_static(b"c"),
        Bytes::from_static(b"ch/USER_IP"),
    ]);
    let subscribed = run(&[first, second], limits, |decoder, buf| {
        if let Some((index, payload)) = decoder.decode_message_on(buf, &channels) {
            return Ok(Some(Incoming::Message(Message {
                pattern: None,
                channel: channels.names()[index].clone(),
                payload,
            })));
        }
        decoder.decode_pubsub(buf)
    });
    assert_eq!(subscribed, pubsub);

    assert_eq!(
        with_offsets(input, limits),
        (whole.0.clone(), whole.1.clone())
    );

    for frame in &whole.0 {
        let bytes = frame.to_bytes().expect("a decoded frame encodes");
        assert_eq!(bytes.len(), frame.encoded_len());
        let mut buf = BytesMut::from(&bytes[..]);
        // The frame was within `limits`, and so is its encoding (which may
        // be shorter: `:+1` encodes as `:1`).
        let again = RespDecoder::with_limits(limits)
            .decode(&mut buf)
            .expect("an encoded frame decodes")
            .expect("an encoded frame is complete");
        assert_eq!(&again, frame);
        assert!(buf.is_empty());
    }
}
