//! A call of Synapse's replication HTTP API as its callee reads it, from
//! arbitrary bytes: the first byte picks the method, the bytes up to the
//! first newline are the path, the rest is the body. Never panics; a
//! refusal is a 4xx with Synapse's error body; a path that routes, written
//! again from what it routed to, routes to the same; what is read carries
//! no positions key in its content and at most `MAX_POSITIONS` positions,
//! which an answer carries back to the caller unchanged. The caller's
//! readers (`read_answer`, `RemoteError::from_answer`, `call_query`) never
//! panic on the same bytes.

use std::sync::Arc;

use serde_json::Value;
use synapse_replication::config::StreamWriters;
use synapse_replication::http::{MAX_POSITIONS, Method, RemoteError, ReplicationApi, ReplicationEndpoint, STREAM_POSITIONS_KEY, answer_body, call_query, read_answer};
use synapse_replication::wire::InstanceName;

const SECRET: &[u8] = b"Bearer s3cret";

fn api() -> ReplicationApi {
    let writers = StreamWriters::default().with_redis(true);
    ReplicationApi::new(InstanceName::from("rust1"), Some("s3cret".into()))
        .with_endpoint(ReplicationEndpoint::fed_send_edu())
        .with_endpoint(ReplicationEndpoint::presence_set_state())
        .with_endpoint(ReplicationEndpoint::new(
            Method::Get,
            "get_thing",
            &["a", "b"],
        ))
        .with_endpoint(ReplicationEndpoint::new(Method::Put, "put_it", &[]).without_cache())
        .with_writers(Arc::new(writers))
}

pub fn check(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let method = ["POST", "GET", "PUT", "HEAD", "DELETE"][usize::from(selector % 5)];
    let secret: &[&[u8]] = if selector & 0x80 == 0 { &[SECRET] } else { &[] };
    let (path, body) = match rest.iter().position(|&b| b == b'\n') {
        Some(at) => (&rest[..at], &rest[at + 1..]),
        None => (rest, &[][..]),
    };
    let path = String::from_utf8_lossy(path);
    let api = api();

    // The caller's readers, on the same bytes.
    let _ = RemoteError::from_answer(400, body);
    if let Ok(answer) = read_answer(200, body) {
        assert!(!answer.content.contains_key(STREAM_POSITIONS_KEY));
        assert!(answer.positions.len() <= MAX_POSITIONS);
    }
    if let Ok(Value::Object(object)) = serde_json::from_slice::<Value>(body) {
        let _ = call_query(&object);
    }

    let route = match api.route(method, &path, secret.iter().copied()) {
        Ok(route) => route,
        Err(error) => return refusal(&error),
    };
    // Written again from what it routed to, the path routes the same.
    let endpoint = api.endpoint(&route).clone();
    let args: Vec<&str> = route.args().map(|(_, value)| value).collect();
    let again = endpoint.path(&args, route.txn_id());
    let rerouted = api
        .route(endpoint.method().as_str(), &again, [SECRET])
        .expect("a path written from a route routes");
    assert_eq!(rerouted, route, "{path:?} -> {again:?}");

    let request = match api.read(route, None, body) {
        Ok(request) => request,
        Err(error) => return refusal(&error),
    };
    assert!(!request.content.contains_key(STREAM_POSITIONS_KEY));
    if let Some(caller) = &request.caller {
        assert!(caller.streams.len() <= MAX_POSITIONS);
        // An answer carries positions back as they were.
        let content = Value::Object(request.content.clone()).to_string();
        let answer = answer_body(&content, &caller.streams);
        let read = read_answer(200, answer.as_bytes()).expect("an answer of ours reads");
        assert_eq!(read.positions, caller.streams);
        assert_eq!(read.content, request.content);
    }
}

fn refusal(error: &synapse_replication::http::ReplicationError) {
    let status = error.status();
    assert!((400..=405).contains(&status), "{error:?}: {status}");
    let body: Value = serde_json::from_str(&error.body()).expect("a JSON error body");
    assert!(
        body["errcode"].is_string() && body["error"].is_string(),
        "{body}"
    );
}
