//! RESP throughput: what a subscriber can decode and a publisher encode.
//!
//! `cargo bench --bench resp`
//!
//! The input is what a Redis subscriber connection carries for a busy
//! Synapse deployment: thousands of pub/sub `message`s on the server-name
//! channel, each a replication line of 100 to 400 bytes, as RESP2 arrays
//! or RESP3 pushes, in one buffer (as after a large read) or arriving in
//! TCP-segment-sized reads. Counters give frames/s and MB/s.

use bytes::BytesMut;
use divan::counter::{BytesCount, ItemsCount};
use divan::{Bencher, black_box};
use synapse_replication::resp::{
    Frame, Incoming, RespDecoder, encode_command, encode_publish, publish_len,
};

fn main() {
    divan::main();
}

/// Messages per buffer.
const MESSAGES: usize = 2000;

const CHANNEL: &[u8] = b"example.com";

/// Replication lines of 100 to 400 bytes, deterministic.
fn payloads() -> Vec<Vec<u8>> {
    let mut seed: u32 = 0x2545_f491;
    (0..MESSAGES)
        .map(|index| {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            let len = 100 + (seed >> 8) as usize % 301;
            let mut line = format!(
                r#"RDATA events event_persister1 {} ["ev",["$9lUlKX4q1T0CMy0tPQbWuzMJH3AeiRLw0mBzb8Z0pkA","!OGEhHVWSdvArJzumhm:matrix.org","m.room.message",null,null,null,null,false,false]]"#,
                4_183_921 + index
            )
            .into_bytes();
            line.resize(len, b' ');
            line
        })
        .collect()
}

/// The messages as Redis writes them to a subscriber.
fn wire(resp3: bool) -> BytesMut {
    let mut buf = BytesMut::new();
    for payload in payloads() {
        let items = vec![
            Frame::bulk("message"),
            Frame::bulk(CHANNEL),
            Frame::bulk(payload),
        ];
        let frame = if resp3 {
            Frame::Push(items)
        } else {
            Frame::Array(items)
        };
        frame.encode(&mut buf).expect("messages encode");
    }
    buf
}

fn count_messages(decoder: &mut RespDecoder, buf: &mut BytesMut) -> usize {
    let mut count = 0;
    while let Ok(Some(item)) = decoder.decode_pubsub(buf) {
        if let Incoming::Message(message) = item {
            black_box(&message.payload);
            count += 1;
        }
    }
    count
}

/// The subscriber's hot path: `decode_pubsub` on a buffer of RESP2
/// `message` arrays.
#[divan::bench(sample_size = 8)]
fn pubsub_resp2(bencher: Bencher) {
    let input = wire(false);
    bencher
        .counter(ItemsCount::new(MESSAGES))
        .counter(BytesCount::new(input.len()))
        .with_inputs(|| input.clone())
        .bench_local_values(|mut buf| {
            let mut decoder = RespDecoder::new();
            assert_eq!(count_messages(&mut decoder, &mut buf), MESSAGES);
            buf
        });
}

/// The same on RESP3 `>3` pushes.
#[divan::bench(sample_size = 8)]
fn pubsub_resp3(bencher: Bencher) {
    let input = wire(true);
    bencher
        .counter(ItemsCount::new(MESSAGES))
        .counter(BytesCount::new(input.len()))
        .with_inputs(|| input.clone())
        .bench_local_values(|mut buf| {
            let mut decoder = RespDecoder::new();
            assert_eq!(count_messages(&mut decoder, &mut buf), MESSAGES);
            buf
        });
}

/// The general decoder on the same input: a `Frame::Array` (one `Vec`)
/// per message.
#[divan::bench(sample_size = 8)]
fn frames_resp2(bencher: Bencher) {
    let input = wire(false);
    bencher
        .counter(ItemsCount::new(MESSAGES))
        .counter(BytesCount::new(input.len()))
        .with_inputs(|| input.clone())
        .bench_local_values(|mut buf| {
            let mut decoder = RespDecoder::new();
            let mut count = 0;
            while let Ok(Some(frame)) = decoder.decode(&mut buf) {
                black_box(&frame);
                count += 1;
            }
            assert_eq!(count, MESSAGES);
            buf
        });
}

/// A transport's loop: the same messages arriving in reads of `size`
/// bytes (a TCP segment, a small and a large read buffer), appended to
/// the buffer and decoded after each read. Includes the copy into the
/// buffer; frames split across reads take the general path.
#[divan::bench(args = [1460, 16 * 1024, 64 * 1024], sample_size = 8)]
fn pubsub_in_reads(bencher: Bencher, size: usize) {
    let input = wire(false).freeze();
    bencher
        .counter(ItemsCount::new(MESSAGES))
        .counter(BytesCount::new(input.len()))
        .bench_local(|| {
            let mut decoder = RespDecoder::new();
            let mut buf = BytesMut::with_capacity(2 * size);
            let mut count = 0;
            for read in input.chunks(size) {
                buf.extend_from_slice(read);
                count += count_messages(&mut decoder, &mut buf);
            }
            assert_eq!(count, MESSAGES);
        });
}

/// The publisher's hot path: PUBLISH commands appended to one buffer.
#[divan::bench(sample_size = 8)]
fn encode_publishes(bencher: Bencher) {
    let payloads = payloads();
    let total: usize = payloads
        .iter()
        .map(|payload| publish_len(CHANNEL, payload))
        .sum();
    let mut buf = BytesMut::with_capacity(total);
    bencher
        .counter(ItemsCount::new(MESSAGES))
        .counter(BytesCount::new(total))
        .bench_local(|| {
            buf.clear();
            for payload in &payloads {
                encode_publish(&mut buf, CHANNEL, black_box(payload));
            }
            black_box(&buf);
        });
}

/// The same with the generic `encode_command`.
#[divan::bench(sample_size = 8)]
fn encode_publishes_generic(bencher: Bencher) {
    let payloads = payloads();
    let total: usize = payloads
        .iter()
        .map(|payload| publish_len(CHANNEL, payload))
        .sum();
    let mut buf = BytesMut::with_capacity(total);
    bencher
        .counter(ItemsCount::new(MESSAGES))
        .counter(BytesCount::new(total))
        .bench_local(|| {
            buf.clear();
            for payload in &payloads {
                encode_command(&mut buf, &[b"PUBLISH", CHANNEL, black_box(payload)]);
            }
            black_box(&buf);
        });
}
