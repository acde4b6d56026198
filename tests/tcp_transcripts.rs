//! Transcripts of the direct TCP sessions on the pair harness: what goes on
//! the wire, and what each side reports, under a virtual clock.

mod common;

use std::time::{Duration, Instant};

use common::pair::{Log, Pair, SERVER_NAME, client, client_summary, row, server, server_summary};
use synapse_replication::positions::{CatchUpRequest, FollowerEvent, RowOrigin};
use synapse_replication::session::{
    ConnectionState, SendError, TcpClientEvent, TcpError, TcpServerEvent, TcpSessionConfig,
};
use synapse_replication::wire::{Command, FederationAck, InstanceName, RawRow, StreamName, Token};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// Answers every catch-up the client asked for since event `from`, in
/// pages of `page` rows, until none is left. Returns the requests.
fn answer_catch_ups(pair: &mut Pair, log: &Log, page: usize) -> Vec<CatchUpRequest> {
    let mut answered = Vec::new();
    let mut seen = 0;
    loop {
        let pending: Vec<CatchUpRequest> = pair.client_events[seen..]
            .iter()
            .filter_map(|event| match event {
                TcpClientEvent::Follower(FollowerEvent::CatchUp(request)) => Some(request.clone()),
                _ => None,
            })
            .collect();
        seen = pair.client_events.len();
        if pending.is_empty() {
            return answered;
        }
        for request in pending {
            let page = log.answer(&request, page);
            pair.client.handle_catch_up(request.id, page).unwrap();
            answered.push(request);
        }
        pair.drive();
    }
}

/// `(token, source)` of every `caches` row the client was given.
fn caches_rows(pair: &Pair) -> Vec<(i64, RowOrigin, usize)> {
    pair.client_events
        .iter()
        .filter_map(|event| match event {
            TcpClientEvent::Follower(FollowerEvent::Rows {
                stream: StreamName::Caches,
                token,
                rows,
                source,
                ..
            }) => Some((token.0, *source, rows.len())),
            _ => None,
        })
        .collect()
}

#[test]
fn handshake() {
    let mut pair = Pair::new();
    pair.connect();
    assert_eq!(
        pair.server_lines(),
        ["NAME worker1", "PING 0", "REPLICATE "]
    );
    assert_eq!(
        pair.client_lines(),
        [
            "SERVER example.com",
            "PING 0",
            "POSITION typing master 0 0",
            "POSITION caches master 0 0",
        ]
    );
    assert_eq!(
        client_summary(&pair.client_events),
        [
            "ready example.com",
            "started typing master 0",
            "started caches master 0"
        ]
    );
    assert_eq!(
        server_summary(&pair.server_events),
        ["named #1 worker1", "replicated #1"]
    );
    assert!(pair.client.is_ready());
    let id = pair.id.unwrap();
    assert_eq!(pair.server.client_name(id), Some("worker1"));

    // Rows now reach the follower.
    pair.server
        .write(&StreamName::Caches, Token(1), [(Token(1), row(1))])
        .unwrap();
    pair.drive();
    assert_eq!(
        pair.client_lines().last().unwrap(),
        r#"RDATA caches master 1 ["row",1]"#
    );
    assert_eq!(caches_rows(&pair), [(1, RowOrigin::Live, 1)]);
}

#[test]
fn a_client_without_name_and_wall_clock_pings() {
    let now = Instant::now();
    let mut client = client(SERVER_NAME, TcpSessionConfig::default());
    client.set_client_name(None).unwrap();
    let wall = std::time::UNIX_EPOCH + Duration::from_millis(1_700_000_000_000);
    client.set_wall_clock(now, wall);
    let server = server(&[StreamName::Typing], TcpSessionConfig::default(), now);
    let mut pair = Pair::from_sessions(server, client, now);
    pair.connect();
    assert_eq!(pair.server_lines(), ["PING 1700000000000", "REPLICATE "]);
    pair.run_for(Duration::from_millis(5_500));
    assert!(
        pair.server_lines()
            .contains(&"PING 1700000005000".to_owned())
    );
}

#[test]
fn wrong_server_name() {
    let mut pair = Pair::with(TcpSessionConfig::default(), "other.example");
    pair.connect();
    assert_eq!(
        pair.server_lines(),
        ["NAME worker1", "PING 0", "REPLICATE ", "ERROR Wrong remote"]
    );
    assert_eq!(
        client_summary(&pair.client_events),
        [r#"closing: wrong remote: expected server name "other.example", got "example.com""#]
    );
    assert_eq!(
        server_summary(&pair.server_events),
        [
            "named #1 worker1",
            "replicated #1",
            "peer error #1 Wrong remote"
        ]
    );
    assert!(!pair.is_connected(), "the client closed after its ERROR");
    assert_eq!(pair.client.follower().counters().positions_processed, 0);
}

#[test]
fn a_server_must_greet_first() {
    let mut pair = Pair::new();
    pair.id = Some(pair.server.accept(pair.now));
    pair.client.connect(pair.now);
    pair.inject_to_client(b"PING 1\nSERVER example.com\n");
    assert_eq!(
        client_summary(&pair.client_events),
        ["closing: expected SERVER first, got PING"]
    );
    assert_eq!(pair.client.state(), None, "closed and disconnected");
}

#[test]
fn pings_keep_an_idle_connection_up() {
    let mut pair = Pair::new();
    pair.connect();
    pair.run_for(secs(60));
    assert!(pair.is_connected());
    for (direction, lines) in [
        ("to client", &pair.to_client),
        ("to server", &pair.to_server),
    ] {
        let mut last = Duration::ZERO;
        let mut pings = 0;
        for line in lines.iter() {
            assert!(
                line.at - last <= secs(5),
                "{direction}: silent from {last:?} to {:?}",
                line.at
            );
            last = line.at;
            pings += usize::from(line.line.starts_with("PING "));
        }
        assert!(secs(60) - last <= secs(5), "{direction}: silent at the end");
        assert_eq!(pings, 13, "{direction}: one at once, then every 5 s");
    }
    assert!(
        !pair
            .client_events
            .iter()
            .any(|e| matches!(e, TcpClientEvent::Closing(_)))
    );
}

#[test]
fn traffic_delays_pings() {
    let mut pair = Pair::new();
    pair.connect();
    // A row every 2 s: the server never needs to ping.
    for token in 1..=10 {
        pair.run_for(secs(2));
        pair.server
            .write(
                &StreamName::Caches,
                Token(token),
                [(Token(token), row(token))],
            )
            .unwrap();
        pair.drive();
    }
    let server_pings = pair
        .to_client
        .iter()
        .filter(|l| l.line.starts_with("PING "))
        .count();
    assert_eq!(server_pings, 1, "only the greeting's");
    assert_eq!(caches_rows(&pair).len(), 10);
}

#[test]
fn a_silent_client_is_closed_after_25_s() {
    let mut pair = Pair::new();
    pair.connect();
    pair.client_frozen = true;
    pair.run_for(secs(40));
    assert!(!pair.is_connected());
    let last = pair.to_client.last().unwrap();
    assert_eq!(last.line, "ERROR ping timeout");
    assert_eq!(last.at, secs(25));
    assert!(matches!(
        pair.server_events.last(),
        Some(TcpServerEvent::Closing { error: TcpError::PingTimeout(silent), .. }) if *silent == secs(25)
    ));
    // The client saw the server's pings and its ERROR, then the end.
    assert!(
        matches!(pair.client_events.last(), Some(TcpClientEvent::PeerError(m)) if m == "ping timeout")
    );
}

#[test]
fn a_silent_server_is_closed_after_25_s() {
    let mut pair = Pair::new();
    pair.connect();
    pair.run_for(secs(3));
    pair.server_frozen = true;
    pair.run_for(secs(40));
    assert!(!pair.is_connected());
    let last = pair.to_server.last().unwrap();
    assert_eq!(last.line, "ERROR ping timeout");
    assert_eq!(
        last.at,
        secs(25),
        "25 s after the server's last line, at 0 s"
    );
    assert!(matches!(
        pair.client_events.last(),
        Some(TcpClientEvent::Closing(TcpError::PingTimeout(_)))
    ));
}

#[test]
fn invalid_lines_get_an_error_and_a_close() {
    // (to the client?, line, ERROR sent back)
    let cases: &[(bool, &str, &str)] = &[
        (true, "REPLICATE ", "ERROR invalid command: REPLICATE"),
        (
            true,
            "USER_SYNC w @a:x d start 1",
            "ERROR invalid command: USER_SYNC",
        ),
        (
            true,
            "NEW_ACTIVE_TASK 1",
            "ERROR invalid command: NEW_ACTIVE_TASK",
        ),
        (
            false,
            r#"RDATA caches master 1 ["a"]"#,
            "ERROR invalid command: RDATA",
        ),
        (
            false,
            "POSITION caches master 1 1",
            "ERROR invalid command: POSITION",
        ),
        (false, "SERVER example.com", "ERROR invalid command: SERVER"),
        (false, "CANCEL_TASK 1", "ERROR invalid command: CANCEL_TASK"),
        (
            true,
            "POSITION caches master x 1",
            "ERROR failed to parse line: POSITION: invalid prev_token",
        ),
        (
            true,
            "RDATA caches master 1 [",
            "ERROR failed to parse line: RDATA: invalid JSON in row",
        ),
        (
            true,
            "HELLO world",
            "ERROR failed to parse line: unknown command \"HELLO\"",
        ),
        (
            false,
            "FEDERATION_ACK w",
            "ERROR failed to parse line: FEDERATION_ACK: missing token",
        ),
        (false, "PING \u{7f}\u{0}", "ERROR"),
    ];
    for &(to_client, line, error) in cases {
        let mut pair = Pair::new();
        pair.connect();
        let input = format!("{line}\nPING after\n");
        if to_client {
            pair.inject_to_client(input.as_bytes());
            if line.starts_with("PING") {
                continue;
            }
            let sent = pair.server_lines();
            assert!(sent.last().unwrap().starts_with(error), "{line}: {sent:?}");
            assert!(
                matches!(pair.client_events.last(), Some(TcpClientEvent::Closing(_))),
                "{line}: nothing after the error"
            );
        } else {
            pair.inject_to_server(input.as_bytes());
            if line.starts_with("PING") {
                // Valid: any text is a PING's data.
                assert!(pair.is_connected());
                continue;
            }
            let sent = pair.client_lines();
            assert!(sent.last().unwrap().starts_with(error), "{line}: {sent:?}");
            assert!(
                matches!(
                    pair.server_events.last(),
                    Some(TcpServerEvent::Closing { .. })
                ),
                "{line}: nothing after the error"
            );
        }
        assert!(!pair.is_connected(), "{line}: closed");
    }
}

#[test]
fn invalid_utf8_is_a_parse_error() {
    let mut pair = Pair::new();
    pair.connect();
    pair.inject_to_server(b"NAME \xff\xfe\n");
    let sent = pair.client_lines();
    assert!(
        sent.last()
            .unwrap()
            .starts_with("ERROR failed to parse line: NAME: invalid name (UTF-8 text)"),
        "{sent:?}"
    );
}

#[test]
fn blank_lines_are_ignored_and_errors_reported() {
    let mut pair = Pair::new();
    pair.connect();
    let before = pair.client_events.len();
    pair.inject_to_client(b"\n   \n\r\n\t\nERROR something odd\n\n");
    assert_eq!(
        client_summary(&pair.client_events[before..]),
        ["peer error something odd"]
    );
    assert!(pair.is_connected(), "an ERROR received is not fatal");
    pair.inject_to_server(b"\n\nERROR me too\nREMOTE_SERVER_UP other.org\n");
    assert_eq!(
        server_summary(&pair.server_events[2..]),
        [
            "peer error #1 me too",
            "command #1 REMOTE_SERVER_UP other.org"
        ]
    );
}

#[test]
fn line_too_long() {
    let max = 16384;
    // A line of exactly the limit passes.
    let mut pair = Pair::new();
    pair.connect();
    let line = format!("PING {}\n", "x".repeat(max - 5));
    pair.inject_to_client(line.as_bytes());
    assert!(pair.is_connected());

    // One byte more fails, before its newline arrives, and nothing over the
    // limit is ever held.
    let mut pair = Pair::new();
    pair.connect();
    let long = format!("PING {}", "x".repeat(max - 4));
    for chunk in long.as_bytes().chunks(1000) {
        pair.client.handle_input(chunk, pair.now);
        assert!(pair.client.buffered_input() <= max);
    }
    assert_eq!(pair.client.buffered_input(), 0);
    pair.drive();
    assert_eq!(
        pair.server_lines().last().unwrap(),
        "ERROR Line length exceeded"
    );
    assert!(!pair.is_connected());
    assert!(matches!(
        pair.client_events.last(),
        Some(TcpClientEvent::Closing(TcpError::LineTooLong {
            max: 16384
        }))
    ));

    // The same towards the server, in one chunk with more lines after.
    let mut pair = Pair::new();
    pair.connect();
    let input = format!("PING {}\nPING ok\n", "y".repeat(max));
    pair.inject_to_server(input.as_bytes());
    assert_eq!(
        pair.client_lines().last().unwrap(),
        "ERROR Line length exceeded"
    );
    assert!(!pair.is_connected());

    // Sending one is refused, as Synapse refuses.
    let mut pair = Pair::new();
    pair.connect();
    let error = pair
        .client
        .send(Command::Ping("z".repeat(max).into()))
        .unwrap_err();
    assert!(matches!(
        error,
        SendError::LineTooLong {
            len: 16389,
            max: 16384
        }
    ));
}

#[test]
fn a_server_whose_client_does_not_read_fails_it_at_10001_commands() {
    let mut pair = Pair::new();
    pair.connect();
    let id = pair.id.unwrap();
    pair.client_reads = false;
    for token in 1..=10_000 {
        pair.server
            .write(
                &StreamName::Caches,
                Token(token),
                [(Token(token), row(token))],
            )
            .unwrap();
    }
    assert_eq!(pair.server.queued_commands(id), 10_000);
    assert_eq!(pair.server.client_state(id), Some(ConnectionState::Open));
    pair.server
        .write(
            &StreamName::Caches,
            Token(10_001),
            [(Token(10_001), row(1))],
        )
        .unwrap();
    assert_eq!(pair.server.client_state(id), Some(ConnectionState::Closing));
    assert_eq!(pair.server.queued_commands(id), 1, "only the ERROR is left");
    pair.client_reads = true;
    pair.drive();
    assert_eq!(
        pair.client_lines().last().unwrap(),
        "ERROR Failed to keep up"
    );
    assert!(!pair.is_connected());
    assert!(matches!(
        pair.server_events.last(),
        Some(TcpServerEvent::Closing {
            error: TcpError::FailedToKeepUp {
                commands: 10_001,
                ..
            },
            ..
        })
    ));
    assert!(caches_rows(&pair).is_empty(), "nothing queued was sent");
}

#[test]
fn a_client_whose_server_does_not_read_fails_it_too() {
    let mut pair = Pair::new();
    pair.connect();
    pair.server_reads = false;
    let ack = |token| {
        Command::FederationAck(FederationAck {
            instance: InstanceName::from("worker1"),
            token: Token(token),
        })
    };
    for token in 0..10_000 {
        pair.client.send(ack(token)).unwrap();
    }
    assert!(matches!(
        pair.client.send(ack(10_000)),
        Err(SendError::Closing)
    ));
    assert!(matches!(
        pair.client.send(ack(10_001)),
        Err(SendError::Closing)
    ));
    assert_eq!(
        pair.client.poll_transmit().unwrap(),
        "ERROR Failed to keep up\n"
    );
    assert_eq!(pair.client.poll_transmit(), None);
}

#[test]
fn a_fatal_error_whose_error_line_cannot_be_written_is_aborted() {
    let mut config = TcpSessionConfig::default();
    config.close_timeout = secs(3);
    let mut pair = Pair::with(config, SERVER_NAME);
    pair.connect();
    let id = pair.id.unwrap();
    pair.client_reads = false;
    pair.server.close(id, "bye\nnow");
    pair.run_for(Duration::from_millis(2_999));
    assert_eq!(pair.server.client_state(id), Some(ConnectionState::Closing));
    pair.run_for(Duration::from_millis(1));
    assert!(!pair.is_connected(), "aborted at the close timeout");
    assert!(!pair.client_lines().iter().any(|l| l.starts_with("ERROR")));
    assert!(matches!(
        pair.server_events.last(),
        Some(TcpServerEvent::Closing { error: TcpError::ByApplication(m), .. }) if m == "bye\nnow"
    ));
}

/// A close timeout beyond the clock's range (up to `Duration::MAX`)
/// gives the `ERROR` line as long as it takes: never aborted at once.
#[test]
fn a_close_timeout_up_to_duration_max_never_aborts() {
    let mut config = TcpSessionConfig::default();
    config.close_timeout = Duration::MAX;
    let mut pair = Pair::with(config, SERVER_NAME);
    pair.connect();
    let id = pair.id.unwrap();
    pair.client_reads = false;
    pair.server.close(id, "bye");
    // Past the default close timeout (5 s), short of the client's own
    // silence timeout (25 s), which would end the connection.
    pair.run_for(secs(20));
    assert_eq!(pair.server.client_state(id), Some(ConnectionState::Closing));
    pair.client_reads = true;
    pair.run_for(secs(1));
    assert!(pair.client_lines().iter().any(|l| l == "ERROR bye"));
}

#[test]
fn a_fatal_error_stays_fatal() {
    let mut pair = Pair::new();
    pair.connect();
    pair.client_reads = false;
    pair.client.handle_input(b"BOGUS\nPING 1\n", pair.now);
    let events = pair.client_events.len();
    pair.client
        .handle_input(b"RDATA caches master 1 []\nERROR x\n", pair.now);
    pair.client.handle_timeout(pair.now + secs(1));
    assert!(
        pair.client
            .poll_event()
            .is_some_and(|e| matches!(e, TcpClientEvent::Closing(_)))
    );
    assert!(
        pair.client.poll_event().is_none(),
        "input after the error is ignored"
    );
    assert_eq!(pair.client_events.len(), events);
    assert!(matches!(
        pair.client.send(Command::Ping("x".into())),
        Err(SendError::Closing)
    ));
    let sent = pair.client.poll_transmit().unwrap();
    assert!(sent.starts_with(b"ERROR failed to parse line: unknown command"));
    assert_eq!(pair.client.poll_transmit(), None);
    assert_eq!(pair.client.state(), Some(ConnectionState::Closing));
}

#[test]
fn reconnect_and_catch_up() {
    let mut pair = Pair::new();
    pair.connect();
    let mut log = Log::default();
    let mut write = |pair: &mut Pair, tokens: std::ops::RangeInclusive<i64>| {
        for token in tokens {
            let rows = [(Token(token), row(token))];
            log.record(&StreamName::Caches, "master", &rows);
            pair.server
                .write(&StreamName::Caches, Token(token), rows)
                .unwrap();
            pair.drive();
        }
    };
    write(&mut pair, 1..=3);
    pair.disconnect();
    write(&mut pair, 4..=8);
    pair.run_for(secs(2));
    pair.connect();
    write(&mut pair, 9..=9);
    let requests = answer_catch_ups(&mut pair, &log, 2);
    let ranges: Vec<(i64, i64)> = requests.iter().map(|r| (r.from.0, r.to.0)).collect();
    assert_eq!(ranges, [(3, 8), (5, 8), (7, 8)], "pages of two rows");
    let rows = caches_rows(&pair);
    let tokens: Vec<i64> = rows.iter().map(|r| r.0).collect();
    assert_eq!(
        tokens,
        (1..=9).collect::<Vec<_>>(),
        "each row once, in order"
    );
    assert!(rows[..3].iter().all(|r| r.1 == RowOrigin::Live));
    assert!(rows[3..8].iter().all(|r| r.1 == RowOrigin::CatchUp));
    assert_eq!(
        rows[8].1,
        RowOrigin::Live,
        "held during the catch-up, then applied"
    );
    assert_eq!(
        pair.client
            .follower()
            .position(&StreamName::Caches, &InstanceName::master()),
        Some(Token(9))
    );
    assert_eq!((pair.connections, pair.disconnections), (2, 1));
}

#[test]
fn a_row_too_long_for_a_line_is_fetched_instead() {
    let mut pair = Pair::new();
    pair.connect();
    let mut log = Log::default();
    let long = RawRow::new(format!(r#"["{}"]"#, "x".repeat(20_000))).unwrap();
    let rows = [(Token(1), long.clone())];
    log.record(&StreamName::Caches, "master", &rows);
    pair.server
        .write(&StreamName::Caches, Token(1), rows)
        .unwrap();
    // A batch with a long row in the middle.
    let batch = [(Token(2), row(1)), (Token(2), long), (Token(2), row(3))];
    log.record(&StreamName::Caches, "master", &batch);
    pair.server
        .write(&StreamName::Caches, Token(2), batch)
        .unwrap();
    let rows = [(Token(3), row(4))];
    log.record(&StreamName::Caches, "master", &rows);
    pair.server
        .write(&StreamName::Caches, Token(3), rows)
        .unwrap();
    pair.drive();
    let lines = pair.client_lines();
    assert_eq!(
        lines[lines.len() - 4..],
        [
            "POSITION caches master 1 1",
            r#"RDATA caches master batch ["row",1]"#,
            "POSITION caches master 2 2",
            r#"RDATA caches master 3 ["row",4]"#,
        ]
    );
    answer_catch_ups(&mut pair, &log, 100);
    let rows = caches_rows(&pair);
    let tokens: Vec<(i64, usize)> = rows.iter().map(|r| (r.0, r.2)).collect();
    assert_eq!(tokens, [(1, 1), (2, 3), (3, 1)], "every row once, in order");
    assert_eq!(
        rows[..2].iter().map(|r| r.1).collect::<Vec<_>>(),
        [RowOrigin::CatchUp; 2]
    );
}

#[test]
fn a_row_that_does_not_decode_closes_and_is_fetched_after_reconnecting() {
    let mut pair = Pair::new();
    pair.connect();
    let mut log = Log::default();
    let rows = [(Token(1), row(1))];
    log.record(&StreamName::Caches, "master", &rows);
    pair.server
        .write(&StreamName::Caches, Token(1), rows)
        .unwrap();
    pair.drive();
    // Row 2 reaches the client as a line it cannot read (Synapse can
    // write NaN): a parse error, so the client sends ERROR and closes.
    log.record(&StreamName::Caches, "master", &[(Token(2), row(2))]);
    pair.inject_to_client(b"RDATA caches master 2 [\"row\",NaN]\n");
    pair.drive();
    assert!(!pair.is_connected());
    let rows = [(Token(3), row(3))];
    log.record(&StreamName::Caches, "master", &rows);
    pair.server
        .write(&StreamName::Caches, Token(3), rows)
        .unwrap();
    // The next connection's POSITION shows the gap: row 2 is fetched, not
    // stepped over.
    pair.connect();
    let requests = answer_catch_ups(&mut pair, &log, 100);
    let ranges: Vec<(i64, i64)> = requests.iter().map(|r| (r.from.0, r.to.0)).collect();
    assert_eq!(ranges, [(1, 3)]);
    let tokens: Vec<(i64, RowOrigin)> = caches_rows(&pair).iter().map(|r| (r.0, r.1)).collect();
    assert_eq!(
        tokens,
        [
            (1, RowOrigin::Live),
            (2, RowOrigin::CatchUp),
            (3, RowOrigin::CatchUp)
        ]
    );
}

#[test]
fn remote_server_up_is_relayed_to_the_other_clients() {
    let now = Instant::now();
    let mut server = server(&[StreamName::Caches], TcpSessionConfig::default(), now);
    let mut clients: Vec<_> = (0..3)
        .map(|_| {
            let id = server.accept(now);
            let mut client = client(SERVER_NAME, TcpSessionConfig::default());
            client.connect(now);
            (id, client)
        })
        .collect();
    let pump =
        |server: &mut synapse_replication::session::TcpServerSession,
         clients: &mut Vec<(_, synapse_replication::session::TcpClientSession)>| {
            for _ in 0..3 {
                for (id, client) in clients.iter_mut() {
                    while let Some(bytes) = client.poll_transmit() {
                        server.handle_input(*id, &bytes, now);
                    }
                    while let Some(bytes) = server.poll_transmit(*id) {
                        client.handle_input(&bytes, now);
                    }
                }
            }
        };
    pump(&mut server, &mut clients);
    clients[0]
        .1
        .send(Command::RemoteServerUp("other.org".into()))
        .unwrap();
    pump(&mut server, &mut clients);
    let heard: Vec<bool> = clients
        .iter_mut()
        .map(|(_, client)| {
            std::iter::from_fn(|| client.poll_event()).any(|e| {
                matches!(e, TcpClientEvent::Command(Command::RemoteServerUp(ref s)) if s == "other.org")
            })
        })
        .collect();
    assert_eq!(heard, [false, true, true]);
    let events: Vec<TcpServerEvent> = std::iter::from_fn(|| server.poll_event()).collect();
    assert!(server_summary(&events).contains(&"command #1 REMOTE_SERVER_UP other.org".to_owned()));
}
