"""Synapse 1.163.2's own account-data writer, run against a test database.

Used by tests/postgres_account_data.rs to compare the crate's writes and
catch-up pages with Synapse's, not with a description of them. The code
run is Synapse's, unchanged: `AccountDataWorkerStore` and
`TagsWorkerStore` (storage/databases/main/account_data.py, tags.py), their
`MultiWriterIdGenerator` (a real one, loading from and writing to the
database), `CacheInvalidationWorkerStore`'s invalidations, `DatabasePool`'s
`simple_*` helpers and `LoggingTransaction`, and `AccountDataStream`'s
update function (replication/tcp/streams/_base.py). Only what they are
called on is a stand-in: a store object with the attributes they read,
in-memory caches that record nothing, and a `runInteraction` that runs the
function in one psycopg2 transaction (autocommit where Synapse asks for
it), then its after-callbacks.

    python account_data_store.py schema
        Prints, one per line (JSON strings), the statements of Synapse's
        full schema for the tables the account-data writer touches.

    python account_data_store.py run DBNAME INSTANCE TS < ops.json
        Loads an id generator for `account_data` as INSTANCE (the only
        writer), runs each op and prints a JSON list of results. The
        clock answers TS (ms). Ops:
          {"op": "add_user", "user_id", "type", "content"}
          {"op": "remove_user", "user_id", "type"}
          {"op": "add_room", "user_id", "room_id", "type", "content"}
          {"op": "remove_room", "user_id", "room_id", "type"}
          {"op": "add_tag", "user_id", "room_id", "tag", "content"}
          {"op": "remove_tag", "user_id", "room_id", "tag"}
              -> {"max_stream_id": N} or {"error": [code, errcode, msg]}
          {"op": "page", "from", "to"}
              -> the catch-up answer's body as the endpoint writes it
                 (`Stream.get_updates_since` with AccountDataStream's
                 update function, encoded with json_encoder)
"""

import asyncio
import json
import os
import re
import sys

import psycopg2
import synapse
from synapse.api.errors import SynapseError
from synapse.replication.tcp.streams import AccountDataStream
from synapse.replication.tcp.streams._base import Stream
from synapse.storage.database import (
    DatabasePool,
    LoggingDatabaseConnection,
    LoggingTransaction,
)
from synapse.storage.databases.main.account_data import AccountDataWorkerStore
from synapse.storage.databases.main.cache import CacheInvalidationWorkerStore
from synapse.storage.databases.main.tags import TagsWorkerStore
from synapse.storage.engines import PostgresEngine
from synapse.storage.util.id_generators import MultiWriterIdGenerator
from synapse.storage.util.sequence import PostgresSequenceGenerator
from synapse.util.json import json_encoder

ENGINE = PostgresEngine({"name": "psycopg2", "args": {}})

# The tables (and their sequences) the writer and its catch-up touch.
TABLES = (
    "account_data",
    "room_account_data",
    "room_tags",
    "room_tags_revisions",
    "ignored_users",
    "stream_positions",
    "account_data_sequence",
    "cache_invalidation_stream_by_instance",
    "cache_invalidation_stream_seq",
)


class Cached:
    """An in-memory cache of Synapse's, as far as the writer uses it."""

    def __init__(self, name):
        self.__name__ = name

    def invalidate(self, keys):
        pass

    def invalidate_all(self):
        pass

    def prefill(self, key, value):
        pass


class StreamCache:
    def entity_has_changed(self, entity, stream_id):
        pass


class CacheIds:
    """cache.py's calls on its id generator (`caches` keeps no positions)."""

    sequence = PostgresSequenceGenerator("cache_invalidation_stream_seq")

    def get_next_txn(self, txn):
        return self.sequence.get_next_id_txn(txn)

    def get_next_mult_txn(self, txn, n):
        return self.sequence.get_next_mult_txn(txn, n)


class Notifier:
    def notify_replication(self):
        pass

    def on_new_replication_data(self):
        pass


class Pool:
    """DatabasePool's methods the writer calls, on one psycopg2 connection."""

    engine = ENGINE
    _unsafe_to_upsert_tables = set()

    def __init__(self, conn):
        self.conn = conn

    simple_upsert = DatabasePool.simple_upsert
    simple_upsert_txn = DatabasePool.simple_upsert_txn
    simple_upsert_txn_native_upsert = staticmethod(
        DatabasePool.simple_upsert_txn_native_upsert
    )
    simple_select_onecol_txn = staticmethod(DatabasePool.simple_select_onecol_txn)
    simple_delete_many_txn = staticmethod(DatabasePool.simple_delete_many_txn)
    simple_delete_txn = staticmethod(DatabasePool.simple_delete_txn)
    simple_insert_txn = staticmethod(DatabasePool.simple_insert_txn)
    simple_insert_many_txn = staticmethod(DatabasePool.simple_insert_many_txn)

    async def runInteraction(self, desc, func, *args, db_autocommit=False, **kwargs):
        after = []
        self.conn.autocommit = db_autocommit
        try:
            cursor = self.conn.cursor()
            txn = LoggingTransaction(
                txn=cursor,
                name=desc,
                server_name="example.com",
                database_engine=ENGINE,
                after_callbacks=after,
            )
            try:
                result = func(txn, *args, **kwargs)
            except BaseException:
                if not db_autocommit:
                    self.conn.rollback()
                raise
            if not db_autocommit:
                self.conn.commit()
        finally:
            self.conn.autocommit = False
        for callback, cb_args, cb_kwargs in after:
            callback(*cb_args, **cb_kwargs)
        return result


class Store:
    """Synapse's account-data and tags writer, on a stand-in store."""

    for _name in (
        "add_account_data_for_user",
        "_add_account_data_for_user",
        "remove_account_data_for_user",
        "add_account_data_to_room",
        "remove_account_data_for_room",
        "get_updated_global_account_data",
        "get_updated_room_account_data",
    ):
        locals()[_name] = getattr(AccountDataWorkerStore, _name)
    for _name in ("add_tag_to_room", "remove_tag_from_room", "_update_revision_txn",
                  "get_all_updated_tags"):
        locals()[_name] = getattr(TagsWorkerStore, _name)
    for _name in (
        "_invalidate_cache_and_stream",
        "_invalidate_cache_and_stream_bulk",
        "_send_invalidation_to_replication",
        "_send_invalidation_to_replication_bulk",
    ):
        locals()[_name] = getattr(CacheInvalidationWorkerStore, _name)
    del _name

    _can_write_to_account_data = True

    def __init__(self, conn, instance, ts):
        self.db_pool = Pool(conn)
        self.database_engine = ENGINE
        self._instance_name = instance
        self._cache_id_gen = CacheIds()
        self._account_data_stream_cache = StreamCache()
        self.clock = self
        self.hs = self
        self.ts = ts
        for name in (
            "get_global_account_data_for_user",
            "get_global_account_data_by_type_for_user",
            "get_room_account_data_for_user",
            "get_account_data_for_room",
            "get_account_data_for_room_and_type",
            "get_tags_for_user",
            "get_tags_for_room",
            "ignored_by",
            "ignored_users",
        ):
            setattr(self, name, Cached(name))
        db_conn = LoggingDatabaseConnection(
            conn=conn, engine=ENGINE, default_txn_name="startup", server_name="example.com"
        )
        self._account_data_id_gen = MultiWriterIdGenerator(
            db_conn=db_conn,
            db=self.db_pool,
            notifier=Notifier(),
            stream_name="account_data",
            server_name="example.com",
            instance_name=instance,
            tables=[
                ("room_account_data", "instance_name", "stream_id"),
                ("room_tags_revisions", "instance_name", "stream_id"),
                ("account_data", "instance_name", "stream_id"),
            ],
            sequence_name="account_data_sequence",
            writers=[instance],
        )
        conn.commit()

    # Clock, HomeServer
    def time_msec(self):
        return self.ts

    def get_notifier(self):
        return Notifier()


def schema():
    path = os.path.join(
        os.path.dirname(synapse.__file__),
        "storage/schema/main/full_schemas/72/full.sql.postgres",
    )
    with open(path) as f:
        text = f.read()
    # The object each statement is about: a table, a sequence, or the
    # table an index or constraint is on.
    subject = re.compile(
        r"^(?:CREATE TABLE|CREATE SEQUENCE|ALTER TABLE ONLY"
        r"|CREATE (?:UNIQUE )?INDEX \w+ ON|SELECT pg_catalog.setval\(')\s*(\w+)"
    )
    for statement in text.split(";\n"):
        statement = "\n".join(
            line for line in statement.strip().splitlines() if not line.startswith("--")
        ).strip()
        found = subject.match(statement)
        if found and found.group(1) in TABLES:
            print(json.dumps(statement + ";"))


def page(store, instance, from_token, to_token):
    stream = Stream.__new__(AccountDataStream)
    stream.store = store
    stream.update_function = stream._update_function
    updates, upto, limited = asyncio.run(
        Stream.get_updates_since(stream, instance, from_token, to_token)
    )
    return json_encoder.encode({"updates": updates, "upto_token": upto, "limited": limited})


def run(dbname, instance, ts):
    ops = json.load(sys.stdin)
    conn = psycopg2.connect(host="127.0.0.1", port=5432, user="postgres", dbname=dbname)
    store = Store(conn, instance, ts)
    results = []
    for op in ops:
        kind = op["op"]
        if kind == "page":
            results.append(page(store, instance, op["from"], op["to"]))
            continue
        call = {
            "add_user": lambda: store.add_account_data_for_user(
                op["user_id"], op["type"], op["content"]
            ),
            "remove_user": lambda: store.remove_account_data_for_user(
                op["user_id"], op["type"]
            ),
            "add_room": lambda: store.add_account_data_to_room(
                op["user_id"], op["room_id"], op["type"], op["content"]
            ),
            "remove_room": lambda: store.remove_account_data_for_room(
                op["user_id"], op["room_id"], op["type"]
            ),
            "add_tag": lambda: store.add_tag_to_room(
                op["user_id"], op["room_id"], op["tag"], op["content"]
            ),
            "remove_tag": lambda: store.remove_tag_from_room(
                op["user_id"], op["room_id"], op["tag"]
            ),
        }[kind]
        try:
            results.append({"max_stream_id": asyncio.run(call())})
        except SynapseError as error:
            results.append({"error": [error.code, error.errcode, error.msg]})
    conn.close()
    print(json.dumps(results))


if __name__ == "__main__":
    if sys.argv[1:2] == ["schema"]:
        schema()
    elif sys.argv[1:2] == ["run"] and len(sys.argv) == 5:
        run(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        sys.exit(__doc__)
