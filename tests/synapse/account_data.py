"""What Synapse 1.163.2's own account-data endpoint classes
(synapse/replication/http/account_data.py) send and answer, for
tests/account_data_calls.rs to compare with the crate's, byte for byte.

Reads one JSON object from stdin:

    {"caller": "master", "caller_streams": [[name, token], ...],
     "callee": "rust_ad", "callee_streams": [[name, token], ...],
     "secret": "...", "max_stream_id": N,
     "calls": [{"endpoint": NAME, "kwargs": {...}}, ...]}

and prints one JSON object per call:

    {"method", "path", "authorization", "body", "args", "handled", "answer"}

- `method`, `path`, `authorization`, `body`: what the class's own
  `make_client` sends (the request function is a stand-in that records its
  arguments; the body is encoded with `encode_canonical_json`, as
  `post_json_get_json` does);
- `args`: the path arguments the class's own `register` pattern takes from
  that path, unquoted as Synapse's router does;
- `handled`: what the class's `_handle_request` passed to the account-data
  handler (a stand-in that records it and returns `max_stream_id`);
- `answer`: the answer `_check_auth_and_handle` builds for that request,
  encoded as Synapse's HTTP layer does (`json_encoder`).
"""

import asyncio
import io
import json
import re
import sys
import urllib.parse
from types import SimpleNamespace

from canonicaljson import encode_canonical_json

from synapse.replication.http import account_data
from synapse.util.json import json_encoder

CLASSES = {
    cls.NAME: cls
    for cls in (
        account_data.ReplicationAddUserAccountDataRestServlet,
        account_data.ReplicationRemoveUserAccountDataRestServlet,
        account_data.ReplicationAddRoomAccountDataRestServlet,
        account_data.ReplicationRemoveRoomAccountDataRestServlet,
        account_data.ReplicationAddTagRestServlet,
        account_data.ReplicationRemoveTagRestServlet,
    )
}


class Stream:
    def __init__(self, name, token):
        self.NAME = name
        self._token = token

    def minimal_local_current_token(self):
        return self._token


class Recorder:
    """The account-data handler and the replication HTTP client, both."""

    def __init__(self, max_stream_id):
        self.max_stream_id = max_stream_id
        self.sent = None
        self.handled = None

    async def post_json_get_json(self, uri, data, headers=None):
        self.sent = ("POST", uri, data, headers)
        return {"max_stream_id": self.max_stream_id}

    async def put_json(self, uri, data, headers=None):
        self.sent = ("PUT", uri, data, headers)
        return {"max_stream_id": self.max_stream_id}

    def __getattr__(self, name):
        # add_account_data_for_user, remove_tag_from_room, ...
        async def handle(*args):
            self.handled = [name, *args]
            return self.max_stream_id

        return handle


class Waits:
    async def wait_for_stream_position(self, instance_name, stream_name, position):
        pass


def homeserver(instance, streams, secret, recorder):
    worker = SimpleNamespace(
        worker_replication_secret=secret,
        instance_map={"master": None, "rust_ad": None, "main": None},
    )
    commands = SimpleNamespace(
        get_streams_to_replicate=lambda: [Stream(n, t) for n, t in streams]
    )
    return SimpleNamespace(
        hostname="example.com",
        config=SimpleNamespace(worker=worker),
        get_clock=lambda: None,
        get_replication_client=lambda: recorder,
        get_instance_name=lambda: instance,
        get_replication_command_handler=lambda: commands,
        get_replication_data_handler=lambda: Waits(),
        get_account_data_handler=lambda: recorder,
    )


class Paths:
    def __init__(self):
        self.patterns = []

    def register_paths(self, method, patterns, callback, servlet_classname):
        self.patterns.extend((method, p) for p in patterns)


class Request:
    def __init__(self, body, authorization):
        self.content = io.BytesIO(body)
        self.method = b"POST"
        self.uri = b"/"
        self.requestHeaders = SimpleNamespace(
            getRawHeaders=lambda name: [authorization] if name == b"Authorization" else None
        )


async def one(spec, call):
    cls = CLASSES[call["endpoint"]]
    # The caller's side: make_client, as main's account-data handler uses it.
    caller = Recorder(spec["max_stream_id"])
    hs = homeserver(spec["caller"], spec["caller_streams"], spec["secret"], caller)
    client = cls.make_client(hs)
    await client(instance_name=spec["callee"], **call["kwargs"])
    method, uri, data, headers = caller.sent
    path = uri[len("synapse-replication://%s" % spec["callee"]) :]
    body = encode_canonical_json(data)

    # The callee's side: the class's own pattern and handler.
    callee = Recorder(spec["max_stream_id"])
    hs = homeserver(spec["callee"], spec["callee_streams"], spec["secret"], callee)
    servlet = cls(hs)
    paths = Paths()
    servlet.register(paths)
    [(registered, pattern)] = paths.patterns
    assert registered == method, (registered, method)
    match = pattern.match(path)
    assert match, (pattern.pattern, path)
    args = {
        name: urllib.parse.unquote(value) if value else value
        for name, value in match.groupdict().items()
    }
    request = Request(body, headers[b"Authorization"][0])
    code, answer = await servlet._check_auth_and_handle(request, **args)
    return {
        "method": method,
        "path": path,
        "pattern": pattern.pattern,
        "authorization": headers[b"Authorization"][0].decode("ascii"),
        "body": body.decode("utf-8"),
        "args": [args[name] for name in cls.PATH_ARGS],
        "cache": cls.CACHE,
        "wait_for_streams": cls.WAIT_FOR_STREAMS,
        "handled": callee.handled,
        "code": code,
        "answer": json_encoder.encode(answer),
    }


async def main():
    spec = json.load(sys.stdin)
    for call in spec["calls"]:
        print(json.dumps(await one(spec, call)))


asyncio.run(main())
