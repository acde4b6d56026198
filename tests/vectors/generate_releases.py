#!/usr/bin/env python3
"""Generate per-release row vectors from an older (or the current) Synapse's own code.

``generate.py`` pins Synapse 1.163.2 and covers every row shape of that release.
This script is its sibling for the releases before it: run with the Python of a
virtualenv holding one Synapse release, it writes ``rows-<version>.jsonl`` next
to this script, for that release. It produces two kinds of vectors:

* ``"source": "row class"``: one typical row per stream (and per ``events`` type
  id) of that release, built from the field names of the release's own row
  classes (``attr.fields``), encoded by its ``RdataCommand.to_line``, parsed back
  with its ``parse_command_from_line`` and ``Stream.parse_row`` and re-encoded.
  This pins each release's row shape (device_lists had two fields up to 1.109).

* ``"source": "update function"``: rows produced by the release's own storage
  functions and stream update functions, fed with database rows as the SQL
  returns them (PostgreSQL form, and SQLite's 0/1 where a column is a boolean).
  The database is a stand-in (``FakePool``: ``runInteraction`` runs the storage
  code's own transaction function on a cursor that yields the given rows);
  everything from the cursor to the RDATA line is Synapse's code. ``db_rows``
  records what the cursor returned (on the first vector of each call). These are the rows whose content goes
  beyond the row classes' annotations (``null`` where ``str`` is annotated, a
  server name where ``entity`` reads like a user): each has ``hand_built``
  saying why the database rows are real.

Set up one virtualenv per release (Python 3.11; dependencies as of the release
date, so that old releases still import):

    python3.11 -m venv /tmp/synapse-1.98.0
    /tmp/synapse-1.98.0/bin/pip install -U pip
    /tmp/synapse-1.98.0/bin/pip install --uploaded-prior-to 2023-12-20T00:00:00Z "matrix-synapse==1.98.0"
    /tmp/synapse-1.98.0/bin/python tests/vectors/generate_releases.py    # from the repo root

(README.md lists the cut-off date used for each release.) Output lines are
``json.dumps(obj, ensure_ascii=True, sort_keys=True)``, deterministic, strict
JSON, in the format of ``rows.jsonl`` plus ``release`` and ``source``.
"""

import json
import os
import sys

import attr

import synapse

RELEASES = ["1.98.0", "1.105.1", "1.109.0", "1.110.0", "1.120.2", "1.140.0", "1.163.2"]
VERSION = synapse.__version__
assert VERSION in RELEASES, "no vectors planned for Synapse %s (known: %s)" % (VERSION, RELEASES)

from synapse.replication.tcp import commands as C  # noqa: E402
from synapse.replication.tcp.commands import parse_command_from_line  # noqa: E402
from synapse.replication.tcp.streams import STREAMS_MAP  # noqa: E402
from synapse.replication.tcp.streams import _base as B  # noqa: E402
from synapse.replication.tcp.streams.events import (  # noqa: E402
    EventsStreamAllStateRow,
    EventsStreamCurrentStateRow,
    EventsStreamEventRow,
    EventsStreamRow,
)
from synapse.storage.databases.main import DataStore  # noqa: E402

OUT_DIR = os.path.dirname(os.path.abspath(__file__))
E = "example.com"
TS = 1700000000000


def version_tuple(v):
    return tuple(int(x) for x in v.split("."))


# ---------------------------------------------------------------------------
# Encoding through the release's own classes


def wire(cmd):
    return "%s %s" % (cmd.NAME, cmd.to_line())


def encode_row(stream, token, row):
    """The row JSON as the release writes it into RDATA, checked by parsing
    the line back with the release's parser and row class."""
    line = wire(C.RdataCommand(stream, "master", token, row))
    prefix = "RDATA %s master %s " % (stream, token)
    assert line.startswith(prefix), line
    row_json = line[len(prefix):]
    parsed = parse_command_from_line(line)
    assert wire(parsed) == line
    typed = STREAMS_MAP[stream].parse_row(parsed.row)
    return row_json, parsed.row, typed


def plain(obj):
    """Tuples (database rows) as the lists JSON has."""
    if isinstance(obj, (list, tuple)):
        return [plain(x) for x in obj]
    if isinstance(obj, dict):
        return {k: plain(x) for k, x in obj.items()}
    return obj


def strict(obj):
    obj = plain(obj)
    text = json.dumps(obj, ensure_ascii=True, sort_keys=True, allow_nan=False)
    assert json.loads(text) == obj
    return text


# ---------------------------------------------------------------------------
# 1. One typical row per stream, from the release's row classes

# Values by field name; `type` and `data` depend on the stream.
VALUES = {
    "event_id": "$ev:" + E,
    "room_id": "!room:" + E,
    "state_key": "@alice:" + E,
    "redacts": None,
    "relates_to": None,
    "membership": "join",
    "rejected": False,
    "outlier": False,
    "user_id": "@alice:" + E,
    "entity": "@alice:" + E,
    "state": "online",
    "last_active_ts": TS,
    "last_federation_update_ts": TS - 1000,
    "last_user_sync_ts": TS - 5,
    "status_msg": "in a meeting",
    "currently_active": True,
    "destination": "remote.org",
    "user_ids": ["@alice:" + E, "@bob:" + E],
    "receipt_type": "m.read",
    "thread_id": None,
    "app_id": "m.http",
    "pushkey": "https://push.example.com/_matrix/push/v1/notify",
    "deleted": False,
    "cache_func": "get_user_by_id",
    "keys": ["@alice:" + E],
    "invalidation_ts": TS,
    "is_signature": False,
    "hosts_calculated": True,
    "data_type": "m.push_rules",
    "action": "update",
    "affected_fields": ["displayname"],
    "origin": "remote.org",
    "media_id": "abcDEF123",
    "quarantined": True,
    "rejection_status_changed": True,
}
BY_STREAM = {
    "receipts": {"data": {"ts": TS}},
    "federation": {"type": "e", "data": {"edu_type": "m.typing", "content": {"room_id": "!room:" + E},
                                         "origin": E, "destination": "remote.org"}},
    "backfill": {"type": "m.room.message", "state_key": None},
    "account_data": {"room_id": None},
}
EVENT_VALUES = {"type": "m.room.member"}


def class_rows():
    out = []
    for name in sorted(STREAMS_MAP):
        stream = STREAMS_MAP[name]
        if name == "events":
            assert [f.name for f in attr.fields(EventsStreamRow)] == ["type", "data"]
            for cls in (EventsStreamEventRow, EventsStreamCurrentStateRow, EventsStreamAllStateRow):
                order = [f.name for f in attr.fields(cls)]
                values = [EVENT_VALUES.get(f, VALUES.get(f)) for f in order]
                # EventsStream._update_function: (TypeId, tuple of the data)
                row_json, _decoded, typed = encode_row(name, 5, (cls.TypeId, tuple(values)))
                assert type(typed.data) is cls
                out.append({
                    "stream": name, "name": "row class: %s" % cls.TypeId, "source": "row class",
                    "row_json": row_json,
                    "fields": {"type_id": cls.TypeId, "data": dict(zip(order, values))},
                    "field_order": ["type_id", "data"], "data_field_order": order,
                })
            continue
        order = [f.name for f in attr.fields(stream.ROW_TYPE)]
        values = [BY_STREAM.get(name, {}).get(f, VALUES.get(f, "MISSING")) for f in order]
        assert "MISSING" not in values, (name, order)
        row_json, _decoded, typed = encode_row(name, 5, tuple(values))
        assert type(typed) is stream.ROW_TYPE
        out.append({
            "stream": name, "name": "row class", "source": "row class",
            "row_json": row_json, "fields": dict(zip(order, values)), "field_order": order,
        })
    return out


# ---------------------------------------------------------------------------
# 2. Rows from the release's storage and update functions


class FakeCursor:
    def __init__(self, rows):
        self.rows = list(rows)

    def execute(self, sql, args=()):
        pass

    def __iter__(self):
        return iter(self.rows)

    def fetchall(self):
        return list(self.rows)


class FakePool:
    """`runInteraction(desc, func, *args)` runs Synapse's own transaction
    function on a cursor that returns the rows given for `desc` (one list per
    execute, in order)."""

    def __init__(self, rows_by_desc):
        self.rows_by_desc = rows_by_desc

    async def runInteraction(self, desc, func, *args, **kwargs):
        results = list(self.rows_by_desc.get(desc, []))

        class Txn(FakeCursor):
            def __init__(self):
                super().__init__([])

            def execute(self, sql, args=()):
                self.rows = list(results.pop(0)) if results else []

        return func(Txn(), *args, **kwargs)


def run(coro):
    """Runs a coroutine that never waits on anything but FakePool."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    raise AssertionError("coroutine blocked")


class FakeStore:
    """Forwards the named storage methods to DataStore's own code."""

    def __init__(self, rows_by_desc):
        self.db_pool = FakePool(rows_by_desc)

    def __getattr__(self, name):
        method = getattr(DataStore, name)
        return lambda *args, **kwargs: method(self, *args, **kwargs)


def stream_updates(stream_cls, rows_by_desc, upto=100):
    stream = object.__new__(stream_cls)
    stream.store = FakeStore(rows_by_desc)
    update_function = getattr(stream_cls, "_update_function", None)
    if update_function is not None:
        updates, _token, _limited = run(update_function(stream, "master", 0, upto, 100))
    else:
        updates, _token, _limited = run(stream.update_function("master", 0, upto, 100))
    return updates


def update_rows():
    out = []
    v = version_tuple(VERSION)

    def add(stream_name, name, updates, db_rows, hand_built, *, sqlite_of=None):
        stream = STREAMS_MAP[stream_name]
        order = [f.name for f in attr.fields(stream.ROW_TYPE)]
        for index, (token, row) in enumerate(updates):
            row_json, decoded, typed = encode_row(stream_name, token, row)
            values = list(row)
            assert len(values) == len(order), (stream_name, values, order)
            for field, value in zip(order, values):
                got = getattr(typed, field)
                assert got == value and type(got) is type(value), (stream_name, field, got, value)
            obj = {
                "stream": stream_name, "source": "update function",
                "name": "update function: %s%s" % (name, "" if len(updates) == 1 else " #%d" % index),
                "row_json": row_json, "fields": dict(zip(order, values)), "field_order": order,
                "hand_built": hand_built,
            }
            if index == 0:
                # What the cursor returned, once per call (the rows after
                # the first come from the same call).
                obj["db_rows"] = db_rows
            bools = [f for f, val in zip(order, values) if isinstance(val, int)
                     and not isinstance(val, bool) and f in sqlite_of] if sqlite_of else []
            if bools:
                canon = tuple(bool(val) if f in bools else val for f, val in zip(order, values))
                canonical_json, _d, typed_canon = encode_row(stream_name, token, canon)
                assert typed_canon == typed
                obj["sqlite"] = True
                obj["canonical_json"] = canonical_json
                obj["fields"] = dict(zip(order, canon))
            out.append(obj)

    # device_lists: the UNION over device_lists_stream (a user's devices
    # changed) and device_lists_outbound_pokes (remote servers to tell), and
    # user_signature_stream.
    dl = "get_all_device_list_changes_for_remotes"
    sig = "get_all_user_signature_changes_for_remotes"
    if v < (1, 110, 0):
        # SELECT stream_id, entity FROM (user_id AS entity ... UNION ALL destination AS entity ...)
        db = [(10, "@alice:" + E), (11, "remote.org")]
        hb = ("up to 1.109 the first field is `entity`: device_lists_stream.user_id, or "
              "device_lists_outbound_pokes.destination (a server name) for outbound pokes")
    else:
        # SELECT stream_id, user_id, hosts FROM (false AS hosts ... UNION ALL true AS hosts ...)
        db = [(10, "@alice:" + E, False), (11, "@alice:" + E, True)]
        hb = ("from 1.110: `false AS hosts` for device_lists_stream, `true AS hosts` "
              "for device_lists_outbound_pokes")
    updates = stream_updates(B.DeviceListsStream, {dl: [db], sig: [[(12, "@alice:" + E)]]})
    add("device_lists", "device change, outbound pokes, signature", updates,
        {dl: db, sig: [[12, "@alice:" + E]]}, hb + "; user_signature_stream.from_user_id for signatures")
    if v >= (1, 110, 0):
        # SQLite has no boolean type: `false AS hosts` reads back as 0.
        db = [(20, "@alice:" + E, 0), (21, "@alice:" + E, 1)]
        updates = stream_updates(B.DeviceListsStream, {dl: [db], sig: [[]]})
        add("device_lists", "SQLite", updates, {dl: db, sig: []},
            "SQLite reads `false AS hosts` / `true AS hosts` back as 0 / 1",
            sqlite_of={"hosts_calculated"})

    # quarantined_media: origin is NULL for local media.
    if "quarantined_media" in STREAMS_MAP:
        qm = "get_quarantined_media_changes"
        db = [(1, None, "localMEDIA", True), (2, "remote.org", "remoteMEDIA", True),
              (3, None, "localMEDIA", False)]
        updates = stream_updates(B.QuarantinedMediaStream, {qm: [db]})
        add("quarantined_media", "local and remote media", updates, {qm: db},
            "quarantined_media_changes.origin is NULL for local media (annotated str)")
        db = [(4, None, "localMEDIA", 1), (5, None, "localMEDIA", 0)]
        updates = stream_updates(B.QuarantinedMediaStream, {qm: [db]})
        add("quarantined_media", "SQLite", updates, {qm: db},
            "origin NULL for local media; the BOOLEAN column reads back as 0 / 1 on SQLite",
            sqlite_of={"quarantined"})

    # presence: status_msg NULL for a user without a status message.
    pr = "get_all_presence_updates"
    db = [(7, "@bob:" + E, "offline", TS, 0, 0, None, False)]
    presence = object.__new__(B.PresenceStream)
    store = FakeStore({pr: [db]})
    updates, _t, _l = run(DataStore.get_all_presence_updates(store, "master", 0, 100, 100))
    add("presence", "no status message", updates, {pr: db},
        "presence_stream.status_msg is NULL for a user without a status message (annotated str)")
    del presence

    # account_data: global account data has no room.
    ga, ra, tg = ("get_updated_global_account_data", "get_updated_room_account_data",
                  "get_all_updated_tags")
    dbs = {ga: [(3, "@alice:" + E, "m.direct")], ra: [(4, "@alice:" + E, "!room:" + E, "m.fully_read")],
           tg: [(5, "@alice:" + E, "!room:" + E)]}
    updates = stream_updates(B.AccountDataStream, {k: [rows] for k, rows in dbs.items()})
    add("account_data", "global, room and tag", updates, dbs,
        "global account data is written with room_id None by AccountDataStream._update_function")

    # un_partial_stated_event: bool() of the column, even on SQLite.
    up = "get_un_partial_stated_events_from_stream"
    db = [(2, "$e:" + E, 1), (3, "$f:" + E, 0)]
    store = FakeStore({up: [db]})
    updates, _t, _l = run(DataStore.get_un_partial_stated_events_from_stream(store, "master", 0, 100, 100))
    add("un_partial_stated_event", "SQLite column", updates, {up: db},
        "the storage function writes bool(rejection_status_changed): true/false even on SQLite")

    # caches: keys NULL invalidates the whole cache; elements of a TEXT[] may be NULL.
    ca = "get_all_updated_caches"
    db = [(8, "get_rooms_for_user", None, TS), (9, "cs_cache_fake", ["!room:" + E, None], TS)]
    store = FakeStore({ca: [db]})
    updates, _t, _l = run(DataStore.get_all_updated_caches(store, "master", 0, 100, 100))
    add("caches", "null keys and a null key element", updates, {ca: db},
        "cache_invalidation_stream_by_instance.keys is a nullable TEXT[]")
    return out


def main():
    objs = [dict(o, release=VERSION) for o in class_rows() + update_rows()]
    names = [o["stream"] + ": " + o["name"] for o in objs]
    assert len(set(names)) == len(names), names
    lines = []
    for o, name in zip(objs, names):
        o["name"] = name
        lines.append(strict(o) + "\n")
    path = os.path.join(OUT_DIR, "rows-%s.jsonl" % VERSION)
    with open(path, "w", encoding="ascii", newline="\n") as f:
        f.write("".join(lines))
    print("rows-%s.jsonl %d vectors" % (VERSION, len(lines)))


if __name__ == "__main__":
    sys.exit(main())
