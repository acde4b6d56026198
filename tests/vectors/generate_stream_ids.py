"""Vectors for `StreamIds`: Synapse 1.163.2's own `MultiWriterIdGenerator`
driven through random schedules, with what it answers after each step.

The generator is the real class, built by its real `__init__` (and so its
real `_load_current_ids`) over a fake database connection that answers its
few queries from the schedule's startup values; only the sequence is
replaced, by one that hands out the ids the schedule says. A fetch from the
sequence runs in a thread of its own that blocks inside the sequence call,
so that, as in Synapse, other writes can finish while a fetch is under way
(`_in_flight_fetches`).

Run from the repository root with the Synapse venv's python:

    python tests/vectors/generate_stream_ids.py > tests/vectors/stream_ids.jsonl

Deterministic: a fixed seed, no clock, no set iteration in the output.
"""

import json
import random
import sys
import threading

import synapse
from synapse.storage.engines import PostgresEngine
from synapse.storage.util import id_generators
from synapse.storage.util.id_generators import MultiWriterIdGenerator

assert synapse.__version__ == "1.163.2", synapse.__version__

CASES = 80
STEPS = 40
TABLES = ["t1", "t2"]


class FetchFailed(Exception):
    pass


class Fetch:
    """One `_load_next_mult_id_txn` call, paused inside the sequence."""

    def __init__(self, gen):
        self.gen = gen
        self.entered = threading.Event()
        self.release = threading.Event()
        self.ids = []
        self.thread = threading.Thread(target=self.run)

    def run(self):
        try:
            # `self` is the transaction the fake sequence is given.
            self.gen._load_next_mult_id_txn(self, 1)
        except FetchFailed:
            pass

    def start(self):
        self.thread.start()
        self.entered.wait()

    def hand_in(self, ids):
        self.ids = ids
        self.release.set()
        self.thread.join()


class FakeSequence:
    def check_consistency(self, *args, **kwargs):
        pass

    def get_next_mult_txn(self, txn, n):
        txn.entered.set()
        txn.release.wait()
        if not txn.ids:
            raise FetchFailed()
        return list(txn.ids)


id_generators.build_sequence_generator = lambda **kwargs: FakeSequence()


class FakeCursor:
    def __init__(self, db):
        self.db = db
        self.rows = []

    def execute(self, sql, args=()):
        sql = " ".join(sql.split())
        if sql.startswith("DELETE FROM stream_positions"):
            writers = args[1]
            for instance in list(self.db.positions):
                if instance not in writers:
                    del self.db.positions[instance]
                    self.db.deleted.append(instance)
            self.rows = []
        elif sql.startswith("SELECT instance_name, stream_id FROM stream_positions"):
            self.rows = list(self.db.positions.items())
        elif sql.startswith("SELECT last_value FROM"):
            self.rows = [(self.db.last_value,)]
        elif "GREATEST" in sql:
            table = sql.split("FROM ")[1].strip()
            ids = [i for (t, _, i) in self.db.table_rows if t == table]
            self.rows = [(max(max(ids, default=1), 1),)]
        elif "WHERE ? <=" in sql:
            table = sql.split("FROM ")[1].split(" ")[0]
            (low,) = args
            self.rows = [(n, i) for (t, n, i) in self.db.table_rows if t == table and low <= i]
        else:
            raise AssertionError(sql)

    def __iter__(self):
        return iter(self.rows)

    def fetchone(self):
        return self.rows[0]

    def close(self):
        pass


class FakeConn:
    def __init__(self, positions, last_value, table_rows):
        self.positions = dict(positions)
        self.last_value = last_value
        self.table_rows = table_rows
        self.deleted = []

    def cursor(self, **kwargs):
        return FakeCursor(self)


class FakeDb:
    engine = PostgresEngine.__new__(PostgresEngine)


def state(gen, own):
    return {
        "own_position": gen.get_current_token_for_writer(own),
        "current_token": gen.get_current_token(),
        "minimal": gen.get_minimal_local_current_token(),
        "positions": sorted(gen.get_positions().items()),
    }


def case(rng):
    own = "me"
    others = ["w1", "w2"][: rng.randrange(0, 3)]
    layout = rng.choice(["writer", "writer", "writer", "any", "reader"])
    if layout == "writer":
        writers = [own] + others
    elif layout == "any":
        writers = []
    else:
        writers = others or ["w1"]
        others = writers
    last_value = rng.randrange(1, 20)
    positions = []
    for instance in writers + ["gone"]:
        if rng.random() < 0.6:
            positions.append((instance, rng.randrange(1, last_value + 1)))
    table_rows = []
    for _ in range(rng.randrange(0, 6)):
        instance = rng.choice(writers + [own, "gone"])
        table_rows.append((rng.choice(TABLES), instance, rng.randrange(1, last_value + 1)))

    conn = FakeConn(positions, last_value, table_rows)
    gen = MultiWriterIdGenerator(
        db_conn=conn,
        db=FakeDb(),
        notifier=None,
        stream_name="s",
        server_name="test",
        instance_name=own,
        tables=[(table, "instance_name", "stream_id") for table in TABLES],
        sequence_name="s_seq",
        writers=writers,
    )
    out = {
        "own": own,
        "writers": writers,
        "stream_positions": positions,
        "last_value": last_value,
        "table_rows": [[instance, i] for (_, instance, i) in table_rows],
        "stale": sorted(set(conn.deleted)),
        "start": state(gen, own),
        "steps": [],
    }

    seq = max([last_value] + [i for (_, _, i) in table_rows])
    may_write = not writers or own in writers
    fetches = []  # (index, Fetch, ids given by the sequence)
    unfinished = []  # lists of ids
    pending = {other: [] for other in others}
    next_fetch = 0
    # The highest id persisted and known to all: what an idle writer has seen.
    known = seq
    for _ in range(STEPS):
        roll = rng.random()
        step = None
        if roll < 0.15 and may_write:
            fetch = Fetch(gen)
            fetch.start()
            fetches.append([next_fetch, fetch, []])
            step = {"op": "reserve", "reservation": next_fetch}
            next_fetch += 1
        elif roll < 0.4 and fetches:
            entry = rng.choice(fetches)
            if not entry[2]:
                n = rng.randrange(1, 4)
                entry[2] = list(range(seq + 1, seq + n + 1))
                seq += n
        elif roll < 0.55 and fetches:
            # Mostly a fetch the sequence has answered; sometimes one that
            # failed before it was.
            fetched = [at for at, entry in enumerate(fetches) if entry[2]]
            if fetched and rng.random() < 0.85:
                at = rng.choice(fetched)
            else:
                at = rng.randrange(len(fetches))
            entry = fetches.pop(at)
            index, fetch, ids = entry
            lose = rng.random() < 0.15
            given = [] if lose else ids
            fetch.hand_in(given)
            if given:
                unfinished.append(list(given))
            step = {"op": "allocated", "reservation": index, "ids": given}
        elif roll < 0.8 and unfinished:
            at = rng.randrange(len(unfinished))
            if rng.random() < 0.5:
                ids = unfinished.pop(at)
            else:
                group = unfinished[at]
                ids = [group.pop(rng.randrange(len(group)))]
                if not group:
                    unfinished.pop(at)
            gen._mark_ids_as_finished(ids)
            known = max([known] + ids)
            step = {"op": "persisted", "ids": ids}
        elif others:
            other = rng.choice(others)
            if rng.random() < 0.5:
                seq += 1
                pending[other].append(seq)
            elif pending[other]:
                token = max(pending[other])
                pending[other] = []
                known = max(known, token)
                gen.advance(other, token)
                step = {"op": "advance", "instance": other, "token": token}
            else:
                # An idle writer announces what it has seen (Synapse's
                # writers do, with nothing in flight).
                token = known
                gen.advance(other, token)
                step = {"op": "advance", "instance": other, "token": token}
        if step is not None:
            step["expect"] = state(gen, own)
            out["steps"].append(step)
    for _, fetch, _ in fetches:
        fetch.hand_in([])
    return out


def main():
    rng = random.Random(36)
    for _ in range(CASES):
        sys.stdout.write(json.dumps(case(rng), separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
