//! Properties of the RESP codec: encode -> decode gives every frame back,
//! RESP2 and RESP3; any split of the byte stream (one byte at a time, or
//! arbitrary short reads through an `io::Read`) decodes to the same frames,
//! or fails with the same error; the pub/sub fast path agrees with the
//! general decoder; every cap is enforced whatever the split.

use std::io::Read;

use bytes::{Bytes, BytesMut};
use proptest::collection::vec;
use proptest::prelude::*;
use synapse_replication::resp::{
    Channels, Frame, Incoming, Limits, Message, RespDecoder, RespError, command_len,
    encode_command, encode_publish, publish_len,
};

fn bytes(max: usize) -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), 0..max).prop_map(Bytes::from)
}

/// Text for a simple string or error: no CR, no LF.
fn line() -> impl Strategy<Value = Bytes> {
    vec(
        any::<u8>().prop_filter("no CR or LF", |b| *b != b'\r' && *b != b'\n'),
        0..16,
    )
    .prop_map(Bytes::from)
}

fn double() -> impl Strategy<Value = Frame> {
    prop_oneof![
        any::<f64>().prop_map(Frame::double),
        "[+-]?[0-9]{1,6}(\\.[0-9]{1,6})?([eE][+-]?[0-9]{1,3})?"
            .prop_map(|text| Frame::Double(text.into())),
        prop::sample::select(vec!["inf", "-inf", "nan", "+inf", "INF", "NaN"])
            .prop_map(|text| Frame::Double(text.into())),
    ]
}

fn resp2_leaf() -> impl Strategy<Value = Frame> {
    prop_oneof![
        line().prop_map(Frame::SimpleString),
        line().prop_map(Frame::Error),
        any::<i64>().prop_map(Frame::Integer),
        bytes(48).prop_map(Frame::BulkString),
        Just(Frame::NullBulkString),
        Just(Frame::NullArray),
    ]
}

fn resp3_leaf() -> impl Strategy<Value = Frame> {
    prop_oneof![
        resp2_leaf(),
        Just(Frame::Null),
        any::<bool>().prop_map(Frame::Boolean),
        double(),
        "[+-]?[0-9]{1,40}".prop_map(|text| Frame::BigNumber(text.into())),
        bytes(48).prop_map(Frame::BulkError),
        (any::<[u8; 3]>(), bytes(48))
            .prop_map(|(format, text)| Frame::VerbatimString { format, text }),
    ]
}

fn resp2_frame() -> impl Strategy<Value = Frame> {
    resp2_leaf().prop_recursive(6, 64, 6, |inner| vec(inner, 0..6).prop_map(Frame::Array))
}

fn resp3_frame() -> impl Strategy<Value = Frame> {
    resp3_leaf().prop_recursive(6, 64, 6, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(Frame::Array),
            vec(inner.clone(), 0..6).prop_map(Frame::Set),
            vec(inner.clone(), 0..6).prop_map(Frame::Push),
            vec((inner.clone(), inner.clone()), 0..4).prop_map(Frame::Map),
            (vec((inner.clone(), inner.clone()), 0..3), inner).prop_map(|(attributes, data)| {
                Frame::Attribute {
                    attributes,
                    data: Box::new(data),
                }
            }),
        ]
    })
}

/// A pub/sub message as Redis writes it: RESP2 array or RESP3 push,
/// `message` or `pmessage`, with any bytes in it.
fn message() -> impl Strategy<Value = (Message, Frame)> {
    (
        any::<bool>(),
        prop::option::of(bytes(24)),
        bytes(32),
        prop_oneof![bytes(48), bytes(600)],
    )
        .prop_map(|(push, pattern, channel, payload)| {
            let mut items = vec![Frame::bulk(if pattern.is_some() {
                "pmessage"
            } else {
                "message"
            })];
            items.extend(pattern.clone().map(Frame::BulkString));
            items.push(Frame::BulkString(channel.clone()));
            items.push(Frame::BulkString(payload.clone()));
            let frame = if push {
                Frame::Push(items)
            } else {
                Frame::Array(items)
            };
            let message = Message {
                pattern,
                channel,
                payload,
            };
            (message, frame)
        })
}

/// The channels of the subscriber tests: a deployment's two, and a short
/// one whose name is a prefix of neither.
fn subscribed() -> Channels {
    Channels::new(
        ["e2e.example.com", "e2e.example.com/USER_IP", "1"]
            .into_iter()
            .map(|name| Bytes::from_static(name.as_bytes())),
    )
}

/// A message on one of [`subscribed`]'s channels (or a near miss), as
/// Redis writes it.
fn subscribed_message() -> impl Strategy<Value = Frame> {
    (
        any::<bool>(),
        any::<bool>(),
        prop::sample::select(vec![
            "e2e.example.com",
            "e2e.example.com/USER_IP",
            "1",
            "e2e.example.co",
            "11",
            "",
        ]),
        prop_oneof![bytes(6), bytes(48), bytes(600)],
    )
        .prop_map(|(push, pattern, channel, payload)| {
            let mut items = vec![Frame::bulk(if pattern { "pmessage" } else { "message" })];
            if pattern {
                items.push(Frame::bulk("e2e.*"));
            }
            items.push(Frame::bulk(channel));
            items.push(Frame::BulkString(payload));
            if push {
                Frame::Push(items)
            } else {
                Frame::Array(items)
            }
        })
}

/// The subscriber's path, as the session takes it: messages on known
/// channels by `decode_message_on`, everything else by `decode_pubsub`.
fn decode_subscribed(
    channels: &Channels,
) -> impl FnMut(&mut RespDecoder, &mut BytesMut) -> Result<Option<Incoming>, RespError> + '_ {
    move |decoder, buf| {
        if let Some((index, payload)) = decoder.decode_message_on(buf, channels) {
            return Ok(Some(Incoming::Message(Message {
                pattern: None,
                channel: channels.names()[index].clone(),
                payload,
            })));
        }
        decoder.decode_pubsub(buf)
    }
}

fn encode_all(frames: &[Frame]) -> Vec<u8> {
    let mut buf = BytesMut::new();
    for frame in frames {
        frame.encode(&mut buf).expect("generated frames encode");
    }
    buf.to_vec()
}

/// How a decode ended: input left over (no complete frame), or an error,
/// compared by kind (its quoted input depends on how much had arrived).
#[derive(Debug, PartialEq, Eq)]
enum End {
    Pending(usize),
    Failed(std::mem::Discriminant<RespError>),
}

/// A reader that hands out at most `sizes[i]` bytes on its `i`-th read.
struct ShortReads<'a> {
    data: &'a [u8],
    sizes: &'a [usize],
    reads: usize,
}

impl Read for ShortReads<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let size = self.sizes[self.reads % self.sizes.len()].max(1);
        self.reads += 1;
        let n = size.min(out.len()).min(self.data.len());
        out[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

/// Decodes `input` as a transport would: read, decode until `None`,
/// repeat until the reader is empty.
fn decode_reads<T>(
    input: &[u8],
    sizes: &[usize],
    limits: Limits,
    mut decode: impl FnMut(&mut RespDecoder, &mut BytesMut) -> Result<Option<T>, RespError>,
) -> (Vec<T>, End) {
    let mut reader = ShortReads {
        data: input,
        sizes,
        reads: 0,
    };
    let mut decoder = RespDecoder::with_limits(limits);
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    let mut scratch = [0u8; 256];
    loop {
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
        let n = reader.read(&mut scratch).expect("reading memory");
        if n == 0 {
            return (out, End::Pending(buf.len()));
        }
        buf.extend_from_slice(&scratch[..n]);
    }
}

fn decode_frames(input: &[u8], sizes: &[usize], limits: Limits) -> (Vec<Frame>, End) {
    decode_reads(input, sizes, limits, RespDecoder::decode)
}

/// The whole input at once.
fn decode_whole(input: &[u8], limits: Limits) -> (Vec<Frame>, End) {
    decode_frames(input, &[input.len().max(1)], limits)
}

/// Decodes with `decode_bytes` on an immutable `Bytes`, advancing by the
/// consumed count.
fn decode_with_offsets(input: &[u8]) -> (Vec<Frame>, End) {
    let mut rest = Bytes::copy_from_slice(input);
    let mut decoder = RespDecoder::new();
    let mut out = Vec::new();
    loop {
        match decoder.decode_bytes(&rest) {
            Ok(Some((frame, used))) => {
                assert!(used > 0 && used <= rest.len());
                out.push(frame);
                rest = rest.slice(used..);
            }
            Ok(None) => return (out, End::Pending(rest.len())),
            Err(error) => return (out, End::Failed(std::mem::discriminant(&error))),
        }
    }
}

fn depth(frame: &Frame) -> usize {
    let inner = |frames: &mut dyn Iterator<Item = &Frame>| frames.map(depth).max().unwrap_or(0);
    match frame {
        Frame::Array(items) | Frame::Set(items) | Frame::Push(items) => {
            1 + inner(&mut items.iter())
        }
        Frame::Map(pairs) => 1 + inner(&mut pairs.iter().flat_map(|(k, v)| [k, v])),
        Frame::Attribute { attributes, data } => {
            1 + inner(&mut attributes.iter().flat_map(|(k, v)| [k, v]).chain([&**data]))
        }
        _ => 0,
    }
}

/// The largest (bulk length, element count) anywhere in the frame.
fn largest(frame: &Frame) -> (usize, usize) {
    let mut bulk = 0;
    let mut count = 0;
    let mut stack = vec![frame];
    while let Some(frame) = stack.pop() {
        match frame {
            Frame::BulkString(b) | Frame::BulkError(b) => bulk = bulk.max(b.len()),
            Frame::VerbatimString { text, .. } => bulk = bulk.max(text.len() + 4),
            Frame::Array(items) | Frame::Set(items) | Frame::Push(items) => {
                count = count.max(items.len());
                stack.extend(items);
            }
            Frame::Map(pairs) => {
                count = count.max(pairs.len());
                stack.extend(pairs.iter().flat_map(|(k, v)| [k, v]));
            }
            Frame::Attribute { attributes, data } => {
                count = count.max(attributes.len());
                stack.extend(attributes.iter().flat_map(|(k, v)| [k, v]));
                stack.push(data);
            }
            _ => {}
        }
    }
    (bulk, count)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn resp2_round_trip(frame in resp2_frame()) {
        let bytes = frame.to_bytes().expect("encodes");
        prop_assert_eq!(bytes.len(), frame.encoded_len());
        let (frames, end) = decode_whole(&bytes, Limits::new());
        prop_assert_eq!(frames, vec![frame]);
        prop_assert_eq!(end, End::Pending(0));
    }

    #[test]
    fn resp3_round_trip(frame in resp3_frame()) {
        let bytes = frame.to_bytes().expect("encodes");
        prop_assert_eq!(bytes.len(), frame.encoded_len());
        let (frames, end) = decode_whole(&bytes, Limits::new());
        prop_assert_eq!(&frames, &vec![frame]);
        prop_assert_eq!(end, End::Pending(0));
        // Re-encoding gives the same bytes back.
        prop_assert_eq!(frames[0].to_bytes().expect("encodes"), bytes);
    }

    #[test]
    fn any_split_decodes_the_same(
        frames in vec(resp3_frame(), 1..6),
        sizes in vec(1usize..40, 1..12),
        cut in any::<prop::sample::Index>(),
    ) {
        let input = encode_all(&frames);
        let whole = decode_whole(&input, Limits::new());
        prop_assert_eq!(&whole.0, &frames);
        prop_assert_eq!(decode_frames(&input, &sizes, Limits::new()), whole);
        prop_assert_eq!(decode_frames(&input, &[1], Limits::new()).0, frames.clone());
        prop_assert_eq!(decode_with_offsets(&input), decode_whole(&input, Limits::new()));
        // A stream cut short decodes the frames before the cut, and waits.
        let cut = cut.index(input.len());
        let (prefix_frames, end) = decode_frames(&input[..cut], &sizes, Limits::new());
        prop_assert!(frames.starts_with(&prefix_frames));
        prop_assert!(matches!(end, End::Pending(_)));
    }

    #[test]
    fn corrupted_streams_fail_the_same_way_whatever_the_split(
        frames in vec(resp3_frame(), 1..4),
        sizes in vec(1usize..16, 1..8),
        at in any::<prop::sample::Index>(),
        byte in prop_oneof![any::<u8>(), prop::sample::select(b"\r\n-?0123456789$*%>|_:+".to_vec())],
    ) {
        let mut input = encode_all(&frames);
        let at = at.index(input.len());
        input[at] = byte;
        let whole = decode_whole(&input, Limits::new());
        prop_assert_eq!(decode_frames(&input, &sizes, Limits::new()), decode_whole(&input, Limits::new()));
        prop_assert_eq!(decode_frames(&input, &[1], Limits::new()), whole);
    }

    #[test]
    fn messages_decode_through_any_split(
        messages in vec(message(), 1..8),
        sizes in vec(1usize..64, 1..12),
    ) {
        let frames: Vec<Frame> = messages.iter().map(|(_, frame)| frame.clone()).collect();
        let input = encode_all(&frames);
        let expected: Vec<Incoming> =
            messages.into_iter().map(|(message, _)| Incoming::Message(message)).collect();
        for sizes in [&sizes[..], &[1], &[input.len()]] {
            let (got, end) = decode_reads(&input, sizes, Limits::new(), RespDecoder::decode_pubsub);
            prop_assert_eq!(&got, &expected);
            prop_assert_eq!(end, End::Pending(0));
        }
    }

    #[test]
    fn decode_pubsub_agrees_with_decode(
        frames in vec(prop_oneof![resp3_frame(), message().prop_map(|(_, frame)| frame)], 1..6),
        sizes in vec(1usize..40, 1..8),
    ) {
        let input = encode_all(&frames);
        let (got, end) = decode_reads(&input, &sizes, Limits::new(), RespDecoder::decode_pubsub);
        let expected: Vec<Incoming> = frames.into_iter().map(Incoming::from_frame).collect();
        prop_assert_eq!(got, expected);
        prop_assert_eq!(end, End::Pending(0));
    }

    #[test]
    fn corrupted_messages_fail_the_same_way_on_both_paths(
        messages in vec(message(), 1..5),
        sizes in vec(1usize..64, 1..8),
        at in any::<prop::sample::Index>(),
        byte in prop_oneof![any::<u8>(), prop::sample::select(b"\r\n-?0123456789$*>".to_vec())],
    ) {
        let frames: Vec<Frame> = messages.into_iter().map(|(_, frame)| frame).collect();
        let mut input = encode_all(&frames);
        let at = at.index(input.len());
        input[at] = byte;
        let general = |sizes: &[usize]| {
            let (frames, end) = decode_frames(&input, sizes, Limits::new());
            (frames.into_iter().map(Incoming::from_frame).collect::<Vec<_>>(), end)
        };
        for sizes in [&sizes[..], &[1], &[input.len()]] {
            let fast = decode_reads(&input, sizes, Limits::new(), RespDecoder::decode_pubsub);
            prop_assert_eq!(fast, general(sizes));
        }
    }

    #[test]
    fn the_channel_fast_path_agrees_with_the_general_path(
        frames in vec(
            prop_oneof![
                4 => subscribed_message(),
                1 => message().prop_map(|(_, frame)| frame),
                1 => resp3_leaf(),
            ],
            1..8,
        ),
        sizes in vec(prop_oneof![1usize..8, 64usize..2048], 1..8),
        corrupt in prop::option::of((
            any::<prop::sample::Index>(),
            prop::sample::select(b"\r\n-0123456789$*>".to_vec()),
        )),
        limits in prop_oneof![
            Just(Limits::new()),
            (1usize..24, 16usize..700).prop_map(|(bulk, frame)| {
                Limits::new().with_max_bulk_len(bulk).with_max_frame_len(frame)
            }),
            Just(Limits::new().with_max_elements(3)),
        ],
    ) {
        let mut input = encode_all(&frames);
        if let Some((at, byte)) = corrupt {
            let at = at.index(input.len());
            input[at] = byte;
        }
        let channels = subscribed();
        for sizes in [&sizes[..], &[1], &[input.len()]] {
            let fast = decode_reads(&input, sizes, limits, decode_subscribed(&channels));
            let general = decode_reads(&input, sizes, limits, |decoder, buf| {
                decoder.decode(buf).map(|frame| frame.map(Incoming::from_frame))
            });
            prop_assert_eq!(fast, general);
        }
    }

    #[test]
    fn messages_mixed_with_tiny_frames_in_tiny_and_large_reads(
        frames in vec(
            prop_oneof![
                message().prop_map(|(_, frame)| frame),
                Just(Frame::Null),
                Just(Frame::Boolean(true)),
                (0i64..10).prop_map(Frame::Integer),
            ],
            1..12,
        ),
        sizes in vec(prop_oneof![1usize..4, 32usize..1024], 1..8),
    ) {
        let input = encode_all(&frames);
        let expected: Vec<Incoming> = frames.into_iter().map(Incoming::from_frame).collect();
        let (got, end) = decode_reads(&input, &sizes, Limits::new(), RespDecoder::decode_pubsub);
        prop_assert_eq!(got, expected);
        prop_assert_eq!(end, End::Pending(0));
    }

    #[test]
    fn caps_are_enforced_whatever_the_split(
        frame in resp3_frame(),
        sizes in vec(1usize..16, 1..8),
    ) {
        let input = frame.to_bytes().expect("encodes");
        let (bulk, count) = largest(&frame);
        let depth = depth(&frame);
        let failed = |error: RespError| End::Failed(std::mem::discriminant(&error));
        let mut cases = vec![(
            Limits::new().with_max_frame_len(input.len() - 1),
            failed(RespError::FrameTooLarge { len: 0, max: 0 }),
        )];
        if bulk > 0 {
            cases.push((
                Limits::new().with_max_bulk_len(bulk - 1),
                failed(RespError::BulkTooLong { len: 0, max: 0 }),
            ));
        }
        if count > 0 {
            cases.push((
                Limits::new().with_max_elements(count - 1),
                failed(RespError::TooManyElements { len: 0, max: 0 }),
            ));
        }
        if depth > 0 {
            cases.push((
                Limits::new().with_max_depth(depth - 1),
                failed(RespError::TooDeep { max: 0 }),
            ));
        }
        for (limits, expected) in cases {
            for sizes in [&sizes[..], &[1], &[input.len()]] {
                let (frames, end) = decode_frames(&input, sizes, limits);
                prop_assert!(frames.is_empty());
                prop_assert_eq!(&end, &expected, "{:?}", limits);
            }
        }
        // Exactly at the caps, the frame decodes.
        let exact = Limits::new()
            .with_max_frame_len(input.len())
            .with_max_bulk_len(bulk)
            .with_max_elements(count)
            .with_max_depth(depth);
        prop_assert_eq!(decode_frames(&input, &sizes, exact).0, vec![frame]);
    }

    #[test]
    fn commands_decode_as_arrays_of_bulk_strings(args in vec(vec(any::<u8>(), 0..40), 0..8)) {
        let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        let mut buf = BytesMut::new();
        encode_command(&mut buf, &args);
        prop_assert_eq!(buf.len(), command_len(&args));
        let expected = Frame::Array(args.iter().map(|arg| Frame::bulk(arg.to_vec())).collect());
        prop_assert_eq!(RespDecoder::new().decode(&mut buf), Ok(Some(expected)));
    }

    #[test]
    fn publish_is_a_command(channel in bytes(32), payload in bytes(600)) {
        let mut fast = BytesMut::from(&b"already queued"[..]);
        encode_publish(&mut fast, &channel, &payload);
        let mut generic = BytesMut::from(&b"already queued"[..]);
        encode_command(&mut generic, &[b"PUBLISH", &channel, &payload]);
        prop_assert_eq!(&fast, &generic);
        prop_assert_eq!(fast.len(), 14 + publish_len(&channel, &payload));
    }
}
