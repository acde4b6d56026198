//! Transcript tests of the replication core: commands in, events and
//! commands out, one test per rule of PROTOCOL.md and per case from
//! Synapse's history.
//!
//! A follower transcript is a list of lines: `> ` an input (a wire line, or
//! a directive starting with `!` or `?`), `< ` an expected output, `#` a
//! comment. Directives: `!connect`, `!disconnect`, `!seed STREAM WRITER
//! TOKEN`, `!page N JSON` (answer catch-up #N with Synapse's JSON),
//! `!failed N`, `!forget STREAM WRITER`, `!lost LINE` (an `RDATA` line
//! that does not decode), `?pos STREAM WRITER`, `?stream
//! STREAM`, `?queued STREAM`, `?pairs`, `?connected STREAM WRITER`.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use synapse_replication::positions::{
    CatchUpId, CatchUpPage, Follower, FollowerEvent, FollowerLimits, RowOrigin, SeedError, Writer,
};
use synapse_replication::wire::{Command, LostRdata, RawRow, StreamName, Token};

use common::transcripts::{deployment, name};

fn stream(s: &str) -> StreamName {
    StreamName::from(s)
}

fn render(event: &FollowerEvent) -> String {
    match event {
        FollowerEvent::Rows {
            stream,
            writer,
            token,
            rows,
            source,
        } => {
            let rows: Vec<&str> = rows.iter().map(RawRow::as_str).collect();
            let source = if *source == RowOrigin::CatchUp {
                " [catch-up]"
            } else {
                ""
            };
            format!("rows {stream} {writer} {token} {}{source}", rows.join(" "))
        }
        FollowerEvent::Position {
            stream,
            writer,
            token,
        } => {
            format!("position {stream} {writer} {token}")
        }
        FollowerEvent::Started {
            stream,
            writer,
            token,
        } => format!("started {stream} {writer} {token}"),
        FollowerEvent::CatchUp(request) => {
            format!(
                "catch-up #{} {} {} ({}, {}]",
                request.id.get(),
                request.stream,
                request.writer,
                request.from,
                request.to
            )
        }
        FollowerEvent::Reset {
            stream,
            writer,
            previous,
            new,
        } => {
            format!("reset {stream} {writer} {previous} -> {new}")
        }
        FollowerEvent::Forgotten {
            stream,
            writer,
            token,
        } => format!("forgotten {stream} {writer} at {token}"),
        FollowerEvent::Rejected {
            stream,
            instance,
            command,
            reason,
        } => {
            format!("rejected {command} {stream} {instance}: {reason}")
        }
        other => format!("{other:?}"),
    }
}

struct Script {
    follower: Follower,
    ids: HashMap<u64, CatchUpId>,
}

impl Script {
    fn new(own: &str) -> Script {
        Script::with(Follower::new(name(own), deployment()))
    }

    fn with(follower: Follower) -> Script {
        Script {
            follower,
            ids: HashMap::new(),
        }
    }

    fn id(&self, n: &str) -> CatchUpId {
        *self
            .ids
            .get(&n.parse::<u64>().unwrap())
            .unwrap_or_else(|| panic!("no catch-up #{n}"))
    }

    /// Applies one input; returns the outputs it produced.
    fn input(&mut self, input: &str) -> Vec<String> {
        let mut out = Vec::new();
        let f = &mut self.follower;
        let words: Vec<&str> = input.split(' ').collect();
        match words[0] {
            "!connect" => f.connected(),
            "!disconnect" => f.disconnected(),
            "!seed" => f
                .set_position(
                    &stream(words[1]),
                    &name(words[2]),
                    Token(words[3].parse().unwrap()),
                )
                .unwrap(),
            "!page" => {
                let id = self.id(words[1]);
                let json = input.splitn(3, ' ').nth(2).unwrap();
                let page = CatchUpPage::from_json(Bytes::copy_from_slice(json.as_bytes())).unwrap();
                if let Err(e) = self.follower.handle_catch_up(id, page) {
                    out.push(format!("error: {e}"));
                }
            }
            "!failed" => {
                let id = self.id(words[1]);
                if let Err(e) = self.follower.catch_up_failed(id) {
                    out.push(format!("error: {e}"));
                }
            }
            "!lost" => {
                let line = input.split_once(' ').unwrap().1;
                assert!(Command::decode(Bytes::copy_from_slice(line.as_bytes())).is_err());
                let lost = LostRdata::from_line(line.as_bytes()).expect("an RDATA line");
                f.handle_lost_rdata(&lost);
            }
            "!forget" => {
                let forgotten = f.forget_writer(&stream(words[1]), &name(words[2]));
                out.push(format!("forgotten {forgotten}"));
            }
            "?pos" => out.push(match f.position(&stream(words[1]), &name(words[2])) {
                Some(t) => format!("pos {t}"),
                None => "pos none".to_owned(),
            }),
            "?stream" => out.push(match f.stream_position(&stream(words[1])) {
                Some(t) => format!("stream-pos {t}"),
                None => "stream-pos none".to_owned(),
            }),
            "?queued" => out.push(format!("queued {}", f.queued_commands(&stream(words[1])))),
            "?pairs" => out.push(format!("pairs {}", f.tracked_pairs())),
            "?connected" => out.push(format!(
                "connected {}",
                f.is_writer_connected(&stream(words[1]), &name(words[2]))
            )),
            _ => {
                let command = Command::decode(Bytes::copy_from_slice(input.as_bytes()))
                    .unwrap_or_else(|e| panic!("{input}: {e}"))
                    .unwrap();
                f.handle_command(command);
            }
        }
        while let Some(event) = self.follower.poll_event() {
            if let FollowerEvent::CatchUp(request) = &event {
                self.ids.insert(request.id.get(), request.id);
            }
            out.push(render(&event));
        }
        out
    }

    /// Runs a transcript and compares every output line.
    fn run(&mut self, transcript: &str) {
        let mut expected = Vec::new();
        let mut actual = Vec::new();
        for line in transcript.lines().map(str::trim) {
            if let Some(input) = line.strip_prefix("> ") {
                expected.push(line.to_owned());
                actual.push(line.to_owned());
                actual.extend(self.input(input).into_iter().map(|o| format!("< {o}")));
            } else if line.starts_with("< ") {
                expected.push(line.to_owned());
            } else {
                assert!(
                    line.is_empty() || line.starts_with('#'),
                    "bad transcript line {line:?}"
                );
            }
        }
        assert_eq!(actual.join("\n"), expected.join("\n"));
        self.check_accounting();
    }

    fn check_accounting(&self) {
        let f = &self.follower;
        assert!(f.buffered_bytes() <= f.limits().max_buffered_bytes);
        // Configured writers are not counted: at most 5 in `deployment()`'s
        // streams a transcript uses.
        assert!(f.tracked_pairs() <= f.limits().max_tracked_pairs + 5);
    }
}

fn run(own: &str, transcript: &str) -> Script {
    let mut script = Script::new(own);
    script.run(transcript);
    script
}

// ---------------------------------------------------------------------------
// The follower's rules.

#[test]
fn own_echoes_are_ignored() {
    let script = run(
        "f1",
        r#"
        > !connect
        > POSITION caches f1 0 5
        > RDATA caches f1 6 ["x",null,1]
        > ?pos caches f1
        < pos none
        > ?pairs
        < pairs 0
        "#,
    );
    assert_eq!(script.follower.counters().own_echoes, 2);
}

#[test]
fn rdata_before_a_position_on_this_connection_is_dropped() {
    let script = run(
        "f1",
        r#"
        > !seed events w1 10
        > !connect
        > RDATA events w1 11 ["a"]
        # w1 has not announced itself on this connection: the row is dropped,
        # and the POSITION that follows finds it missing.
        > POSITION events w1 11 11
        < catch-up #1 events w1 (10, 11]
        > !page 1 {"updates":[[11,["a"]]],"upto_token":11,"limited":false}
        < rows events w1 11 ["a"] [catch-up]
        < position events w1 11
        > RDATA events w1 12 ["b"]
        < rows events w1 12 ["b"]
        # A POSITION of w1 does not let w2's rows through (Synapse tracks
        # this per stream; we track it per writer).
        > RDATA events w2 5 ["c"]
        > ?connected events w2
        < connected false
        # A new connection: every writer must announce itself again.
        > !disconnect
        > !connect
        > RDATA events w1 13 ["d"]
        > POSITION events w1 13 13
        < catch-up #2 events w1 (12, 13]
        "#,
    );
    assert_eq!(script.follower.counters().rdata_unconnected, 3);
}

#[test]
fn stale_and_duplicate_rdata_is_dropped_with_its_batch() {
    let script = run(
        "f1",
        r#"
        > !connect
        > POSITION receipts w1 0 0
        < started receipts w1 0
        > RDATA receipts w1 1 ["r1"]
        < rows receipts w1 1 ["r1"]
        > RDATA receipts w1 1 ["r1"]
        > RDATA receipts w1 batch ["old"]
        > RDATA receipts w1 0 ["older"]
        > RDATA receipts w1 2 ["r2"]
        < rows receipts w1 2 ["r2"]
        "#,
    );
    let counters = script.follower.counters();
    assert_eq!(counters.rdata_stale, 2);
    assert_eq!(counters.batch_rows_discarded, 1);
    assert_eq!(script.follower.buffered_bytes(), 0);
}

#[test]
fn batches_are_held_per_writer_until_their_numbered_row() {
    run(
        "f1",
        r#"
        > !connect
        > POSITION events w1 0 0
        < started events w1 0
        > POSITION events w2 0 0
        < started events w2 0
        > RDATA events w1 batch ["a1"]
        > RDATA events w2 batch ["b1"]
        > RDATA events w1 batch ["a2"]
        > RDATA events w2 2 ["b2"]
        < rows events w2 2 ["b1"] ["b2"]
        > RDATA events w1 1 ["a3"]
        < rows events w1 1 ["a1"] ["a2"] ["a3"]
        > ?stream events
        < stream-pos 1
        "#,
    );
}

#[test]
fn position_with_nothing_missed_advances() {
    let script = run(
        "f1",
        r#"
        > !connect
        > POSITION to_device master 5 5
        < started to_device master 5
        > POSITION to_device master 3 8
        < position to_device master 8
        # redundant: tokens of to_device only grow
        > POSITION to_device master 8 8
        > POSITION to_device master 8 9
        < position to_device master 9
        "#,
    );
    assert_eq!(script.follower.counters().positions_discarded, 1);
}

#[test]
fn a_gap_is_caught_up_in_pages_while_the_writer_waits() {
    run(
        "f1",
        r#"
        > !connect
        > POSITION events w1 10 10
        < started events w1 10
        > RDATA events w1 11 ["a"]
        < rows events w1 11 ["a"]
        > POSITION events w1 14 20
        < catch-up #1 events w1 (11, 20]
        # the writer's commands wait, in order
        > RDATA events w1 21 ["live1"]
        > RDATA events w1 batch ["live2a"]
        > RDATA events w1 22 ["live2b"]
        > ?queued events
        < queued 3
        # other writers of the stream do not wait, nor do other streams
        > POSITION events w2 0 3
        < started events w2 3
        > RDATA events w2 4 ["other"]
        < rows events w2 4 ["other"]
        > POSITION caches master 0 0
        < started caches master 0
        > !page 1 {"updates":[[12,["b"]],[12,["c"]],[15,["d"]]],"upto_token":15,"limited":true}
        < rows events w1 12 ["b"] ["c"] [catch-up]
        < rows events w1 15 ["d"] [catch-up]
        < catch-up #2 events w1 (15, 20]
        > !page 1 {"updates":[],"upto_token":20,"limited":false}
        < error: no outstanding catch-up #1
        > !page 2 {"updates":[[20,["e"]]],"upto_token":20,"limited":false}
        < rows events w1 20 ["e"] [catch-up]
        < position events w1 20
        < rows events w1 21 ["live1"]
        < rows events w1 22 ["live2a"] ["live2b"]
        > ?queued events
        < queued 0
        "#,
    );
}

#[test]
fn a_writer_restart_resets_typing() {
    run(
        "f1",
        r#"
        > !connect
        > POSITION typing w3 500 500
        < started typing w3 500
        > RDATA typing w3 501 ["!r:x",["@a:x"]]
        < rows typing w3 501 ["!r:x",["@a:x"]]
        # w3 restarted: its typing tokens start again from 0
        > POSITION typing w3 0 0
        < reset typing w3 501 -> 0
        < position typing w3 0
        > RDATA typing w3 1 ["!r:x",[]]
        < rows typing w3 1 ["!r:x",[]]
        "#,
    );
}

#[test]
fn a_reset_fetches_the_rows_of_the_new_life() {
    run(
        "f1",
        r#"
        > !connect
        > POSITION typing w3 500 500
        < started typing w3 500
        # w3 restarted and wrote up to 3 before we heard of it
        > POSITION typing w3 3 3
        < reset typing w3 500 -> 3
        < catch-up #1 typing w3 (0, 3]
        > !page 1 {"updates":[[2,["!r:x",["@b:x"]]]],"upto_token":3,"limited":false}
        < rows typing w3 2 ["!r:x",["@b:x"]] [catch-up]
        < position typing w3 3
        > RDATA typing w3 4 ["!r:x",[]]
        < rows typing w3 4 ["!r:x",[]]
        "#,
    );
}

#[test]
fn streams_whose_tokens_only_grow_never_reset() {
    let script = run(
        "f1",
        r#"
        > !seed events w1 100
        > !connect
        # a late POSITION: processed, but it neither resets nor announces
        # w1 (it says nothing of what w1 wrote since 100): w1's rows wait
        # for a POSITION that does
        > POSITION events w1 50 50
        > RDATA events w1 101 ["a"]
        > POSITION events w1 60 60
        > ?pos events w1
        < pos 100
        > POSITION events w1 102 102
        < catch-up #1 events w1 (100, 102]
        "#,
    );
    assert_eq!(script.follower.counters().resets, 0);
    assert_eq!(script.follower.counters().rdata_unconnected, 1);
}

#[test]
fn commands_from_non_writers_are_rejected_and_change_nothing() {
    let script = run(
        "f1",
        r#"
        > !seed events w1 4
        > !connect
        > RDATA events mallory 1 ["x"]
        < rejected RDATA events mallory: not a writer of this stream
        > POSITION typing w1 0 5
        < rejected POSITION typing w1: not a writer of this stream
        > POSITION events master 0 9
        < rejected POSITION events master: not a writer of this stream
        > POSITION org.example.new w1 0 5
        < rejected POSITION org.example.new w1: not a writer of this stream
        > ?pairs
        < pairs 1
        > ?pos events w1
        < pos 4
        # streams this crate does not know are master's, and pass through
        > POSITION org.example.new master 0 0
        < started org.example.new master 0
        > RDATA org.example.new master 1 {"any":["shape"]}
        < rows org.example.new master 1 {"any":["shape"]}
        > ?pairs
        < pairs 2
        "#,
    );
    assert_eq!(script.follower.counters().rejected, 4);
}

#[test]
fn tracked_pairs_are_bounded() {
    let mut script = with_limits(|limits| limits.max_tracked_pairs = 2);
    script.run(
        r#"
        > !connect
        > POSITION caches a 0 1
        < started caches a 1
        > POSITION caches b 0 1
        < started caches b 1
        # A third writer nobody configured: the idlest makes room.
        > RDATA caches b 2 ["f",null,1]
        < rows caches b 2 ["f",null,1]
        > POSITION caches c 0 1
        < forgotten caches a at 1
        < started caches c 1
        > RDATA caches c 2 ["f",null,1]
        < rows caches c 2 ["f",null,1]
        # Configured writers are always tracked, and never forgotten.
        > POSITION caches w1 0 5
        < started caches w1 5
        > POSITION caches w2 0 5
        < started caches w2 5
        > POSITION events w1 0 5
        < started events w1 5
        > ?pairs
        < pairs 5
        > POSITION caches d 0 1
        < forgotten caches b at 2
        < started caches d 1
        # With a catch-up outstanding, a writer is not forgotten.
        > POSITION caches c 9 10
        < catch-up #1 caches c (2, 10]
        > POSITION caches d 9 10
        < catch-up #2 caches d (1, 10]
        > POSITION caches e 0 1
        < rejected POSITION caches e: too many (stream, writer) pairs tracked
        > !forget caches a
        < forgotten false
        > ?pairs
        < pairs 5
        "#,
    );
    assert_eq!(script.follower.counters().writers_forgotten, 2);
    // Many names: memory does not grow.
    for i in 0..1000 {
        script.follower.handle_command(
            Command::decode(Bytes::from(format!("POSITION caches n{i} 0 1")))
                .unwrap()
                .unwrap(),
        );
    }
    assert_eq!(script.follower.tracked_pairs(), 5);
}

#[test]
fn commands_while_disconnected_and_other_commands_are_ignored() {
    let script = run(
        "f1",
        r#"
        > POSITION events w1 0 5
        > !connect
        > PING 123
        > REPLICATE
        > ?pos events w1
        < pos none
        "#,
    );
    assert_eq!(script.follower.counters().while_disconnected, 1);
    assert_eq!(script.follower.counters().ignored_commands, 1);
    assert_eq!(script.follower.counters().replicates, 1);
}

#[test]
fn catch_up_answers_that_do_not_fit_are_refused_whole() {
    run(
        "f1",
        r#"
        > !seed events w1 10
        > !connect
        > POSITION events w1 12 20
        < catch-up #1 events w1 (10, 20]
        > !page 1 {"updates":[[15,["x"]],[12,["y"]]],"upto_token":20,"limited":false}
        < error: catch-up #1: row token 12 after 15
        > !page 1 {"updates":[],"upto_token":10,"limited":true}
        < error: catch-up #1: limited page with upto 10 does not advance past 10
        > !page 1 {"updates":[[9,["x"]]],"upto_token":7,"limited":true}
        < error: catch-up #1: limited page with upto 7 does not advance past 10
        > ?pos events w1
        < pos 10
        > !failed 1
        < catch-up #2 events w1 (10, 20]
        > !page 1 {"updates":[],"upto_token":20,"limited":false}
        < error: no outstanding catch-up #1
        > !failed 1
        < error: no outstanding catch-up #1
        > !page 2 {"updates":[],"upto_token":20,"limited":false}
        < position events w1 20
        "#,
    );
}

#[test]
fn a_full_queue_is_folded_and_nothing_is_lost() {
    let mut script = with_limits(|limits| limits.max_queued_commands = 3);
    script.run(
        r#"
        > !connect
        > POSITION events w1 0 0
        < started events w1 0
        > POSITION events w2 0 0
        < started events w2 0
        > POSITION events w1 2 5
        < catch-up #1 events w1 (0, 5]
        > RDATA events w1 6 ["a6"]
        > RDATA events w1 7 ["a7"]
        > RDATA events w1 batch ["a8a"]
        > ?queued events
        < queued 3
        # other writers go on meanwhile
        > RDATA events w2 1 ["b1"]
        < rows events w2 1 ["b1"]
        # the fourth held command overflows: the writer's queue becomes one
        # summary (up to 7, a batch open)
        > RDATA events w1 batch ["a8b"]
        > ?queued events
        < queued 0
        > RDATA events w1 8 ["a8c"]
        > RDATA events w1 9 ["a9"]
        > !page 1 {"updates":[[3,["a3"]]],"upto_token":5,"limited":false}
        < rows events w1 3 ["a3"] [catch-up]
        < position events w1 5
        # from the last row, not the position: rows in (3, 5] would refute it
        < catch-up #2 events w1 (3, 7]
        > !page 2 {"updates":[[6,["a6"]],[7,["a7"]]],"upto_token":7,"limited":false}
        < rows events w1 6 ["a6"] [catch-up]
        < rows events w1 7 ["a7"] [catch-up]
        < position events w1 7
        # the batch of token 8 lost rows in the fold: fetched whole
        < catch-up #3 events w1 (7, 8]
        > !page 3 {"updates":[[8,["a8a"]],[8,["a8b"]],[8,["a8c"]]],"upto_token":8,"limited":false}
        < rows events w1 8 ["a8a"] ["a8b"] ["a8c"] [catch-up]
        < position events w1 8
        < rows events w1 9 ["a9"]
        "#,
    );
    assert_eq!(script.follower.counters().queue_overflows, 1);
    assert_eq!(script.follower.buffered_bytes(), 0);
}

#[test]
fn a_full_batch_is_cut_and_fetched_whole() {
    let mut script = with_limits(|limits| limits.max_batch_rows = 2);
    script.run(
        r#"
        > !connect
        > POSITION caches master 0 0
        < started caches master 0
        > RDATA caches master batch ["a"]
        > RDATA caches master batch ["b"]
        > RDATA caches master batch ["c"]
        > RDATA caches master batch ["d"]
        > RDATA caches master 1 ["e"]
        < catch-up #1 caches master (0, 1]
        > RDATA caches master 2 ["f"]
        > !page 1 {"updates":[[1,["a"]],[1,["b"]],[1,["c"]],[1,["d"]],[1,["e"]]],"upto_token":1,"limited":false}
        < rows caches master 1 ["a"] ["b"] ["c"] ["d"] ["e"] [catch-up]
        < position caches master 1
        < rows caches master 2 ["f"]
        "#,
    );
    assert_eq!(script.follower.counters().batch_overflows, 1);
    assert_eq!(script.follower.buffered_bytes(), 0);
}

#[test]
fn the_byte_budget_bounds_batches_and_queues() {
    let mut script = with_limits(|limits| limits.max_buffered_bytes = 20);
    script.run(
        r#"
        > !connect
        > POSITION caches master 0 0
        < started caches master 0
        > RDATA caches master batch ["0123456789"]
        > ?pairs
        < pairs 1
        > RDATA caches master batch ["0123456789"]
        > RDATA caches master 1 ["x"]
        < catch-up #1 caches master (0, 1]
        > RDATA caches master 2 ["0123456789"]
        > ?queued caches
        < queued 1
        # over budget: 2 and 3 are folded into "up to 3"
        > RDATA caches master 3 ["0123456789"]
        > ?queued caches
        < queued 0
        > !page 1 {"updates":[[1,["0123456789"]],[1,["0123456789"]],[1,["x"]]],"upto_token":1,"limited":false}
        < rows caches master 1 ["0123456789"] ["0123456789"] ["x"] [catch-up]
        < position caches master 1
        < catch-up #2 caches master (1, 3]
        "#,
    );
}

#[test]
fn a_disconnection_during_a_catch_up_drops_what_waited() {
    let script = run(
        "f1",
        r#"
        > !seed events w1 0
        > !connect
        > POSITION events w1 2 3
        < catch-up #1 events w1 (0, 3]
        > RDATA events w1 4 ["d"]
        > !disconnect
        > !connect
        > RDATA events w1 5 ["e"]
        # the catch-up is still good; w1 must announce itself again
        > !page 1 {"updates":[[1,["a"]]],"upto_token":3,"limited":false}
        < rows events w1 1 ["a"] [catch-up]
        < position events w1 3
        > ?connected events w1
        < connected false
        > POSITION events w1 5 5
        < catch-up #2 events w1 (1, 5]
        "#,
    );
    assert_eq!(script.follower.counters().dropped_on_disconnect, 1);
    assert_eq!(script.follower.counters().rdata_unconnected, 1);
}

#[test]
fn a_first_position_of_an_unknown_writer_is_adopted() {
    run(
        "f1",
        r#"
        > !connect
        > RDATA receipts w2 7 ["x"]
        > POSITION receipts w2 7 7
        < started receipts w2 7
        > RDATA receipts w2 8 ["y"]
        < rows receipts w2 8 ["y"]
        "#,
    );
}

#[test]
fn stream_position_is_the_minimum_over_writers() {
    let mut script = Script::new("f1");
    script.run(
        r#"
        > ?stream events
        < stream-pos none
        > !seed events w1 5
        > ?stream events
        < stream-pos 5
        > !seed events w2 3
        > ?stream events
        < stream-pos 3
        > !connect
        > POSITION events w2 3 9
        < catch-up #1 events w2 (3, 9]
        > !page 1 {"updates":[],"upto_token":9,"limited":false}
        < position events w2 9
        > ?stream events
        < stream-pos 5
        > POSITION caches a 0 4
        < started caches a 4
        > POSITION caches b 0 2
        < started caches b 2
        > ?stream caches
        < stream-pos 2
        "#,
    );
    // What the application persists: the last row delivered, not what a
    // POSITION claimed (w2 announced 9 but delivered nothing above 3).
    assert_eq!(
        script.follower.position(&StreamName::Events, &name("w2")),
        Some(Token(9))
    );
    let mut positions: Vec<String> = script
        .follower
        .resume_points()
        .map(|(stream, writer, token)| format!("{stream} {writer} {token}"))
        .collect();
    positions.sort();
    assert_eq!(
        positions,
        ["caches a 4", "caches b 2", "events w1 5", "events w2 3"]
    );
}

#[test]
fn seeding_refuses_what_cannot_be_tracked() {
    let mut f = Follower::new(name("w1"), deployment());
    assert!(matches!(
        f.set_position(&StreamName::Events, &name("w1"), Token(1)),
        Err(SeedError::OwnName(_))
    ));
    assert!(matches!(
        f.set_position(&StreamName::Typing, &name("w2"), Token(1)),
        Err(SeedError::Rejected { .. })
    ));
    f.set_position(&StreamName::Events, &name("w2"), Token(1))
        .unwrap();
    f.connected();
    f.handle_command(
        Command::decode(Bytes::from_static(b"POSITION events w2 5 6"))
            .unwrap()
            .unwrap(),
    );
    assert!(matches!(f.poll_event(), Some(FollowerEvent::CatchUp(_))));
    assert!(matches!(
        f.set_position(&StreamName::Events, &name("w2"), Token(1)),
        Err(SeedError::CatchUpOutstanding(_))
    ));
    assert!(!f.forget_writer(&StreamName::Events, &name("w2")));
    assert_eq!(f.outstanding_catch_ups().len(), 1);
}

// ---------------------------------------------------------------------------
// Cases from Synapse's history.

#[test]
fn history_batch_cut_by_a_disconnect() {
    let script = run(
        "f1",
        r#"
        > !connect
        > POSITION caches master 7 7
        < started caches master 7
        > RDATA caches master batch ["a",null,1]
        > RDATA caches master batch ["b",null,1]
        > !disconnect
        > !connect
        # the batch's last rows went out while we were away
        > RDATA caches master 9 ["c",null,2]
        > POSITION caches master 9 9
        < catch-up #1 caches master (7, 9]
        > !page 1 {"updates":[[8,["a",null,1]],[8,["b",null,1]],[8,["z",null,1]],[9,["c",null,2]]],"upto_token":9,"limited":false}
        < rows caches master 8 ["a",null,1] ["b",null,1] ["z",null,1] [catch-up]
        < rows caches master 9 ["c",null,2] [catch-up]
        < position caches master 9
        "#,
    );
    assert_eq!(script.follower.counters().batch_rows_discarded, 2);
}

#[test]
fn history_a_batch_whose_first_rows_came_before_the_position() {
    run(
        "f1",
        r#"
        > !seed caches master 7
        > !connect
        > RDATA caches master batch ["a"]
        > POSITION caches master 7 7
        # applying the numbered row alone would lose ["a"]: fetch the batch
        > RDATA caches master 8 ["b"]
        < catch-up #1 caches master (7, 8]
        "#,
    );
}

#[test]
fn history_duplicated_and_reordered_commands_across_writers() {
    run(
        "f1",
        r#"
        > !connect
        > POSITION events w2 0 0
        < started events w2 0
        > POSITION events w1 0 0
        < started events w1 0
        > RDATA events w2 2 ["w2-2"]
        < rows events w2 2 ["w2-2"]
        > RDATA events w1 1 ["w1-1"]
        < rows events w1 1 ["w1-1"]
        > RDATA events w2 2 ["w2-2"]
        > RDATA events w2 4 ["w2-4"]
        < rows events w2 4 ["w2-4"]
        > RDATA events w1 1 ["w1-1"]
        > POSITION events w2 0 0
        > RDATA events w1 3 ["w1-3"]
        < rows events w1 3 ["w1-3"]
        > POSITION events w1 3 5
        < position events w1 5
        > POSITION events w1 3 5
        > RDATA events w1 3 ["w1-3"]
        > ?stream events
        < stream-pos 4
        "#,
    );
}

#[test]
fn history_a_position_storm_from_20_writers() {
    let mut f = Follower::new(name("f1"), deployment());
    for i in 0..20 {
        f.set_position(&StreamName::Caches, &name(&format!("c{i:02}")), Token(0))
            .unwrap();
    }
    f.connected();
    // Three rounds of every writer answering REPLICATE; writer i says it
    // wrote nothing between i/2 and i, so from c02 on rows are missing,
    // and c01's move is checked (as every writer's first move on a new
    // connection).
    for _ in 0..3 {
        for i in 0..20 {
            let line = format!("POSITION caches c{i:02} {} {i}", i / 2);
            f.handle_command(Command::decode(Bytes::from(line)).unwrap().unwrap());
        }
    }
    let mut caught_up = 0;
    loop {
        let mut requests = Vec::new();
        while let Some(event) = f.poll_event() {
            if let FollowerEvent::CatchUp(request) = event {
                requests.push(request);
            }
        }
        if requests.is_empty() {
            break;
        }
        // Each writer's catch-up runs at once, one per writer.
        assert_eq!(f.outstanding_catch_ups(), requests);
        for request in requests {
            assert_eq!(request.from, Token(0));
            let page = CatchUpPage {
                updates: Vec::new(),
                upto: request.to,
                limited: false,
            };
            f.handle_catch_up(request.id, page).unwrap();
            caught_up += 1;
        }
    }
    assert_eq!(caught_up, 19);
    for i in 0..20 {
        assert_eq!(
            f.position(&StreamName::Caches, &name(&format!("c{i:02}"))),
            Some(Token(i))
        );
        assert!(f.is_writer_connected(&StreamName::Caches, &name(&format!("c{i:02}"))));
    }
    assert_eq!(f.stream_position(&StreamName::Caches), Some(Token(0)));
    // c00 never moves, so it stays to be checked: its repeats are
    // processed rather than discarded.
    assert_eq!(f.counters().positions_discarded, 38);
    assert_eq!(f.tracked_pairs(), 20);
}

#[test]
fn history_replicate_before_subscription() {
    let registry = deployment();
    let t0 = Instant::now();
    let mut w1 = Writer::new(name("w1"), registry.clone());
    w1.advance(&StreamName::Events, Token(10)).unwrap();
    w1.connected(t0);
    let lost: Vec<Command> = std::iter::from_fn(|| w1.poll_command()).collect();
    assert_eq!(
        lost.len(),
        1,
        "w1's announcement, made before f1 subscribed"
    );

    let mut f1_writer = Writer::new(name("f1"), registry.clone());
    let mut f1 = Follower::new(name("f1"), registry);
    f1.set_position(&StreamName::Events, &name("w1"), Token(10))
        .unwrap();
    // The bug: REPLICATE published before the subscription was confirmed.
    f1_writer.connected(t0);
    f1_writer.request_replicate(t0);
    assert_eq!(f1_writer.poll_command(), Some(Command::Replicate));
    w1.handle_replicate(t0);
    let answers: Vec<Command> = std::iter::from_fn(|| w1.poll_command()).collect();
    assert_eq!(
        answers.len(),
        1,
        "answered, but f1 is not subscribed yet: lost"
    );
    f1.connected();

    // w1's rows are dropped: it never announced itself on f1's connection.
    w1.write(
        &StreamName::Events,
        Token(11),
        [(Token(11), RawRow::new(&b"[1]"[..]).unwrap())],
    )
    .unwrap();
    while let Some(command) = w1.poll_command() {
        f1.handle_command(command);
    }
    assert_eq!(f1.poll_event(), None);
    assert!(!f1.is_writer_connected(&StreamName::Events, &name("w1")));

    // Asking again (rate limited: one second later) heals it.
    let t1 = t0 + Duration::from_millis(100);
    f1_writer.request_replicate(t1);
    assert_eq!(f1_writer.poll_command(), None);
    let due = f1_writer.poll_timeout().unwrap();
    assert_eq!(due, t0 + Duration::from_secs(1));
    f1_writer.handle_timeout(due);
    assert_eq!(f1_writer.poll_command(), Some(Command::Replicate));
    w1.handle_replicate(due);
    while let Some(command) = w1.poll_command() {
        f1.handle_command(command);
    }
    let Some(FollowerEvent::CatchUp(request)) = f1.poll_event() else {
        panic!()
    };
    assert_eq!((request.from, request.to), (Token(10), Token(11)));
    assert_eq!(
        request.path("txn"),
        "/_synapse/replication/get_repl_stream_updates/events/txn?from_token=10&upto_token=11"
    );
}

#[test]
fn deployment_caches_answers_beyond_the_range_are_accepted() {
    // Synapse 1.163.2's event persister, asked for caches (93, 104], answers
    // upto_token 104 with rows up to 106: `get_all_updated_caches` does not
    // bound by the current token, on purpose. The rows above 104 reach the
    // follower live, after the POSITION that asked: each is delivered once.
    let script = run(
        "f1",
        r#"
        > !seed caches w1 93
        > !connect
        > POSITION caches w1 100 104
        < catch-up #1 caches w1 (93, 104]
        > RDATA caches w1 105 ["k5",null,1]
        > RDATA caches w1 106 ["k6",null,1]
        > !page 1 {"updates":[[94,["k1",null,1]],[104,["k4",null,1]],[105,["k5",null,1]],[106,["k6",null,1]]],"upto_token":104,"limited":false}
        < rows caches w1 94 ["k1",null,1] [catch-up]
        < rows caches w1 104 ["k4",null,1] [catch-up]
        < position caches w1 104
        < rows caches w1 105 ["k5",null,1]
        < rows caches w1 106 ["k6",null,1]
        # a limited page may even reach beyond the range asked for
        > POSITION caches w1 110 120
        < catch-up #2 caches w1 (106, 120]
        > !page 2 {"updates":[[107,["a",null,1]],[121,["b",null,1]]],"upto_token":121,"limited":true}
        < rows caches w1 107 ["a",null,1] [catch-up]
        < position caches w1 120
        # catch-ups start at the last row delivered: 118 is new (a row
        # committed late, say), 107 is not
        > POSITION caches w1 125 130
        < catch-up #3 caches w1 (107, 130]
        > !page 3 {"updates":[[107,["a",null,1]],[118,["c",null,1]],[121,["b",null,1]],[126,["d",null,1]]],"upto_token":126,"limited":true}
        < rows caches w1 118 ["c",null,1] [catch-up]
        < rows caches w1 121 ["b",null,1] [catch-up]
        < rows caches w1 126 ["d",null,1] [catch-up]
        < catch-up #4 caches w1 (126, 130]
        "#,
    );
    assert_eq!(script.follower.counters().catch_up_rows_skipped, 4);
}

#[test]
fn a_failing_catch_up_holds_back_only_its_writer() {
    run(
        "f1",
        r#"
        > !connect
        > POSITION caches w1 10 10
        < started caches w1 10
        > POSITION caches w2 10 10
        < started caches w2 10
        > POSITION events w1 0 0
        < started events w1 0
        > POSITION caches w1 15 20
        < catch-up #1 caches w1 (10, 20]
        > !failed 1
        < catch-up #2 caches w1 (10, 20]
        > RDATA caches w1 21 ["x",null,1]
        > RDATA caches w2 11 ["y",null,1]
        < rows caches w2 11 ["y",null,1]
        > RDATA events w1 1 ["ev","$a"]
        < rows events w1 1 ["ev","$a"]
        > !failed 2
        < catch-up #3 caches w1 (10, 20]
        > POSITION caches w2 15 18
        < catch-up #4 caches w2 (11, 18]
        > !page 4 {"updates":[],"upto_token":18,"limited":false}
        < position caches w2 18
        > ?queued caches
        < queued 1
        > !page 3 {"updates":[],"upto_token":20,"limited":false}
        < position caches w1 20
        < rows caches w1 21 ["x",null,1]
        "#,
    );
}

#[test]
fn deployment_a_writer_blip_is_caught_up_after_replicate() {
    // What Synapse 1.163.2's event persister w1 publishes after losing its
    // own Redis connections while it persisted events 12 to 14 (those RDATA
    // never reached Redis): REPLICATE, RDATA at its latest token, then
    // POSITION prev=new. w2 answers the REPLICATE with its position, which
    // proves nothing (any process may send it ahead of w2's): w2's next
    // row is checked too.
    let script = run(
        "f1",
        r#"
        > !connect
        > POSITION events w1 10 10
        < started events w1 10
        > POSITION events w2 30 30
        < started events w2 30
        > RDATA events w1 11 ["ev","$11"]
        < rows events w1 11 ["ev","$11"]
        > REPLICATE
        > RDATA events w1 15 ["ev","$15"]
        < catch-up #1 events w1 (11, 15]
        > POSITION events w1 15 15
        > POSITION events w2 30 30
        > RDATA events w2 31 ["ev","$31"]
        < catch-up #2 events w2 (30, 31]
        > !page 1 {"updates":[[12,["ev","$12"]],[13,["ev","$13"]],[14,["ev","$14"]],[15,["ev","$15"]]],"upto_token":15,"limited":false}
        < rows events w1 12 ["ev","$12"] [catch-up]
        < rows events w1 13 ["ev","$13"] [catch-up]
        < rows events w1 14 ["ev","$14"] [catch-up]
        < rows events w1 15 ["ev","$15"] [catch-up]
        < position events w1 15
        > !page 2 {"updates":[[31,["ev","$31"]]],"upto_token":31,"limited":false}
        < rows events w2 31 ["ev","$31"] [catch-up]
        < position events w2 31
        # once checked, the writer's rows apply live again
        > RDATA events w1 16 ["ev","$16"]
        < rows events w1 16 ["ev","$16"]
        "#,
    );
    assert_eq!(script.follower.counters().unproven_checked, 2);
}

#[test]
fn after_replicate_a_position_is_checked_whatever_its_prev() {
    run(
        "f1",
        r#"
        > !connect
        > POSITION events w1 10 10
        < started events w1 10
        # without a REPLICATE, prev <= current <= new proves nothing missed
        > POSITION events w1 10 12
        < position events w1 12
        > REPLICATE
        # after one it does not: the writer may have lost rows it published
        # (fetched from the last row: 12 was only claimed)
        > POSITION events w1 12 14
        < catch-up #1 events w1 (10, 14]
        > !page 1 {"updates":[[13,["ev","$13"]]],"upto_token":14,"limited":false}
        < rows events w1 13 ["ev","$13"] [catch-up]
        < position events w1 14
        # nor does a POSITION at the follower's own position, which any
        # process may send ahead of the writer's: as the position rests on
        # a claim (nothing was delivered at 14), it is checked at once, and
        # as it moved nothing, the writer's next move is checked too
        > REPLICATE
        > POSITION events w1 14 14
        < catch-up #2 events w1 (13, 14]
        > POSITION events w1 14 16
        > !page 2 {"updates":[],"upto_token":14,"limited":false}
        < position events w1 14
        < catch-up #3 events w1 (13, 16]
        > !page 3 {"updates":[],"upto_token":16,"limited":false}
        < position events w1 16
        > POSITION events w1 16 17
        < position events w1 17
        "#,
    );
}

#[test]
fn a_replicate_keeps_its_place_among_held_commands() {
    // w1's commands wait behind its catch-up; the REPLICATE between them
    // applies to what came after it, not before.
    let mut script = with_limits(|limits| limits.max_queued_commands = 3);
    script.run(
        r#"
        > !seed events w1 0
        > !connect
        > POSITION events w1 0 0
        > POSITION events w1 2 5
        < catch-up #1 events w1 (0, 5]
        > RDATA events w1 6 ["a6"]
        > REPLICATE
        > RDATA events w1 9 ["a9"]
        > !page 1 {"updates":[[3,["a3"]]],"upto_token":5,"limited":false}
        < rows events w1 3 ["a3"] [catch-up]
        < position events w1 5
        < rows events w1 6 ["a6"]
        # from w1's last row: 4 and 5 were only claimed empty
        < catch-up #2 events w1 (3, 9]
        > RDATA events w1 10 ["a10"]
        > !page 2 {"updates":[[7,["a7"]],[9,["a9"]]],"upto_token":9,"limited":false}
        < rows events w1 7 ["a7"] [catch-up]
        < rows events w1 9 ["a9"] [catch-up]
        < position events w1 9
        < rows events w1 10 ["a10"]
        # folded: a REPLICATE after the writer's last folded token still
        # makes its next command checked
        > POSITION events w1 12 15
        < catch-up #3 events w1 (10, 15]
        > RDATA events w1 16 ["a16"]
        > RDATA events w1 17 ["a17"]
        > RDATA events w1 18 ["a18"]
        > REPLICATE
        > RDATA events w1 21 ["a21"]
        > !page 3 {"updates":[],"upto_token":15,"limited":false}
        < position events w1 15
        < catch-up #4 events w1 (10, 18]
        > !page 4 {"updates":[[16,["a16"]],[17,["a17"]],[18,["a18"]]],"upto_token":18,"limited":false}
        < rows events w1 16 ["a16"] [catch-up]
        < rows events w1 17 ["a17"] [catch-up]
        < rows events w1 18 ["a18"] [catch-up]
        < position events w1 18
        < catch-up #5 events w1 (18, 21]
        "#,
    );
    assert_eq!(script.follower.counters().queue_overflows, 1);
}

#[test]
fn a_row_that_cannot_be_read_is_fetched_not_stepped_over() {
    let script = run(
        "f1",
        r#"
        > !connect
        > POSITION events w1 10 10
        < started events w1 10
        > POSITION events w2 20 20
        < started events w2 20
        # the writer and token are readable: the row is fetched at once
        > !lost RDATA events w1 11 ["ev",NaN]
        < catch-up #1 events w1 (10, 11]
        > RDATA events w1 12 ["ev","$12"]
        > !page 1 {"updates":[[11,["ev","$11"]]],"upto_token":11,"limited":false}
        < rows events w1 11 ["ev","$11"] [catch-up]
        < position events w1 11
        < rows events w1 12 ["ev","$12"]
        # a lost batch row makes its batch fetched whole
        > RDATA events w1 batch ["a"]
        > !lost RDATA events w1 batch ["b",
        > RDATA events w1 13 ["c"]
        < catch-up #2 events w1 (12, 13]
        > !page 2 {"updates":[[13,["a"]],[13,["b"]],[13,["c"]]],"upto_token":13,"limited":false}
        < rows events w1 13 ["a"] ["b"] ["c"] [catch-up]
        < position events w1 13
        # a lost row at or below the position was delivered already
        > !lost RDATA events w1 12 ["ev",
        > RDATA events w1 14 ["d"]
        < rows events w1 14 ["d"]
        # no token: the writer has its next move checked, not its row
        > !lost RDATA events w2 x1 ["ev"]
        > RDATA events w2 22 ["e"]
        < catch-up #3 events w2 (20, 22]
        > RDATA events w1 15 ["f"]
        < rows events w1 15 ["f"]
        # no writer: every writer of the stream
        > !page 3 {"updates":[[21,["e21"]],[22,["e"]]],"upto_token":22,"limited":false}
        < rows events w2 21 ["e21"] [catch-up]
        < rows events w2 22 ["e"] [catch-up]
        < position events w2 22
        > !lost RDATA events  16 ["ev"]
        > RDATA events w2 23 ["g"]
        < catch-up #4 events w2 (22, 23]
        > RDATA events w1 16 ["h"]
        < catch-up #5 events w1 (15, 16]
        # ...but not writers of other streams
        > POSITION caches master 0 0
        < started caches master 0
        > !lost RDATA events
        > RDATA caches master 1 ["k",null,1]
        < rows caches master 1 ["k",null,1]
        "#,
    );
    let counters = script.follower.counters();
    assert_eq!(counters.rdata_lost, 3);
    assert_eq!(counters.rdata_unattributed, 3);
}

#[test]
fn a_forged_announcement_before_the_writer_s_own_hides_no_row() {
    // After the follower reconnects, a forged POSITION at its own position
    // reaches it before w1's answer, and w1's next row comes before that
    // answer too: rows 12 to 14, published while the follower was away,
    // are fetched all the same.
    run(
        "f1",
        r#"
        > !connect
        > POSITION events w1 10 10
        < started events w1 10
        > RDATA events w1 11 ["ev","$11"]
        < rows events w1 11 ["ev","$11"]
        > !disconnect
        > !connect
        > POSITION events w1 11 11
        > ?connected events w1
        < connected true
        > RDATA events w1 15 ["ev","$15"]
        < catch-up #1 events w1 (11, 15]
        > !page 1 {"updates":[[12,["ev","$12"]],[13,["ev","$13"]],[14,["ev","$14"]],[15,["ev","$15"]]],"upto_token":15,"limited":false}
        < rows events w1 12 ["ev","$12"] [catch-up]
        < rows events w1 13 ["ev","$13"] [catch-up]
        < rows events w1 14 ["ev","$14"] [catch-up]
        < rows events w1 15 ["ev","$15"] [catch-up]
        < position events w1 15
        # checked: its rows apply live again
        > RDATA events w1 16 ["ev","$16"]
        < rows events w1 16 ["ev","$16"]
        # the same after a REPLICATE, with an announcement claiming the
        # range above: fetched
        > REPLICATE
        > POSITION events w1 16 18
        < catch-up #2 events w1 (16, 18]
        "#,
    );
}

#[test]
fn a_forged_claim_the_writer_then_reaches_hides_no_row() {
    // A forged POSITION claims (2, 18] empty; w1 then really writes there
    // and reaches 18, while the follower is away. On the new connection
    // w1 announces 18, where the forged claim put it: its position rests
    // on a claim above its last row, so it is checked at once.
    run(
        "f1",
        r#"
        > !connect
        > POSITION events w1 2 2
        < started events w1 2
        > POSITION events w1 2 18
        < position events w1 18
        > !disconnect
        > !connect
        > POSITION events w1 18 18
        < catch-up #1 events w1 (2, 18]
        > !page 1 {"updates":[[5,["ev","$5"]],[18,["ev","$18"]]],"upto_token":18,"limited":false}
        < rows events w1 5 ["ev","$5"] [catch-up]
        < rows events w1 18 ["ev","$18"] [catch-up]
        < position events w1 18
        "#,
    );
}

#[test]
fn a_forged_row_that_closes_a_batch_repeats_none_of_its_rows() {
    // A row forged ahead closes w1's open batch: its rows are delivered
    // with it. w1's own numbered row then comes below it, and its rows
    // are fetched: the batch's rows, first at that token in the answer,
    // are not delivered again.
    run(
        "f1",
        r#"
        > !connect
        > POSITION events w1 10 10
        < started events w1 10
        > RDATA events w1 batch ["b1"]
        > RDATA events w1 batch ["b2"]
        > RDATA events w1 14 ["forged"]
        < rows events w1 14 ["b1"] ["b2"] ["forged"]
        > RDATA events w1 11 ["a11"]
        < catch-up #1 events w1 (10, 11]
        > !page 1 {"updates":[[11,["b1"]],[11,["b2"]],[11,["a11"]]],"upto_token":11,"limited":false}
        < rows events w1 11 ["a11"] [catch-up]
        < position events w1 14
        # below the forged row: fetched, as every row of w1's there
        > RDATA events w1 12 ["a12"]
        < catch-up #2 events w1 (11, 12]
        > !page 2 {"updates":[[12,["a12"]]],"upto_token":12,"limited":false}
        < rows events w1 12 ["a12"] [catch-up]
        < position events w1 14
        "#,
    );
}

#[test]
fn a_forged_claim_whose_refuting_rows_were_lost_hides_no_row() {
    // A forged POSITION claims (11, 20] empty; w1's rows 12 and 13, which
    // would refute it, are lost with the connection. The catch-up on the
    // new connection starts at the last row delivered, not at the claim.
    run(
        "f1",
        r#"
        > !connect
        > POSITION events w1 10 10
        < started events w1 10
        > RDATA events w1 11 ["ev","$11"]
        < rows events w1 11 ["ev","$11"]
        > POSITION events w1 11 20
        < position events w1 20
        > !disconnect
        > !connect
        > POSITION events w1 21 21
        < catch-up #1 events w1 (11, 21]
        > !page 1 {"updates":[[12,["ev","$12"]],[13,["ev","$13"]]],"upto_token":21,"limited":false}
        < rows events w1 12 ["ev","$12"] [catch-up]
        < rows events w1 13 ["ev","$13"] [catch-up]
        < position events w1 21
        "#,
    );
}

#[test]
fn a_forged_row_ahead_hides_no_row_lost_with_a_connection() {
    // A forged row lands ahead of w1 and jumps over tokens w1 had not
    // reached. The follower's connection drops while w1 writes in them;
    // w1's answer to the follower's REPLICATE says it was at 6 (a
    // writer's prev is never below a row it published), inside what the
    // forged row jumped over: its rows up to there are fetched, not
    // stepped over as `prev <= current` would.
    let script = run(
        "master",
        r#"
        > !connect
        > POSITION caches w1 0 0
        < started caches w1 0
        > RDATA caches w1 12 ["forged"]
        < rows caches w1 12 ["forged"]
        > !disconnect
        > !connect
        > POSITION caches w1 6 13
        < catch-up #1 caches w1 (0, 13]
        > !page 1 {"updates":[[6,["c","6a"]],[6,["c","6b"]]],"upto_token":13,"limited":false}
        < rows caches w1 6 ["c","6a"] ["c","6b"] [catch-up]
        < position caches w1 13
        # the writer answered for every token up to 13: its rows there
        # are stale now, and its next POSITIONs fetch nothing
        > RDATA caches w1 6 ["c","6b"]
        > POSITION caches w1 13 14
        < position caches w1 14
        > RDATA caches w1 15 ["c","15"]
        < rows caches w1 15 ["c","15"]
        "#,
    );
    assert_eq!(script.follower.counters().claims_refuted, 1);
    assert_eq!(
        script.follower.resume_point(&stream("caches"), &name("w1")),
        Some(Token(15))
    );
}

#[test]
fn a_catch_up_settles_the_tokens_a_forged_row_jumped_over() {
    // w1 moves inside what a forged row jumped over: fetched (nothing is
    // there). An answer with no rows settles nothing (Synapse's writers
    // confirm whatever range they are asked): the next catch-up starts
    // at the bottom of what the forged row jumped over again.
    run(
        "master",
        r#"
        > !connect
        > POSITION caches w1 0 0
        < started caches w1 0
        > RDATA caches w1 12 ["forged"]
        < rows caches w1 12 ["forged"]
        > POSITION caches w1 0 6
        < catch-up #1 caches w1 (0, 6]
        > !page 1 {"updates":[],"upto_token":6,"limited":false}
        < position caches w1 12
        # nothing in (6, 13], says w1, where a row was delivered: one of
        # the two was forged, and w1 settles it
        > POSITION caches w1 6 13
        < catch-up #2 caches w1 (0, 13]
        > !page 2 {"updates":[],"upto_token":13,"limited":false}
        < position caches w1 13
        > POSITION caches w1 13 14
        < position caches w1 14
        > RDATA caches w1 15 ["c","15"]
        < rows caches w1 15 ["c","15"]
        "#,
    );
}

#[test]
fn a_claim_that_contradicts_a_row_is_fetched_not_taken() {
    // A forged POSITION claims (2, 9] empty and comes twice; the first
    // one's catch-up finds w1 at 3, with a row there. The second, held
    // behind it, is refuted by that row: taken, it would have hidden
    // w1's next rows when a lost connection took them (w1 then only
    // announces 9 9).
    let script = run(
        "w2",
        r#"
        > !seed events w1 0
        > !connect
        > POSITION events w1 0 0
        > POSITION events w1 2 9
        < catch-up #1 events w1 (0, 9]
        > POSITION events w1 2 9
        > !page 1 {"updates":[[1,["ev","$1"]],[3,["ev","$3"]]],"upto_token":3,"limited":false}
        < rows events w1 1 ["ev","$1"] [catch-up]
        < rows events w1 3 ["ev","$3"] [catch-up]
        < position events w1 3
        < catch-up #2 events w1 (3, 9]
        > !page 2 {"updates":[],"upto_token":3,"limited":false}
        < position events w1 3
        # w1 writes 4 to 9; the follower's connection drops meanwhile
        > !disconnect
        > !connect
        > POSITION events w1 9 9
        < catch-up #3 events w1 (3, 9]
        > !page 3 {"updates":[[4,["ev","$4"]],[9,["ev","$9"]]],"upto_token":9,"limited":false}
        < rows events w1 4 ["ev","$4"] [catch-up]
        < rows events w1 9 ["ev","$9"] [catch-up]
        < position events w1 9
        "#,
    );
    assert_eq!(script.follower.counters().claims_refuted, 3);
}

#[test]
fn a_forged_row_inside_what_another_jumped_over_hides_no_row() {
    // Two forged rows just ahead of w1, the higher first. The lower one
    // lands inside what the first jumped over, below it: one of the two
    // was forged (w1's rows come in order). Taken as it comes, it would
    // make w1's rows below it stale; the writer's rows up to it are
    // fetched instead.
    let script = run(
        "master",
        r#"
        > !connect
        > POSITION caches w1 0 0
        < started caches w1 0
        > RDATA caches w1 5 ["forged"]
        < rows caches w1 5 ["forged"]
        > RDATA caches w1 4 ["forged"]
        < catch-up #1 caches w1 (0, 4]
        # w1 is at 3: its rows there are fetched
        > !page 1 {"updates":[[1,["c","1"]],[2,["c","2"]]],"upto_token":3,"limited":false}
        < rows caches w1 1 ["c","1"] [catch-up]
        < rows caches w1 2 ["c","2"] [catch-up]
        < position caches w1 5
        # and come live too: delivered once
        > RDATA caches w1 1 ["c","1"]
        > RDATA caches w1 2 ["c","2"]
        # nothing in (2, 6], says w1, where a row was delivered
        > POSITION caches w1 2 6
        < catch-up #2 caches w1 (2, 6]
        > !page 2 {"updates":[],"upto_token":6,"limited":false}
        < position caches w1 6
        > RDATA caches w1 7 ["c","7"]
        < rows caches w1 7 ["c","7"]
        "#,
    );
    assert_eq!(script.follower.counters().claims_refuted, 3);
}

#[test]
fn a_contradiction_with_nothing_between_asks_for_nothing() {
    // A claim ahead of w1's last row (2, above its row at 1), then a
    // forged POSITION whose prev lies below that row: the claim is refuted
    // back to the row, which is where the forged POSITION ends, so there
    // is nothing to fetch: no catch-up for the empty range (1, 1].
    let script = run(
        "master",
        r#"
        > !connect
        > POSITION caches w1 0 0
        < started caches w1 0
        > RDATA caches w1 1 ["c","1"]
        < rows caches w1 1 ["c","1"]
        > POSITION caches w1 1 2
        < position caches w1 2
        > POSITION caches w1 0 1
        < position caches w1 1
        > RDATA caches w1 3 ["c","3"]
        < rows caches w1 3 ["c","3"]
        "#,
    );
    assert_eq!(script.follower.counters().claims_refuted, 2);
    assert_eq!(script.follower.counters().catch_ups_requested, 0);
}

#[test]
fn a_far_claim_that_synapse_confirms_hides_no_row() {
    // What Synapse 1.163.2's persisters do after one forged `POSITION
    // events w1 0 i64::MAX` (tests/synapse_multi_writer.rs): w1's
    // catch-up endpoint confirms the whole range it is asked (with the
    // rows it has), w2 adopts the claim and announces it as its own, and
    // both then publish no row below it: their rows reach the follower
    // only through their next announcements and catch-ups.
    run(
        "master",
        r#"
        > !connect
        > POSITION events w1 0 0
        < started events w1 0
        > POSITION events w2 0 0
        < started events w2 0
        > RDATA events w1 1 ["ev","$1"]
        < rows events w1 1 ["ev","$1"]
        > RDATA events w2 2 ["ev","$2"]
        < rows events w2 2 ["ev","$2"]
        > POSITION events w1 0 9223372036854775807
        < catch-up #1 events w1 (1, 9223372036854775807]
        > !page 1 {"updates":[],"upto_token":9223372036854775807,"limited":false}
        < position events w1 1
        > POSITION events w2 2 9223372036854775807
        # from the bottom of what w2's row 2 jumped over
        < catch-up #2 events w2 (0, 9223372036854775807]
        > !page 2 {"updates":[[2,["ev","$2"]],[3,["ev","$3"]]],"upto_token":9223372036854775807,"limited":false}
        < rows events w2 3 ["ev","$3"] [catch-up]
        < position events w2 3
        # w1 and w2 write 4 and 5, publish nothing, and answer a REPLICATE
        > REPLICATE
        > POSITION events w1 9223372036854775807 9223372036854775807
        < catch-up #3 events w1 (1, 9223372036854775807]
        > !page 3 {"updates":[[4,["ev","$4"]]],"upto_token":9223372036854775807,"limited":false}
        < rows events w1 4 ["ev","$4"] [catch-up]
        < position events w1 4
        > POSITION events w2 9223372036854775807 9223372036854775807
        < catch-up #4 events w2 (3, 9223372036854775807]
        > !page 4 {"updates":[[5,["ev","$5"]]],"upto_token":9223372036854775807,"limited":false}
        < rows events w2 5 ["ev","$5"] [catch-up]
        < position events w2 5
        "#,
    );
}

#[test]
fn forged_rows_that_jump_twice_hide_no_row() {
    // Two rows forged ahead of w1, the second jumping above the first,
    // then w1's own rows below them and at their very tokens: each of
    // w1's rows is delivered once, in order (fetched: a row below the
    // last one says that one was forged).
    run(
        "master",
        r#"
        > !connect
        > POSITION events w1 0 0
        < started events w1 0
        > RDATA events w1 1000 ["forged",1000]
        < rows events w1 1000 ["forged",1000]
        > RDATA events w1 1002 ["forged",1002]
        < rows events w1 1002 ["forged",1002]
        > RDATA events w1 1 ["ev","$1"]
        < catch-up #1 events w1 (0, 1]
        > RDATA events w1 2 ["ev","$2"]
        > POSITION events w1 2 2
        > RDATA events w1 1000 ["ev","$1000"]
        > RDATA events w1 1002 ["ev","$1002"]
        > RDATA events w1 1003 ["ev","$1003"]
        > !page 1 {"updates":[[1,["ev","$1"]]],"upto_token":1,"limited":false}
        < rows events w1 1 ["ev","$1"] [catch-up]
        < position events w1 1002
        < catch-up #2 events w1 (1, 2]
        > !page 2 {"updates":[[2,["ev","$2"]]],"upto_token":2,"limited":false}
        < rows events w1 2 ["ev","$2"] [catch-up]
        < position events w1 1002
        # w1's row at the first forged row's token: fetched, from where
        # w1's rows were settled
        < catch-up #3 events w1 (2, 1000]
        > !page 3 {"updates":[[1000,["ev","$1000"]]],"upto_token":1000,"limited":false}
        < rows events w1 1000 ["ev","$1000"] [catch-up]
        < position events w1 1002
        # at the last row's token: delivered as it comes
        < rows events w1 1002 ["ev","$1002"]
        < rows events w1 1003 ["ev","$1003"]
        "#,
    );
}

#[test]
fn forged_rows_at_the_writer_s_next_tokens_hide_no_row() {
    // Rows forged at w1's next tokens, one after the other (no token
    // jumped over), ahead of w1's own: w1's row at the first arrives below
    // the last row, at a token where another row was delivered. It is
    // fetched (w1's answer says which row there is its) and delivered.
    run(
        "master",
        r#"
        > !connect
        > POSITION events w1 0 0
        < started events w1 0
        > RDATA events w1 1 ["ev","$1"]
        < rows events w1 1 ["ev","$1"]
        > RDATA events w1 2 ["forged",2]
        < rows events w1 2 ["forged",2]
        > RDATA events w1 3 ["forged",3]
        < rows events w1 3 ["forged",3]
        > RDATA events w1 2 ["ev","$2"]
        < catch-up #1 events w1 (1, 2]
        > RDATA events w1 3 ["ev","$3"]
        > RDATA events w1 4 ["ev","$4"]
        > !page 1 {"updates":[[2,["ev","$2"]]],"upto_token":2,"limited":false}
        < rows events w1 2 ["ev","$2"] [catch-up]
        < position events w1 3
        < rows events w1 3 ["ev","$3"]
        < rows events w1 4 ["ev","$4"]
        # the forged rows again: known, dropped
        > RDATA events w1 2 ["forged",2]
        > RDATA events w1 3 ["forged",3]
        "#,
    );
}

#[test]
fn a_writer_forgotten_to_make_room_loses_no_row() {
    // Made-up names fill the pairs a follower tracks for writers the
    // configuration does not name; a real one (a generic worker writing
    // `caches`) is forgotten to make room. Heard of again, it goes on
    // from where it was: what it wrote meanwhile is fetched.
    let mut script = with_limits(|limits| limits.max_tracked_pairs = 2);
    script.run(
        r#"
        > !connect
        > POSITION caches generic1 0 1
        < started caches generic1 1
        > RDATA caches generic1 2 ["f",null,2]
        < rows caches generic1 2 ["f",null,2]
        > POSITION caches made_up1 0 1
        < started caches made_up1 1
        # generic1 was heard from since it was admitted: it stays, once
        > POSITION caches made_up2 0 1
        < forgotten caches made_up1 at 1
        < started caches made_up2 1
        > POSITION caches made_up3 0 1
        < forgotten caches generic1 at 2
        < started caches made_up3 1
        # generic1 wrote 3 meanwhile (lost on the follower's side), then 4
        > RDATA caches generic1 4 ["f",null,4]
        < forgotten caches made_up2 at 1
        < catch-up #1 caches generic1 (2, 4]
        > !page 1 {"updates":[[3,["f",null,3]],[4,["f",null,4]]],"upto_token":4,"limited":false}
        < rows caches generic1 3 ["f",null,3] [catch-up]
        < rows caches generic1 4 ["f",null,4] [catch-up]
        < position caches generic1 4
        > RDATA caches generic1 5 ["f",null,5]
        < rows caches generic1 5 ["f",null,5]
        "#,
    );
    assert_eq!(script.follower.counters().writers_forgotten, 3);
}

/// A follower that asks a writer to prove its rows every `rows` rows.
fn proving_every(rows: usize) -> Script {
    with_limits(|limits| limits.max_unproven_rows = rows)
}

/// Follower `f1` with the default limits, but for what `set` changes.
fn with_limits(set: impl FnOnce(&mut FollowerLimits)) -> Script {
    let mut limits = FollowerLimits::default();
    set(&mut limits);
    Script::with(Follower::with_limits(name("f1"), deployment(), limits))
}

#[test]
fn a_writer_proves_its_rows_and_they_are_forgotten() {
    // Every 3 live rows w1 is asked for the last one; holding it, its
    // answer proves every row up to it, which the follower forgets: a row
    // there again is a duplicate, whatever its fingerprint. Nothing waits
    // for the answer.
    let mut script = proving_every(3);
    script.run(
        r#"
        > !connect
        > POSITION events w1 10 10
        < started events w1 10
        > RDATA events w1 11 ["a11"]
        < rows events w1 11 ["a11"]
        > RDATA events w1 12 ["a12"]
        < rows events w1 12 ["a12"]
        > RDATA events w1 13 ["a13"]
        < rows events w1 13 ["a13"]
        < catch-up #1 events w1 (12, 13]
        > RDATA events w1 14 ["a14"]
        < rows events w1 14 ["a14"]
        > RDATA events w1 15 ["a15"]
        < rows events w1 15 ["a15"]
        > !page 1 {"updates":[[13,["a13"]]],"upto_token":13,"limited":false}
        # Proven: another row at 12 is a replay (or forged), not w1's.
        > RDATA events w1 12 ["other"]
        # Not proven yet: another row at 14 may be w1's own (the one
        # delivered there forged), and the writer's answer says.
        > RDATA events w1 14 ["other"]
        < catch-up #2 events w1 (13, 14]
        > !page 2 {"updates":[[14,["a14"]]],"upto_token":14,"limited":false}
        < position events w1 15
        "#,
    );
    let counters = script.follower.counters();
    assert_eq!(
        (counters.proofs_requested, counters.proofs_confirmed),
        (1, 2)
    );
    assert_eq!(counters.unproven_forgotten, 0);
}

#[test]
fn a_long_run_of_forged_rows_at_the_writer_s_next_tokens_hides_no_row() {
    // Rows forged at w1's next tokens one after the other jump over
    // nothing: only the rows the follower recorded tell w1's own rows
    // there from duplicates, and it keeps them until w1 proves them. 100
    // forged rows (w1 asked every 16: they are not its rows, so its
    // answers prove nothing), then w1's own rows at those tokens and
    // above: each is delivered once, and its rows above the forged ones,
    // proven, free the record.
    let mut limits = FollowerLimits::default();
    limits.max_unproven_rows = 64;
    let mut f = Follower::with_limits(name("f1"), deployment(), limits);
    let mut log: Vec<(i64, String)> = Vec::new();
    let mut delivered = Vec::new();
    let rdata = |token: i64, row: &str| {
        Command::decode(Bytes::from(format!("RDATA events w1 {token} {row}")))
            .unwrap()
            .unwrap()
    };
    // Answers every catch-up from w1's log, and keeps the rows delivered.
    let drain = |f: &mut Follower, log: &[(i64, String)], delivered: &mut Vec<String>| loop {
        let Some(event) = f.poll_event() else { break };
        match event {
            FollowerEvent::CatchUp(request) => {
                let updates: Vec<String> = log
                    .iter()
                    .filter(|(t, _)| request.from.get() < *t && *t <= request.to.get())
                    .map(|(t, row)| format!("[{t},{row}]"))
                    .collect();
                let json = format!(
                    r#"{{"updates":[{}],"upto_token":{},"limited":false}}"#,
                    updates.join(","),
                    request.to
                );
                let page = CatchUpPage::from_json(Bytes::from(json)).unwrap();
                f.handle_catch_up(request.id, page).unwrap();
            }
            FollowerEvent::Rows { rows, .. } => {
                delivered.extend(rows.iter().map(|r| r.as_str().to_owned()))
            }
            _ => {}
        }
    };
    f.connected();
    f.handle_command(
        Command::decode(Bytes::from("POSITION events w1 10 10"))
            .unwrap()
            .unwrap(),
    );
    for token in 11..=110 {
        f.handle_command(rdata(token, &format!(r#"["forged",{token}]"#)));
        drain(&mut f, &log, &mut delivered);
    }
    for token in 11..=300 {
        let row = format!(r#"["w1",{token}]"#);
        log.push((token, row.clone()));
        f.handle_command(rdata(token, &row));
        drain(&mut f, &log, &mut delivered);
    }
    let own: Vec<&String> = delivered
        .iter()
        .filter(|r| r.starts_with(r#"["w1""#))
        .collect();
    let expected: Vec<String> = (11..=300).map(|t| format!(r#"["w1",{t}]"#)).collect();
    assert_eq!(own, expected.iter().collect::<Vec<_>>());
    let counters = f.counters();
    assert_eq!(counters.unproven_forgotten, 0);
    assert!(counters.proofs_confirmed >= 1, "{counters:?}");
}

#[test]
fn a_position_folded_after_rows_and_below_them_hides_none_of_them() {
    // w1's rows 7 and 8 wait behind its catch-up; a forged POSITION 0 0
    // follows them, and the queue (4 commands here) overflows into one
    // summary. The announcement below the rows does not undo them: they
    // are fetched, not taken as stale.
    let mut script = with_limits(|limits| limits.max_queued_commands = 4);
    script.run(
        r#"
        > !seed events w1 0
        > !connect
        > POSITION events w1 6 6
        < catch-up #1 events w1 (0, 6]
        > RDATA events w1 7 ["a7"]
        > RDATA events w1 8 ["a8"]
        > POSITION events w1 0 0
        > POSITION events w1 0 0
        > POSITION events w1 0 0
        > RDATA events w1 9 ["a9"]
        > !page 1 {"updates":[[6,["a6"]]],"upto_token":6,"limited":false}
        < rows events w1 6 ["a6"] [catch-up]
        < position events w1 6
        < catch-up #2 events w1 (6, 8]
        > !page 2 {"updates":[[7,["a7"]],[8,["a8"]]],"upto_token":8,"limited":false}
        < rows events w1 7 ["a7"] [catch-up]
        < rows events w1 8 ["a8"] [catch-up]
        < position events w1 8
        < rows events w1 9 ["a9"]
        "#,
    );
}

#[test]
fn a_forged_announcement_at_the_follower_s_position_hides_no_row() {
    // w1's position (12) rests on a claim above its last row (10). While
    // the follower is away, w1 writes 13 and 14 (lost). On the new
    // connection a forged `POSITION w1 12 12` comes before w1's own: the
    // claim is checked at once, up to 12; as the announcement moved
    // nothing, w1's next row is checked too, and 13 and 14 are fetched.
    run(
        "f1",
        r#"
        > !connect
        > POSITION events w1 10 10
        < started events w1 10
        > POSITION events w1 10 12
        < position events w1 12
        > !disconnect
        > !connect
        > POSITION events w1 12 12
        < catch-up #1 events w1 (10, 12]
        > !page 1 {"updates":[],"upto_token":12,"limited":false}
        < position events w1 12
        > RDATA events w1 15 ["ev","$15"]
        < catch-up #2 events w1 (10, 15]
        > !page 2 {"updates":[[13,["ev","$13"]],[14,["ev","$14"]],[15,["ev","$15"]]],"upto_token":15,"limited":false}
        < rows events w1 13 ["ev","$13"] [catch-up]
        < rows events w1 14 ["ev","$14"] [catch-up]
        < rows events w1 15 ["ev","$15"] [catch-up]
        < position events w1 15
        "#,
    );
}

#[test]
fn any_number_of_forged_rows_each_jumping_ahead_hides_no_row() {
    // 40 rows forged ahead of w1, each jumping above the one before: the
    // follower keeps the last 32 ranges they jumped over, but the record
    // of what was delivered says that nothing was at 11: w1's row there
    // is fetched, not taken as stale.
    let mut transcript =
        String::from("> !connect\n> POSITION events w1 10 10\n< started events w1 10\n");
    for i in 0..40 {
        let token = 20 + 2 * i;
        transcript += &format!(
            "> RDATA events w1 {token} [\"forged\",{token}]\n\
             < rows events w1 {token} [\"forged\",{token}]\n"
        );
    }
    transcript += r#"> RDATA events w1 11 ["ev","$11"]
        < catch-up #1 events w1 (10, 11]
        > !page 1 {"updates":[[11,["ev","$11"]]],"upto_token":11,"limited":false}
        < rows events w1 11 ["ev","$11"] [catch-up]
        < position events w1 98
        "#;
    run("f1", &transcript);
}
