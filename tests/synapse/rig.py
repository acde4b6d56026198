#!/usr/bin/env python3
"""A throwaway Synapse 1.163.2 with its own Redis, for the interop tests.

Run it with the Python of the venv that scripts/test.sh creates
(``$SYNAPSE_PYTHON``):

    rig.py start --dir DIR [--server-name rig.test] [--owner-pid PID] [--config-json JSON]
                 [--listeners-json JSON]
        Picks free loopback ports, starts a redis-server (no persistence) and
        a monolith Synapse (SQLite in DIR) that replicates over that Redis,
        waits until Synapse answers /health and is SUBSCRIBEd to Redis, then
        prints ONE line of JSON describing the rig and exits; the servers
        keep running. With --owner-pid, a watchdog stops the rig when that
        process dies (so a killed test run leaks nothing). --config-json is
        merged into homeserver.yaml (objects merged key by key, anything
        else replaced), e.g. '{"stream_writers": {"typing": ["rust1"]},
        "instance_map": {"rust1": {"host": "127.0.0.1", "port": 1234}}}'.
        --listeners-json is a JSON list of listeners added to the rig's own
        two (which a merge could only replace), e.g. a federation listener.

    rig.py stop --dir DIR
        Stops everything `start` started (pids recorded in DIR/rig.json).

    rig.py register --dir DIR USER PASSWORD [--admin]
        Registers USER with the shared-secret admin API and prints Synapse's
        JSON answer (user_id, access_token, device_id, home_server).

    rig.py request --dir DIR --method M --path /_matrix/... [--token T] [--body -|JSON]
        One HTTP request to the rig's client listener (or --url for any URL);
        the body is JSON text, read from stdin if `-`. Prints one line of
        JSON: {"status": int, "body": <parsed JSON, or text if not JSON>}.
        Exit code 0 whatever the HTTP status.

Only loopback ports are used; nothing listens on 6379.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

STATE = "rig.json"
HEALTH_TIMEOUT = 90.0


def free_ports(count: int) -> list[int]:
    """`count` distinct ports the OS says are free (held open until all
    are picked, so they differ)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        ports = [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()
    assert 6379 not in ports
    return ports


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (our own child that exited) counts as dead.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def redis_command(port: int, *args: str, lines: int = 1, timeout: float = 2.0) -> bytes:
    """One RESP2 command; the raw reply, read until it holds `lines` CRLFs
    (enough for PING and PUBSUB NUMSUB)."""
    payload = f"*{len(args)}\r\n".encode()
    for arg in args:
        data = arg.encode()
        payload += b"$%d\r\n%s\r\n" % (len(data), data)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(payload)
        reply = b""
        while reply.count(b"\r\n") < lines:
            chunk = sock.recv(4096)
            if not chunk:
                break
            reply += chunk
        return reply


def subscribers(port: int, channel: str) -> int:
    reply = redis_command(port, "PUBSUB", "NUMSUB", channel, lines=4)
    # *2\r\n$N\r\nchannel\r\n:K\r\n
    lines = reply.split(b"\r\n")
    for line in lines:
        if line.startswith(b":"):
            return int(line[1:])
    return 0


def spawn_redis(directory: Path, port: int, deadline: float) -> subprocess.Popen | None:
    """Start redis-server on `port` and wait until it answers PING.
    Returns None if it exited (the port was taken) or missed the deadline."""
    log = open(directory / "redis.log", "ab")
    proc = subprocess.Popen(
        [
            "redis-server",
            "--port", str(port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(directory),
            "--daemonize", "no",
        ],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return None
        try:
            if redis_command(port, "PING").startswith(b"+PONG"):
                return proc
        except OSError:
            pass
        time.sleep(0.02)
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    return None


def start_redis(directory: Path) -> tuple[subprocess.Popen, int]:
    for _attempt in range(5):
        (port,) = free_ports(1)
        proc = spawn_redis(directory, port, time.monotonic() + 10)
        if proc is not None:
            return proc, port
        # lost the port race: try another
    raise SystemExit("rig: redis-server did not start; see " + str(directory / "redis.log"))


def write_signing_key(path: Path) -> None:
    from signedjson.key import generate_signing_key, write_signing_keys

    with open(path, "w") as out:
        write_signing_keys(out, [generate_signing_key("a_rig")])


LOG_CONFIG = """\
version: 1
formatters:
  precise:
    format: '%(asctime)s - %(name)s - %(lineno)d - %(levelname)s - %(request)s - %(message)s'
filters:
  context:
    (): synapse.logging.context.LoggingContextFilter
    request: ""
handlers:
  file:
    class: logging.FileHandler
    filename: {log}
    formatter: precise
    filters: [context]
    encoding: utf8
loggers:
  synapse.storage.SQL:
    level: WARNING
  twisted:
    level: WARNING
root:
  level: INFO
  handlers: [file]
disable_existing_loggers: false
"""


def homeserver_config(
    directory: Path,
    server_name: str,
    client_port: int,
    replication_port: int,
    redis_port: int,
    secret: str,
    registration_secret: str,
) -> dict:
    generous = {"per_second": 1000, "burst_count": 1000}
    return {
        "server_name": server_name,
        "public_baseurl": f"http://127.0.0.1:{client_port}/",
        "pid_file": str(directory / "homeserver.pid"),
        "report_stats": False,
        "listeners": [
            {
                "port": client_port,
                "bind_addresses": ["127.0.0.1"],
                "type": "http",
                "tls": False,
                "x_forwarded": False,
                "resources": [{"names": ["client"], "compress": False}],
            },
            {
                "port": replication_port,
                "bind_addresses": ["127.0.0.1"],
                "type": "http",
                "tls": False,
                "resources": [{"names": ["replication"], "compress": False}],
            },
        ],
        "database": {
            "name": "sqlite3",
            "args": {"database": str(directory / "homeserver.db")},
        },
        "log_config": str(directory / "log.config"),
        "media_store_path": str(directory / "media_store"),
        "signing_key_path": str(directory / f"{server_name}.signing.key"),
        "trusted_key_servers": [],
        "suppress_key_server_warning": True,
        "macaroon_secret_key": secrets.token_hex(16),
        "form_secret": secrets.token_hex(16),
        "registration_shared_secret": registration_secret,
        "enable_registration": False,
        "worker_replication_secret": secret,
        "redis": {"enabled": True, "host": "127.0.0.1", "port": redis_port},
        "instance_map": {"main": {"host": "127.0.0.1", "port": replication_port}},
        "presence": {"enabled": True},
        "enable_metrics": False,
        "url_preview_enabled": False,
        "federation_domain_whitelist": [],
        "user_directory": {"enabled": False},
        "rc_message": generous,
        "rc_registration": generous,
        "rc_login": {"address": generous, "account": generous, "failed_attempts": generous},
        "rc_joins": {"local": generous, "remote": generous},
        "rc_joins_per_room": generous,
        "rc_room_creation": generous,
        "rc_presence": {"per_user": generous},
        "rc_invites": {"per_room": generous, "per_user": generous, "per_issuer": generous},
        "rc_profile": generous,
        "rc_delayed_event_mgmt": generous,
    }


def merge(base: dict, extra: dict) -> dict:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merge(base[key], value)
        else:
            base[key] = value
    return base


def http(
    method: str,
    url: str,
    token: str | None = None,
    body: bytes | None = None,
    timeout: float = 30.0,
) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, method=method)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    if body is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def tail(path: Path, lines: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as error:
        return f"({path}: {error})"


def stop_pid(pid: int, grace: float) -> None:
    if pid == os.getpid() or not alive(pid):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not alive(pid):
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def stop_all(directory: Path, pids: dict[str, int]) -> None:
    # Synapse first (it is a Redis client), then Redis, then the watchdog.
    for name, grace in (("synapse", 10.0), ("redis", 5.0), ("watchdog", 2.0)):
        pid = pids.get(name)
        if pid:
            stop_pid(pid, grace)


def cmd_start(args: argparse.Namespace) -> int:
    started = time.monotonic()
    directory = Path(args.dir).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    python = sys.executable
    server_name = args.server_name
    secret = "rig-replication-" + secrets.token_hex(8)
    registration_secret = "rig-registration-" + secrets.token_hex(8)
    log = directory / "homeserver.log"
    pids: dict[str, int] = {}

    redis, redis_port = start_redis(directory)
    pids["redis"] = redis.pid

    write_signing_key(directory / f"{server_name}.signing.key")
    (directory / "log.config").write_text(LOG_CONFIG.replace("{log}", json.dumps(str(log))))

    synapse = None
    client_port = replication_port = 0
    try:
        for attempt in range(3):
            client_port, replication_port = free_ports(2)
            config = homeserver_config(
                directory, server_name, client_port, replication_port,
                redis_port, secret, registration_secret,
            )
            if args.config_json:
                merge(config, json.loads(args.config_json))
            if args.listeners_json:
                config["listeners"].extend(json.loads(args.listeners_json))
            # JSON is YAML: no quoting surprises.
            (directory / "homeserver.yaml").write_text(json.dumps(config, indent=2))
            out = open(directory / "synapse.out", "ab")
            synapse = subprocess.Popen(
                [python, "-m", "synapse.app.homeserver",
                 "-c", str(directory / "homeserver.yaml")],
                cwd=directory,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            out.close()
            pids["synapse"] = synapse.pid
            # Record pids at once, so `stop` works even if we fail below.
            (directory / STATE).write_text(json.dumps({"pids": pids}))

            deadline = time.monotonic() + args.timeout
            healthy = subscribed = False
            while time.monotonic() < deadline and synapse.poll() is None:
                if not healthy:
                    try:
                        status, _ = http("GET", f"http://127.0.0.1:{client_port}/health", timeout=2)
                        healthy = status == 200
                    except OSError:
                        pass
                if healthy and not subscribed:
                    try:
                        subscribed = subscribers(redis_port, server_name) >= 1
                    except OSError:
                        pass
                if healthy and subscribed:
                    break
                time.sleep(0.05)
            if healthy and subscribed:
                break
            exited = synapse.poll()
            output = tail(directory / "synapse.out", 30)
            if exited is not None and "Address already in use" in (output + tail(log)) and attempt < 2:
                continue  # lost a port race: new ports, new try
            why = (
                f"exited with {exited}" if exited is not None
                else f"not ready after {args.timeout:.0f} s (healthy={healthy}, "
                     f"subscribed to Redis={subscribed})"
            )
            sys.stderr.write(
                f"rig: Synapse {why}\n--- {directory / 'synapse.out'} ---\n{output}\n"
                f"--- {log} (tail) ---\n{tail(log)}\n"
            )
            stop_all(directory, pids)
            return 1
    except BaseException:
        stop_all(directory, pids)
        raise

    if args.owner_pid:
        watchdog = subprocess.Popen(
            [python, os.path.abspath(__file__), "watchdog", "--dir", str(directory),
             "--pid", str(args.owner_pid)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(directory / "watchdog.log", "ab"),
            start_new_session=True,
        )
        pids["watchdog"] = watchdog.pid

    info = {
        "server_name": server_name,
        "client_url": f"http://127.0.0.1:{client_port}",
        "client_port": client_port,
        "replication_url": f"http://127.0.0.1:{replication_port}",
        "replication_port": replication_port,
        "redis_port": redis_port,
        "secret": secret,
        "registration_shared_secret": registration_secret,
        "dir": str(directory),
        "log": str(log),
        "pids": pids,
        "startup_seconds": round(time.monotonic() - started, 2),
    }
    (directory / STATE).write_text(json.dumps(info))
    sys.stdout.write(json.dumps(info) + "\n")
    sys.stdout.flush()
    return 0


def load(directory: str) -> dict:
    path = Path(directory) / STATE
    try:
        return json.loads(path.read_text())
    except OSError as error:
        raise SystemExit(f"rig: no rig in {directory}: {error}")


def cmd_stop(args: argparse.Namespace) -> int:
    stop_all(Path(args.dir), load(args.dir).get("pids", {}))
    return 0


def cmd_watchdog(args: argparse.Namespace) -> int:
    while alive(args.pid):
        time.sleep(1)
    state = load(args.dir)
    stop_all(Path(args.dir), state.get("pids", {}))
    return 0


def cmd_register(args: argparse.Namespace) -> int:
    state = load(args.dir)
    url = state["client_url"] + "/_synapse/admin/v1/register"
    status, body = http("GET", url)
    if status != 200:
        sys.stderr.write(f"rig: GET nonce answered {status}: {body!r}\n")
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
    status, body = http("POST", url, body=json.dumps(request).encode())
    if status != 200:
        sys.stderr.write(f"rig: register answered {status}: {body.decode(errors='replace')}\n")
        return 1
    sys.stdout.write(json.dumps(json.loads(body)) + "\n")
    return 0


def cmd_request(args: argparse.Namespace) -> int:
    if args.url:
        url = args.url
    elif args.path:
        url = load(args.dir)["client_url"] + args.path
    else:
        raise SystemExit("rig: request needs --url or --path (with --dir)")
    body = None
    if args.body is not None:
        text = sys.stdin.read() if args.body == "-" else args.body
        body = text.encode("utf-8")
    status, raw = http(args.method, url, token=args.token, body=body)
    try:
        parsed = json.loads(raw) if raw else None
    except ValueError:
        parsed = raw.decode("utf-8", errors="replace")
    sys.stdout.write(json.dumps({"status": status, "body": parsed}) + "\n")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    start = sub.add_parser("start")
    start.add_argument("--dir", required=True)
    start.add_argument("--server-name", default="rig.test")
    start.add_argument("--timeout", type=float, default=HEALTH_TIMEOUT)
    start.add_argument("--owner-pid", type=int)
    start.add_argument("--config-json", help="JSON object merged into homeserver.yaml")
    start.add_argument("--listeners-json", help="JSON list of listeners added to the rig's")
    start.set_defaults(run=cmd_start)

    stop = sub.add_parser("stop")
    stop.add_argument("--dir", required=True)
    stop.set_defaults(run=cmd_stop)

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

    request = sub.add_parser("request")
    request.add_argument("--dir")
    request.add_argument("--method", default="GET")
    request.add_argument("--url")
    request.add_argument("--path")
    request.add_argument("--token")
    request.add_argument("--body", help="JSON text, or - to read it from stdin")
    request.set_defaults(run=cmd_request)

    args = parser.parse_args()
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
