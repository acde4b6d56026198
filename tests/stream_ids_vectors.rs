//! `StreamIds` against Synapse 1.163.2's own `MultiWriterIdGenerator`:
//! `tests/vectors/stream_ids.jsonl` holds random schedules run through the
//! real class (startup by its `_load_current_ids` over a fake database,
//! fetches from the sequence paused in threads, ids finished out of order,
//! other writers advancing), with what it answered after every step
//! (`tests/vectors/generate_stream_ids.py`). Replayed here, every answer
//! must be the same.

use serde_json::Value;
use synapse_replication::positions::{Reservation, StreamIds};
use synapse_replication::wire::{InstanceName, Token};

fn name(value: &Value) -> InstanceName {
    InstanceName::from(value.as_str().expect("a name"))
}

fn token(value: &Value) -> Token {
    Token(value.as_i64().expect("an id"))
}

fn pairs(value: &Value) -> Vec<(InstanceName, Token)> {
    value
        .as_array()
        .expect("pairs")
        .iter()
        .map(|pair| (name(&pair[0]), token(&pair[1])))
        .collect()
}

fn tokens(value: &Value) -> Vec<Token> {
    value.as_array().expect("ids").iter().map(token).collect()
}

fn check(ids: &StreamIds, expect: &Value, at: &str) {
    let own = ids.instance().clone();
    assert_eq!(
        ids.own_position(),
        token(&expect["own_position"]),
        "{at}: own position"
    );
    assert_eq!(
        ids.current_token(),
        token(&expect["current_token"]),
        "{at}: current token"
    );
    assert_eq!(
        ids.own_minimal_position(),
        token(&expect["minimal"]),
        "{at}: minimal"
    );
    let positions: Vec<(InstanceName, Token)> = ids
        .positions()
        .map(|(name, token)| (name.clone(), token))
        .collect();
    assert_eq!(positions, pairs(&expect["positions"]), "{at}: positions");
    for (instance, _) in &positions {
        if *instance != own {
            assert!(ids.position(instance) >= ids.current_token(), "{at}");
        }
    }
}

#[test]
fn stream_ids_answer_as_synapse_does() {
    let text = include_str!("vectors/stream_ids.jsonl");
    let mut steps = 0;
    for (line, case) in text.lines().enumerate() {
        let case: Value = serde_json::from_str(case).expect("json");
        let own = name(&case["own"]);
        let writers: Vec<InstanceName> = case["writers"]
            .as_array()
            .expect("writers")
            .iter()
            .map(name)
            .collect();
        let loading = StreamIds::loading(
            own,
            writers,
            pairs(&case["stream_positions"]),
            token(&case["last_value"]),
        );
        let stale: Vec<InstanceName> = case["stale"]
            .as_array()
            .expect("stale")
            .iter()
            .map(name)
            .collect();
        assert_eq!(loading.stale(), stale, "case {line}: stale");
        let rows = pairs(&case["table_rows"]);
        let mut ids = match loading.rows_from() {
            // Synapse's max over the tables, as the caller reads it.
            None => {
                let max = rows.iter().map(|(_, id)| *id).max().unwrap_or(Token(1));
                loading.with_max_id(max).unwrap()
            }
            // All rows: those below the minimum must be left out.
            Some(_) => loading.with_rows(rows).unwrap(),
        };
        check(&ids, &case["start"], &format!("case {line}: start"));

        let mut reservations: Vec<(i64, Reservation)> = Vec::new();
        for (n, step) in case["steps"].as_array().expect("steps").iter().enumerate() {
            let at = format!("case {line}, step {n} ({step})");
            match step["op"].as_str().expect("op") {
                "reserve" => {
                    let index = step["reservation"].as_i64().expect("index");
                    reservations.push((index, ids.reserve().expect(&at)));
                }
                "allocated" => {
                    let index = step["reservation"].as_i64().expect("index");
                    let at_index = reservations
                        .iter()
                        .position(|(i, _)| *i == index)
                        .expect(&at);
                    let (_, reservation) = reservations.remove(at_index);
                    ids.allocated(reservation, &tokens(&step["ids"]))
                        .expect(&at);
                }
                "persisted" => {
                    ids.persisted(&tokens(&step["ids"])).expect(&at);
                }
                "advance" => {
                    ids.advance(&name(&step["instance"]), token(&step["token"]))
                        .expect(&at);
                }
                other => panic!("{at}: unknown op {other}"),
            }
            check(&ids, &step["expect"], &at);
            steps += 1;
        }
    }
    assert!(steps > 1000, "{steps} steps");
}
