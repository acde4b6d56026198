//! Transcript tests of the writer: what it sends, line by line, for what
//! its process writes, as Synapse's writers send it (batches, positions,
//! `REPLICATE` answers), and what it refuses.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use synapse_replication::positions::{Follower, RateLimit, WriteError, Writer, WriterConfig};
use synapse_replication::wire::{Command, InstanceName, RawRow, StreamName, Token};

use common::transcripts::{deployment, name};

fn lines(writer: &mut Writer) -> Vec<String> {
    std::iter::from_fn(|| writer.poll_command())
        .map(|c| String::from_utf8(c.to_bytes().unwrap().to_vec()).unwrap())
        .collect()
}

fn row(json: &str) -> RawRow {
    RawRow::new(Bytes::copy_from_slice(json.as_bytes())).unwrap()
}

#[test]
fn writer_batches_rows_as_synapse_and_follows_with_a_position() {
    let mut w = Writer::new(InstanceName::master(), deployment());
    w.advance(&StreamName::Caches, Token(0)).unwrap();
    w.connected(Instant::now());
    assert_eq!(lines(&mut w), ["POSITION caches master 0 0"]);
    let updates = [
        (1, "[\"a\"]"),
        (1, "[\"b\"]"),
        (2, "[\"c\"]"),
        (3, "[\"d\"]"),
        (3, "[\"e\"]"),
    ]
    .map(|(t, r)| (Token(t), row(r)));
    w.write(&StreamName::Caches, Token(5), updates).unwrap();
    assert_eq!(
        lines(&mut w),
        [
            r#"RDATA caches master batch ["a"]"#,
            r#"RDATA caches master 1 ["b"]"#,
            r#"RDATA caches master 2 ["c"]"#,
            r#"RDATA caches master batch ["d"]"#,
            r#"RDATA caches master 3 ["e"]"#,
            "POSITION caches master 3 5",
        ]
    );
    // Current equal to the last row: no POSITION.
    w.write(&StreamName::Caches, Token(6), [(Token(6), row("[1]"))])
        .unwrap();
    assert_eq!(lines(&mut w), [r#"RDATA caches master 6 [1]"#]);
    assert_eq!(w.position(&StreamName::Caches), Some(Token(6)));
}

#[test]
fn writer_sends_a_position_when_the_token_moves_without_rows() {
    let mut w = Writer::new(InstanceName::master(), deployment());
    w.connected(Instant::now());
    assert_eq!(lines(&mut w), Vec::<String>::new());
    w.advance(&StreamName::Pushers, Token(5)).unwrap();
    assert_eq!(lines(&mut w), ["POSITION pushers master 5 5"]);
    w.advance(&StreamName::Pushers, Token(7)).unwrap();
    w.advance(&StreamName::Pushers, Token(7)).unwrap();
    w.write(&StreamName::Pushers, Token(9), []).unwrap();
    assert_eq!(
        lines(&mut w),
        ["POSITION pushers master 5 7", "POSITION pushers master 7 9"]
    );
    assert!(matches!(
        w.advance(&StreamName::Pushers, Token(8)),
        Err(WriteError::CurrentTooLow { .. })
    ));
}

#[test]
fn writer_refuses_streams_it_does_not_write_and_bad_tokens() {
    let mut w = Writer::new(InstanceName::master(), deployment());
    w.connected(Instant::now());
    let err = w
        .write(&StreamName::Typing, Token(1), [(Token(1), row("[]"))])
        .unwrap_err();
    assert_eq!(err.to_string(), "master is not a writer of stream typing");
    assert!(matches!(
        w.advance(&StreamName::Events, Token(1)),
        Err(WriteError::NotAWriter { .. })
    ));
    assert!(w.position(&StreamName::Typing).is_none());

    w.advance(&StreamName::Pushers, Token(5)).unwrap();
    let _ = lines(&mut w);
    for (current, updates, expected) in [
        (
            6,
            vec![(5, "[]")],
            "row token 5 is not above the last token sent, 5",
        ),
        (8, vec![(7, "[]"), (6, "[]")], "row token 6 after 7"),
        (6, vec![(7, "[]")], "current token 6 is below 7"),
    ] {
        let updates = updates.into_iter().map(|(t, r)| (Token(t), row(r)));
        let err = w
            .write(&StreamName::Pushers, Token(current), updates)
            .unwrap_err();
        assert!(err.to_string().ends_with(expected), "{err}");
    }
    assert_eq!(lines(&mut w), Vec::<String>::new(), "nothing sent");
    assert_eq!(w.position(&StreamName::Pushers), Some(Token(5)));
}

#[test]
fn writer_announces_on_connect_before_anything_written_after() {
    let registry = deployment();
    let mut w = Writer::new(name("w1"), registry);
    w.advance(&StreamName::Caches, Token(3)).unwrap();
    w.advance(&StreamName::Events, Token(10)).unwrap();
    w.advance(&StreamName::Receipts, Token(4)).unwrap();
    // Written while disconnected: nothing sent, but the position moves.
    w.write(
        &StreamName::Events,
        Token(12),
        [(Token(11), row("[]")), (Token(12), row("[]"))],
    )
    .unwrap();
    assert_eq!(lines(&mut w), Vec::<String>::new());
    let t0 = Instant::now();
    // Asked before connecting: sent first. Asked again at once: delayed.
    w.request_replicate(t0);
    w.connected(t0);
    w.request_replicate(t0);
    w.write(&StreamName::Events, Token(13), [(Token(13), row("[]"))])
        .unwrap();
    assert_eq!(
        lines(&mut w),
        [
            "REPLICATE ",
            "POSITION events w1 12 12",
            "POSITION receipts w1 4 4",
            "POSITION caches w1 3 3",
            "RDATA events w1 13 []",
        ]
    );
    assert_eq!(w.counters().rows_unsent, 2);
    // A lost connection drops what was not sent.
    w.write(&StreamName::Events, Token(14), [(Token(14), row("[]"))])
        .unwrap();
    w.disconnected();
    assert_eq!(lines(&mut w), Vec::<String>::new());
    w.connected(t0);
    assert_eq!(lines(&mut w)[0], "POSITION events w1 14 14");
}

#[test]
fn writer_answers_replicate_coalesced_and_rate_limited() {
    let mut w = Writer::new(InstanceName::master(), deployment());
    w.advance(&StreamName::Pushers, Token(5)).unwrap();
    let t0 = Instant::now();
    w.connected(t0);
    let _ = lines(&mut w);
    w.handle_command(&Command::Replicate, t0);
    assert_eq!(lines(&mut w), ["POSITION pushers master 5 5"]);
    let ms = Duration::from_millis;
    w.handle_replicate(t0 + ms(10));
    w.handle_replicate(t0 + ms(20));
    assert_eq!(lines(&mut w), Vec::<String>::new());
    assert_eq!(w.poll_timeout(), Some(t0 + ms(250)));
    w.handle_timeout(t0 + ms(100));
    assert_eq!(lines(&mut w), Vec::<String>::new());
    w.advance(&StreamName::Pushers, Token(6)).unwrap();
    w.handle_timeout(t0 + ms(250));
    assert_eq!(
        lines(&mut w),
        ["POSITION pushers master 5 6", "POSITION pushers master 6 6"]
    );
    assert_eq!(w.poll_timeout(), None);

    // Without a rate limit, requests between two drains share one answer.
    let mut config = WriterConfig::default();
    config.answer = RateLimit::none();
    let mut w = Writer::with_config(InstanceName::master(), deployment(), config);
    w.advance(&StreamName::Pushers, Token(5)).unwrap();
    w.connected(t0);
    for _ in 0..100 {
        w.handle_replicate(t0);
    }
    assert_eq!(lines(&mut w), ["POSITION pushers master 5 5"]);
    assert_eq!(w.counters().answers_coalesced, 100);
}

#[test]
fn writer_replicate_in_a_reconnect_loop_backs_off() {
    let mut w = Writer::new(name("f1"), deployment());
    let t0 = Instant::now();
    let mut sent = Vec::new();
    let mut now = t0;
    // Reconnect every 100 ms for two minutes, connected for 50 ms each time.
    while now < t0 + Duration::from_secs(120) {
        w.connected(now);
        w.request_replicate(now);
        let until = now + Duration::from_millis(50);
        while let Some(due) = w.poll_timeout().filter(|due| *due <= until) {
            w.handle_timeout(due);
        }
        for line in lines(&mut w) {
            assert_eq!(line, "REPLICATE ");
            sent.push(now.duration_since(t0).as_millis());
        }
        w.disconnected();
        now += Duration::from_millis(100);
    }
    assert!(sent.len() <= 10, "{sent:?}");
    let gaps: Vec<u128> = sent.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps.iter().all(|gap| *gap >= 1000), "{gaps:?}");
    assert!(*gaps.last().unwrap() >= 30_000, "{gaps:?}");
}

#[test]
fn writer_own_echoes_do_not_reach_its_follower() {
    let registry = deployment();
    let t0 = Instant::now();
    let mut w = Writer::new(name("w3"), registry.clone());
    let mut f = Follower::new(name("w3"), registry);
    w.advance(&StreamName::Typing, Token(0)).unwrap();
    w.connected(t0);
    f.connected();
    w.write(
        &StreamName::Typing,
        Token(1),
        [(Token(1), row("[\"!r:x\",[]]"))],
    )
    .unwrap();
    while let Some(command) = w.poll_command() {
        f.handle_command(command);
    }
    assert_eq!(f.poll_event(), None);
    assert_eq!(f.counters().own_echoes, 2);
}
