"""Synapse 1.163.2's own `caches` code, run against a test database.

Used by tests/postgres_caches.rs to compare the crate with Synapse, not
with a description of it. The functions run are Synapse's, unchanged
(`CacheInvalidationWorkerStore` in storage/databases/main/cache.py, its
`PostgresSequenceGenerator`, `DatabasePool.simple_insert*_txn` and
`json_encoder`); only what they are called on is a stand-in: a store
object with the few attributes they read, and a transaction that turns
Synapse's `?` placeholders into psycopg2's, as its LoggingTransaction does
on PostgreSQL.

    python caches.py schema
        Prints, one per line (JSON strings), the statements of Synapse's
        full schema that create the caches stream's table, indexes and
        sequence, and `stream_positions`.

    python caches.py run DBNAME < ops.json
        Runs each op in its own transaction and prints a JSON list of
        results. Ops:
          {"op": "entry", "instance", "cache", "key": [...], "ts"}
          {"op": "entries", "instance", "cache", "keys": [[...], ...], "ts"}
          {"op": "all", "instance", "cache", "ts"}
              -> null
          {"op": "page", "instance", "from", "to", "limit"}
              -> {"body": the endpoint's answer as json_encoder writes it,
                  "lines": [the RDATA line its writer sends for each row]}

    python caches.py position DBNAME INSTANCE
        Starts the `caches` id generator as cache.py builds it for INSTANCE
        on PostgreSQL (a real MultiWriterIdGenerator, `writers=[]`,
        loading from the database as at a process's startup) and prints
        the position that process announces for itself (`POSITION caches
        INSTANCE N N`: `CachesStream`'s current token,
        `get_cache_stream_token_for_writer`) as a JSON number.
"""

import asyncio
import json
import os
import re
import sys

import psycopg2
import psycopg2.extras
import synapse
from synapse.replication.tcp.commands import RdataCommand
from synapse.storage.database import DatabasePool, LoggingDatabaseConnection
from synapse.storage.databases.main.cache import CacheInvalidationWorkerStore
from synapse.storage.engines import PostgresEngine
from synapse.storage.util.id_generators import MultiWriterIdGenerator
from synapse.storage.util.sequence import PostgresSequenceGenerator
from synapse.util.json import json_encoder

# An engine Synapse's isinstance checks accept; none of its methods run.
ENGINE = PostgresEngine.__new__(PostgresEngine)


class Txn:
    """What Synapse's LoggingTransaction does that these functions use."""

    database_engine = ENGINE

    def __init__(self, cursor):
        self.cursor = cursor

    def execute(self, sql, args=()):
        self.cursor.execute(sql.replace("?", "%s"), args)

    def execute_values(self, sql, values, fetch=True):
        return psycopg2.extras.execute_values(
            self.cursor, sql.replace("?", "%s"), values, fetch=fetch
        )

    def fetchone(self):
        return self.cursor.fetchone()

    def __iter__(self):
        return iter(self.cursor)

    def call_after(self, *args, **kwargs):
        pass


class Ids:
    """The calls cache.py makes on its MultiWriterIdGenerator, which take
    ids from the sequence as Synapse's does."""

    sequence = PostgresSequenceGenerator("cache_invalidation_stream_seq")

    def get_next_txn(self, txn):
        return self.sequence.get_next_id_txn(txn)

    def get_next_mult_txn(self, txn, n):
        return self.sequence.get_next_mult_txn(txn, n)


class Cached:
    """A cached function, as far as _invalidate_cache_and_stream looks."""

    def __init__(self, name):
        self.__name__ = name

    def invalidate(self, keys):
        pass

    def invalidate_all(self):
        pass


class Store:
    """Synapse's methods, on a stand-in for the store."""

    _invalidate_cache_and_stream = CacheInvalidationWorkerStore._invalidate_cache_and_stream
    _invalidate_cache_and_stream_bulk = (
        CacheInvalidationWorkerStore._invalidate_cache_and_stream_bulk
    )
    _invalidate_all_cache_and_stream = (
        CacheInvalidationWorkerStore._invalidate_all_cache_and_stream
    )
    _send_invalidation_to_replication = (
        CacheInvalidationWorkerStore._send_invalidation_to_replication
    )
    _send_invalidation_to_replication_bulk = (
        CacheInvalidationWorkerStore._send_invalidation_to_replication_bulk
    )
    get_all_updated_caches = CacheInvalidationWorkerStore.get_all_updated_caches

    def __init__(self, conn, instance, ts):
        self.conn = conn
        self._instance_name = instance
        self.database_engine = ENGINE
        self._cache_id_gen = Ids()
        self.db_pool = self
        self.clock = self
        self.hs = self
        self.ts = ts

    # DatabasePool
    simple_insert_txn = staticmethod(DatabasePool.simple_insert_txn)
    simple_insert_many_txn = staticmethod(DatabasePool.simple_insert_many_txn)

    async def runInteraction(self, desc, func, *args):
        with self.conn:
            with self.conn.cursor() as cursor:
                return func(Txn(cursor), *args)

    # Clock, HomeServer, Notifier
    def time_msec(self):
        return self.ts

    def get_notifier(self):
        return self

    def on_new_replication_data(self):
        pass


def schema():
    path = os.path.join(
        os.path.dirname(synapse.__file__),
        "storage/schema/main/full_schemas/72/full.sql.postgres",
    )
    with open(path) as f:
        text = f.read()
    for statement in text.split(";\n"):
        statement = statement.strip()
        # Drop comment lines pg_dump put before each statement.
        statement = "\n".join(
            line for line in statement.splitlines() if not line.startswith("--")
        ).strip()
        # And `stream_positions`, which every id generator reads at startup.
        if re.search(
            r"\b(cache_invalidation_stream_(by_instance|seq)|stream_positions)\b", statement
        ):
            print(json.dumps(statement + ";"))


def run(dbname):
    ops = json.load(sys.stdin)
    conn = psycopg2.connect(host="127.0.0.1", port=5432, user="postgres", dbname=dbname)
    results = []
    for op in ops:
        store = Store(conn, op["instance"], op.get("ts"))
        kind = op["op"]
        if kind == "page":
            updates, upto, limited = asyncio.run(
                store.get_all_updated_caches(
                    op["instance"], op["from"], op["to"], op["limit"]
                )
            )
            body = json_encoder.encode(
                {"updates": updates, "upto_token": upto, "limited": limited}
            )
            # The lines its writer sends for these rows (one id each, so
            # no batch), as ReplicationCommandHandler.send_command writes them.
            lines = [
                "RDATA " + RdataCommand("caches", op["instance"], token, row).to_line()
                for token, row in updates
            ]
            results.append({"body": body, "lines": lines})
            continue
        with conn:
            with conn.cursor() as cursor:
                txn = Txn(cursor)
                cached = Cached(op["cache"])
                if kind == "entry":
                    store._invalidate_cache_and_stream(txn, cached, tuple(op["key"]))
                elif kind == "entries":
                    store._invalidate_cache_and_stream_bulk(
                        txn, cached, [tuple(key) for key in op["keys"]]
                    )
                elif kind == "all":
                    store._invalidate_all_cache_and_stream(txn, cached)
                else:
                    raise ValueError(f"unknown op {kind}")
        results.append(None)
    conn.close()
    print(json.dumps(results))


class Notifier:
    def notify_replication(self):
        pass


class Pool:
    """What MultiWriterIdGenerator reads of its DatabasePool at startup."""

    engine = PostgresEngine({"name": "psycopg2", "args": {}})


def position(dbname, instance):
    conn = psycopg2.connect(host="127.0.0.1", port=5432, user="postgres", dbname=dbname)
    db_conn = LoggingDatabaseConnection(
        conn=conn, engine=Pool.engine, default_txn_name="startup", server_name="example.com"
    )
    # As CacheInvalidationWorkerStore.__init__ builds it on PostgreSQL.
    ids = MultiWriterIdGenerator(
        db_conn=db_conn,
        db=Pool(),
        notifier=Notifier(),
        stream_name="caches",
        server_name="example.com",
        instance_name=instance,
        tables=[("cache_invalidation_stream_by_instance", "instance_name", "stream_id")],
        sequence_name="cache_invalidation_stream_seq",
        writers=[],
    )
    conn.commit()
    conn.close()
    # CachesStream.current_token(instance): get_cache_stream_token_for_writer.
    print(json.dumps(ids.get_current_token_for_writer(instance)))


if __name__ == "__main__":
    if sys.argv[1:2] == ["schema"]:
        schema()
    elif sys.argv[1:2] == ["position"] and len(sys.argv) == 4:
        position(sys.argv[2], sys.argv[3])
    elif sys.argv[1:2] == ["run"] and len(sys.argv) == 3:
        run(sys.argv[2])
    else:
        sys.exit(__doc__)
