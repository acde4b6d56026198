#!/usr/bin/env python3
"""Captures real Redis pub/sub traffic for the fuzz corpora.

Starts its own redis-server on a free loopback port (never the one on
6379), opens the connections a Synapse worker opens (a RESP2 subscriber, a
RESP3 subscriber, a publisher, a pattern subscriber, a user without the
right to publish), sends the handshakes and publishes replication lines
taken from tests/vectors/commands.jsonl, and writes every byte each
connection sent and received to seeds/redis-pubsub.json (bytes as code
points 0-255). make_corpus.py cuts the corpora from that file, so it is
committed and this script is only needed to refresh it:

    python3 fuzz/capture_redis.py && python3 fuzz/make_corpus.py
"""

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
VECTORS = os.path.join(HERE, "..", "tests", "vectors")
OUT = os.path.join(HERE, "seeds", "redis-pubsub.json")
PREFIX = "example.com"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(*args):
    out = b"*%d\r\n" % len(args)
    for arg in args:
        arg = arg if isinstance(arg, bytes) else str(arg).encode()
        out += b"$%d\r\n%s\r\n" % (len(arg), arg)
    return out


class Conn:
    def __init__(self, name, port):
        self.name = name
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.settimeout(0.3)
        self.sent = b""
        self.received = b""

    def send(self, *args):
        data = command(*args)
        self.sent += data
        self.sock.sendall(data)
        self.drain()

    def drain(self):
        """Reads until Redis has been quiet for 0.3 s."""
        while True:
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                return
            if not chunk:
                return
            self.received += chunk

    def record(self):
        return {
            "name": self.name,
            "sent": self.sent.decode("latin-1"),
            "received": self.received.decode("latin-1"),
        }


def lines_to_publish():
    """One line of each command Synapse sends over Redis, and a few rows."""
    seen = {}
    rdata = []
    with open(os.path.join(VECTORS, "commands.jsonl")) as f:
        for raw in f:
            vector = json.loads(raw)
            line = vector["line"]
            if len(line) > 600:
                continue
            if vector["cmd"] == "RDATA":
                rdata.append(line)
            seen.setdefault(vector["cmd"], line)
    return list(seen.values()) + rdata[::8]


def main():
    server = shutil.which("redis-server")
    if server is None:
        raise SystemExit("redis-server not found")
    port = free_port()
    assert port != 6379
    workdir = tempfile.mkdtemp()
    proc = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", workdir, "--requirepass", "secret"],
        stdout=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port)).close()
                break
            except OSError:
                time.sleep(0.05)
        conns = run(port)
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump([c.record() for c in conns], f, indent=1)
        f.write("\n")
    print(f"wrote {OUT}")


def run(port):
    admin = Conn("admin", port)
    admin.send("AUTH", "secret")
    admin.send("ACL", "SETUSER", "reader", "on", ">pw", "~*", "&*", "+@all", "-publish")

    # The subscriber of a two-connection setup: RESP2, AUTH, SELECT,
    # CLIENT SETNAME, SUBSCRIBE, a PING while subscribed.
    sub2 = Conn("subscriber-resp2", port)
    sub2.send("PING")  # before AUTH: NOAUTH
    sub2.send("AUTH", "wrong")
    sub2.send("AUTH", "secret")
    sub2.send("SELECT", "3")
    sub2.send("CLIENT", "SETNAME", "worker1")
    sub2.send("SUBSCRIBE", PREFIX, PREFIX + "/USER_IP")
    sub2.send("PING")

    # The single connection: RESP3, pushes.
    sub3 = Conn("subscriber-resp3", port)
    sub3.send("HELLO", "4")  # NOPROTO
    sub3.send("HELLO", "3", "AUTH", "default", "secret", "SETNAME", "worker2")
    sub3.send("SUBSCRIBE", PREFIX)
    sub3.send("PING")

    pattern = Conn("pattern-resp2", port)
    pattern.send("AUTH", "secret")
    pattern.send("PSUBSCRIBE", PREFIX + "*")

    reader = Conn("reader", port)
    reader.send("AUTH", "reader", "pw")
    reader.send("PUBLISH", PREFIX, "REPLICATE")  # NOPERM

    publisher = Conn("publisher", port)
    publisher.send("AUTH", "secret")
    publisher.send("SELECT", "3")
    publisher.send("CLIENT", "SETNAME", "master")
    publisher.send("FOO")
    for line in lines_to_publish():
        channel = PREFIX + "/USER_IP" if line.startswith("USER_IP ") else PREFIX
        publisher.send("PUBLISH", channel, line.encode())
    publisher.send("PUBLISH", "elsewhere", "PING 1")
    publisher.send("PING")

    sub2.send("UNSUBSCRIBE")
    sub3.send("UNSUBSCRIBE")
    for conn in (sub2, sub3, pattern):
        conn.drain()
    return [sub2, sub3, pattern, reader, publisher]


if __name__ == "__main__":
    main()
