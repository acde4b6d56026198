#!/usr/bin/env python3
"""Writes the seed corpora, fuzz/corpus/<target>/, from committed sources.

    python3 fuzz/make_corpus.py

Deterministic: the same sources give the same files (a fixed-seed PRNG for
the operation sequences; file names are a content hash). Sources:

- tests/vectors/*.jsonl: Synapse's command lines (accepted, non-canonical,
  rejected) and rows (rows.jsonl and every release's rows-*.jsonl);
- seeds/redis-pubsub.json: RESP traffic of real redis-server pub/sub
  connections, both directions (capture_redis.py refreshes it);
- for the stateful targets (follower, session_tcp, session_redis): operation
  sequences encoded the way each target reads its bytes (see the `Input`
  and `step` functions of src/<target>.rs), made of the lines, rows and
  RESP frames above.

Every file the script does not name `crash-*` or `regress-*` is replaced;
keep a fixed crash's input under one of those names and it stays (and the
replay runs it).
"""

import glob
import hashlib
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
VECTORS = os.path.join(HERE, "..", "tests", "vectors")
CORPUS = os.path.join(HERE, "corpus")
# libFuzzer's default -max_len is 4096; the line targets also get a few
# inputs around the TCP line limit, the rest stay small.
MAX_LINE_SEED = 4096
KEEP_PREFIXES = ("crash-", "regress-")


def jsonl(name):
    with open(os.path.join(VECTORS, name)) as f:
        return [json.loads(line) for line in f if line.strip()]


def command_lines():
    """Every distinct line of the vectors, in file order."""
    out = []
    for name in ("commands.jsonl", "noncanonical.jsonl", "rejected.jsonl"):
        out.extend(v["line"].encode() for v in jsonl(name))
    return unique(out)


def rows():
    """Every distinct row of every release."""
    out = []
    for path in sorted(glob.glob(os.path.join(VECTORS, "rows*.jsonl"))):
        out.extend(v["row_json"].encode() for v in jsonl(os.path.basename(path)))
    return unique(out)


def unique(items):
    seen = set()
    return [i for i in items if not (i in seen or seen.add(i))]


def captures():
    with open(os.path.join(HERE, "seeds", "redis-pubsub.json")) as f:
        conns = json.load(f)
    for c in conns:
        c["sent"] = c["sent"].encode("latin-1")
        c["received"] = c["received"].encode("latin-1")
    return conns


def resp_frames(data):
    """Cuts a RESP2/RESP3 byte stream into whole frames."""
    frames = []
    at = 0
    while at < len(data):
        end = resp_end(data, at)
        frames.append(data[at:end])
        at = end
    return frames


def resp_end(data, at):
    kind = data[at:at + 1]
    line_end = data.index(b"\r\n", at)
    head = data[at + 1:line_end]
    at = line_end + 2
    if kind in b"$!=" and kind:
        n = int(head)
        return at if n < 0 else at + n + 2
    if kind in b"*>~":
        n = int(head)
        for _ in range(max(n, 0)):
            at = resp_end(data, at)
        return at
    if kind in b"%|":
        for _ in range(2 * int(head)):
            at = resp_end(data, at)
        return at
    return at  # simple strings, errors, integers, doubles, null, booleans


class Seeds:
    """The files of one corpus."""

    def __init__(self, target):
        self.target = target
        self.files = {}

    def add(self, data):
        data = bytes(data)
        if data:
            self.files[hashlib.sha1(data).hexdigest()[:16]] = data

    def write(self):
        path = os.path.join(CORPUS, self.target)
        os.makedirs(path, exist_ok=True)
        for name in os.listdir(path):
            if not name.startswith(KEEP_PREFIXES):
                os.remove(os.path.join(path, name))
        for name, data in sorted(self.files.items()):
            with open(os.path.join(path, name), "wb") as f:
                f.write(data)
        size = sum(len(d) for d in self.files.values())
        print(f"{self.target:15} {len(self.files):4} files {size:7} bytes")
        return size


# --- line and row targets -------------------------------------------------

def line_seeds(lines, rows_):
    seeds = Seeds("decode_line")
    for line in lines:
        if len(line) <= MAX_LINE_SEED:
            seeds.add(line)
    # The recogniser is checked against serde_json on the whole input: rows
    # are the JSON it sees, and a few values at its edges.
    for row in rows_:
        seeds.add(row)
    for value in (b'{"a":[1,-0.5e+3,true,null,"\\u00e9\\ud83d\\ude00"]}',
                  b'"\\ud800"', b"[1,]", b"01", b"1" * 4301, b"[" * 200 + b"]" * 200,
                  b'"\x7f\xc3\xa9"', b"\xff", b'"a\tb"', b" [ ] "):
        seeds.add(value)
    return seeds


def roundtrip_seeds(lines):
    seeds = Seeds("roundtrip_line")
    for line in lines:
        if len(line) <= MAX_LINE_SEED:
            seeds.add(line)
    return seeds


def row_seeds(rows_):
    seeds = Seeds("decode_row")
    for row in rows_:
        seeds.add(row)
    return seeds


# --- resp_decode: [split lo, split hi, caps] + RESP bytes --------------------

def resp_seeds(conns):
    seeds = Seeds("resp_decode")
    for c in conns:
        for stream in (c["received"], c["sent"]):
            if not stream:
                continue
            frames = resp_frames(stream)
            # Whole connections, each under every set of caps, split in two
            # inside a frame.
            for caps in range(5):
                split = (len(stream) * (caps + 1)) // 6
                seeds.add(split.to_bytes(2, "little") + bytes([caps]) + stream)
            # Each distinct frame alone, whole and cut short.
            for i, frame in enumerate(unique(frames)):
                caps = i % 5
                seeds.add(bytes([len(frame) // 2, 0, caps]) + frame)
                if i % 3 == 0:
                    seeds.add(bytes([1, 0, caps]) + frame[:-1])
    return seeds


# --- follower ----------------------------------------------------------------
# src/follower.rs: every step is `byte % 12` then its arguments. Tokens are
# one byte: 3 = the same token as the writer's position, 4 = one above,
# 0..11 = -3..+8 relative, >= 240 = an absolute small token.

F_STREAMS = ["events", "typing", "caches", "receipts", "org.example.x"]
F_WRITERS = ["w1", "w2", "w3", "master", "me", "evil", "c1", "c2"]
F_ROWS = 4


def f_rdata(stream, writer, token, row=0, batch=False):
    if batch:
        return [0, stream, writer, 0, row]
    return [1, stream, writer, 1, token, row]


def f_position(stream, writer, prev, new):
    return [4, stream, writer, prev, new]


def f_page(honest=1, pick=1, index=0, updates=(1, 1), limited=1):
    # An honest page of the outstanding catch-up `index`: `len(updates)`
    # rows at steps of 0-2 tokens, `limited` even = more to come.
    return [8, honest, pick, index, len(updates), *updates, limited]


def follower_seeds(rng):
    seeds = Seeds("follower")
    events, typing, caches, receipts, other = range(5)
    w1, w2, w3, master, me, evil, c1, c2 = range(8)
    scripted = [
        # Rows of two writers in order, then a gap that needs a catch-up,
        # answered honestly in two pages.
        [6] + f_rdata(events, w1, 4) + f_rdata(events, w2, 4)
        + f_rdata(events, w1, 4, 1) + f_position(events, w1, 3, 11)
        + f_page(updates=(1, 2), limited=0) + f_page(updates=(2,), limited=1)
        + f_rdata(events, w1, 4, 2),
        # A batch completed by its token, under the batch limit and over it.
        [6] + f_rdata(caches, master, 0, 1, batch=True)
        + f_rdata(caches, master, 0, 2, batch=True) + f_rdata(caches, master, 4, 3)
        + f_rdata(caches, master, 0, 0, batch=True) * 5 + f_rdata(caches, master, 5),
        # Typing resets (a restarted writer), echoes of our own rows.
        [6] + f_position(typing, w3, 3, 11) + f_rdata(typing, w3, 4)
        + f_position(typing, w3, 240, 241) + f_rdata(typing, me, 4)
        + f_position(typing, me, 3, 4) + f_rdata(typing, w3, 0),
        # Non-writers and more pairs than the limit.
        [6] + f_rdata(events, evil, 4) + f_rdata(receipts, w3, 4)
        + sum((f_position(other, w, 3, 5) for w in range(8)), []),
        # Disconnect with a catch-up outstanding, a stale answer, a failure.
        [6] + f_position(receipts, w2, 3, 9) + [7, 6] + f_position(receipts, w2, 3, 9)
        + [10, 0] + f_page(honest=0, pick=0, index=0, updates=(4,), limited=1)
        + [11, receipts, w2, 0, 4] + [11, receipts, w2, 1],
    ]
    for script in scripted:
        seeds.add(script)
    # Random schedules of the same shape: writers' tokens mostly step up.
    for _ in range(120):
        out = [6]
        for _ in range(rng.randrange(4, 40)):
            op = rng.choices(["rdata", "batch", "position", "page", "conn", "fail", "set"],
                             [8, 2, 4, 3, 1, 1, 1])[0]
            s, w = rng.randrange(5), rng.choice([0, 1, 2, 3, 2, 0, 4, 5])
            token = rng.choice([4, 4, 4, 5, 3, 8, 0, 241])
            if op == "rdata":
                out += f_rdata(s, w, token, rng.randrange(F_ROWS))
            elif op == "batch":
                out += f_rdata(s, w, 0, rng.randrange(F_ROWS), batch=True)
            elif op == "position":
                out += f_position(s, w, rng.choice([3, 4]), rng.choice([4, 5, 9, 11]))
            elif op == "page":
                n = rng.randrange(4)
                out += f_page(honest=rng.choice([1, 1, 1, 0]), pick=1, index=rng.randrange(3),
                              updates=[rng.choice([1, 1, 2]) for _ in range(n)],
                              limited=rng.randrange(2))
            elif op == "conn":
                out += [rng.choice([6, 7])]
            elif op == "fail":
                out += [10, rng.randrange(4)]
            else:
                out += [11, s, w, rng.randrange(2), token]
        seeds.add(out)
    return seeds


# --- session_tcp ---------------------------------------------------------------
# src/session_tcp.rs: a role byte (even = client, odd = server), then
# operations. A chunk is `kind` (< 64: raw, a length byte and bytes; else
# 1 + kind % 6 of its 16 known lines, cut where a byte says if kind >= 128).

def t_raw(data):
    return [0, len(data), *data]


def t_lines(indices, cut=None):
    assert 1 <= len(indices) <= 6
    kind = next(k for k in range(64, 256)
                if k % 6 == len(indices) - 1 and (k >= 128) == (cut is not None))
    return [kind, *indices] + ([cut] if cut is not None else [])


def session_tcp_seeds(rng, lines):
    seeds = Seeds("session_tcp")
    short = [l for l in lines if len(l) < 200]
    SERVER, PING, POS_CACHES, POS_TYPING, RDATA_BATCH, RDATA_CACHES, RDATA_TYPING = range(7)
    ERROR, NAME, REPLICATE, USER_SYNC, FED_ACK = 8, 9, 10, 11, 12
    # Client: the server greets, positions, rows, pings; we send, time
    # passes, the connection drops and comes back, catch-ups are answered.
    client = [0]
    client += [0] + t_lines([SERVER, PING, POS_CACHES, POS_TYPING])
    client += [5, 4] + [0] + t_lines([RDATA_BATCH, RDATA_CACHES, RDATA_TYPING])
    client += [1] + t_lines([POS_CACHES, RDATA_CACHES], cut=20)
    client += [4, *t_raw(b"USER_SYNC worker1 @a:x d start 1")[1:]]
    client += [5, 4, 2, 30, 3, 3, 5, 4, 8, 1, 7, 6, 0] + t_lines([SERVER, POS_CACHES])
    client += [8, 2, 3, 5, 4]
    seeds.add(client)
    # Server: two clients, one names itself and replicates, rows written in
    # batches, one client closed, one errors, time runs out on a third.
    server = [1]
    server += [0, 0, 1, 0] + t_lines([NAME, REPLICATE, PING])
    server += [5, 3, 5, 0x83, 8, 4, 4, 2, 1] + t_lines([USER_SYNC, FED_ACK])
    server += [6, 0, *t_raw(b"REMOTE_SERVER_UP x.org")[1:]]
    server += [8, 9, 4, 1, 1] + t_lines([ERROR]) + [8, 9, 4, 7, 0, 8, 4, 4]
    server += [0, 3, 250, 4, 4, 9, 0, 9, 0]
    seeds.add(server)
    # Real lines from the vectors as raw chunks, a few per input, to both
    # roles, split across reads.
    for i in range(60):
        role = i % 2
        out = [role]
        if role:
            out += [0]
        for _ in range(rng.randrange(2, 8)):
            line = rng.choice(short) + b"\n"
            cut = rng.randrange(len(line) + 1)
            for part in (line[:cut], line[cut:]):
                if not part:
                    continue
                out += ([1, 0] if role else [1]) + t_raw(part)
            roll = rng.randrange(6)
            if roll == 0:
                out += [2, rng.randrange(60)] if not role else [3, rng.randrange(60)]
            elif roll == 1:
                out += [5, 4] if not role else [8, 4]
            elif roll == 2:
                out += [3] if not role else [4]
            elif roll == 3 and not role:
                out += [8, rng.randrange(256)]
            elif roll == 3:
                out += [5, rng.randrange(256)]
        seeds.add(out)
    return seeds


# --- session_redis ---------------------------------------------------------------
# src/session_redis.rs: a flags byte (auth, database, name, one connection,
# USER_IP channel, received reports, a prompt driver) and one more (queue
# while disconnected, PING timeout), then operations: `op % 16`, with bit
# 0x80 for the publisher link. Redis' replies come from the target's model
# (op 2-4) or as chunks (op 6-7) of known frames or raw bytes (kind 15: a
# length byte and the bytes: here, frames captured from a real Redis).

SUB, PUB = 0x00, 0x80


def r_pieces(pieces):
    # Fed in `pieces` + 1 reads, cut after 7 bytes each.
    return [pieces] + [7] * pieces


def r_answer(link, replies, twist=1, pieces=0):
    # The next `replies` owed commands answered (correctly if
    # twist % 16 != 0).
    return [link | 2, replies - 1] + [twist] * replies + r_pieces(pieces)


def r_raw_chunk(link, frames, pieces=0):
    out = [link | 6, len(frames) - 1]
    for frame in frames:
        out += [15, 0, len(frame), *frame]
    return out + r_pieces(pieces)


def r_known_chunk(link, kinds, pick=0, pieces=0):
    out = [link | 6, len(kinds) - 1]
    for kind in kinds:
        out += [kind, pick]
    return out + r_pieces(pieces)


def session_redis_seeds(rng, conns):
    seeds = Seeds("session_redis")
    received = {c["name"]: resp_frames(c["received"]) for c in conns}
    frames = [f for fs in received.values() for f in fs if len(f) < 256]
    messages = [f for f in frames if b"message" in f]
    # Two connections, no auth: the subscriber needs its SUBSCRIBE answered,
    # the publisher nothing. Then lines are sent and published, Redis
    # delivers, real messages arrive, time passes with PINGs answered.
    two = [0x00, 0x14]
    two += [SUB | 0, PUB | 0] + r_answer(SUB, 1) + [PUB | 10, 14, PUB | 10, 12]
    two += [5] + r_pieces(0) + r_raw_chunk(SUB, messages[:3]) + [8, 24] + r_answer(SUB, 2)
    two += r_answer(PUB, 1) + [11, 3, 11, 0x80, 12, 1, 9, 15, 5] + r_pieces(1)
    seeds.add(two)
    # One RESP3 connection with auth, a database, a name and the USER_IP
    # channel: HELLO, SELECT, SUBSCRIBE of two channels answered.
    one = [0x01 | 0x04 | 0x08 | 0x10 | 0x20, 0x08]
    one += [SUB | 0] + r_answer(SUB, 4, pieces=3)
    one += r_raw_chunk(SUB, [f for f in received["subscriber-resp3"] if f.startswith(b">")][:4])
    one += [SUB | 10, 15, 5] + r_pieces(0) + [8, 40, 9, 9] + r_answer(SUB, 2)
    seeds.add(one)
    # Redis refusing: wrong password, no permission, an unknown protocol.
    for flags, twist in ((0x01, 16), (0x02, 32), (0x12, 64)):
        bad = [flags, 0x04, SUB | 0, PUB | 0] + r_answer(SUB, 1, twist=twist)
        bad += r_answer(PUB, 1, twist=twist) + [0x8e, 14, 0, 0x80]
        seeds.add(bad)
    # Real traffic as raw chunks, mixed with the model's answers, time,
    # sends, writes, blocked sockets and lost links.
    for i in range(60):
        flags = rng.randrange(256)
        out = [flags, rng.randrange(256), SUB | 0]
        if not flags & 0x10:
            out += [PUB | 0]
        for _ in range(rng.randrange(3, 14)):
            roll = rng.randrange(10)
            link = rng.choice([SUB, SUB, PUB])
            if roll < 3:
                out += r_answer(link, rng.randrange(1, 5), pieces=rng.randrange(3))
            elif roll < 5:
                picked = rng.sample(frames, rng.randrange(1, 4))
                out += r_raw_chunk(link, picked, pieces=rng.randrange(3))
            elif roll == 5:
                out += [link | 10, rng.randrange(24)]
            elif roll == 6:
                out += [5] + r_pieces(rng.randrange(3))
            elif roll == 7:
                out += [8, rng.randrange(60)] if rng.randrange(2) else [9]
            elif roll == 8:
                out += [11, rng.randrange(256), 12, rng.randrange(256)]
            elif rng.randrange(2):
                kinds = [rng.randrange(256) for _ in range(rng.randrange(1, 5))]
                out += r_known_chunk(link, kinds, rng.randrange(256), rng.randrange(3))
            else:
                out += rng.choice([[link | 13], [link | 1], [link | 0], [14], [15]])
        seeds.add(out)
    return seeds


def main():
    rng = random.Random(17)
    lines = command_lines()
    rows_ = rows()
    conns = captures()
    total = 0
    for seeds in (
        line_seeds(lines, rows_),
        roundtrip_seeds(lines),
        row_seeds(rows_),
        resp_seeds(conns),
        follower_seeds(rng),
        session_tcp_seeds(rng, lines),
        session_redis_seeds(rng, conns),
    ):
        total += seeds.write()
    print(f"{'total':15} {total:18} bytes")


if __name__ == "__main__":
    main()
