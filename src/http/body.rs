//! The bodies of calls and answers: the content, and the positions that
//! travel with it under `_INT_STREAM_POS`.

use serde_json::{Map, Value};

use crate::wire::{InstanceName, StreamName, Token};

use super::STREAM_POSITIONS_KEY;
use super::error::{RemoteError, ReplicationError};

/// The most streams one `_INT_STREAM_POS` may name (Synapse has
/// nineteen): beyond it a call is refused, so that no call makes the
/// callee wait on an unbounded list.
pub const MAX_POSITIONS: usize = 64;

/// The positions a caller sends with a call: the streams it writes and
/// its token on each (`{"streams": {<stream>: <token>}, "instance_name":
/// <caller>}`), which the callee waits to have seen before it acts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamPositions {
    /// The caller, as it names itself on the streams.
    pub instance: InstanceName,
    /// Its token on each stream it writes.
    pub streams: Vec<(StreamName, Token)>,
}

impl StreamPositions {
    /// Reads `_INT_STREAM_POS` as a caller sent it.
    pub fn from_json(value: &Value) -> Result<StreamPositions, ReplicationError> {
        let object = value
            .as_object()
            .ok_or(ReplicationError::InvalidPositions("not an object"))?;
        let instance = object
            .get("instance_name")
            .ok_or(ReplicationError::InvalidPositions("no instance_name"))?
            .as_str()
            .filter(|name| !name.is_empty())
            .ok_or(ReplicationError::InvalidPositions(
                "instance_name is not a name",
            ))?;
        let streams = object
            .get("streams")
            .ok_or(ReplicationError::InvalidPositions("no streams"))?
            .as_object()
            .ok_or(ReplicationError::InvalidPositions(
                "streams is not an object",
            ))?;
        if streams.len() > MAX_POSITIONS {
            return Err(ReplicationError::InvalidPositions("too many streams"));
        }
        let streams = streams
            .iter()
            .map(|(name, token)| {
                let token = token.as_i64().ok_or(ReplicationError::InvalidPositions(
                    "a token is not an integer",
                ))?;
                Ok((StreamName::from(name.as_str()), Token(token)))
            })
            .collect::<Result<Vec<_>, ReplicationError>>()?;
        Ok(StreamPositions {
            instance: InstanceName::from(instance),
            streams,
        })
    }

    /// As a caller sends it.
    pub fn to_json(&self) -> Value {
        let streams: Map<String, Value> = self
            .streams
            .iter()
            .map(|(stream, token)| (stream.as_str().to_owned(), Value::from(token.0)))
            .collect();
        serde_json::json!({"streams": streams, "instance_name": self.instance.as_str()})
    }
}

/// The body of a call: `content` with the caller's positions under
/// `_INT_STREAM_POS` (replacing any the content had), written byte for
/// byte as Synapse's processes send it (`encode_canonical_json` in
/// `post_json_get_json` and `put_json`): keys sorted, compact, UTF-8.
pub fn call_body(mut content: Map<String, Value>, positions: Option<&StreamPositions>) -> String {
    if let Some(positions) = positions {
        content.insert(STREAM_POSITIONS_KEY.to_owned(), positions.to_json());
    }
    crate::wire::json::to_canonical_string(&Value::Object(content))
}

/// The query of a `GET` call: `content` as Synapse's client sends a
/// `GET`'s payload (`urlencode(args, doseq=True)`): `key=value` pairs,
/// `+` for a space and `%XX` for other bytes than letters, digits and
/// `_.-~`; a string as it is, a number as it is written, `True`/`False`
/// and `None` as Python spells them, an array as one pair per element.
///
/// ```
/// use synapse_replication::http::call_query;
///
/// let content = serde_json::json!({"from_token": 3, "upto_token": 5, "who": "a b"});
/// assert_eq!(
///     call_query(content.as_object().unwrap()),
///     "from_token=3&upto_token=5&who=a+b",
/// );
/// ```
pub fn call_query(content: &Map<String, Value>) -> String {
    let mut out = String::new();
    let mut pair = |key: &str, value: &Value| {
        let text = match value {
            Value::String(text) => text.clone(),
            Value::Bool(true) => "True".to_owned(),
            Value::Bool(false) => "False".to_owned(),
            Value::Null => "None".to_owned(),
            other => other.to_string(),
        };
        if !out.is_empty() {
            out.push('&');
        }
        quote_plus_into(&mut out, key);
        out.push('=');
        quote_plus_into(&mut out, &text);
    };
    for (key, value) in content {
        match value {
            Value::Array(items) => items.iter().for_each(|item| pair(key, item)),
            value => pair(key, value),
        }
    }
    out
}

/// Python's `urllib.parse.quote_plus(text)`.
fn quote_plus_into(out: &mut String, text: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for byte in text.bytes() {
        match byte {
            b' ' => out.push('+'),
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'.' | b'-' | b'~' => {
                out.push(char::from(byte));
            }
            _ => {
                out.push('%');
                out.push(char::from(HEX[usize::from(byte >> 4)]));
                out.push(char::from(HEX[usize::from(byte & 0xf)]));
            }
        }
    }
}

/// The body of an answer: `body` (a JSON object, as a handler answered it
/// or as it was kept for its txn id) with the callee's positions on the
/// streams it writes under `_INT_STREAM_POS`, as Synapse adds them to
/// every answer of an endpoint that waits for streams. A `body` that is
/// not an object is returned as it is.
pub fn answer_body(body: &str, positions: &[(StreamName, Token)]) -> String {
    let trimmed = body.trim_ascii();
    let Some(inner) = trimmed
        .strip_prefix('{')
        .and_then(|rest| rest.strip_suffix('}'))
    else {
        return body.to_owned();
    };
    let mut out = String::with_capacity(body.len() + 32 + positions.len() * 24);
    out.push('{');
    let inner = inner.trim_ascii();
    if !inner.is_empty() {
        out.push_str(inner);
        out.push(',');
    }
    out.push('"');
    out.push_str(STREAM_POSITIONS_KEY);
    out.push_str("\":{");
    for (index, (stream, token)) in positions.iter().enumerate() {
        if index > 0 {
            out.push(',');
        }
        out.push_str(&Value::from(stream.as_str()).to_string());
        out.push(':');
        out.push_str(&token.0.to_string());
    }
    out.push_str("}}");
    out
}

/// A successful answer to a call, read.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ReplicationAnswer {
    /// The answer's JSON object, without `_INT_STREAM_POS`.
    pub content: Map<String, Value>,
    /// The callee's positions on the streams it writes: wait for them
    /// before returning, as Synapse's callers do.
    pub positions: Vec<(StreamName, Token)>,
    /// Whether this process had seen them when the call returned (a
    /// caller that waits sets it; true when there are none): false when
    /// the wait gave up after five seconds and the call returned anyway,
    /// as Synapse's do.
    pub seen: bool,
}

/// Reads the answer to a call: for a 2xx status, its content and the
/// callee's positions; otherwise the callee's error.
pub fn read_answer(status: u16, body: &[u8]) -> Result<ReplicationAnswer, RemoteError> {
    if !(200..300).contains(&status) {
        return Err(RemoteError::from_answer(status, body));
    }
    let not_object = || RemoteError {
        status,
        errcode: "M_NOT_JSON".to_owned(),
        message: "the answer is not a JSON object".to_owned(),
    };
    let Value::Object(mut content) = serde_json::from_slice(body).map_err(|_| not_object())? else {
        return Err(not_object());
    };
    let positions = match content.remove(STREAM_POSITIONS_KEY) {
        Some(Value::Object(streams)) => streams
            .iter()
            .take(MAX_POSITIONS)
            .filter_map(|(name, token)| {
                Some((StreamName::from(name.as_str()), Token(token.as_i64()?)))
            })
            .collect(),
        _ => Vec::new(),
    };
    let seen = positions.is_empty();
    Ok(ReplicationAnswer {
        content,
        positions,
        seen,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_round_trip() {
        let positions = StreamPositions {
            instance: InstanceName::from("worker1"),
            streams: vec![
                (StreamName::Events, Token(12)),
                (StreamName::Caches, Token(3)),
            ],
        };
        let json = positions.to_json();
        assert_eq!(
            json.to_string(),
            r#"{"streams":{"events":12,"caches":3},"instance_name":"worker1"}"#
        );
        assert_eq!(StreamPositions::from_json(&json), Ok(positions));
    }

    #[test]
    fn malformed_positions_are_refused() {
        for bad in [
            r#"[]"#,
            r#"{"streams":{}}"#,
            r#"{"instance_name":"w"}"#,
            r#"{"streams":[],"instance_name":"w"}"#,
            r#"{"streams":{"events":"1"},"instance_name":"w"}"#,
            r#"{"streams":{"events":1.5},"instance_name":"w"}"#,
            r#"{"streams":{},"instance_name":""}"#,
            r#"{"streams":{},"instance_name":7}"#,
        ] {
            let value: Value = serde_json::from_str(bad).unwrap();
            assert!(
                matches!(
                    StreamPositions::from_json(&value),
                    Err(ReplicationError::InvalidPositions(_))
                ),
                "{bad}"
            );
        }
        let many: Map<String, Value> = (0..=MAX_POSITIONS)
            .map(|index| (format!("s{index}"), Value::from(1)))
            .collect();
        let value = serde_json::json!({"streams": many, "instance_name": "w"});
        assert_eq!(
            StreamPositions::from_json(&value),
            Err(ReplicationError::InvalidPositions("too many streams"))
        );
    }

    #[test]
    fn answers_carry_positions() {
        let positions = [(StreamName::Typing, Token(5))];
        assert_eq!(
            answer_body("{}", &positions),
            r#"{"_INT_STREAM_POS":{"typing":5}}"#
        );
        assert_eq!(
            answer_body(r#"{"a":1}"#, &positions),
            r#"{"a":1,"_INT_STREAM_POS":{"typing":5}}"#
        );
        assert_eq!(answer_body("{}", &[]), r#"{"_INT_STREAM_POS":{}}"#);
        let answer =
            read_answer(200, answer_body(r#"{"a":1}"#, &positions).as_bytes()).expect("an answer");
        assert_eq!(answer.positions, positions);
        assert_eq!(Value::Object(answer.content).to_string(), r#"{"a":1}"#);
    }

    #[test]
    fn error_answers_are_remote_errors() {
        let error = read_answer(403, br#"{"error":"nope","errcode":"M_FORBIDDEN"}"#).unwrap_err();
        assert_eq!((error.status, error.errcode.as_str()), (403, "M_FORBIDDEN"));
        assert!(read_answer(200, b"[1]").is_err());
        assert!(read_answer(200, b"not json").is_err());
    }

    #[test]
    fn get_queries_as_python_writes_them() {
        let content = serde_json::json!({
            "a": "x/y&z", "b": [1, "two"], "c": true, "d": null, "e": 1.5, "ü": "ß"
        });
        assert_eq!(
            call_query(content.as_object().expect("an object")),
            "a=x%2Fy%26z&b=1&b=two&c=True&d=None&e=1.5&%C3%BC=%C3%9F"
        );
        assert_eq!(call_query(&Map::new()), "");
    }

    #[test]
    fn call_bodies_carry_the_caller() {
        let mut content = Map::new();
        content.insert("origin".into(), Value::from("remote.org"));
        let positions = StreamPositions {
            instance: InstanceName::from("w"),
            streams: vec![(StreamName::Typing, Token(2))],
        };
        assert_eq!(
            call_body(content, Some(&positions)),
            r#"{"_INT_STREAM_POS":{"instance_name":"w","streams":{"typing":2}},"origin":"remote.org"}"#
        );
    }
}
