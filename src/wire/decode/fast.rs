//! The lines Synapse writes, read without the general path: the `RDATA`
//! header and `POSITION`, `USER_IP`, `USER_SYNC`, `FEDERATION_ACK` and
//! `LOCK_RELEASED`. Each reader takes only lines the general path reads
//! the same way (its tests check that against the general path) and
//! returns `None` for anything else, which the general path then reads or
//! refuses.

use super::*;

/// The strings of `USER_IP`'s JSON data (access token, IP, user agent and
/// device, as they stand in the text: not yet checked as UTF-8), and
/// `last_seen`.
type UserIpFields<'a> = ([&'a [u8]; 3], Option<&'a [u8]>, i64);

/// A string without escapes or control characters at `at` (on its
/// opening quote), and the offset after its closing quote.
fn json_string(data: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let body = data.get(at..)?.strip_prefix(b"\"")?;
    // Eight bytes at a time to the first quote, backslash, control
    // or non-ASCII byte (past the end, words read as zeros: control
    // characters).
    let mut len = 0;
    loop {
        let special = json::ascii_string_specials(word_at(body, len));
        if special != 0 {
            len += special.trailing_zeros() as usize / 8;
            break;
        }
        len += 8;
    }
    if body.get(len) != Some(&b'"') {
        // Non-ASCII text, or the end: byte by byte.
        len += body
            .get(len..)?
            .iter()
            .position(|&b| b == b'"' || b == b'\\' || b < 0x20)?;
        if body.get(len) != Some(&b'"') {
            return None;
        }
    }
    Some((body.get(..len)?, at + len + 2))
}

/// `USER_IP`'s JSON data as Synapse writes it, compact and without
/// escapes: `["<token>","<ip>","<agent>",null|"<device>",<last_seen>]`,
/// read without serde_json. `None` for anything else (whitespace, an
/// escape, another number), which serde_json then reads, or refuses: so
/// what this accepts (its strings being UTF-8) reads exactly as
/// serde_json reads it.
fn user_ip_fields(data: &[u8]) -> Option<UserIpFields<'_>> {
    let expect = |at: usize, byte: u8| (data.get(at) == Some(&byte)).then_some(at + 1);
    let at = expect(0, b'[')?;
    let (token, at) = json_string(data, at)?;
    let (ip, at) = json_string(data, expect(at, b',')?)?;
    let (agent, at) = json_string(data, expect(at, b',')?)?;
    let at = expect(at, b',')?;
    let (device, at) = match data.get(at..)?.strip_prefix(b"null") {
        Some(_) => (None, at + 4),
        None => {
            let (device, at) = json_string(data, at)?;
            (Some(device), at)
        }
    };
    let at = expect(at, b',')?;
    let digits = data.get(at..data.len().checked_sub(1)?)?;
    // JSON has no leading zeros (`0` and `-0` are left to serde_json too).
    let unsigned = digits.strip_prefix(b"-").unwrap_or(digits);
    if data.last() != Some(&b']') || digits.len() > 18 || unsigned.first() == Some(&b'0') {
        return None;
    }
    Some(([token, ip, agent], device, parse_i64(digits)?))
}

/// `USER_IP` from its fields read by [`user_ip_fields`], every string a
/// slice of `line`; `None` if one is not UTF-8 (or the user id is
/// empty), for the general path to refuse.
pub(super) fn user_ip_fast(line: &Bytes, user: &[u8], data: &[u8]) -> Option<UserIp> {
    let ([token, ip, agent], device, last_seen) = user_ip_fields(data)?;
    let text = |bytes: &[u8]| ByteString::try_from(line.slice_ref(bytes)).ok();
    if user.is_empty() {
        return None;
    }
    Some(UserIp {
        user_id: text(user)?,
        access_token: text(token)?,
        ip: text(ip)?,
        user_agent: text(agent)?,
        device_id: match device {
            Some(device) => Some(text(device)?),
            None => None,
        },
        last_seen,
    })
}

/// How a `USER_IP` line starts.
pub(super) const USER_IP: &[u8] = b"USER_IP ";

/// How a `USER_SYNC` line starts.
const USER_SYNC: &[u8] = b"USER_SYNC ";

/// The commonest commands after `RDATA` and `POSITION`, as Synapse writes
/// them, each read in one pass over the line with one UTF-8 check for all
/// its text fields; `None` for anything else, which
/// [`decode_any_command`] then reads (or refuses). What this returns,
/// [`decode_any_command`] returns too.
pub(super) fn common_command(line: &Bytes) -> Option<Command> {
    if line.starts_with(USER_IP) {
        return user_ip_line(line).map(|user_ip| Command::UserIp(Box::new(user_ip)));
    }
    if line.starts_with(USER_SYNC) {
        return user_sync_line(line).map(Command::UserSync);
    }
    if line.starts_with(FEDERATION_ACK) {
        return federation_ack_line(line).map(Command::FederationAck);
    }
    if line.starts_with(LOCK_RELEASED) {
        return lock_released_line(line).map(Command::LockReleased);
    }
    None
}

/// How a `FEDERATION_ACK` line starts.
const FEDERATION_ACK: &[u8] = b"FEDERATION_ACK ";

/// How a `LOCK_RELEASED` line starts.
pub(super) const LOCK_RELEASED: &[u8] = b"LOCK_RELEASED ";

/// A `FEDERATION_ACK` line with a non-empty name and a token, and no
/// newline; `None` otherwise.
fn federation_ack_line(line: &Bytes) -> Option<FederationAck> {
    let start = FEDERATION_ACK.len();
    let [instance_end] = spaces::<1>(line, start)?;
    // The token has no space or newline if it is a number.
    let token = Token(parse_i64(line.get(instance_end + 1..)?)?);
    let instance = line.get(start..instance_end)?;
    if instance.is_empty() {
        return None;
    }
    Some(FederationAck {
        instance: InstanceName::from_line(instance)?,
        token,
    })
}

/// A `LOCK_RELEASED` line whose data is three strings as Synapse writes
/// them, compact, without escapes or control characters (so without a
/// newline): `["<instance>","<lock_name>","<lock_key>"]`; `None`
/// otherwise. serde_json reads such data as these three strings.
fn lock_released_line(line: &Bytes) -> Option<LockReleased> {
    let data = line.get(LOCK_RELEASED.len()..)?;
    let expect = |at: usize, byte: u8| (data.get(at) == Some(&byte)).then_some(at + 1);
    let (instance, at) = json_string(data, expect(0, b'[')?)?;
    let (lock_name, at) = json_string(data, expect(at, b',')?)?;
    let (lock_key, at) = json_string(data, expect(at, b',')?)?;
    if expect(at, b']')? != data.len() {
        return None;
    }
    // Every byte outside the strings is ASCII: the line is UTF-8 if and
    // only if they all are.
    let text = ByteString::try_from(line.clone()).ok()?;
    let field = |part: &[u8]| {
        let from = offset_in(line, part);
        text_at(&text, from, from.wrapping_add(part.len()))
    };
    let instance = field(instance)?;
    Some(LockReleased {
        instance: InstanceName::from(&*instance),
        lock_name: field(lock_name)?,
        lock_key: field(lock_key)?,
    })
}

/// Where `part` (a slice of `line`) starts in `line`.
fn offset_in(line: &[u8], part: &[u8]) -> usize {
    (part.as_ptr() as usize).wrapping_sub(line.as_ptr() as usize)
}

/// `line[start..end]` as a slice of `text` (the whole line, known to be
/// UTF-8): no UTF-8 check of its own.
fn text_at(text: &ByteString, start: usize, end: usize) -> Option<ByteString> {
    Some(text.slice_ref(text.get(start..end)?))
}

/// A `USER_IP` line whose data [`user_ip_fields`] reads, with a non-empty
/// user id and no newline; `None` otherwise. (A newline in the data is a
/// control character in a string, or not JSON that
/// [`user_ip_fields`] reads.)
fn user_ip_line(line: &Bytes) -> Option<UserIp> {
    let start = USER_IP.len();
    let [user_end] = spaces::<1>(line, start)?;
    if user_end == start {
        return None;
    }
    let data = line.get(user_end + 1..)?;
    let ([token, ip, agent], device, last_seen) = user_ip_fields(data)?;
    // Every byte outside the strings is ASCII: the line is UTF-8 if and
    // only if they all are.
    let text = ByteString::try_from(line.clone()).ok()?;
    let field = |part: &[u8]| {
        let from = offset_in(line, part);
        text_at(&text, from, from.wrapping_add(part.len()))
    };
    Some(UserIp {
        user_id: text_at(&text, start, user_end)?,
        access_token: field(token)?,
        ip: field(ip)?,
        user_agent: field(agent)?,
        device_id: match device {
            Some(device) => Some(field(device)?),
            None => None,
        },
        last_seen,
    })
}

/// A `USER_SYNC` line with its five fields, none empty, and no newline;
/// `None` otherwise.
fn user_sync_line(line: &Bytes) -> Option<UserSync> {
    let start = USER_SYNC.len();
    let [instance_end, user_end, device_end, state_end] = spaces::<4>(line, start)?;
    let is_syncing = match line.get(device_end + 1..state_end)? {
        b"start" => true,
        b"end" => false,
        _ => return None,
    };
    // The last field has no newline if it is a number.
    let last_sync_ms = parse_i64(line.get(state_end + 1..)?)?;
    let instance = line.get(start..instance_end)?;
    if instance.is_empty() || user_end == instance_end + 1 || device_end == user_end + 1 {
        return None;
    }
    let instance_id = InstanceName::from_line(instance)?;
    let text = ByteString::try_from(line.clone()).ok()?;
    Some(UserSync {
        instance_id,
        user_id: text_at(&text, instance_end + 1, user_end)?,
        device_id: match line.get(user_end + 1..device_end)? {
            b"None" => None,
            _ => Some(text_at(&text, user_end + 1, device_end)?),
        },
        is_syncing,
        last_sync_ms,
    })
}

/// A `POSITION` line as Synapse writes it, read as [`rdata_fields_fast`]
/// reads an `RDATA` header (the new token ends the line); `None` for any
/// other line, which [`decode_position_general`] then reads (or
/// refuses). What this returns, [`decode_position_general`] returns too.
pub(super) fn position_fast(line: &[u8]) -> Option<Position> {
    let (stream, stream_end) = position_stream(line)?;
    position_rest_fast(line, stream, stream_end)
}

/// The known stream of a `POSITION` line and where its name ends (at the
/// first space after `POSITION `), as [`position_fast`] reads it; `None`
/// where it would give the line to the general path.
pub(super) fn position_stream(line: &[u8]) -> Option<(StreamName, usize)> {
    known_stream(line, POSITION.len())
}

/// The rest of [`position_fast`], after [`position_stream`] read the
/// stream.
pub(super) fn position_rest_fast(
    line: &[u8],
    stream: StreamName,
    stream_end: usize,
) -> Option<Position> {
    let (instance, instance_end) = rdata_instance(line, stream_end + 1)?;
    let (RdataToken::At(prev_token), prev_end) = rdata_token(line, instance_end + 1)? else {
        return None;
    };
    // A token is digits: no newline.
    let new_token = Token(token_at(line, prev_end + 1, line.len())?);
    Some(Position {
        stream,
        instance,
        prev_token,
        new_token,
    })
}

/// [`rdata_fields`] for the lines Synapse writes: a known stream, a
/// writer's name and a token each found with one word read where they are
/// short, and a valid row; `None` for any other line, which
/// [`rdata_fields`] then reads (or refuses). What this returns,
/// [`rdata_fields`] returns too.
pub(super) fn rdata_fields_fast(line: &[u8]) -> Option<RdataFields> {
    let (stream, stream_end) = rdata_stream(line)?;
    rdata_rest_fast(line, stream, stream_end)
}

/// The known stream of an `RDATA` line and where its name ends (at the
/// first space after `RDATA `), as [`rdata_fields_fast`] reads it; `None`
/// where it would give the line to the general path.
#[inline(always)]
pub(super) fn rdata_stream(line: &[u8]) -> Option<(StreamName, usize)> {
    known_stream(line, RDATA.len())
}

/// The rest of [`rdata_fields_fast`], after [`rdata_stream`] read the
/// stream.
#[inline(always)]
pub(super) fn rdata_rest_fast(
    line: &[u8],
    stream: StreamName,
    stream_end: usize,
) -> Option<RdataFields> {
    let (instance, instance_end) = rdata_instance(line, stream_end + 1)?;
    let (token, token_end) = rdata_token(line, instance_end + 1)?;
    json::validate_row(line.get(token_end + 1..)?).ok()?;
    Some((stream, instance, token, token_end + 1))
}

/// The known stream whose name starts `line` at `start` and is followed
/// by a space, and where it ends; a short name is compared as a word.
#[inline(always)]
fn known_stream(line: &[u8], start: usize) -> Option<(StreamName, usize)> {
    // A known name holds no space, newline or other control character:
    // the first such byte ends it.
    let (word, end) = short_field(line, start)?;
    let len = end - start;
    let stream = match len {
        1..8 => StreamName::known_word(word & (u64::MAX >> (64 - 8 * len))),
        _ => None,
    };
    match stream {
        Some(stream) => Some((stream, end)),
        None => Some((StreamName::known_bytes(line.get(start..end)?)?, end)),
    }
}

/// The writer's name of an `RDATA` line, from `start`, and its end.
#[inline(always)]
fn rdata_instance(line: &[u8], start: usize) -> Option<(InstanceName, usize)> {
    let (word, end) = short_field(line, start)?;
    let len = end - start;
    let name = match len {
        ..8 => InstanceName::from_word(word & (u64::MAX >> (64 - 8 * len)), len),
        _ => None,
    };
    match name {
        Some(name) => Some((name, end)),
        None => Some((InstanceName::from_line(line.get(start..end)?)?, end)),
    }
}

/// The token of an `RDATA` line, from `start`, and its end.
#[inline(always)]
fn rdata_token(line: &[u8], start: usize) -> Option<(RdataToken, usize)> {
    const BATCH: u64 = u64::from_le_bytes(*b"batch\0\0\0");
    let (word, end) = short_field(line, start)?;
    let len = end - start;
    if len >= 8 {
        return Some((RdataToken::At(Token(token_at(line, start, end)?)), end));
    }
    let shift = 8 * (8 - len) as u32;
    if len == 5 && word << shift >> shift == BATCH {
        return Some((RdataToken::Batch, end));
    }
    // As in `token_at`: the token in the high bytes, `0`s below it.
    let digits = word << shift | (ONES * u64::from(b'0')) >> (64 - shift);
    Some((RdataToken::At(Token(eight_digits(digits)? as i64)), end))
}

/// For the fast paths' tests: whether `fast` read `line`; what it reads,
/// `general` must read the same (and not refuse).
#[cfg(test)]
fn fast_path_agrees<T, E>(
    line: &[u8],
    fast: impl FnOnce(&Bytes) -> Option<T>,
    general: impl FnOnce(&Bytes) -> Result<T, E>,
) -> Result<bool, proptest::test_runner::TestCaseError>
where
    T: PartialEq + std::fmt::Debug,
    E: std::fmt::Display,
{
    let line = Bytes::copy_from_slice(line);
    let Some(fast) = fast(&line) else {
        return Ok(false);
    };
    match general(&line) {
        Ok(general) => proptest::prop_assert_eq!(fast, general),
        Err(error) => {
            return Err(proptest::test_runner::TestCaseError::fail(format!(
                "the fast path read {fast:?} from {line:?}, the general path refused it: {error}"
            )));
        }
    }
    Ok(true)
}

/// For the echo checks' tests: the session's check, the plain way: `line`
/// starts with `command`, and the sender's field (after the first space
/// after it) starts with `own` and a space.
#[cfg(test)]
fn names_own(line: &[u8], command: &[u8], own: &[u8]) -> bool {
    let Some(rest) = line.strip_prefix(command) else {
        return false;
    };
    let Some(space) = rest.iter().position(|b| *b == b' ') else {
        return false;
    };
    let sender = &rest[space + 1..];
    sender.starts_with(own) && sender.get(own.len()) == Some(&b' ')
}

/// For the echo checks' tests: an own name for `line`, by `pick`: its
/// sender (the third field), the sender and the next field (a name with
/// a space), `master`, the sender less its last byte, or `other`.
#[cfg(test)]
fn own_for(line: &[u8], pick: usize, other: Vec<u8>) -> Vec<u8> {
    let fields: Vec<&[u8]> = line.splitn(5, |b| *b == b' ').collect();
    let sender = fields.get(2).copied().unwrap_or_default().to_vec();
    match pick {
        0 | 1 => sender,
        2 => fields.get(2..4).unwrap_or_default().join(&b' '),
        3 => b"master".to_vec(),
        4 => sender
            .get(..sender.len().saturating_sub(1))
            .unwrap_or_default()
            .to_vec(),
        _ => other,
    }
}

/// For the fast paths' tests: a property's inputs (from `lines`) take the
/// fast path often and fall back often, so that it tests something.
#[cfg(test)]
fn takes_both_paths(
    lines: impl proptest::strategy::Strategy<Value = Vec<u8>>,
    fast: impl Fn(&[u8]) -> bool,
) {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let taken = (0..1000)
        .filter(|_| {
            let line = lines
                .new_tree(&mut runner)
                .map(|tree| tree.current())
                .unwrap_or_default();
            fast(&line)
        })
        .count();
    assert!(
        (50..950).contains(&taken),
        "{taken} of 1000 took the fast path"
    );
}

#[cfg(test)]
mod user_ip_tests {
    use proptest::prelude::*;

    use super::user_ip_fields;

    type Fields = (String, String, String, Option<String>, i64);

    /// JSON text that is `USER_IP` data or close to it: strings with
    /// quotes, escapes, control and non-ASCII characters, numbers with
    /// signs, leading zeros, fractions and exponents, extra fields and
    /// trailing bytes.
    fn near_user_ip() -> impl Strategy<Value = Vec<u8>> {
        // Weighted so that about one case in ten takes the fast path.
        let string = prop_oneof![
            8 => "[a-z0-9_.:@ é-]{0,12}".prop_map(|s| format!("\"{s}\"")),
            1 => "[a-z\"\\\\\u{1}é\u{10000}]{0,6}".prop_map(|s| format!("\"{s}\"")),
            1 => Just("\"a\\u00e9\"".to_owned()),
            1 => Just("\"unterminated".to_owned()),
        ];
        let device = prop_oneof![
            3 => string.clone(),
            3 => Just("null".to_owned()),
            1 => Just("nul".to_owned()),
        ];
        let number = prop_oneof![
            6 => (-(1i64 << 50)..1 << 50).prop_map(|n| n.to_string()),
            1 => any::<i64>().prop_map(|n| n.to_string()),
            2 => (0u64..1000).prop_map(|n| n.to_string()),
            1 => Just("-0".to_owned()),
            1 => Just("007".to_owned()),
            1 => Just("-01".to_owned()),
            1 => Just("1.5".to_owned()),
            1 => Just("1e3".to_owned()),
            1 => Just("99999999999999999999".to_owned()),
            1 => Just("-".to_owned()),
        ];
        let tail = prop_oneof![
            6 => Just(String::new()),
            1 => Just(" ".to_owned()),
            1 => Just(",1".to_owned()),
            1 => Just("]".to_owned()),
        ];
        (string.clone(), string.clone(), string, device, number, tail).prop_map(
            |(token, ip, agent, device, number, tail)| {
                format!("[{token},{ip},{agent},{device},{number}]{tail}").into_bytes()
            },
        )
    }

    #[test]
    fn synapse_s_data_takes_the_fast_path() {
        let data = br#"["syt_abc","10.0.0.1","Mozilla/5.0 (X11)","DEVICE",1700000000000]"#;
        assert_eq!(
            user_ip_fields(data),
            Some((
                [&b"syt_abc"[..], b"10.0.0.1", b"Mozilla/5.0 (X11)"],
                Some(&b"DEVICE"[..]),
                1_700_000_000_000
            ))
        );
        let data = br#"["t","::1","",null,-5]"#;
        assert_eq!(
            user_ip_fields(data),
            Some(([&b"t"[..], b"::1", b""], None, -5))
        );
    }

    /// The property below tests something: its inputs take the fast path
    /// often, and fall back often.
    #[test]
    fn the_inputs_take_both_paths() {
        super::takes_both_paths(near_user_ip(), |data| user_ip_fields(data).is_some());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// What the fast path reads, serde_json reads the same.
        #[test]
        fn the_fast_path_reads_as_serde_json(data in near_user_ip()) {
            let text = |bytes: &[u8]| std::str::from_utf8(bytes).ok().map(str::to_owned);
            if let Some(([token, ip, agent], device, last_seen)) = user_ip_fields(&data) {
                // Taken only if its strings are UTF-8 (`user_ip_fast`).
                let device = match device.map(text) {
                    Some(None) => return Ok(()),
                    device => device.flatten(),
                };
                let (Some(token), Some(ip), Some(agent)) = (text(token), text(ip), text(agent))
                else {
                    return Ok(());
                };
                let fields: Fields = serde_json::from_slice(&data)
                    .map_err(|e| TestCaseError::fail(format!("serde_json refused it: {e}")))?;
                prop_assert_eq!(fields, (token, ip, agent, device, last_seen));
            }
        }
    }
}

#[cfg(test)]
mod common_command_tests {
    use proptest::prelude::*;

    use super::*;

    /// What [`common_command`] reads, [`decode_any_command`] reads the
    /// same; and it reads Synapse's lines.
    fn agrees(line: &[u8]) -> Result<bool, TestCaseError> {
        fast_path_agrees(line, common_command, decode_any_command)
    }

    #[test]
    fn synapse_s_lines_take_the_fast_path() {
        for line in [
            &br#"USER_IP @a:x ["syt_abc","10.0.0.1","Mozilla/5.0 (X11)","DEVICE",1700000000000]"#[..],
            br#"USER_IP @a:x ["t","::1","",null,-5]"#,
            b"USER_IP @\xc3\xa9:x [\"t\xc3\xa9\",\"::1\",\"\xf0\x9f\x8d\x94\",null,5]",
            b"USER_SYNC synchrotron1 @a:x DEVICE start 1700000000000",
            b"USER_SYNC synchrotron1 @a:x None end 1",
            b"FEDERATION_ACK federation_sender1 1700000000000",
            b"FEDERATION_ACK f\xc3\xa9 -1",
            br#"LOCK_RELEASED ["w1","new_event_lock","!room:x"]"#,
            br#"LOCK_RELEASED ["","",""]"#,
            b"LOCK_RELEASED [\"w\xc3\xa9\",\"\xf0\x9f\x8d\x94\",\"k\"]",
            "USER_SYNC sync\u{e9} @\u{e9}:x d\u{e9}v start -1".as_bytes(),
        ] {
            assert!(
                matches!(agrees(line), Ok(true)),
                "{}",
                String::from_utf8_lossy(line)
            );
        }
        for line in [
            &br#"USER_IP  ["t","::1","",null,5]"#[..],
            br#"USER_IP @a:x ["t","::1","",null,5] "#,
            b"USER_IP @a\n:x [\"t\",\"::1\",\"\",null,5]",
            b"USER_IP @a:\xff [\"t\",\"::1\",\"\",null,5]",
            b"USER_IP @a:x [\"t\xff\",\"::1\",\"\",null,5]",
            b"USER_IP @a:x [\"t\",\"::1\",\"\xe9\",null,5]",
            b"USER_SYNC  @a:x DEVICE start 1",
            b"USER_SYNC s1  DEVICE start 1",
            b"USER_SYNC s1 @a:x  start 1",
            b"USER_SYNC s1 @a:x DEVICE stop 1",
            b"USER_SYNC s1 @a:x DEVICE start 1 ",
            b"USER_SYNC s1 @a:x DEVICE start 1\n",
            b"USER_SYNC s1 @a:x DEV\nICE start 1",
            b"USER_SYNC s1 @a:\xff DEVICE start 1",
            b"USER_SYNC s\xff @a:x DEVICE start 1",
            b"USER_SYNC s1 @a:x DEVICE start",
            b"FEDERATION_ACK  1",
            b"FEDERATION_ACK f1 1 2",
            b"FEDERATION_ACK f1 1\n",
            b"FEDERATION_ACK f\n1 1",
            b"FEDERATION_ACK f\xff 1",
            b"FEDERATION_ACK f1",
            br#"LOCK_RELEASED ["w1","l","k"] "#,
            br#"LOCK_RELEASED ["w1","l","k","x"]"#,
            br#"LOCK_RELEASED ["w1","l\u00e9","k"]"#,
            br#"LOCK_RELEASED [ "w1","l","k"]"#,
            b"LOCK_RELEASED [\"w1\",\"l\xff\",\"k\"]",
            b"LOCK_RELEASED [\"w1\",\"l\n\",\"k\"]",
        ] {
            assert!(
                matches!(agrees(line), Ok(false)),
                "{}",
                String::from_utf8_lossy(line)
            );
        }
    }

    /// Text around the fast paths' boundaries: every length across a few
    /// words, spaces, newlines, non-ASCII and invalid UTF-8.
    fn field() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            12 => "[a-z@:._]{0,20}".prop_map(String::into_bytes),
            1 => "[a-z é\n\u{1f354}]{0,20}".prop_map(String::into_bytes),
            1 => prop::collection::vec(any::<u8>(), 0..20),
            1 => Just(b"None".to_vec()),
        ]
    }

    fn json_string() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            12 => field().prop_map(|f| [&b"\""[..], &f, b"\""].concat()),
            1 => Just(b"null".to_vec()),
            1 => Just(b"\"a\\u00e9\"".to_vec()),
        ]
    }

    fn number() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            6 => (-(1i64 << 50)..1 << 50).prop_map(|n| n.to_string().into_bytes()),
            1 => any::<i64>().prop_map(|n| n.to_string().into_bytes()),
            1 => Just(b"start".to_vec()),
            1 => Just(b"end".to_vec()),
            1 => "[0-9 \n-]{0,20}".prop_map(String::into_bytes),
        ]
    }

    fn user_ip() -> impl Strategy<Value = Vec<u8>> {
        (
            field(),
            prop::collection::vec(json_string(), 4),
            number(),
            prop_oneof![4 => Just(&b""[..]), 1 => Just(&b" "[..]), 1 => Just(&b"\n"[..])],
        )
            .prop_map(|(user, strings, number, tail)| {
                let mut line = b"USER_IP ".to_vec();
                line.extend_from_slice(&user);
                line.extend_from_slice(b" [");
                for string in &strings {
                    line.extend_from_slice(string);
                    line.push(b',');
                }
                line.extend_from_slice(&number);
                line.push(b']');
                line.extend_from_slice(tail);
                line
            })
    }

    fn federation_ack() -> impl Strategy<Value = Vec<u8>> {
        (
            field(),
            number(),
            prop_oneof![4 => Just(&b""[..]), 1 => Just(&b" 1"[..])],
        )
            .prop_map(|(instance, number, tail)| {
                [&b"FEDERATION_ACK "[..], &instance, b" ", &number, tail].concat()
            })
    }

    fn lock_released() -> impl Strategy<Value = Vec<u8>> {
        (
            prop::collection::vec(json_string(), 3),
            prop_oneof![4 => Just(&b""[..]), 1 => Just(&b" "[..]), 1 => Just(&b","[..])],
        )
            .prop_map(|(strings, tail)| {
                let mut line = b"LOCK_RELEASED [".to_vec();
                line.extend_from_slice(&strings.join(&b","[..]));
                line.push(b']');
                line.extend_from_slice(tail);
                line
            })
    }

    fn user_sync() -> impl Strategy<Value = Vec<u8>> {
        (
            prop::collection::vec(field(), 3),
            prop_oneof![Just(&b"start"[..]), Just(&b"end"[..]), Just(&b"en"[..])],
            number(),
        )
            .prop_map(|(fields, state, number)| {
                let mut line = b"USER_SYNC".to_vec();
                for field in fields.iter().map(Vec::as_slice).chain([state, &number]) {
                    line.push(b' ');
                    line.extend_from_slice(field);
                }
                line
            })
    }

    /// The properties below test something: their inputs take the fast
    /// paths often, and fall back often.
    #[test]
    fn the_inputs_take_both_paths() {
        for lines in [
            user_ip().boxed(),
            user_sync().boxed(),
            federation_ack().boxed(),
            lock_released().boxed(),
        ] {
            takes_both_paths(lines, |line| {
                common_command(&Bytes::copy_from_slice(line)).is_some()
            });
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        #[test]
        fn user_ip_reads_as_the_general_path(line in user_ip()) {
            agrees(&line)?;
        }

        #[test]
        fn user_sync_reads_as_the_general_path(line in user_sync()) {
            agrees(&line)?;
        }

        #[test]
        fn federation_ack_reads_as_the_general_path(line in federation_ack()) {
            agrees(&line)?;
        }

        #[test]
        fn lock_released_reads_as_the_general_path(line in lock_released()) {
            agrees(&line)?;
        }
    }
}

#[cfg(test)]
mod rdata_fast_tests {
    use proptest::prelude::*;

    use super::*;

    /// What [`rdata_fields_fast`] reads, [`rdata_fields`] reads the same.
    fn agrees(line: &[u8]) -> Result<bool, TestCaseError> {
        fast_path_agrees(line, |line| rdata_fields_fast(line), rdata_fields)
    }

    /// Every length of writer's name and token across the word sizes,
    /// with and without a non-ASCII or non-digit byte at each place.
    #[test]
    fn every_length_of_name_and_token() {
        let fast = |line: &[u8]| agrees(line).unwrap_or_else(|e| panic!("{e}"));
        for len in 1..=24 {
            let name = "abcdefghijklmnopqrstuvwxyz".get(..len).unwrap_or_default();
            let line = format!("RDATA events {name} 12 [1]");
            assert!(fast(line.as_bytes()), "{line}");
            for at in 0..len {
                let mut other = name.as_bytes().to_vec();
                other[at] = 0xe9;
                fast(&[&b"RDATA events "[..], &other, b" 12 [1]"].concat());
                let mut other = name.to_owned();
                other.replace_range(at..=at, "\u{e9}");
                assert!(fast(format!("RDATA events {other} 12 [1]").as_bytes()));
                let mut other = name.to_owned();
                other.replace_range(at..=at, "\n");
                assert!(!fast(format!("RDATA events {other} 12 [1]").as_bytes()));
            }
        }
        for len in 1..=19 {
            let token = "9123456789012345678".get(..len).unwrap_or_default();
            let line = format!("RDATA caches master {token} [1]");
            assert!(fast(line.as_bytes()), "{line}");
            for at in 0..len {
                for byte in ["-", "+", "a", "/", ":", "\n", "\u{e9}", "_"] {
                    let mut other = token.to_owned();
                    other.replace_range(at..=at, byte);
                    fast(format!("RDATA caches master {other} [1]").as_bytes());
                }
            }
        }
        for token in [
            "batch", "batc", "batchx", "Batch", "batch\n", "-1", "-0", "0",
        ] {
            fast(format!("RDATA caches master {token} [1]").as_bytes());
        }
        assert!(fast(b"RDATA caches master batch [1]"));
        for line in [
            &b"RDATA caches master 1 [1"[..],
            b"RDATA caches master 1 [1]\n",
            b"RDATA caches  1 [1]",
            b"RDATA caches master  [1]",
            b"RDATA caches\nmaster 1 [1]",
            b"RDATA caches master\n1 [1]",
            b"RDATA caches master 1\n[1]",
            b"RDATA new_stream master 1 [1]",
            b"RDATA  master 1 [1]",
            b"RDATA caches master 1",
            b"RDATA caches master",
        ] {
            assert!(!fast(line), "{}", String::from_utf8_lossy(line));
        }
    }

    fn field() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            8 => "[a-z_0-9]{0,20}".prop_map(String::into_bytes),
            1 => "[a-z é\n\u{1f354}]{0,12}".prop_map(String::into_bytes),
            1 => prop::collection::vec(any::<u8>(), 0..12),
        ]
    }

    fn line() -> impl Strategy<Value = Vec<u8>> {
        let stream = prop_oneof![
            6 => prop::sample::select(StreamName::KNOWN.to_vec())
                .prop_map(|s| s.as_str().as_bytes().to_vec()),
            1 => field(),
        ];
        let token = prop_oneof![
            4 => any::<i64>().prop_map(|n| n.to_string().into_bytes()),
            4 => (0i64..100_000_000).prop_map(|n| n.to_string().into_bytes()),
            1 => Just(b"batch".to_vec()),
            1 => field(),
        ];
        let row = prop_oneof![
            4 => Just(&b"[1]"[..]),
            1 => Just(&b"{\"a\":[null]} "[..]),
            1 => Just(&b"[1"[..]),
            1 => Just(&b"[\"\n\"]"[..]),
        ];
        (stream, field(), token, row).prop_map(|(stream, instance, token, row)| {
            [
                &b"RDATA "[..],
                &stream,
                b" ",
                &instance,
                b" ",
                &token,
                b" ",
                row,
            ]
            .concat()
        })
    }

    /// The property below tests something: its inputs take the fast path
    /// often, and fall back often.
    #[test]
    fn the_inputs_take_both_paths() {
        takes_both_paths(line(), |line| rdata_fields_fast(line).is_some());
    }

    /// A line of [`line`] and an own name: often the line's sender, or
    /// the start of it up to a space, or a name with a space.
    fn line_and_own() -> impl Strategy<Value = (Vec<u8>, Vec<u8>)> {
        (line(), 0..6usize, field()).prop_map(|(line, pick, other)| {
            let own = own_for(&line, pick, other);
            (line, own)
        })
    }

    /// Every echo is told apart from the other lines exactly as the
    /// session's own check does, and every other line decodes as
    /// [`Decoder::decode_rdata_salvaging`] decodes it.
    fn reads_echoes_as_the_session(line: &[u8], own: &[u8]) -> Result<(), TestCaseError> {
        let line = Bytes::copy_from_slice(line);
        for decoder in [Decoder::new(), Decoder::new().max_line_len(20)] {
            let read = decoder.decode_rdata_unless_from(line.clone(), own);
            let expected = if names_own(&line, RDATA, own) {
                Ok(None)
            } else {
                decoder.decode_rdata_salvaging(line.clone()).map(Some)
            };
            prop_assert_eq!(format!("{read:?}"), format!("{expected:?}"));
        }
        Ok(())
    }

    #[test]
    fn echoes_of_every_shape() {
        let check = |line: &[u8], own: &[u8], echo: bool| {
            reads_echoes_as_the_session(line, own).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(names_own(line, RDATA, own), echo, "{line:?} {own:?}");
        };
        check(b"RDATA events me 1 [1]", b"me", true);
        check(b"RDATA events me 1 [1", b"me", true);
        check(b"RDATA events me 1 [1]", b"m", false);
        check(b"RDATA events me 1 [1]", b"me 1", true);
        check(
            b"RDATA events me
1 [1]",
            b"me
1",
            true,
        );
        check(b"RDATA new_stream me 1 [1]", b"me", true);
        check(b"RDATA new_stream me 1 [1]", b"you", false);
        check(b"RDATA  me 1 [1]", b"me", true);
        check(b"RDATA events  1 [1]", b"", true);
        check(b"RDATA events me", b"me", false);
        check(b"RDATA events", b"", false);
        check(
            b"RDATA caches a_writer_name_longer_than_a_word batch [1]",
            b"a_writer_name_longer_than_a_word",
            true,
        );
        check(b"RDATA un_partial_stated_room me 1 [1]", b"me", true);
        check(b"RDATA events me_too 1 [1]", b"me", false);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        #[test]
        fn rdata_reads_as_the_general_path(line in line()) {
            agrees(&line)?;
        }

        #[test]
        fn echoes_are_told_as_the_session_tells_them((line, own) in line_and_own()) {
            reads_echoes_as_the_session(&line, &own)?;
        }
    }
}

#[cfg(test)]
mod position_fast_tests {
    use proptest::prelude::*;

    use super::*;

    /// What [`position_fast`] reads, [`decode_position_general`] reads the
    /// same.
    fn agrees(line: &[u8]) -> Result<bool, TestCaseError> {
        fast_path_agrees(line, |line| position_fast(line), decode_position_general)
    }

    #[test]
    fn every_length_of_token() {
        let fast = |line: &[u8]| agrees(line).unwrap_or_else(|e| panic!("{e}"));
        for len in 1..=19 {
            let token = "9123456789012345678".get(..len).unwrap_or_default();
            for line in [
                format!("POSITION events master {token} 12"),
                format!("POSITION events master 12 {token}"),
                format!("POSITION events event_persister1 {token} {token}"),
            ] {
                assert!(fast(line.as_bytes()), "{line}");
            }
            for at in 0..len {
                for byte in ["-", "+", "a", "/", ":", "\n", " ", "\u{e9}", "_"] {
                    let mut other = token.to_owned();
                    other.replace_range(at..=at, byte);
                    fast(format!("POSITION caches master {other} 1").as_bytes());
                    fast(format!("POSITION caches master 1 {other}").as_bytes());
                }
            }
        }
        for line in [
            &b"POSITION caches master batch 1"[..],
            b"POSITION caches master 1 batch",
            b"POSITION caches master 1 2 ",
            b"POSITION caches master 1 2\n",
            b"POSITION caches master 1 2 3",
            b"POSITION caches master 1 ",
            b"POSITION caches master 1",
            b"POSITION caches  1 2",
            b"POSITION caches ma\nster 1 2",
            b"POSITION caches\n master 1 2",
            b"POSITION new_stream master 1 2",
            b"POSITION caches m\xff 1 2",
        ] {
            assert!(!fast(line), "{}", String::from_utf8_lossy(line));
        }
        assert!(fast("POSITION caches m\u{e9} 1 2".as_bytes()));
    }

    fn field() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            8 => "[a-z_0-9]{0,20}".prop_map(String::into_bytes),
            1 => "[a-z é\n\u{1f354}]{0,12}".prop_map(String::into_bytes),
            1 => prop::collection::vec(any::<u8>(), 0..12),
        ]
    }

    fn line() -> impl Strategy<Value = Vec<u8>> {
        let stream = prop_oneof![
            6 => prop::sample::select(StreamName::KNOWN.to_vec())
                .prop_map(|s| s.as_str().as_bytes().to_vec()),
            1 => field(),
        ];
        let token = || {
            prop_oneof![
                4 => any::<i64>().prop_map(|n| n.to_string().into_bytes()),
                4 => (0i64..100_000_000).prop_map(|n| n.to_string().into_bytes()),
                1 => field(),
            ]
        };
        (stream, field(), token(), token()).prop_map(|(stream, instance, prev, new)| {
            [
                &b"POSITION "[..],
                &stream,
                b" ",
                &instance,
                b" ",
                &prev,
                b" ",
                &new,
            ]
            .concat()
        })
    }

    /// The property below tests something: its inputs take the fast path
    /// often, and fall back often.
    #[test]
    fn the_inputs_take_both_paths() {
        takes_both_paths(line(), |line| position_fast(line).is_some());
    }

    /// Every echo is told apart from the other lines exactly as the
    /// session's own check does, and every other line decodes as
    /// [`Decoder::decode_salvaging`] decodes it.
    fn reads_echoes_as_the_session(line: &[u8], own: &[u8]) -> Result<(), TestCaseError> {
        let line = Bytes::copy_from_slice(line);
        for decoder in [Decoder::new(), Decoder::new().max_line_len(20)] {
            let read = decoder.decode_position_unless_from(&line, own);
            let expected = if names_own(&line, POSITION, own) {
                Ok(None)
            } else {
                decoder
                    .decode_salvaging(line.clone())
                    .map(|command| match command {
                        Some(Command::Position(position)) => Some(position),
                        other => panic!("not a position: {other:?}"),
                    })
            };
            prop_assert_eq!(format!("{read:?}"), format!("{expected:?}"));
        }
        Ok(())
    }

    #[test]
    fn echoes_of_every_shape() {
        let check = |line: &[u8], own: &[u8], echo: bool| {
            reads_echoes_as_the_session(line, own).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(names_own(line, POSITION, own), echo, "{line:?} {own:?}");
        };
        check(b"POSITION events me 1 2", b"me", true);
        check(b"POSITION events me 1 x", b"me", true);
        check(b"POSITION events me 1 2", b"m", false);
        check(b"POSITION events me 1 2", b"me 1", true);
        check(b"POSITION new_stream me 1 2", b"me", true);
        check(b"POSITION new_stream me 1 2", b"you", false);
        check(b"POSITION  me 1 2", b"me", true);
        check(b"POSITION events  1 2", b"", true);
        check(b"POSITION events me", b"me", false);
        check(b"POSITION un_partial_stated_event me 1 2", b"me", true);
        check(b"POSITION events me_too 1 2", b"me", false);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        #[test]
        fn position_reads_as_the_general_path(line in line()) {
            agrees(&line)?;
        }

        #[test]
        fn echoes_are_told_as_the_session_tells_them(
            (line, own) in (line(), 0..6usize, field())
                .prop_map(|(line, pick, other)| {
                    let own = own_for(&line, pick, other);
                    (line, own)
                })
        ) {
            reads_echoes_as_the_session(&line, &own)?;
        }
    }
}
