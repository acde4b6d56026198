#!/usr/bin/env python3
"""A throwaway multi-writer Synapse 1.163.2 deployment, for interop tests.

Run it with the Python of the venv that scripts/test.sh creates
(``$SYNAPSE_PYTHON``; it needs psycopg2: ``matrix-synapse[redis,postgres]``).
It reuses the helpers of rig.py (beside this file), which runs a single
Synapse on SQLite.

    deployment.py start --dir DIR [--server-name dep.test] [--owner-pid PID]
                        [--persisters 2] [--config-json JSON]
                        [--database-prefix synapse_dep_|synrep_bench_]
        Creates a PostgreSQL database of its own (a unique name, on
        127.0.0.1:5432, user postgres, trust auth), starts a redis-server
        (no persistence) on a free loopback port, then Synapse's main
        process and, once main answers /health, in parallel, the workers:
          persister1..N  event persisters (stream_writers.events)
          worker1        a generic worker writing `typing`
        Every process has an HTTP replication listener (instance_map) and a
        client listener, and replicates over the rig's Redis. Waits until
        every process answers /health and is SUBSCRIBEd, prints ONE line of
        JSON describing the deployment and exits; the servers keep running.
        With --owner-pid a watchdog stops everything (and drops the
        database) when that process dies.

    deployment.py stop --dir DIR
        Stops every process `start` started, then drops the database.

    deployment.py register --dir DIR USER PASSWORD [--admin]
        Registers USER on main with the shared-secret admin API; prints
        Synapse's JSON answer.

    deployment.py requests --dir DIR [--threads N]
        Reads a JSON list of requests from stdin, each
        {"method", "url", "token"?, "body"?, "timeout"?}, runs them on N threads, and
        prints one line: a JSON list of {"status", "body"} in the same order.

    deployment.py redis-restart --dir DIR [--timeout S]
        Kills redis-server (SIGKILL), starts a new one on the same port and
        waits until every Synapse process has SUBSCRIBEd again.

    deployment.py redis-clients --dir DIR
        Redis' CLIENT LIST, each client with "instance": the Synapse
        process that owns its socket (found through /proc), or null.

    deployment.py redis-kill --dir DIR (--instance NAME | --name-prefix P)
        CLIENT KILL every connection of a Synapse process, or every client
        whose CLIENT SETNAME name starts with P.

    deployment.py blip --dir DIR --instance NAME [--threads 4] [--after 1.0]
        A writer blip: CLIENT KILLs every Redis connection of NAME, then runs
        the requests read from stdin (as `requests`, on --threads threads)
        while watching CLIENT LIST for NAME's return, until --after seconds
        after it is back (or the requests run out): NAME keeps persisting
        events while it cannot publish them. A request may carry "timeout"
        (seconds): a client that gives up does not stop Synapse persisting.
        Prints
        {"killed", "reconnected_after", "results": [{"status", "body",
        "before_reconnect"}]}.

    deployment.py restart --dir DIR --instance NAME [--timeout S]
        Stops one Synapse process (SIGTERM, SIGKILL after 10 s), starts it
        again on the same configuration and waits until it answers /health
        and is SUBSCRIBEd to Redis; prints {"pid", "seconds"}.

    deployment.py sql --dir DIR QUERY
        Runs QUERY on the deployment's database; prints the rows as one
        JSON list of lists.

Only loopback ports are used; nothing touches the Redis on 6379 or any
database but the deployment's own.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# rig.py is imported from the source tree: leave no __pycache__ there.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rig  # noqa: E402  (beside this file)

STATE = "deployment.json"
START_TIMEOUT = 150.0
PG = {"host": "127.0.0.1", "port": 5432, "user": "postgres"}
TYPING_WORKER = "worker1"
# The names a deployment's database may have (`start --database-prefix`):
# the tests' and benches/account_data.sh's. Nothing else is ever dropped.
DATABASE_PREFIXES = ("synapse_dep_", "synrep_bench_")


# ---------------------------------------------------------------------
# PostgreSQL
# ---------------------------------------------------------------------


def pg_connect(database: str):
    import psycopg2

    connection = psycopg2.connect(dbname=database, connect_timeout=10, **PG)
    connection.autocommit = True
    return connection


def create_database(name: str) -> None:
    connection = pg_connect("postgres")
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                f'CREATE DATABASE "{name}" ENCODING \'UTF8\' '
                "LC_COLLATE='C' LC_CTYPE='C' TEMPLATE template0"
            )
    finally:
        connection.close()


def drop_database(name: str) -> None:
    # Only ever the deployment's own database, by its recorded name.
    assert name.startswith(DATABASE_PREFIXES), name
    connection = pg_connect("postgres")
    try:
        with connection.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        connection.close()


def query(database: str, sql: str) -> list:
    connection = pg_connect(database)
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql)
            if cursor.description is None:
                return []
            return [list(row) for row in cursor.fetchall()]
    finally:
        connection.close()


# ---------------------------------------------------------------------
# Redis
# ---------------------------------------------------------------------


def restartable_port() -> int:
    """A free port below the kernel's ephemeral range. Redis is restarted
    on the same port; an ephemeral port could meanwhile become the local
    end of some process's outgoing connection (to PostgreSQL, say), and the
    restart would fail with "address already in use"."""
    low = 32768
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    for _ in range(200):
        port = random.randrange(max(1024, low - 12000), low)
        if port == 6379:
            continue
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            sock.close()
        return port
    raise SystemExit("deployment: no free port below the ephemeral range")


def start_redis_on(directory: Path, port: int, timeout: float = 10.0) -> subprocess.Popen:
    # Restarted on the same port, it may find the port briefly taken: a
    # process reconnecting meanwhile can be given it as its own end (a TCP
    # self-connection, on an ephemeral port). Such a socket goes away as
    # soon as its owner sees nonsense, so try again until the deadline.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc = rig.spawn_redis(directory, port, deadline)
        if proc is not None:
            return proc
        time.sleep(0.1)
    raise SystemExit(f"deployment: redis-server did not start on {port}; see {directory / 'redis.log'}")


def client_list(port: int) -> list[dict]:
    reply = rig.redis_command(port, "CLIENT", "LIST", lines=2)
    head, _, rest = reply.partition(b"\r\n")
    if not head.startswith(b"$"):
        raise SystemExit(f"deployment: CLIENT LIST answered {reply!r}")
    body = rest[: int(head[1:])].decode()
    clients = []
    for line in body.splitlines():
        fields = {}
        for part in line.split(" "):
            key, _, value = part.partition("=")
            fields[key] = value
        clients.append(fields)
    return clients


def socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def local_ports_to_redis(redis_port: int) -> dict[str, int]:
    """inode -> local port, for every TCP socket connected to redis_port."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, remote, inode = fields[1], fields[2], fields[9]
            if int(remote.rsplit(":", 1)[1], 16) == redis_port:
                found[inode] = int(local.rsplit(":", 1)[1], 16)
    return found


def clients_by_instance(state: dict) -> list[dict]:
    port = state["redis_port"]
    clients = client_list(port)
    ports = local_ports_to_redis(port)
    owner_of_port = {}
    for name, instance in state["instances"].items():
        for inode in socket_inodes(instance["pid"]):
            if inode in ports:
                owner_of_port[ports[inode]] = name
    for client in clients:
        try:
            local_port = int(client.get("addr", ":0").rsplit(":", 1)[1])
        except ValueError:
            local_port = 0
        client["instance"] = owner_of_port.get(local_port)
    return clients


def kill_clients(port: int, clients: list[dict]) -> list[str]:
    killed = []
    for client in clients:
        reply = rig.redis_command(port, "CLIENT", "KILL", "ID", client["id"])
        if reply.startswith(b":1") or reply.startswith(b"+OK"):
            killed.append(client["addr"])
    return killed


def synapse_subscribers(state: dict) -> int:
    """How many Synapse processes have a subscriber on the prefix channel."""
    clients = clients_by_instance(state)
    return len(
        {c["instance"] for c in clients if c["instance"] and int(c.get("sub", "0")) > 0}
    )


# ---------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------


def worker_config(directory: Path, name: str, replication_port: int, client_port: int) -> dict:
    return {
        "worker_app": "synapse.app.generic_worker",
        "worker_name": name,
        "worker_listeners": [
            {
                "type": "http",
                "port": replication_port,
                "bind_addresses": ["127.0.0.1"],
                "resources": [{"names": ["replication"], "compress": False}],
            },
            {
                "type": "http",
                "port": client_port,
                "bind_addresses": ["127.0.0.1"],
                "x_forwarded": False,
                "resources": [{"names": ["client"], "compress": False}],
            },
        ],
        "worker_log_config": str(directory / f"{name}.log.config"),
    }


def write_log_config(directory: Path, name: str) -> Path:
    log = directory / f"{name}.log"
    (directory / f"{name}.log.config").write_text(
        rig.LOG_CONFIG.replace("{log}", json.dumps(str(log)))
    )
    return log


# ---------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------


def save(directory: Path, state: dict) -> None:
    path = directory / STATE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    tmp.replace(path)


def load(directory: str) -> dict:
    path = Path(directory) / STATE
    try:
        return json.loads(path.read_text())
    except OSError as error:
        raise SystemExit(f"deployment: none in {directory}: {error}")


def stop_all(directory: Path, state: dict) -> None:
    # Synapse first (Redis and PostgreSQL clients), in parallel; then
    # Redis, the database and the watchdog.
    pids = state.get("pids", {})
    synapse = [pid for name, pid in pids.items() if name not in ("redis", "watchdog")]
    for pid in synapse:
        if pid != os.getpid() and rig.alive(pid):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    for pid in synapse:
        rig.stop_pid(pid, 10.0)
    if pids.get("redis"):
        rig.stop_pid(pids["redis"], 5.0)
    database = state.get("database")
    if database and not state.get("dropped"):
        try:
            drop_database(database)
            state["dropped"] = True
            save(directory, state)
        except Exception as error:  # noqa: BLE001 - report, go on stopping
            sys.stderr.write(f"deployment: dropping {database}: {error}\n")
    if pids.get("watchdog"):
        rig.stop_pid(pids["watchdog"], 2.0)


def spawn_synapse(directory: Path, name: str, configs: list[Path]) -> subprocess.Popen:
    module = "synapse.app.homeserver" if name == "main" else "synapse.app.generic_worker"
    command = [sys.executable, "-m", module]
    for config in configs:
        command += ["-c", str(config)]
    out = open(directory / f"{name}.out", "ab")
    proc = subprocess.Popen(
        command,
        cwd=directory,
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    out.close()
    return proc


def healthy(port: int) -> bool:
    try:
        status, _ = rig.http("GET", f"http://127.0.0.1:{port}/health", timeout=2)
        return status == 200
    except OSError:
        return False


def cmd_start(args: argparse.Namespace) -> int:
    started = time.monotonic()
    directory = Path(args.dir).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    server_name = args.server_name
    database = f"{args.database_prefix}{os.getpid()}_{secrets.token_hex(4)}"
    state: dict = {"pids": {}, "database": database, "instances": {}}
    save(directory, state)
    phases: dict[str, float] = {}

    def phase(name: str) -> None:
        phases[name] = round(time.monotonic() - started, 2)

    try:
        create_database(database)
        phase("database")
        redis_port = restartable_port()
        redis = start_redis_on(directory, redis_port)
        state["pids"]["redis"] = redis.pid
        state["redis_port"] = redis_port
        save(directory, state)

        workers = [f"persister{i + 1}" for i in range(args.persisters)] + [TYPING_WORKER]
        names = ["main"] + workers
        ports = rig.free_ports(2 * len(names))
        client_ports = dict(zip(names, ports[0::2]))
        replication_ports = dict(zip(names, ports[1::2]))

        secret = "dep-replication-" + secrets.token_hex(8)
        registration_secret = "dep-registration-" + secrets.token_hex(8)
        rig.write_signing_key(directory / f"{server_name}.signing.key")
        logs = {name: write_log_config(directory, name) for name in names}
        config = rig.homeserver_config(
            directory, server_name, client_ports["main"], replication_ports["main"],
            redis_port, secret, registration_secret,
        )
        config["log_config"] = str(directory / "main.log.config")
        config["database"] = {
            "name": "psycopg2",
            "args": {
                "user": PG["user"],
                "host": PG["host"],
                "port": PG["port"],
                "database": database,
                "cp_min": 1,
                "cp_max": 5,
            },
        }
        config["instance_map"] = {
            name: {"host": "127.0.0.1", "port": replication_ports[name]} for name in names
        }
        config["stream_writers"] = {
            "events": workers[:-1],
            "typing": [TYPING_WORKER],
        }
        if args.config_json:
            rig.merge(config, json.loads(args.config_json))
        # JSON is YAML.
        (directory / "homeserver.yaml").write_text(json.dumps(config, indent=2))
        for name in workers:
            (directory / f"{name}.yaml").write_text(json.dumps(
                worker_config(directory, name, replication_ports[name], client_ports[name]),
                indent=2,
            ))
        state["instances"] = {
            name: {
                "client_url": f"http://127.0.0.1:{client_ports[name]}",
                "client_port": client_ports[name],
                "replication_port": replication_ports[name],
                "log": str(logs[name]),
                "out": str(directory / f"{name}.out"),
                "pid": 0,
            }
            for name in names
        }

        procs: dict[str, subprocess.Popen] = {}

        def launch(name: str) -> None:
            configs = [directory / "homeserver.yaml"]
            if name != "main":
                configs.append(directory / f"{name}.yaml")
            procs[name] = spawn_synapse(directory, name, configs)
            state["pids"][name] = procs[name].pid
            state["instances"][name]["pid"] = procs[name].pid
            save(directory, state)

        def failed(why: str) -> int:
            report = [f"deployment: {why}"]
            for name in procs:
                report.append(f"--- {name}.out ---\n{rig.tail(directory / f'{name}.out', 20)}")
                report.append(f"--- {name}.log (tail) ---\n{rig.tail(logs[name], 30)}")
            sys.stderr.write("\n".join(report) + "\n")
            stop_all(directory, state)
            return 1

        launch("main")
        deadline = time.monotonic() + args.timeout
        # Workers refuse a database whose schema main has not finished
        # preparing (the schema_version table appears before the last
        # deltas are applied: seen, a worker exited): start them once main
        # answers /health, all at once.
        ready: set[str] = set()
        while not healthy(client_ports["main"]):
            if procs["main"].poll() is not None:
                return failed(f"main exited with {procs['main'].returncode}")
            if time.monotonic() > deadline:
                return failed("main did not answer /health in time")
            time.sleep(0.05)
        ready.add("main")
        phase("main healthy")
        for name in workers:
            launch(name)

        subscribed = 0
        while True:
            for name, proc in procs.items():
                if proc.poll() is not None:
                    return failed(f"{name} exited with {proc.returncode}")
                if name not in ready and healthy(client_ports[name]):
                    ready.add(name)
                    phase(f"{name} healthy")
            if len(ready) == len(names):
                try:
                    subscribed = synapse_subscribers(state)
                except OSError:
                    subscribed = 0
                if subscribed == len(names):
                    break
            if time.monotonic() > deadline:
                return failed(
                    f"not ready after {args.timeout:.0f} s: healthy {sorted(ready)}, "
                    f"{subscribed} processes subscribed to Redis"
                )
            time.sleep(0.1)
        phase("subscribed")
    except BaseException:
        stop_all(directory, state)
        raise

    if args.owner_pid:
        watchdog = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "watchdog", "--dir", str(directory),
             "--pid", str(args.owner_pid)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(directory / "watchdog.log", "ab"),
            start_new_session=True,
        )
        state["pids"]["watchdog"] = watchdog.pid

    state.update({
        "server_name": server_name,
        "redis_port": redis_port,
        "secret": secret,
        "registration_shared_secret": registration_secret,
        "dir": str(directory),
        "config": config,
        "startup_seconds": round(time.monotonic() - started, 2),
        "phases": phases,
    })
    save(directory, state)
    sys.stdout.write(json.dumps(state) + "\n")
    sys.stdout.flush()
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    stop_all(Path(args.dir), load(args.dir))
    return 0


def cmd_watchdog(args: argparse.Namespace) -> int:
    while rig.alive(args.pid):
        time.sleep(1)
    state = load(args.dir)
    stop_all(Path(args.dir), state)
    return 0


def cmd_restart(args: argparse.Namespace) -> int:
    started = time.monotonic()
    directory = Path(args.dir).resolve()
    state = load(args.dir)
    name = args.instance
    if name not in state["instances"]:
        raise SystemExit(f"deployment: no instance {name}")
    rig.stop_pid(state["pids"][name], 10.0)
    configs = [directory / "homeserver.yaml"]
    if name != "main":
        configs.append(directory / f"{name}.yaml")
    proc = spawn_synapse(directory, name, configs)
    state["pids"][name] = proc.pid
    state["instances"][name]["pid"] = proc.pid
    save(directory, state)
    port = state["instances"][name]["client_port"]
    deadline = time.monotonic() + args.timeout
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"deployment: {name} exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise SystemExit(f"deployment: {name} not back after {args.timeout:.0f} s")
        if healthy(port):
            try:
                clients = clients_by_instance(state)
            except OSError:
                clients = []
            if any(c["instance"] == name and int(c.get("sub", "0")) > 0 for c in clients):
                break
        time.sleep(0.1)
    sys.stdout.write(json.dumps({
        "pid": proc.pid, "seconds": round(time.monotonic() - started, 2),
    }) + "\n")
    return 0


def cmd_register(args: argparse.Namespace) -> int:
    state = load(args.dir)
    url = state["instances"]["main"]["client_url"] + "/_synapse/admin/v1/register"
    status, body = rig.http("GET", url)
    if status != 200:
        sys.stderr.write(f"deployment: GET nonce answered {status}: {body!r}\n")
        return 1
    nonce = json.loads(body)["nonce"]
    mac = hmac.new(state["registration_shared_secret"].encode(), digestmod=hashlib.sha1)
    for part in (nonce, args.user, args.password):
        mac.update(part.encode())
        mac.update(b"\x00")
    mac.update(b"admin" if args.admin else b"notadmin")
    request = {
        "nonce": nonce,
        "username": args.user,
        "password": args.password,
        "admin": args.admin,
        "mac": mac.hexdigest(),
    }
    status, body = rig.http("POST", url, body=json.dumps(request).encode())
    if status != 200:
        sys.stderr.write(f"deployment: register answered {status}: {body.decode(errors='replace')}\n")
        return 1
    sys.stdout.write(json.dumps(json.loads(body)) + "\n")
    return 0


def run_request(request: dict) -> dict:
    body = request.get("body")
    data = None if body is None else json.dumps(body).encode()
    try:
        status, raw = rig.http(
            request.get("method", "GET"), request["url"], token=request.get("token"), body=data,
            timeout=request.get("timeout", 60),
        )
    except (OSError, TimeoutError) as error:
        return {"status": 0, "body": f"{type(error).__name__}: {error}"}
    try:
        parsed = json.loads(raw) if raw else None
    except ValueError:
        parsed = raw.decode("utf-8", errors="replace")
    return {"status": status, "body": parsed}


def cmd_requests(args: argparse.Namespace) -> int:
    requests = json.load(sys.stdin)
    with ThreadPoolExecutor(max_workers=max(1, args.threads)) as pool:
        results = list(pool.map(run_request, requests))
    sys.stdout.write(json.dumps(results) + "\n")
    return 0


def cmd_redis_restart(args: argparse.Namespace) -> int:
    directory = Path(args.dir)
    state = load(args.dir)
    port = state["redis_port"]
    started = time.monotonic()
    old = state["pids"]["redis"]
    os.kill(old, signal.SIGKILL)
    while rig.alive(old):
        time.sleep(0.01)
    new = start_redis_on(directory, port)
    state["pids"]["redis"] = new.pid
    save(directory, state)
    up = time.monotonic() - started
    wanted = len(state["instances"])
    deadline = time.monotonic() + args.timeout
    subscribed = 0
    while subscribed < wanted:
        if time.monotonic() > deadline:
            sys.stderr.write(
                f"deployment: only {subscribed} of {wanted} Synapse processes SUBSCRIBEd "
                f"again after {args.timeout} s\n"
            )
            return 1
        time.sleep(0.05)
        try:
            subscribed = synapse_subscribers(state)
        except OSError:
            subscribed = 0
    sys.stdout.write(json.dumps({
        "down_seconds": round(up, 3),
        "resubscribed_seconds": round(time.monotonic() - started, 3),
        "redis_pid": new.pid,
    }) + "\n")
    return 0


def cmd_redis_clients(args: argparse.Namespace) -> int:
    sys.stdout.write(json.dumps(clients_by_instance(load(args.dir))) + "\n")
    return 0


def cmd_redis_kill(args: argparse.Namespace) -> int:
    state = load(args.dir)
    clients = clients_by_instance(state)
    if args.instance:
        chosen = [c for c in clients if c["instance"] == args.instance]
    else:
        chosen = [c for c in clients if c.get("name", "").startswith(args.name_prefix)]
    killed = kill_clients(state["redis_port"], chosen)
    sys.stdout.write(json.dumps({"killed": killed}) + "\n")
    return 0


def cmd_blip(args: argparse.Namespace) -> int:
    state = load(args.dir)
    requests = json.load(sys.stdin)
    port = state["redis_port"]
    clients = [c for c in clients_by_instance(state) if c["instance"] == args.instance]
    if not clients:
        sys.stderr.write(f"deployment: {args.instance} has no Redis connection\n")
        return 1
    old_ids = {c["id"] for c in clients}
    killed_at = time.monotonic()
    killed = kill_clients(port, clients)
    back = threading.Event()
    reconnected_after: list[float] = []

    def watch() -> None:
        # Back once it has a new subscriber again.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                again = [
                    c for c in clients_by_instance(state)
                    if c["instance"] == args.instance and c["id"] not in old_ids
                    and int(c.get("sub", "0")) > 0
                ]
            except OSError:
                again = []
            if again:
                reconnected_after.append(time.monotonic() - killed_at)
                back.set()
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    pending = list(reversed(requests))
    lock = threading.Lock()
    results: list[dict] = []

    def done() -> bool:
        return bool(reconnected_after) and (
            time.monotonic() - killed_at - reconnected_after[0] >= args.after
        )

    def sender() -> None:
        while not done():
            with lock:
                if not pending:
                    return
                request = pending.pop()
            result = run_request(request)
            result["before_reconnect"] = not back.is_set()
            with lock:
                results.append(result)

    threads = [threading.Thread(target=sender) for _ in range(max(1, args.threads))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    watcher.join(65)
    sys.stdout.write(json.dumps({
        "killed": killed,
        "reconnected_after": reconnected_after[0] if reconnected_after else None,
        "results": results,
    }) + "\n")
    return 0


def cmd_sql(args: argparse.Namespace) -> int:
    state = load(args.dir)
    rows = query(state["database"], args.query)
    sys.stdout.write(json.dumps(rows, default=str) + "\n")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    start = sub.add_parser("start")
    start.add_argument("--dir", required=True)
    start.add_argument("--server-name", default="dep.test")
    start.add_argument("--timeout", type=float, default=START_TIMEOUT)
    start.add_argument("--owner-pid", type=int)
    start.add_argument("--persisters", type=int, default=2)
    start.add_argument("--config-json", help="JSON object merged into homeserver.yaml")
    start.add_argument("--database-prefix", choices=DATABASE_PREFIXES, default="synapse_dep_")
    start.set_defaults(run=cmd_start)

    for name, run in (("stop", cmd_stop), ("redis-clients", cmd_redis_clients)):
        command = sub.add_parser(name)
        command.add_argument("--dir", required=True)
        command.set_defaults(run=run)

    watchdog = sub.add_parser("watchdog")
    watchdog.add_argument("--dir", required=True)
    watchdog.add_argument("--pid", type=int, required=True)
    watchdog.set_defaults(run=cmd_watchdog)

    register = sub.add_parser("register")
    register.add_argument("--dir", required=True)
    register.add_argument("user")
    register.add_argument("password")
    register.add_argument("--admin", action="store_true")
    register.set_defaults(run=cmd_register)

    requests = sub.add_parser("requests")
    requests.add_argument("--dir", required=True)
    requests.add_argument("--threads", type=int, default=4)
    requests.set_defaults(run=cmd_requests)

    restart = sub.add_parser("redis-restart")
    restart.add_argument("--dir", required=True)
    restart.add_argument("--timeout", type=float, default=60.0)
    restart.set_defaults(run=cmd_redis_restart)

    kill = sub.add_parser("redis-kill")
    kill.add_argument("--dir", required=True)
    which = kill.add_mutually_exclusive_group(required=True)
    which.add_argument("--instance")
    which.add_argument("--name-prefix")
    kill.set_defaults(run=cmd_redis_kill)

    blip = sub.add_parser("blip")
    blip.add_argument("--dir", required=True)
    blip.add_argument("--instance", required=True)
    blip.add_argument("--threads", type=int, default=4)
    blip.add_argument("--after", type=float, default=1.0,
                      help="seconds to go on sending once NAME is back")
    blip.set_defaults(run=cmd_blip)

    restart_one = sub.add_parser("restart")
    restart_one.add_argument("--dir", required=True)
    restart_one.add_argument("--instance", required=True)
    restart_one.add_argument("--timeout", type=float, default=START_TIMEOUT)
    restart_one.set_defaults(run=cmd_restart)

    sql = sub.add_parser("sql")
    sql.add_argument("--dir", required=True)
    sql.add_argument("query")
    sql.set_defaults(run=cmd_sql)

    args = parser.parse_args()
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
