//! Malformed lines and the errors they get: each is a typed error naming
//! what was wrong, never a panic, never a half-decoded command.

use bytes::Bytes;
use synapse_replication::wire::{Command, CommandKind, DecodeError, Decoder};

fn decode(line: &[u8]) -> Result<Option<Command>, DecodeError> {
    Command::decode(Bytes::copy_from_slice(line))
}

#[test]
fn blank_lines_are_skipped() {
    for line in [&b""[..], b" ", b"\t", b"  \r", b"\x0b\x0c"] {
        assert!(matches!(decode(line), Ok(None)), "{line:?}");
    }
}

#[test]
fn unknown_commands_are_distinct_so_callers_can_skip_them() {
    for line in [
        &b"FOO bar"[..],
        b"rdata events master 1 []",
        b"RDATA\x00",
        b"\xff\xfe",
    ] {
        let error = decode(line).expect_err("unknown");
        assert!(
            matches!(error, DecodeError::UnknownCommand { .. }),
            "{error}"
        );
        assert_eq!(error.command(), None);
    }
}

#[test]
fn missing_fields_are_named() {
    let cases: &[(&[u8], CommandKind, &str)] = &[
        (b"RDATA events", CommandKind::Rdata, "instance name"),
        (b"RDATA events master", CommandKind::Rdata, "token"),
        (b"RDATA events master 5", CommandKind::Rdata, "row"),
        (
            b"POSITION events master 5",
            CommandKind::Position,
            "new_token",
        ),
        (
            b"USER_SYNC w1 @a:x D start",
            CommandKind::UserSync,
            "last_sync_ms",
        ),
        (b"FEDERATION_ACK w1", CommandKind::FederationAck, "token"),
        (b"USER_IP @a:x", CommandKind::UserIp, "JSON data"),
    ];
    for (line, command, field) in cases {
        match decode(line) {
            Err(DecodeError::MissingField {
                command: got,
                field: got_field,
            }) => {
                assert_eq!((got, got_field), (*command, *field), "{line:?}");
            }
            other => panic!("{line:?}: {other:?}"),
        }
    }
}

#[test]
fn bad_tokens_say_which_token() {
    for (line, field) in [
        (&b"RDATA events master x []"[..], "token"),
        (b"RDATA events master 1.5 []", "token"),
        (b"RDATA events master +5 []", "token"),
        (b"RDATA events master 9223372036854775808 []", "token"),
        (b"POSITION events master a 5", "prev_token"),
        (b"POSITION events master 5 5 5", "new_token"),
        (b"FEDERATION_ACK w1 -", "token"),
        (b"USER_SYNC w1 @a:x D end soon", "last_sync_ms"),
    ] {
        match decode(line) {
            Err(DecodeError::InvalidToken { field: got, .. }) => assert_eq!(got, field, "{line:?}"),
            other => panic!("{line:?}: {other:?}"),
        }
    }
    // The extremes of i64 are fine.
    assert!(decode(b"POSITION events master -9223372036854775808 9223372036854775807").is_ok());
}

#[test]
fn bad_json_is_refused_with_the_offending_text() {
    for line in [
        &b"RDATA events master 5 [1,"[..],
        b"RDATA events master 5 [NaN]",
        b"RDATA events master 5 ['a']",
        b"RDATA events master 5 [\"\xff\"]",
        b"RDATA events master 5 [1] [2]",
        b"USER_IP @a:x [\"t\",\"ip\",\"ua\",null]",
        b"USER_IP @a:x [\"t\",\"ip\",\"ua\",null,1.5]",
        b"LOCK_RELEASED [\"a\",\"b\"]",
        b"LOCK_RELEASED {}",
    ] {
        let error = decode(line).expect_err("invalid JSON");
        assert!(
            matches!(error, DecodeError::InvalidJson { .. }),
            "{line:?}: {error}"
        );
        assert!(error.to_string().contains("invalid JSON"), "{error}");
    }
}

#[test]
fn fields_that_are_not_utf8_or_empty_are_refused() {
    for line in [
        &b"RDATA events mas\xffter 5 []"[..],
        b"RDATA  master 5 []",
        b"RDATA events  5 []",
        b"PING \xc3",
        b"USER_SYNC w1 @a:x D maybe 5",
    ] {
        let error = decode(line).expect_err("invalid field");
        assert!(
            matches!(error, DecodeError::InvalidField { .. }),
            "{line:?}: {error}"
        );
    }
}

#[test]
fn newlines_inside_a_line_are_refused_wherever_they_are() {
    for line in [
        &b"PING 1\n2"[..],
        b"RDATA ev\nents master 5 []",
        b"RDATA events master 5 [1,\n2]",
        b"RDATA events master 5 [1]\n",
        b"POSITION events master 1 2\n",
        b"FOO\nBAR",
    ] {
        assert!(
            matches!(decode(line), Err(DecodeError::Newline)),
            "{line:?}"
        );
    }
}

#[test]
fn the_line_limit_is_checked_before_anything_else() {
    let decoder = Decoder::new().max_line_len(16);
    let error = decoder
        .decode(Bytes::from_static(b"PING 12345678901234567890"))
        .expect_err("too long");
    assert!(matches!(
        error,
        DecodeError::LineTooLong { len: 25, max: 16 }
    ));
    assert!(
        decoder
            .decode(Bytes::from_static(b"PING 12345678901"))
            .is_ok()
    );
}

#[test]
fn error_messages_quote_a_bounded_piece_of_the_input() {
    let mut line = b"RDATA events master 5 [".to_vec();
    line.extend(std::iter::repeat_n(b'1', 100_000));
    let message = decode(&line).expect_err("unterminated").to_string();
    assert!(message.len() < 300, "message of {} bytes", message.len());
    assert!(
        message.starts_with("RDATA: invalid JSON in row"),
        "{message}"
    );
}

#[test]
fn encoding_refuses_fields_that_would_not_read_back() {
    use synapse_replication::wire::{EncodeError, InstanceName, Position, StreamName, Token};
    let position = |stream: &str, instance: &str| {
        Command::Position(Position {
            stream: StreamName::from(stream),
            instance: InstanceName::from(instance),
            prev_token: Token(1),
            new_token: Token(2),
        })
    };
    for command in [
        position("even ts", "master"),
        position("events", ""),
        position("", "master"),
        position("events", "mas\nter"),
        Command::Ping("a\nb".into()),
    ] {
        let mut out = bytes::BytesMut::from(&b"kept"[..]);
        let error = command.encode(&mut out).expect_err("refused");
        assert!(
            matches!(
                error,
                EncodeError::InvalidField { .. } | EncodeError::Newline { .. }
            ),
            "{error}"
        );
        assert_eq!(&out[..], b"kept", "nothing written on error");
    }
}

#[test]
fn what_can_be_read_of_a_broken_rdata_line() {
    use synapse_replication::wire::{InstanceName, LostRdata, RdataToken, StreamName, Token};
    let read = |line: &[u8]| LostRdata::from_line(line);
    let lost = |stream: Option<&str>, instance: Option<&str>, token: Option<RdataToken>| {
        Some(LostRdata {
            stream: stream.map(StreamName::from),
            instance: instance.map(InstanceName::from),
            token,
        })
    };
    let at = |n: i64| Some(RdataToken::At(Token(n)));
    assert_eq!(
        read(b"RDATA events master 5 [1,"),
        lost(Some("events"), Some("master"), at(5))
    );
    assert_eq!(
        read(b"RDATA caches w1 batch [NaN]"),
        lost(Some("caches"), Some("w1"), Some(RdataToken::Batch))
    );
    assert_eq!(
        read(b"RDATA org.example.x w1 -3 x"),
        lost(Some("org.example.x"), Some("w1"), at(-3))
    );
    // Unreadable parts are left out, readable ones kept.
    assert_eq!(
        read(b"RDATA events master x []"),
        lost(Some("events"), Some("master"), None)
    );
    assert_eq!(
        read(b"RDATA events master 5"),
        lost(Some("events"), Some("master"), None)
    );
    assert_eq!(
        read(b"RDATA events mas\xffter 5 []"),
        lost(Some("events"), None, at(5))
    );
    assert_eq!(
        read(b"RDATA  master 5 []"),
        lost(None, Some("master"), at(5))
    );
    assert_eq!(read(b"RDATA"), lost(None, None, None));
    assert_eq!(read(b"RDATA "), lost(None, None, None));
    // Not RDATA lines.
    assert_eq!(read(b"RDATAX events master 5 []"), None);
    assert_eq!(read(b"POSITION events master 5 6"), None);
    assert_eq!(read(b""), None);
    // A line far over any limit: only its head is looked at.
    let mut long = b"RDATA events master 7 [\"".to_vec();
    long.extend(std::iter::repeat_n(b'a', 4 << 20));
    assert_eq!(read(&long), lost(Some("events"), Some("master"), at(7)));
    // A head cut short inside a name: the cut name is not trusted.
    let mut cut = b"RDATA ".to_vec();
    cut.extend(std::iter::repeat_n(b's', 2000));
    cut.extend(b" master 5 []");
    assert_eq!(read(&cut), lost(None, None, None));
}
