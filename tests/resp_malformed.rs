//! Malformed and hostile RESP: each input gives `Ok(None)` (need more) or
//! the expected typed error, never a panic, never a frame, and never an
//! allocation proportional to a length the input declares (a counting
//! allocator checks the largest allocation made while decoding).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use bytes::BytesMut;
use synapse_replication::resp::{Frame, Incoming, Limits, RespDecoder, RespError};

/// Records the largest allocation made by the current thread while
/// `TRACKING` is set.
struct Counting;

thread_local! {
    static TRACKING: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    let tracking = TRACKING.try_with(Cell::get).unwrap_or(false);
    if tracking {
        let _ = LARGEST.try_with(|largest| largest.set(largest.get().max(size)));
    }
}

// SAFETY: forwards to the system allocator; only records sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The largest allocation `run` makes.
fn largest_allocation<T>(run: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|largest| largest.set(0));
    TRACKING.with(|tracking| tracking.set(true));
    let out = run();
    TRACKING.with(|tracking| tracking.set(false));
    (out, LARGEST.with(Cell::get))
}

/// What decoding an input must give.
#[derive(Debug)]
enum Expect {
    /// `Ok(None)`: a valid prefix, waiting for more.
    NeedMore,
    /// This error (compared by kind).
    Fails(RespError),
}

use Expect::{Fails, NeedMore};

fn kind(error: &RespError) -> std::mem::Discriminant<RespError> {
    std::mem::discriminant(error)
}

fn invalid_type() -> Expect {
    Fails(RespError::InvalidType {
        byte: 0,
        input: String::new(),
    })
}
fn invalid_length() -> Expect {
    Fails(RespError::InvalidLength {
        input: String::new(),
    })
}
fn missing_crlf() -> Expect {
    Fails(RespError::MissingCrlf {
        input: String::new(),
    })
}
fn invalid_value() -> Expect {
    Fails(RespError::InvalidValue {
        what: "",
        input: String::new(),
    })
}
fn bulk_too_long() -> Expect {
    Fails(RespError::BulkTooLong { len: 0, max: 0 })
}
fn too_many() -> Expect {
    Fails(RespError::TooManyElements { len: 0, max: 0 })
}
fn too_deep() -> Expect {
    Fails(RespError::TooDeep { max: 0 })
}
fn line_too_long() -> Expect {
    Fails(RespError::LineTooLong {
        max: 0,
        input: String::new(),
    })
}
fn frame_too_large() -> Expect {
    Fails(RespError::FrameTooLarge { len: 0, max: 0 })
}

/// Inputs that are no RESP, or break a default cap.
fn cases() -> Vec<(&'static str, Vec<u8>, Expect)> {
    let mut cases: Vec<(&'static str, Vec<u8>, Expect)> = vec![
        // Bad type bytes.
        ("unknown type", b"?\r\n".to_vec(), invalid_type()),
        ("type byte alone", b"x".to_vec(), invalid_type()),
        ("bare CRLF", b"\r\n".to_vec(), invalid_type()),
        ("leading space", b" +OK\r\n".to_vec(), invalid_type()),
        ("inline command", b"PING\r\n".to_vec(), invalid_type()),
        ("NUL", b"\0".to_vec(), invalid_type()),
        (
            "bad type inside an array",
            b"*2\r\n:1\r\n@\r\n".to_vec(),
            invalid_type(),
        ),
        ("streamed string end", b".\r\n".to_vec(), invalid_type()),
        ("streamed chunk", b";4\r\nabcd\r\n".to_vec(), invalid_type()),
        // Bad lengths.
        ("letters", b"$abc\r\n".to_vec(), invalid_length()),
        ("empty", b"$\r\n".to_vec(), invalid_length()),
        ("sign only", b"*-\r\n".to_vec(), invalid_length()),
        ("plus sign", b"$+1\r\n".to_vec(), invalid_length()),
        ("space", b"$ 1\r\n".to_vec(), invalid_length()),
        ("trailing space", b"$1 \r\n".to_vec(), invalid_length()),
        ("bare LF", b"$1\n".to_vec(), invalid_length()),
        ("CR then garbage", b"*1\rx".to_vec(), invalid_length()),
        (
            "20 digits",
            b"$12345678901234567890\r\n".to_vec(),
            invalid_length(),
        ),
        ("streamed bulk", b"$?\r\n".to_vec(), invalid_length()),
        ("streamed array", b"*?\r\n".to_vec(), invalid_length()),
        // Negative lengths other than RESP2's -1.
        ("bulk -2", b"$-2\r\n".to_vec(), invalid_length()),
        ("array -5", b"*-5\r\n".to_vec(), invalid_length()),
        ("bulk -0", b"$-0\r\n".to_vec(), invalid_length()),
        ("bulk -01", b"$-01\r\n".to_vec(), invalid_length()),
        ("bulk -10", b"$-10\r\n".to_vec(), invalid_length()),
        (
            "huge negative",
            b"*-9999999999\r\n".to_vec(),
            invalid_length(),
        ),
        ("map -1", b"%-1\r\n".to_vec(), invalid_length()),
        ("set -1", b"~-1\r\n".to_vec(), invalid_length()),
        ("push -1", b">-1\r\n".to_vec(), invalid_length()),
        ("attribute -1", b"|-1\r\n".to_vec(), invalid_length()),
        ("bulk error -1", b"!-1\r\n".to_vec(), invalid_length()),
        ("verbatim -1", b"=-1\r\n".to_vec(), invalid_length()),
        // Missing CRLF.
        (
            "bulk too long for its length",
            b"$3\r\nabcde".to_vec(),
            missing_crlf(),
        ),
        (
            "empty bulk with content",
            b"$0\r\nxx".to_vec(),
            missing_crlf(),
        ),
        ("bulk CR only", b"$1\r\na\rX".to_vec(), missing_crlf()),
        ("simple string LF", b"+OK\n".to_vec(), missing_crlf()),
        ("simple string CR", b"+OK\rX".to_vec(), missing_crlf()),
        ("integer CR CR", b":1\r\r\n".to_vec(), missing_crlf()),
        (
            "error with LF inside",
            b"-ERR a\nb\r\n".to_vec(),
            missing_crlf(),
        ),
        // Values.
        ("integer letters", b":abc\r\n".to_vec(), invalid_value()),
        ("integer empty", b":\r\n".to_vec(), invalid_value()),
        (
            "integer overflow",
            b":9223372036854775808\r\n".to_vec(),
            invalid_value(),
        ),
        ("integer float", b":1.5\r\n".to_vec(), invalid_value()),
        ("double", b",1.2.3\r\n".to_vec(), invalid_value()),
        ("double empty", b",\r\n".to_vec(), invalid_value()),
        (
            "double infinity",
            b",infinity\r\n".to_vec(),
            invalid_value(),
        ),
        ("big number", b"(1.5\r\n".to_vec(), invalid_value()),
        ("boolean", b"#x\r\n".to_vec(), invalid_value()),
        ("boolean long", b"#true\r\n".to_vec(), invalid_value()),
        ("null with content", b"_x\r\n".to_vec(), invalid_value()),
        (
            "verbatim too short",
            b"=3\r\ntxt\r\n".to_vec(),
            invalid_value(),
        ),
        (
            "verbatim without colon",
            b"=5\r\ntxt-a\r\n".to_vec(),
            invalid_value(),
        ),
        // Huge declared lengths: refused at the header, nothing allocated.
        (
            "bulk 10 TB",
            b"$9999999999999\r\n".to_vec(),
            bulk_too_long(),
        ),
        (
            "bulk just over",
            format!("${}\r\n", (64 << 20) + 1).into_bytes(),
            bulk_too_long(),
        ),
        (
            "bulk error huge",
            b"!9999999999\r\n".to_vec(),
            bulk_too_long(),
        ),
        (
            "verbatim huge",
            b"=9999999999\r\n".to_vec(),
            bulk_too_long(),
        ),
        ("array huge", b"*9999999999\r\n".to_vec(), too_many()),
        ("map huge", b"%2000000\r\n".to_vec(), too_many()),
        ("set huge", b"~1048577\r\n".to_vec(), too_many()),
        ("push huge", b">4294967296\r\n".to_vec(), too_many()),
        ("attribute huge", b"|1048577\r\n".to_vec(), too_many()),
        (
            "nested huge",
            b"*1\r\n*1\r\n*9999999999\r\n".to_vec(),
            too_many(),
        ),
        // Limits that only need a prefix.
        (
            "line too long",
            [b"+".as_slice(), &[b'a'; 70_000]].concat(),
            line_too_long(),
        ),
        (
            "error line too long",
            [b"-".as_slice(), &[b'e'; 65_537], b"\r\n"].concat(),
            line_too_long(),
        ),
        // Valid prefixes: wait.
        (
            "bulk at the cap, body missing",
            format!("${}\r\n", 64 << 20).into_bytes(),
            NeedMore,
        ),
        (
            "array at the cap, elements missing",
            b"*1048576\r\n".to_vec(),
            NeedMore,
        ),
        (
            "map at the cap, pairs missing",
            b"%1048576\r\n:1\r\n".to_vec(),
            NeedMore,
        ),
        (
            "line just at the cap",
            [b"+".as_slice(), &[b'a'; 65_536]].concat(),
            NeedMore,
        ),
    ];
    // Deep nesting, of every aggregate type.
    for (name, open) in [
        ("array", &b"*1\r\n"[..]),
        ("set", b"~1\r\n"),
        ("push", b">1\r\n"),
        ("map value", b"%1\r\n:1\r\n"),
        ("attribute", b"|0\r\n"),
    ] {
        let _ = name;
        cases.push((
            "33 levels",
            [open.repeat(33), b":1\r\n".to_vec()].concat(),
            too_deep(),
        ));
        cases.push(("a million levels", open.repeat(1_000_000), too_deep()));
    }
    cases.push((
        "33 empty levels",
        [b"*1\r\n".repeat(32), b"*0\r\n".to_vec()].concat(),
        too_deep(),
    ));
    cases
}

/// Decodes `input` whole, then one byte at a time; both must match.
fn check(name: &str, input: &[u8], expect: &Expect) {
    check_with(Limits::new(), name, input, expect);
}

/// [`check`] with other limits.
fn check_with(limits: Limits, name: &str, input: &[u8], expect: &Expect) {
    for step in [input.len().max(1), 1, 7] {
        let mut decoder = RespDecoder::with_limits(limits);
        let mut buf = BytesMut::new();
        let mut outcome = Ok(None);
        for chunk in input.chunks(step) {
            buf.extend_from_slice(chunk);
            let before = buf.len();
            outcome = decoder.decode(&mut buf);
            assert_eq!(buf.len(), before, "{name}: consumed input without a frame");
            if outcome.is_err() {
                break;
            }
            if let Ok(Some(frame)) = &outcome {
                panic!("{name}: decoded {frame:?}");
            }
        }
        match (expect, &outcome) {
            (NeedMore, Ok(None)) => {}
            (Fails(expected), Err(error)) if kind(expected) == kind(error) => {
                let text = error.to_string();
                assert!(
                    text.chars().next().is_some_and(|c| !c.is_uppercase()),
                    "{name}: message starts in lowercase: {text}"
                );
            }
            _ => panic!("{name} (reads of {step}): expected {expect:?}, got {outcome:?}"),
        }
    }
}

#[test]
fn malformed_inputs_give_typed_errors() {
    for (name, input, expect) in cases() {
        check(name, &input, &expect);
    }
}

#[test]
fn the_pubsub_path_agrees_on_malformed_inputs() {
    for (name, input, expect) in cases() {
        let mut buf = BytesMut::from(&input[..]);
        let outcome = RespDecoder::new().decode_pubsub(&mut buf);
        match (&expect, &outcome) {
            (NeedMore, Ok(None)) => {}
            (Fails(expected), Err(error)) if kind(expected) == kind(error) => {}
            _ => panic!("{name}: expected {expect:?}, got {outcome:?}"),
        }
    }
}

#[test]
fn no_allocation_proportional_to_a_declared_length() {
    // Whatever a header declares, decoding it allocates a few hundred
    // bytes at most (the decoder's token list, the error message).
    for (name, input, expect) in cases() {
        if input.len() > 64 {
            continue; // the long inputs are big themselves
        }
        let mut buf = BytesMut::with_capacity(input.len());
        buf.extend_from_slice(&input);
        let (outcome, largest) = largest_allocation(|| RespDecoder::new().decode(&mut buf));
        assert!(
            largest <= 1024,
            "{name}: allocated {largest} bytes ({outcome:?}, {expect:?})"
        );
    }
    // Valid headers at the caps, with the body still to come.
    for header in [
        format!("${}\r\n", 64 << 20),
        "*1048576\r\n".to_owned(),
        "%1048576\r\n".to_owned(),
        "*1\r\n~1048576\r\n>1048576\r\n".to_owned(),
    ] {
        let mut decoder = RespDecoder::new();
        let mut buf = BytesMut::from(header.as_bytes());
        let (outcome, largest) = largest_allocation(|| decoder.decode(&mut buf));
        assert_eq!(outcome, Ok(None), "{header:?}");
        assert!(largest <= 1024, "{header:?}: allocated {largest} bytes");
        assert!(decoder.min_buffer_len() <= Limits::DEFAULT_MAX_FRAME_LEN);
    }
}

#[test]
fn a_large_decoded_array_allocates_for_what_arrived() {
    // The element Vec is sized by the count only once every element is in
    // the buffer: its size follows the bytes received.
    let count = 100_000;
    let mut input = format!("*{count}\r\n").into_bytes();
    input.extend(b"_\r\n".repeat(count));
    let mut buf = BytesMut::from(&input[..]);
    let mut decoder = RespDecoder::new();
    let (outcome, largest) = largest_allocation(|| decoder.decode(&mut buf));
    let Ok(Some(Frame::Array(items))) = outcome else {
        panic!("an array")
    };
    assert_eq!(items.len(), count);
    assert!(
        largest <= 16 * input.len(),
        "{largest} bytes for {} bytes",
        input.len()
    );
}

/// Valid frames, to cut at every byte offset.
fn samples() -> Vec<&'static [u8]> {
    vec![
        b"+OK\r\n",
        b"-ERR unknown command 'FOO'\r\n",
        b":1000\r\n",
        b"$5\r\nhello\r\n",
        b"$0\r\n\r\n",
        b"$-1\r\n",
        b"*-1\r\n",
        b"*0\r\n",
        b"*3\r\n$7\r\nmessage\r\n$11\r\nexample.com\r\n$21\r\nPOSITION events m 1 2\r\n",
        b">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$3\r\nabc\r\n",
        b"*4\r\n$8\r\npmessage\r\n$2\r\nc*\r\n$2\r\nch\r\n$1\r\nx\r\n",
        b"*3\r\n$9\r\nsubscribe\r\n$11\r\nexample.com\r\n:1\r\n",
        b"*2\r\n$4\r\npong\r\n$0\r\n\r\n",
        b"_\r\n",
        b"#t\r\n",
        b",3.14\r\n",
        b",-inf\r\n",
        b"(3492890328409238509324850943850943825024385\r\n",
        b"!21\r\nSYNTAX invalid syntax\r\n",
        b"=15\r\ntxt:Some string\r\n",
        b"%2\r\n+first\r\n:1\r\n+second\r\n:2\r\n",
        b"~2\r\n+a\r\n#f\r\n",
        b"|1\r\n+key-popularity\r\n%2\r\n$1\r\na\r\n,0.1923\r\n$1\r\nb\r\n,0.0012\r\n*2\r\n:2039123\r\n:9543892\r\n",
        b"*2\r\n*1\r\n|0\r\n:1\r\n%0\r\n",
    ]
}

#[test]
fn truncated_frames_wait_at_every_offset() {
    for sample in samples() {
        // The whole sample decodes, and takes all of it.
        let mut buf = BytesMut::from(sample);
        assert!(RespDecoder::new().decode(&mut buf).unwrap().is_some());
        assert!(buf.is_empty());
        for cut in 0..sample.len() {
            let prefix = &sample[..cut];
            for pubsub in [false, true] {
                let mut buf = BytesMut::from(prefix);
                let mut decoder = RespDecoder::new();
                let outcome = if pubsub {
                    decoder.decode_pubsub(&mut buf).map(|item| item.map(|_| ()))
                } else {
                    decoder.decode(&mut buf).map(|frame| frame.map(|_| ()))
                };
                assert_eq!(
                    outcome,
                    Ok(None),
                    "{:?} cut at {cut}",
                    String::from_utf8_lossy(sample)
                );
                assert_eq!(&buf[..], prefix, "nothing consumed");
            }
        }
    }
}

#[test]
fn garbage_after_a_frame_fails_on_the_next_call() {
    let mut decoder = RespDecoder::new();
    let mut buf = BytesMut::from(&b"+OK\r\n?garbage"[..]);
    assert_eq!(
        decoder.decode(&mut buf),
        Ok(Some(Frame::SimpleString("OK".into())))
    );
    assert!(matches!(
        decoder.decode(&mut buf),
        Err(RespError::InvalidType { byte: b'?', .. })
    ));
    assert_eq!(&buf[..], b"?garbage", "an error leaves the buffer alone");
}

#[test]
fn an_error_after_waiting() {
    let mut decoder = RespDecoder::new();
    let mut buf = BytesMut::from(&b"*2\r\n$3\r\nab"[..]);
    assert_eq!(decoder.decode(&mut buf), Ok(None));
    buf.extend_from_slice(b"cXY");
    assert!(matches!(
        decoder.decode(&mut buf),
        Err(RespError::MissingCrlf { .. })
    ));
}

#[test]
fn error_messages_quote_a_truncated_snippet() {
    let long = [b"?".as_slice(), &[b'x'; 500]].concat();
    let error = RespDecoder::new()
        .decode(&mut BytesMut::from(&long[..]))
        .unwrap_err();
    let text = error.to_string();
    assert!(
        text.starts_with("invalid frame type byte 0x3f: \"?xxx"),
        "{text}"
    );
    assert!(text.len() < 100, "{text}");
    let error = RespDecoder::new()
        .decode(&mut BytesMut::from(&b"$-7\r\n"[..]))
        .unwrap_err();
    assert_eq!(error.to_string(), "invalid length: \"$-7\\r\\n\"");
    let error = RespDecoder::new()
        .decode(&mut BytesMut::from(&b"$99999999999\r\n"[..]))
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "bulk length 99999999999 exceeds the limit of 67108864 bytes"
    );
    assert!(error.is_limit());
}

#[test]
fn frame_cap_bounds_what_is_buffered() {
    let limits = Limits::new().with_max_frame_len(64);
    for (name, input, expect) in [
        ("bulk over", b"$63\r\n".to_vec(), frame_too_large()),
        ("bulk just over", b"$58\r\n".to_vec(), frame_too_large()),
        ("bulk at the cap", b"$57\r\n".to_vec(), NeedMore),
        (
            "many elements",
            [b"*100\r\n".as_slice(), &b":1\r\n".repeat(20)].concat(),
            frame_too_large(),
        ),
        (
            "line without end",
            [b"+".as_slice(), &[b'a'; 64]].concat(),
            frame_too_large(),
        ),
        (
            "line ending past the cap",
            [b"+".as_slice(), &[b'a'; 62], b"\r\n"].concat(),
            frame_too_large(),
        ),
        (
            "header past the cap",
            [b"*1\r\n".repeat(16), b"*1\r\n".to_vec()].concat(),
            frame_too_large(),
        ),
    ] {
        check_with(limits, name, &input, &expect);
    }
    let at_cap = [b"+".as_slice(), &[b'a'; 61], b"\r\n"].concat();
    assert!(
        RespDecoder::with_limits(limits)
            .decode(&mut BytesMut::from(&at_cap[..]))
            .unwrap()
            .is_some()
    );
}

#[test]
fn every_short_input_is_handled() {
    // Every input of up to four bytes over an alphabet of the bytes that
    // matter: no panic, and whole or byte-by-byte decoding agree.
    const ALPHABET: &[u8] = b"\r\n-?01$*%|>_:+#t=~!(,";
    let mut input = Vec::new();
    let mut total = 0;
    for len in 1..=4u32 {
        for mut code in 0..(ALPHABET.len() as u32).pow(len) {
            input.clear();
            for _ in 0..len {
                input.push(ALPHABET[(code % ALPHABET.len() as u32) as usize]);
                code /= ALPHABET.len() as u32;
            }
            let whole = drain(&input, input.len());
            let bytewise = drain(&input, 1);
            assert_eq!(whole, bytewise, "{:?}", String::from_utf8_lossy(&input));
            total += 1;
        }
    }
    assert!(total > 200_000);
}

/// Frames decoded, then how it ended, feeding `step` bytes at a time.
fn drain(
    input: &[u8],
    step: usize,
) -> (
    Vec<Incoming>,
    Result<usize, std::mem::Discriminant<RespError>>,
) {
    let mut decoder = RespDecoder::new();
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    for chunk in input.chunks(step) {
        buf.extend_from_slice(chunk);
        loop {
            match decoder.decode_pubsub(&mut buf) {
                Ok(Some(item)) => out.push(item),
                Ok(None) => break,
                Err(error) => return (out, Err(kind(&error))),
            }
        }
    }
    (out, Ok(buf.len()))
}
