#!/usr/bin/env python3
"""Generate the replication test vectors from Synapse's own code.

Every vector in this directory is produced, or checked, by Synapse 1.163.2's own
classes: commands are built with ``synapse.replication.tcp.commands``, turned into
wire lines exactly as Synapse's senders do (``"%s %s" % (cmd.NAME, cmd.to_line())``,
see ``redis.py`` ``_async_send_command`` and ``protocol.py`` ``send_command``) and
parsed back with ``parse_command_from_line``. Rows are built with the stream row
classes of ``synapse.replication.tcp.streams`` and encoded by ``RdataCommand.to_line``
(``json_encoder.encode(row)``), then parsed back with ``Stream.parse_row``.

Set up the reference environment once (network access to PyPI needed):

    python3 -m venv /tmp/synapse-ref && /tmp/synapse-ref/bin/pip install "matrix-synapse[redis]==1.163.2"

Then, from the repository root:

    /tmp/synapse-ref/bin/python tests/vectors/generate.py

It (re)writes, next to this script:

    commands.jsonl      canonical wire lines, one per command, with parsed fields
    noncanonical.jsonl  lines Synapse accepts but never writes, with the canonical form
    rejected.jsonl      lines Synapse's parser rejects, with the Python exception
    rows.jsonl          typed rows for all 19 streams, as Synapse puts them into RDATA

Rows of older releases (1.98.0 to 1.140.0) come from the sibling script
``generate_releases.py``, run with each release's own Synapse.

The output is deterministic (no clocks, no randomness, no set iteration): running
the script twice gives byte-identical files. Each output line is
``json.dumps(obj, ensure_ascii=True, sort_keys=True) + "\\n"``. Every output object is
checked to be strict JSON (no NaN/Infinity, no lone surrogate escapes), so that any
strict JSON parser (e.g. serde_json) can read every line of every file.
"""

import json
import os
import sys

import attr

import synapse

assert synapse.__version__ == "1.163.2", (
    "these vectors pin Synapse 1.163.2, found %s" % synapse.__version__
)

from synapse.api.constants import ProfileUpdateAction  # noqa: E402
from synapse.api.presence import UserPresenceState  # noqa: E402
from synapse.federation import send_queue  # noqa: E402
from synapse.federation.units import Edu  # noqa: E402
from synapse.replication.tcp import commands as C  # noqa: E402
from synapse.replication.tcp.commands import (  # noqa: E402
    COMMAND_MAP,
    parse_command_from_line,
)
from synapse.replication.tcp.streams import STREAMS_MAP  # noqa: E402
from synapse.replication.tcp.streams.events import (  # noqa: E402
    EventsStreamAllStateRow,
    EventsStreamCurrentStateRow,
    EventsStreamEventRow,
    EventsStreamRow,
)
from synapse.util.json import json_decoder, json_encoder  # noqa: E402

OUT_DIR = os.path.dirname(os.path.abspath(__file__))

# The largest line Synapse's direct-TCP transport sends or accepts
# (twisted LineOnlyReceiver.MAX_LENGTH; protocol.py checks `len > MAX_LENGTH`).
TCP_MAX_LINE = 16384


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def wire(cmd):
    """The line exactly as Synapse's senders write it (no trailing newline)."""
    return "%s %s" % (cmd.NAME, cmd.to_line())


def has_lone_surrogate(s):
    return any(0xD800 <= ord(ch) <= 0xDFFF for ch in s)


def strict_json_problem(obj):
    """Why `obj` cannot be written as strict JSON (or None if it can).

    Python's json writes lone surrogates as "\\udXXX" escapes and floats
    inf/nan as Infinity/NaN: strict parsers refuse both.
    """
    if isinstance(obj, str):
        return "lone surrogate" if has_lone_surrogate(obj) else None
    if isinstance(obj, float):
        return None if obj == obj and obj not in (float("inf"), float("-inf")) else "non-finite float"
    if isinstance(obj, (list, tuple)):
        for x in obj:
            p = strict_json_problem(x)
            if p:
                return p
        return None
    if isinstance(obj, dict):
        for k, v in obj.items():
            p = strict_json_problem(k) or strict_json_problem(v)
            if p:
                return p
        return None
    return None


def command_fields(cmd):
    """The parsed fields of a command, as Python has them after parsing."""
    if isinstance(cmd, C._SimpleCommand):
        return {"data": cmd.data}
    if isinstance(cmd, C.RdataCommand):
        return {
            "stream_name": cmd.stream_name,
            "instance_name": cmd.instance_name,
            "token": cmd.token,
            "row": cmd.row,
        }
    if isinstance(cmd, C.PositionCommand):
        return {
            "stream_name": cmd.stream_name,
            "instance_name": cmd.instance_name,
            "prev_token": cmd.prev_token,
            "new_token": cmd.new_token,
        }
    if isinstance(cmd, C.ReplicateCommand):
        return {}
    if isinstance(cmd, C.UserSyncCommand):
        return {
            "instance_id": cmd.instance_id,
            "user_id": cmd.user_id,
            "device_id": cmd.device_id,
            "is_syncing": cmd.is_syncing,
            "last_sync_ms": cmd.last_sync_ms,
        }
    if isinstance(cmd, C.ClearUserSyncsCommand):
        return {"instance_id": cmd.instance_id}
    if isinstance(cmd, C.FederationAckCommand):
        return {"instance_name": cmd.instance_name, "token": cmd.token}
    if isinstance(cmd, C.UserIpCommand):
        return {
            "user_id": cmd.user_id,
            "access_token": cmd.access_token,
            "ip": cmd.ip,
            "user_agent": cmd.user_agent,
            "device_id": cmd.device_id,
            "last_seen": cmd.last_seen,
        }
    if isinstance(cmd, C.LockReleasedCommand):
        return {
            "instance_name": cmd.instance_name,
            "lock_name": cmd.lock_name,
            "lock_key": cmd.lock_key,
        }
    raise AssertionError("unknown command %r" % (cmd,))


def attach_fields(obj, fields):
    """Put `fields` into `obj`, leaving out values that strict JSON cannot
    carry: lone surrogates (valid for Python, not for a Rust String) and inf
    (from 1e400). Those are named in obj["unrepresentable"] = {field: reason}."""
    good = {}
    bad = []
    for k, v in fields.items():
        p = strict_json_problem(v)
        if p:
            bad.append(k)
            obj.setdefault("unrepresentable", {})[k] = p
        else:
            good[k] = v
    obj["fields"] = good


def write_jsonl(filename, objs):
    names = [o["name"] for o in objs]
    dup = sorted({n for n in names if names.count(n) > 1})
    assert not dup, "duplicate vector names in %s: %r" % (filename, dup)
    out = []
    for o in objs:
        p = strict_json_problem(o)
        assert p is None, "vector %r is not strict JSON: %s" % (o["name"], p)
        text = json.dumps(o, ensure_ascii=True, sort_keys=True, allow_nan=False)
        assert "\n" not in text
        assert json.loads(text) == o
        out.append(text + "\n")
    path = os.path.join(OUT_DIR, filename)
    with open(path, "w", encoding="ascii", newline="\n") as f:
        f.write("".join(out))
    return len(out)


# ---------------------------------------------------------------------------
# 1. commands.jsonl: canonical wire lines
# ---------------------------------------------------------------------------

# Awkward strings, reused below.
NON_ASCII = "caf\u00e9 \u4e2d\u6587 \u05e9\u05dc\u05d5\u05dd \u0645\u0631\u062d\u0628\u0627"  # é, CJK, Hebrew & Arabic (RTL)
ASTRAL = "\U0001f600 \U0001f469\u200d\U0001f4bb \U0010ffff \U00010000"  # emoji, ZWJ sequence, U+10FFFF, U+10000
CONTROL = "".join(chr(c) for c in range(0x00, 0x20)) + "\x7f"  # every C0 control + DEL
QUOTES = 'say "hi" \\ back\\slash \\" /slash/ \'single\''
BIG = 2**63 - 1

TS = 1700000000000  # a fixed ms timestamp (2023-11-14)


def ev(event_id, room_id, typ, state_key=None, redacts=None, relates_to=None,
       membership=None, rejected=False, outlier=False):
    """An events-stream "ev" row as EventsStream._update_function builds it:
    (TypeId, rest) where rest is the list from `(stream_id, *rest) in event_rows`."""
    return (EventsStreamEventRow.TypeId,
            [event_id, room_id, typ, state_key, redacts, relates_to, membership, rejected, outlier])


def command_specs():
    S = []  # (name, Command)

    def add(name, cmd):
        S.append((name, cmd))

    # --- SERVER --------------------------------------------------------------
    add("SERVER server_name", C.ServerCommand("example.com"))
    add("SERVER server_name with port", C.ServerCommand("matrix.example.org:8448"))
    add("SERVER localhost", C.ServerCommand("localhost"))
    add("SERVER non-ASCII raw UTF-8", C.ServerCommand("\u00e9xample.\u4e2d\u6587"))
    add("SERVER empty data (trailing space)", C.ServerCommand(""))

    # --- NAME ----------------------------------------------------------------
    add("NAME master", C.NameCommand("master"))
    add("NAME generic worker", C.NameCommand("generic_worker1"))
    add("NAME with dots and dashes", C.NameCommand("synapse.app.generic_worker-2"))
    add("NAME with spaces", C.NameCommand("worker with spaces"))
    add("NAME non-ASCII", C.NameCommand("\u540d\u524d-\u00e9"))

    # --- PING ----------------------------------------------------------------
    add("PING ms timestamp", C.PingCommand(str(TS)))
    add("PING zero", C.PingCommand("0"))
    add("PING arbitrary text", C.PingCommand("hello world"))
    add("PING trailing spaces in data", C.PingCommand("1700000000000  "))
    add("PING leading space in data", C.PingCommand(" 42"))
    add("PING empty data (trailing space)", C.PingCommand(""))

    # --- ERROR ---------------------------------------------------------------
    add("ERROR line length exceeded", C.ErrorCommand("Line length exceeded"))
    add("ERROR failed to keep up", C.ErrorCommand("Failed to keep up"))
    add("ERROR ping timeout", C.ErrorCommand("ping timeout"))
    add("ERROR wrong remote", C.ErrorCommand("Wrong remote"))
    add("ERROR invalid command", C.ErrorCommand("invalid command: SERVER"))
    add("ERROR parse failure with repr", C.ErrorCommand(
        "failed to parse line: %r (%r):" % (KeyError("FOO"), "FOO bar")))
    add("ERROR non-ASCII and astral raw UTF-8", C.ErrorCommand(
        "erreur: " + NON_ASCII + " " + ASTRAL))
    add("ERROR quotes and backslashes", C.ErrorCommand(QUOTES))
    add("ERROR tab and DEL in data", C.ErrorCommand("a\tb\x7fc"))

    # --- REPLICATE -----------------------------------------------------------
    add("REPLICATE (trailing space)", C.ReplicateCommand())

    # --- REMOTE_SERVER_UP ----------------------------------------------------
    add("REMOTE_SERVER_UP server", C.RemoteServerUpCommand("example.org"))
    add("REMOTE_SERVER_UP with port", C.RemoteServerUpCommand("matrix.org:8448"))
    add("REMOTE_SERVER_UP IPv6 literal", C.RemoteServerUpCommand("[2001:db8::1]:8448"))
    add("REMOTE_SERVER_UP punycode", C.RemoteServerUpCommand("xn--e1afmkfd.xn--p1ai"))

    # --- NEW_ACTIVE_TASK / CANCEL_TASK --------------------------------------
    add("NEW_ACTIVE_TASK task id", C.NewActiveTaskCommand("GDmTmCyJaVcYwYLE"))
    add("NEW_ACTIVE_TASK short id", C.NewActiveTaskCommand("a"))
    add("NEW_ACTIVE_TASK non-ASCII", C.NewActiveTaskCommand("t\u00e2che-\U0001f600"))
    add("CANCEL_TASK task id", C.CancelTaskCommand("GDmTmCyJaVcYwYLE"))
    add("CANCEL_TASK with spaces", C.CancelTaskCommand("task id with spaces "))
    add("CANCEL_TASK digits", C.CancelTaskCommand("1234567890"))

    # --- CLEAR_USER_SYNC -----------------------------------------------------
    add("CLEAR_USER_SYNC worker", C.ClearUserSyncsCommand("generic_worker1"))
    add("CLEAR_USER_SYNC master", C.ClearUserSyncsCommand("master"))
    add("CLEAR_USER_SYNC non-ASCII", C.ClearUserSyncsCommand("w\u00f6rker-\u4e2d"))

    # --- FEDERATION_ACK ------------------------------------------------------
    add("FEDERATION_ACK token", C.FederationAckCommand("federation_sender1", 123456))
    add("FEDERATION_ACK token 0", C.FederationAckCommand("federation_sender1", 0))
    add("FEDERATION_ACK max i64", C.FederationAckCommand("federation_sender1", BIG))
    add("FEDERATION_ACK negative", C.FederationAckCommand("master", -1))

    # --- POSITION ------------------------------------------------------------
    add("POSITION events prev == new", C.PositionCommand("events", "master", 1234, 1234))
    add("POSITION caches worker", C.PositionCommand("caches", "generic_worker1", 100, 105))
    add("POSITION typing zero", C.PositionCommand("typing", "master", 0, 0))
    add("POSITION receipts event persister", C.PositionCommand("receipts", "event_persister-2", 7, 9))
    add("POSITION max i64", C.PositionCommand("events", "master", BIG - 1, BIG))
    add("POSITION min i64", C.PositionCommand("events", "master", -(2**63), -(2**63)))
    add("POSITION negative tokens", C.PositionCommand("backfill", "master", -5, -3))
    add("POSITION new below prev (stream reset)", C.PositionCommand("caches", "master", 500, 3))
    add("POSITION unknown stream", C.PositionCommand("some_future_stream", "master", 1, 2))
    add("POSITION non-ASCII instance", C.PositionCommand("presence", "w\u00f6rker", 1, 2))
    for s in ("backfill", "presence_federation", "push_rules", "pushers", "device_lists",
              "to_device", "federation", "account_data", "profile_updates", "sticky_events",
              "thread_subscriptions", "un_partial_stated_room", "un_partial_stated_event",
              "quarantined_media"):
        add("POSITION %s" % s, C.PositionCommand(s, "master", 41, 42))

    # --- USER_SYNC -----------------------------------------------------------
    add("USER_SYNC start with device", C.UserSyncCommand(
        "generic_worker1", "@alice:example.com", "ABCDEFGHIJ", True, TS))
    add("USER_SYNC end with device", C.UserSyncCommand(
        "generic_worker1", "@alice:example.com", "ABCDEFGHIJ", False, TS + 1))
    add("USER_SYNC device None (literal None)", C.UserSyncCommand(
        "generic_worker1", "@bob:example.com", None, True, TS))
    add("USER_SYNC end device None", C.UserSyncCommand(
        "master", "@bob:example.com", None, False, 0))
    add("USER_SYNC non-ASCII ids raw UTF-8", C.UserSyncCommand(
        "w\u00f6rker", "@\u00e9l\u00e8ve:example.com", "\u8bbe\u5907", True, 5))
    add("USER_SYNC max i64 ms", C.UserSyncCommand("w1", "@c:example.com", "D", True, BIG))
    add("USER_SYNC negative ms", C.UserSyncCommand("w1", "@c:example.com", "D", False, -1))

    # --- USER_IP -------------------------------------------------------------
    add("USER_IP typical", C.UserIpCommand(
        "@alice:example.com", "syt_YWxpY2U_aBcDeFgHiJkLmNoPqRsT_0a1b2c", "203.0.113.7",
        "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Element/1.11.50 Chrome/120.0 Electron/28.0 Safari/537.36",
        "ABCDEFGHIJ", TS))
    add("USER_IP device None", C.UserIpCommand(
        "@bob:example.com", "syt_Ym9i_token", "::ffff:198.51.100.2", "curl/8.4.0", None, TS))
    add("USER_IP IPv6 and empty user agent", C.UserIpCommand(
        "@c:example.com", "tok", "2001:db8::1", "", "DEV", 0))
    add("USER_IP non-ASCII and astral user agent", C.UserIpCommand(
        "@d:example.com", "tok", "127.0.0.1", "Element " + NON_ASCII + " " + ASTRAL, "DEV", TS))
    add("USER_IP control chars, DEL, quotes in user agent", C.UserIpCommand(
        "@e:example.com", "tok", "127.0.0.1", CONTROL + QUOTES, "DEV", TS))
    add("USER_IP non-ASCII user id raw, device escaped", C.UserIpCommand(
        "@\u00e9:example.com", "tok", "10.0.0.1", "ua", "\u8bbe\u5907", BIG))
    add("USER_IP lone surrogate in user agent", C.UserIpCommand(
        "@f:example.com", "tok", "10.0.0.1", "bad \ud800 ua", "DEV", 1))

    # --- LOCK_RELEASED -------------------------------------------------------
    add("LOCK_RELEASED purge lock", C.LockReleasedCommand(
        "master", "purge_pagination_lock", "!room:example.com"))
    add("LOCK_RELEASED new event during purge", C.LockReleasedCommand(
        "event_persister1", "new_event_during_purge_lock", "!abc:example.com"))
    add("LOCK_RELEASED federation inbound pdu", C.LockReleasedCommand(
        "generic_worker1", "federation_inbound_pdu", "!r:example.com"))
    add("LOCK_RELEASED empty key", C.LockReleasedCommand("master", "upload_media", ""))
    add("LOCK_RELEASED non-ASCII and quotes", C.LockReleasedCommand(
        "w\u00f6rker", "lock \u4e2d", QUOTES + ASTRAL))

    # --- RDATA: events -------------------------------------------------------
    def rdata(name, stream, token, row, instance="master"):
        add(name, C.RdataCommand(stream, instance, token, row))

    rdata("RDATA events message", "events", 1234, ev(
        "$EvEnTiD0123456789abcdefghijklmnopqrstuvwx", "!room:example.com", "m.room.message"))
    rdata("RDATA events membership join", "events", 1235, ev(
        "$join:example.com", "!room:example.com", "m.room.member",
        state_key="@alice:example.com", membership="join"))
    rdata("RDATA events redaction", "events", 1236, ev(
        "$redact:example.com", "!room:example.com", "m.room.redaction",
        redacts="$EvEnTiD0123456789abcdefghijklmnopqrstuvwx"))
    rdata("RDATA events relation", "events", 1237, ev(
        "$reply:example.com", "!room:example.com", "m.room.message",
        relates_to="$thread_root:example.com"))
    rdata("RDATA events rejected outlier", "events", 1238, ev(
        "$o:example.com", "!room:example.com", "m.room.member", state_key="@x:remote.org",
        membership="leave", rejected=True, outlier=True))
    rdata("RDATA events SQLite booleans 0/1", "events", 1239, ev(
        "$s:example.com", "!room:example.com", "m.room.create", state_key="",
        rejected=0, outlier=1))
    rdata("RDATA events batch token", "events", None, ev(
        "$b1:example.com", "!room:example.com", "m.room.message"))
    rdata("RDATA events state row", "events", 1240, (
        EventsStreamCurrentStateRow.TypeId,
        ["!room:example.com", "m.room.member", "@alice:example.com", "$join:example.com"]))
    rdata("RDATA events state row removed (event_id null)", "events", 1241, (
        EventsStreamCurrentStateRow.TypeId,
        ["!room:example.com", "m.room.topic", "", None]))
    rdata("RDATA events state-all row", "events", 1242, (
        EventsStreamAllStateRow.TypeId, ("!room:example.com",)))
    rdata("RDATA events from event persister", "events", 77, ev(
        "$p:example.com", "!room:example.com", "m.reaction"), instance="event_persister-1")
    rdata("RDATA backfill (positive token)", "backfill", 3, [
        "$old:example.com", "!room:example.com", "m.room.message", None, None, None])

    # --- RDATA: caches -------------------------------------------------------
    rdata("RDATA caches get_user_by_id", "caches", 88, [
        "get_user_by_id", ["@alice:example.com"], TS])
    rdata("RDATA caches cs_cache_fake", "caches", 89, [
        "cs_cache_fake", ["!room:example.com", "@alice:example.com", "@bob:example.com"], TS])
    rdata("RDATA caches invalidate all (keys null)", "caches", 90, [
        "get_rooms_for_user", None, TS])
    rdata("RDATA caches empty keys", "caches", 91, ["get_monthly_active_count", [], TS])
    rdata("RDATA caches JSON text inside key string", "caches", 92, [
        "_get_e2e_cross_signing_signatures_for_device",
        [json.dumps(["@alice:example.com", "DEVICEID"])], TS])
    rdata("RDATA caches token 0", "caches", 0, ["get_user_by_id", ["@a:example.com"], 0])
    rdata("RDATA caches from worker (caches go backwards)", "caches", 5, [
        "_get_state_group_for_events", ["$e:example.com"], TS], instance="generic_worker1")

    # --- RDATA: the other streams --------------------------------------------
    rdata("RDATA receipts read", "receipts", 12, [
        "!room:example.com", "m.read", "@alice:example.com", "$e:example.com", None, {"ts": TS}])
    rdata("RDATA receipts threaded private", "receipts", 13, [
        "!room:example.com", "m.read.private", "@alice:example.com", "$e:example.com", "main",
        {"ts": TS, "thread_id": "main"}])
    rdata("RDATA typing two users", "typing", 5, ["!room:example.com", ["@a:example.com", "@b:example.com"]])
    rdata("RDATA typing nobody", "typing", 6, ["!room:example.com", []])
    rdata("RDATA presence online", "presence", 300, [
        "@alice:example.com", "online", TS, TS - 1000, TS - 5, "at lunch \U0001f354", True])
    rdata("RDATA presence status null SQLite bool", "presence", 301, [
        "@bob:example.com", "offline", TS, 0, 0, None, 0])
    rdata("RDATA presence_federation", "presence_federation", 4, ["remote.org", "@alice:example.com"])
    rdata("RDATA to_device user", "to_device", 1001, ["@alice:example.com"])
    rdata("RDATA to_device remote destination", "to_device", 1002, ["remote.example.org"])
    rdata("RDATA device_lists", "device_lists", 50, ["@alice:example.com", False, True])
    rdata("RDATA device_lists signature", "device_lists", 51, ["@alice:example.com", True, False])
    rdata("RDATA account_data global", "account_data", 20, ["@alice:example.com", None, "m.push_rules"])
    rdata("RDATA account_data room tag", "account_data", 21, ["@alice:example.com", "!room:example.com", "m.tag"])
    rdata("RDATA push_rules", "push_rules", 9, ["@alice:example.com"])
    rdata("RDATA pushers deleted", "pushers", 10, ["@alice:example.com", "m.http", "pushkey/abc+==", True])
    rdata("RDATA profile_updates update", "profile_updates", 3, ["@alice:example.com", "update", ["displayname", "avatar_url"]])
    rdata("RDATA profile_updates joined_room", "profile_updates", 4, ["@alice:example.com", "joined_room", None])
    rdata("RDATA sticky_events", "sticky_events", 2, ["!room:example.com", "$sticky:example.com"])
    rdata("RDATA thread_subscriptions", "thread_subscriptions", 2, ["@alice:example.com", "!room:example.com", "$root:example.com"])
    rdata("RDATA un_partial_stated_room", "un_partial_stated_room", 1, ["!room:example.com"])
    rdata("RDATA un_partial_stated_event", "un_partial_stated_event", 1, ["$e:example.com", True])
    rdata("RDATA quarantined_media", "quarantined_media", 1, ["example.com", "abcDEF123", True])
    rdata("RDATA federation presence destinations", "federation", 70, [
        "pd", send_queue.PresenceDestinationsRow(
            state=UserPresenceState("@alice:example.com", "online", TS, TS, TS, None, True),
            destinations=["remote.org", "other.org"]).to_data()])
    rdata("RDATA federation keyed edu", "federation", 71, [
        "k", send_queue.KeyedEduRow(
            key=("!room:example.com",),
            edu=Edu(edu_type="m.typing",
                    content={"room_id": "!room:example.com", "user_id": "@alice:example.com", "typing": True},
                    origin="example.com", destination="remote.org")).to_data()])
    rdata("RDATA unknown stream", "some_future_stream", 1, ["anything", {"goes": [1, 2]}])

    # --- RDATA: tokens -------------------------------------------------------
    rdata("RDATA token max i64", "events", BIG, ev("$x:example.com", "!r:example.com", "m.room.message"))
    rdata("RDATA token min i64", "caches", -(2**63), ["f", None, 0])
    rdata("RDATA negative token", "caches", -7, ["f", None, 0])
    rdata("RDATA batch token caches", "caches", None, ["get_user_by_id", ["@a:example.com"], TS])

    # --- RDATA: JSON awkwardness ---------------------------------------------
    rdata("RDATA empty row", "typing", 8, [])
    rdata("RDATA non-ASCII BMP escaped lowercase", "caches", 100, ["f", [NON_ASCII], 0])
    rdata("RDATA astral chars as surrogate pairs", "caches", 101, ["f", [ASTRAL], 0])
    rdata("RDATA U+1F600 alone", "caches", 102, ["f", ["\U0001f600"], 0])
    rdata("RDATA U+10FFFF alone", "caches", 103, ["f", ["\U0010ffff"], 0])
    rdata("RDATA U+0080 U+FFFF U+FEFF U+2028 U+2029", "caches", 104, ["f", ["\u0080\uffff\ufeff\u2028\u2029"], 0])
    rdata("RDATA every C0 control char and DEL", "caches", 105, ["f", [CONTROL], 0])
    rdata("RDATA quotes backslashes slashes", "caches", 106, ["f", [QUOTES], 0])
    rdata("RDATA spaces inside row strings", "receipts", 107, [
        "!room:example.com", "m.read", "@a:example.com", "$e:example.com", None,
        {"note": "  spaces  in the middle and at the ends  "}])
    rdata("RDATA nested objects and arrays", "federation", 108, ["e", {
        "edu_type": "m.direct_to_device", "origin": "example.com", "destination": "remote.org",
        "content": {"messages": {"@bob:remote.org": {"DEV": {"a": [1, [2, [3, {"b": None}]]], "c": {}, "d": []}}},
                    "sender": "@alice:example.com", "type": "m.room_key_request",
                    "message_id": "abc"}}])
    rdata("RDATA object keys not sorted (insertion order kept)", "federation", 109, ["e", {
        "z": 1, "a": 2, "m": {"y": True, "b": False}}])
    rdata("RDATA empty object and array values", "federation", 110, ["e", {"": "", "x": {}, "y": []}])
    rdata("RDATA all JSON literal kinds", "federation", 111, ["e", {"t": True, "f": False, "n": None, "i": -12, "s": "s"}])
    floats = [1.5, 1e16, 1e-05, 0.1, -0.0, 123456789.123, 1e15, 1e22, 5e-324,
              1.7976931348623157e308, 2.0 ** 53, 0.30000000000000004, 100.0, 1e-07, 1.0, -2.5e-10]
    rdata("RDATA floats (Python repr)", "federation", 112, ["e", {"floats": floats}])
    for i, f in enumerate([1e16, 1e-05, -0.0, 1e15, 1e22, 5e-324, 123456789.123, 0.1]):
        rdata("RDATA float %d %s" % (i, repr(f)), "federation", 113 + i, ["e", {"v": f}])
    rdata("RDATA big ints in row (beyond u64)", "federation", 130, ["e", {
        "u64max": 2**64 - 1, "two64": 2**64, "neg": -(2**64), "huge": 10**30, "i64min": -(2**63)}])
    rdata("RDATA 2**62 in row", "caches", 131, ["f", None, 2**62])
    rdata("RDATA lone high surrogate", "caches", 132, ["f", ["\ud800"], 0])
    rdata("RDATA lone low surrogate", "caches", 133, ["f", ["\udfff"], 0])
    rdata("RDATA reversed surrogate pair", "caches", 134, ["f", ["\ude00\ud83d"], 0])
    rdata("RDATA high surrogate then ASCII", "caches", 135, ["f", ["x\ud83dy"], 0])
    rdata("RDATA lone surrogate as object key", "federation", 136, ["e", {"\udc00": 1}])

    # --- long lines ----------------------------------------------------------
    # ~16000 bytes: a typing row with many users.
    users = []
    while True:
        users.append("@user%05d:example.com" % len(users))
        line = wire(C.RdataCommand("typing", "master", 999, ["!big:example.com", users]))
        if len(line.encode("utf-8")) >= 16000:
            break
    rdata("RDATA long typing row ~16000 bytes", "typing", 999, ["!big:example.com", users])

    # exactly the TCP maximum, and one byte more.
    def padded_caches(total):
        prefix = wire(C.RdataCommand("caches", "master", 1000, ["get_user_by_id", [""], TS]))
        pad = "a" * (total - len(prefix.encode("utf-8")))
        return ["get_user_by_id", [pad], TS]

    rdata("RDATA exactly 16384 bytes (TCP max)", "caches", 1000, padded_caches(TCP_MAX_LINE))
    rdata("RDATA 16385 bytes (over TCP max)", "caches", 1000, padded_caches(TCP_MAX_LINE + 1))

    # ~36 kB presence status message (the largest real rows).
    status = ("Out of office \U0001f334 \u2014 back on Monday. Urgent: ping @oncall:example.com. "
              "Absent \u2014 de retour lundi. \u4e0d\u5728\u529e\u516c\u5ba4\u3002 ")
    msg = ""
    while len(json_encoder.encode(msg)) < 36000:
        msg += status
    rdata("RDATA presence 36 kB status message", "presence", 302, [
        "@verbose:example.com", "unavailable", TS, TS, TS, msg, False])
    return S


def build_commands():
    objs = []
    names_seen = set()
    for name, cmd in command_specs():
        line = wire(cmd)
        assert "\n" not in line and "\r" not in line, name
        line.encode("utf-8")  # what the senders do; raises on a raw lone surrogate
        parsed = parse_command_from_line(line)
        assert type(parsed) is type(cmd), name
        assert wire(parsed) == line, "round trip failed for %r" % name
        # the parsed fields are what was built (tuples come back as lists)
        assert json_encoder.encode(command_fields(parsed)) == json_encoder.encode(command_fields(cmd)), name
        obj = {"name": name, "line": line, "cmd": cmd.NAME}
        attach_fields(obj, command_fields(parsed))
        if "lone surrogate" in obj.get("unrepresentable", {}).values():
            obj["lone_surrogate"] = True
        n = len(line.encode("utf-8"))
        if n > TCP_MAX_LINE:
            obj["over_tcp_limit"] = True
        if n >= 15000:
            obj["utf8_len"] = n
        objs.append(obj)
        names_seen.add(cmd.NAME)
    missing = set(COMMAND_MAP) - names_seen
    assert not missing, "commands without vectors: %r" % missing
    return objs


# ---------------------------------------------------------------------------
# 2. noncanonical.jsonl: accepted by Synapse, never written by it
# ---------------------------------------------------------------------------

# (name, line, ours, why) -- ours is None (the crate accepts and re-encodes to
# `canonical`) or "reject" (the crate deliberately refuses a line Synapse accepts).
EV = '["ev",["$e:x","!r:x","m.room.message",null,null,null,null,false,false]]'
NONCANONICAL = [
    # empty rest
    ("REPLICATE without trailing space", "REPLICATE", None, None),
    ("REPLICATE with junk", "REPLICATE junk", None, None),
    ("REPLICATE with two spaces", "REPLICATE  ", None, None),
    ("SERVER without space", "SERVER", None, None),
    ("PING without space", "PING", None, None),
    ("NAME without space", "NAME", None, None),
    ("ERROR without space", "ERROR", None, None),
    ("REMOTE_SERVER_UP without space", "REMOTE_SERVER_UP", None, None),
    ("NEW_ACTIVE_TASK without space", "NEW_ACTIVE_TASK", None, None),
    ("CANCEL_TASK without space", "CANCEL_TASK", None, None),
    ("CLEAR_USER_SYNC without space", "CLEAR_USER_SYNC", None, None),
    # row JSON spelling
    ("row JSON with spaces after commas", "RDATA typing master 5 [1, 2]", None, None),
    ("row JSON with spaces everywhere", 'RDATA caches master 5 [ "f" , [ "k" ] , 1 ]', None, None),
    ("row JSON leading space (two spaces after token)", "RDATA caches master 5  [1]", None, None),
    ("row JSON trailing space", "RDATA caches master 5 [1] ", None, None),
    ("row JSON trailing CR (CRLF sender)", "RDATA caches master 5 [1]\r", None, None),
    ("row JSON tab and CR whitespace", 'RDATA caches master 5 [\t1,\r2\t]', None, None),
    ("row JSON object with spaces", 'RDATA federation master 5 ["e", {"a" : 1 , "b":[ ]}]', None, None),
    ("non-ASCII raw in row JSON", 'RDATA caches master 5 ["f",["caf\u00e9 \u4e2d"],0]', None, None),
    ("astral raw in row JSON", 'RDATA caches master 5 ["f",["\U0001f600"],0]', None, None),
    ("uppercase hex escape", 'RDATA caches master 5 ["f",["\\u00E9"],0]', None, None),
    ("uppercase hex surrogate pair", 'RDATA caches master 5 ["f",["\\uD83D\\uDE00"],0]', None, None),
    ("escaped slash", 'RDATA caches master 5 ["f",["a\\/b"],0]', None, None),
    ("needlessly escaped ASCII", 'RDATA caches master 5 ["\\u0066",null,0]', None, None),
    ("escaped \\b \\f short forms kept, \\u0008 becomes \\b", 'RDATA caches master 5 ["f",["\\u0008\\u000c\\u000a\\u0009\\u000d"],0]', None, None),
    ("raw DEL inside string", 'RDATA caches master 5 ["f",["a\x7fb"],0]', None, None),
    ("duplicate object keys (last wins)", 'RDATA federation master 5 ["e",{"a":1,"a":2}]', None, None),
    ("number 1E5 becomes float", 'RDATA federation master 5 ["e",{"v":1E5}]', None, None),
    ("number 1e16 gets a plus sign", 'RDATA federation master 5 ["e",{"v":1e16}]', None, None),
    ("number 1.0e0", 'RDATA federation master 5 ["e",{"v":1.0e0}]', None, None),
    ("number 0.10", 'RDATA federation master 5 ["e",{"v":0.10}]', None, None),
    ("number 100e-2", 'RDATA federation master 5 ["e",{"v":100e-2}]', None, None),
    ("number -0 integer", 'RDATA federation master 5 ["e",{"v":-0}]', None, None),
    ("number 1e-400 underflows to 0.0", 'RDATA federation master 5 ["e",{"v":1e-400}]', None, None),
    ("number with 17+ digits rounds", 'RDATA federation master 5 ["e",{"v":1.00000000000000001}]', None, None),
    ("number 1.5E+00", 'RDATA federation master 5 ["e",{"v":1.5E+00}]', None, None),
    ("events row with spaces", 'RDATA events master 5 ["ev", ["$e:x", "!r:x", "m.room.message", null, null, null, null, false, false]]', None, None),
    # row values Synapse's parser accepts although its writers never produce them
    ("row is a number, not an array", "RDATA caches master 5 5", None, None),
    ("row is null", "RDATA caches master 5 null", None, None),
    ("row is an object", 'RDATA caches master 5 {"a":1}', None, None),
    ("row is a string", 'RDATA caches master 5 "s"', None, None),
    # tokens
    ("token with leading zeros", "RDATA events master 007 " + EV, None, None),
    ("token -0", "RDATA events master -0 " + EV, None, None),
    ("POSITION tokens with leading zeros", "POSITION events master 01 002", None, None),
    ("FEDERATION_ACK token with leading zeros", "FEDERATION_ACK federation_sender1 0010", None, None),
    ("USER_SYNC ms with leading zeros", "USER_SYNC w1 @a:x D start 0099", None, None),
    # tokens Python accepts that the crate refuses
    ("token 2**63 (beyond i64)", "RDATA events master 9223372036854775808 " + EV, "reject", "token outside signed 64-bit"),
    ("token -2**63-1 (beyond i64)", "RDATA events master -9223372036854775809 " + EV, "reject", "token outside signed 64-bit"),
    ("token 10**30", "RDATA events master 1000000000000000000000000000000 " + EV, "reject", "token outside signed 64-bit"),
    ("POSITION new token 2**63", "POSITION events master 1 9223372036854775808", "reject", "token outside signed 64-bit"),
    ("POSITION prev token -2**63-1", "POSITION events master -9223372036854775809 1", "reject", "token outside signed 64-bit"),
    ("FEDERATION_ACK token 2**64", "FEDERATION_ACK federation_sender1 18446744073709551616", "reject", "token outside signed 64-bit"),
    ("USER_SYNC ms 10**30", "USER_SYNC w1 @a:x D start 1000000000000000000000000000000", "reject", "integer outside signed 64-bit"),
    ("token +5", "RDATA events master +5 " + EV, "reject", "token is not -?[0-9]+"),
    ("token 1_000", "RDATA events master 1_000 " + EV, "reject", "token is not -?[0-9]+"),
    ("token Arabic-Indic digit five", "RDATA events master \u0665 " + EV, "reject", "token is not -?[0-9]+ (non-ASCII digit)"),
    ("token fullwidth digit five", "RDATA events master \uff15 " + EV, "reject", "token is not -?[0-9]+ (non-ASCII digit)"),
    ("token with trailing tab", "RDATA events master 5\t " + EV, "reject", "token is not -?[0-9]+ (whitespace)"),
    ("token with leading tab", "RDATA events master \t5 " + EV, "reject", "token is not -?[0-9]+ (whitespace)"),
    ("token with leading NBSP", "RDATA events master \u00a05 " + EV, "reject", "token is not -?[0-9]+ (whitespace)"),
    ("POSITION new token with leading space", "POSITION events master 1  5", "reject", "token is not -?[0-9]+ (whitespace)"),
    ("POSITION new token with trailing space", "POSITION events master 1 5 ", "reject", "token is not -?[0-9]+ (whitespace)"),
    ("POSITION token +5", "POSITION events master +1 5", "reject", "token is not -?[0-9]+"),
    ("FEDERATION_ACK token with tab", "FEDERATION_ACK federation_sender1 5\t", "reject", "token is not -?[0-9]+ (whitespace)"),
    ("FEDERATION_ACK token 1_0", "FEDERATION_ACK federation_sender1 1_0", "reject", "token is not -?[0-9]+"),
    ("USER_SYNC ms with trailing space", "USER_SYNC w1 @a:x D start 5 ", "reject", "integer is not -?[0-9]+ (whitespace)"),
    ("USER_SYNC ms +5", "USER_SYNC w1 @a:x D end +5", "reject", "integer is not -?[0-9]+"),
    # empty names
    ("RDATA empty stream name", "RDATA  master 1 []", "reject", "empty stream name"),
    ("RDATA empty instance name", "RDATA caches  1 []", "reject", "empty instance name"),
    ("POSITION empty stream name", "POSITION  master 1 2", "reject", "empty stream name"),
    ("POSITION empty instance name", "POSITION events  1 2", "reject", "empty instance name"),
    # numbers out of f64 range
    ("row number 1e400 (Python: inf)", 'RDATA federation master 5 ["e",{"v":1e400}]', "reject", "number out of f64 range (Python decodes inf, then cannot re-encode it)"),
    ("row number -1e400 (Python: -inf)", 'RDATA caches master 5 ["f",null,-1e400]', "reject", "number out of f64 range (Python decodes -inf, then cannot re-encode it)"),
    # USER_IP / LOCK_RELEASED JSON that Python unpacks without type checks
    ("USER_IP JSON with spaces", 'USER_IP @a:x ["tok", "1.2.3.4", "ua", null, 5]', None, None),
    ("USER_IP leading space before JSON", 'USER_IP @a:x  ["tok","1.2.3.4","ua",null,5]', None, None),
    ("USER_IP raw non-ASCII user agent", 'USER_IP @a:x ["tok","1.2.3.4","\u00e9\U0001f600",null,5]', None, None),
    ("USER_IP last_seen 2**63", 'USER_IP @a:x ["tok","1.2.3.4","ua",null,9223372036854775808]', "reject", "integer outside signed 64-bit"),
    ("USER_IP last_seen float", 'USER_IP @a:x ["tok","1.2.3.4","ua",null,5.0]', "reject", "last_seen is not an integer"),
    ("USER_IP wrong element types", "USER_IP @a:x [1,2,3,4,5]", "reject", "access_token/ip/user_agent are not strings"),
    ("USER_IP 5-char string unpacked by Python", 'USER_IP @a:x "abcde"', "reject", "JSON is a string, not an array (Python unpacks its characters)"),
    ("USER_IP 5-key object unpacked by Python", 'USER_IP @a:x {"a":1,"b":2,"c":3,"d":4,"e":5}', "reject", "JSON is an object, not an array (Python unpacks its keys)"),
    ("LOCK_RELEASED JSON with spaces", 'LOCK_RELEASED [ "master", "lock", "key" ]', None, None),
    ("LOCK_RELEASED raw non-ASCII", 'LOCK_RELEASED ["master","\u4e2d","\U0001f600"]', None, None),
    ("LOCK_RELEASED 3-char string unpacked by Python", 'LOCK_RELEASED "abc"', "reject", "JSON is a string, not an array (Python unpacks its characters)"),
    ("LOCK_RELEASED numbers", "LOCK_RELEASED [1,2,3]", "reject", "elements are not strings"),
    ("LOCK_RELEASED nulls", "LOCK_RELEASED [null,null,null]", "reject", "elements are not strings"),
]


def build_noncanonical():
    objs = []
    for name, line, ours, why in NONCANONICAL:
        assert "\n" not in line, name
        parsed = parse_command_from_line(line)  # must not raise: Synapse accepts it
        obj = {"name": name, "line": line, "cmd": parsed.NAME}
        try:
            canonical = wire(parsed)
        except ValueError as e:
            # e.g. 1e400: parsed to inf, json_encoder (allow_nan=False) refuses it
            obj["canonical"] = None
            obj["reencode_error"] = repr(e)
        else:
            obj["canonical"] = canonical
            # the canonical form is a fixed point of Synapse's codec
            assert wire(parse_command_from_line(canonical)) == canonical, name
            if canonical == line:
                assert ours is not None or parsed.NAME == "RDATA", (
                    "%r is canonical; belongs in commands.jsonl" % name)
        attach_fields(obj, command_fields(parsed))
        if ours is not None:
            obj["ours"] = ours
            obj["why"] = why
        objs.append(obj)
    return objs


# ---------------------------------------------------------------------------
# 3. rejected.jsonl: lines Synapse's parser refuses
# ---------------------------------------------------------------------------

REJECTED = [
    ("unknown command", "FOO bar"),
    ("unknown command no rest", "FOO"),
    ("lowercase rdata", "rdata events master 1 " + EV),
    ("mixed case Rdata", "Rdata events master 1 " + EV),
    ("lowercase ping", "ping 1"),
    ("leading space before name", " PING 1"),
    ("tab instead of space after name", "PING\t1"),
    ("RDATA no rest", "RDATA"),
    ("RDATA only stream", "RDATA events"),
    ("RDATA no token", "RDATA events master"),
    ("RDATA no row", "RDATA events master 1"),
    ("RDATA empty row JSON", "RDATA events master 1 "),
    ("RDATA token abc", "RDATA events master abc " + EV),
    ("RDATA token 1.5", "RDATA events master 1.5 " + EV),
    ("RDATA token empty", "RDATA events master  " + EV),
    ("RDATA token Batch", "RDATA events master Batch " + EV),
    ("RDATA token BATCH", "RDATA events master BATCH " + EV),
    ("RDATA token hex", "RDATA events master 0x10 " + EV),
    ("RDATA token 1e3", "RDATA events master 1e3 " + EV),
    ("RDATA token 5000 digits (Python int limit)", "RDATA events master " + "1" * 5000 + " " + EV),
    ("RDATA tab between instance and token", "RDATA events master\t1 " + EV),
    ("row JSON truncated", "RDATA caches master 1 [1"),
    ("row JSON trailing garbage", "RDATA caches master 1 [1] x"),
    ("row JSON two values", "RDATA caches master 1 [1] [2]"),
    ("row JSON extra bracket", "RDATA caches master 1 [1]]"),
    ("row JSON single quotes", "RDATA caches master 1 ['a']"),
    ("row JSON trailing comma", "RDATA caches master 1 [1,]"),
    ("row JSON leading zero", "RDATA caches master 1 [01]"),
    ("row JSON Python True", "RDATA caches master 1 [True]"),
    ("row JSON undefined", "RDATA caches master 1 [undefined]"),
    ("row JSON comment", "RDATA caches master 1 [1]//c"),
    ("row JSON NaN", "RDATA caches master 1 [NaN]"),
    ("row JSON Infinity", "RDATA caches master 1 [Infinity]"),
    ("row JSON -Infinity", "RDATA caches master 1 [-Infinity]"),
    ("row JSON NaN nested", 'RDATA federation master 1 ["e",{"v":[NaN]}]'),
    ("row JSON invalid escape", 'RDATA caches master 1 ["\\x41"]'),
    ("row JSON short unicode escape", 'RDATA caches master 1 ["\\u12"]'),
    ("row JSON raw tab in string", 'RDATA caches master 1 ["a\tb"]'),
    ("row JSON raw NUL in string", 'RDATA caches master 1 ["a\x00b"]'),
    ("row JSON raw control char 0x1f in string", 'RDATA caches master 1 ["a\x1fb"]'),
    ("row JSON unterminated string", 'RDATA caches master 1 ["abc]'),
    ("row JSON integer of 5000 digits", "RDATA caches master 1 [" + "9" * 5000 + "]"),
    ("row JSON bare minus", "RDATA caches master 1 [-]"),
    ("row JSON .5", "RDATA caches master 1 [.5]"),
    ("row JSON 1.", "RDATA caches master 1 [1.]"),
    ("row JSON NBSP whitespace", "RDATA caches master 1 [1,\u00a02]"),
    ("POSITION missing new token", "POSITION events master 1"),
    ("POSITION missing both tokens", "POSITION events master"),
    ("POSITION extra token", "POSITION events master 1 2 3"),
    ("POSITION batch token", "POSITION events master 1 batch"),
    ("POSITION non-integer prev", "POSITION events master a 2"),
    ("POSITION float token", "POSITION events master 1 2.0"),
    ("POSITION empty rest", "POSITION"),
    ("USER_SYNC bad state maybe", "USER_SYNC w1 @a:x D maybe 1"),
    ("USER_SYNC uppercase state", "USER_SYNC w1 @a:x D START 1"),
    ("USER_SYNC too few fields", "USER_SYNC w1 @a:x start 1"),
    ("USER_SYNC bad ms", "USER_SYNC w1 @a:x D start abc"),
    ("USER_SYNC empty ms", "USER_SYNC w1 @a:x D start "),
    ("USER_SYNC float ms", "USER_SYNC w1 @a:x D start 1.5"),
    ("USER_SYNC ms with inner space", "USER_SYNC w1 @a:x D start 1 2"),
    ("USER_SYNC empty rest", "USER_SYNC"),
    ("FEDERATION_ACK three parts", "FEDERATION_ACK federation_sender1 1 2"),
    ("FEDERATION_ACK one part", "FEDERATION_ACK federation_sender1"),
    ("FEDERATION_ACK non-integer", "FEDERATION_ACK federation_sender1 abc"),
    ("FEDERATION_ACK batch", "FEDERATION_ACK federation_sender1 batch"),
    ("FEDERATION_ACK trailing space", "FEDERATION_ACK federation_sender1 1 "),
    ("FEDERATION_ACK empty rest", "FEDERATION_ACK"),
    ("USER_IP not JSON", "USER_IP @a:x notjson"),
    ("USER_IP no JSON part", "USER_IP @a:x"),
    ("USER_IP array too short", 'USER_IP @a:x ["tok","1.2.3.4","ua",null]'),
    ("USER_IP array too long", 'USER_IP @a:x ["tok","1.2.3.4","ua",null,5,6]'),
    ("USER_IP null", "USER_IP @a:x null"),
    ("USER_IP number", "USER_IP @a:x 5"),
    ("USER_IP NaN last_seen", 'USER_IP @a:x ["tok","1.2.3.4","ua",null,NaN]'),
    ("USER_IP truncated JSON", 'USER_IP @a:x ["tok","1.2.3.4"'),
    ("LOCK_RELEASED two elements", 'LOCK_RELEASED ["master","lock"]'),
    ("LOCK_RELEASED four elements", 'LOCK_RELEASED ["master","lock","key","x"]'),
    ("LOCK_RELEASED not JSON", "LOCK_RELEASED master lock key"),
    ("LOCK_RELEASED empty rest", "LOCK_RELEASED"),
    ("LOCK_RELEASED null", "LOCK_RELEASED null"),
    ("LOCK_RELEASED 2-char string", 'LOCK_RELEASED "ab"'),
]


def build_rejected():
    objs = []
    for name, line in REJECTED:
        assert "\n" not in line and line.strip() != "", name
        try:
            parse_command_from_line(line)
        except Exception as e:
            err = repr(e)
        else:
            raise AssertionError("Synapse accepted %r (%r)" % (name, line))
        objs.append({"name": name, "line": line, "python_error": err})
    return objs


# ---------------------------------------------------------------------------
# 4. rows.jsonl: typed rows per stream
# ---------------------------------------------------------------------------
#
# How Synapse turns a row into RDATA JSON (the writer side):
#   resource.py ReplicationStreamer.on_notifier_poke -> stream.get_updates()
#   returns [(token, row)] where `row` is the plain tuple/list built by the
#   stream's update function (NOT the ROW_TYPE instance; e.g. for events
#   `(stream_id, (EventsStreamEventRow.TypeId, rest))`), _batch_updates() marks
#   all but the last of a run of equal tokens as None ("batch"), then
#   handler.py ReplicationCommandHandler.stream_update(stream_name, token, row)
#   -> RdataCommand(stream_name, instance_name, token, row) -> send_command,
#   whose transport writes "%s %s" % (cmd.NAME, cmd.to_line()), and
#   RdataCommand.to_line() = json_encoder.encode(row) (synapse/util/json.py:
#   json.JSONEncoder(allow_nan=False, separators=(",", ":")), ensure_ascii on).
#   The catch-up HTTP endpoint (replication/http/streams.py) returns the same
#   `(token, row)` tuples inside its JSON answer.
# The reader side: handler.py _process_rdata -> STREAMS_MAP[name].parse_row(row)
#   which is ROW_TYPE(*row) (streams/_base.py Stream.parse_row), or for events
#   EventsStream.parse_row: (typ, data) = row; TypeToRow[typ](*data).
#
# Below, each row is built as a ROW_TYPE instance, turned into the wire tuple
# (its fields in attrs order; frozenset -> list as ProfileUpdatesStream does),
# sent through RdataCommand.to_line, parsed back with parse_command_from_line and
# parse_row, and re-encoded: all three must agree.
#
# Row shapes in Synapse 1.163.2 (read from the attrs classes; checked against
# attr.fields() below). "bool*" = arrives as 0/1 from a SQLite-backed Synapse
# (value comes straight from SQL); "bool" = always true/false (Python literal or
# bool() in the writer). "?" = may be null.
#
#  stream                  class                                 fields (wire order)
#  events                  EventsStreamRow                       [type_id: "ev"|"state"|"state-all", data: array]
#    ev                    EventsStreamEventRow                  event_id str, room_id str, type str, state_key str?, redacts str?,
#                                                                relates_to str?, membership str?, rejected bool*, outlier bool*
#    state                 EventsStreamCurrentStateRow           room_id str, type str, state_key str, event_id str? (null = state removed)
#    state-all             EventsStreamAllStateRow               room_id str
#  backfill                BackfillStreamRow                     event_id str, room_id str, type str, state_key str?, redacts str?, relates_to str?
#  presence                PresenceStreamRow                     user_id str, state str, last_active_ts int, last_federation_update_ts int,
#                                                                last_user_sync_ts int, status_msg str (typed str, but null in practice:
#                                                                DB column and UserPresenceState allow None), currently_active bool*
#  presence_federation     PresenceFederationStreamRow           destination str, user_id str
#  typing                  TypingStreamRow                       room_id str, user_ids list[str] (order = Python set order)
#  receipts                ReceiptsStreamRow                     room_id str, receipt_type str, user_id str, event_id str, thread_id str?, data dict (JSON object)
#  push_rules              PushRulesStreamRow                    user_id str
#  pushers                 PushersStreamRow                      user_id str, app_id str, pushkey str, deleted bool
#  caches                  CachesStreamRow                       cache_func str, keys list[Any]? (null = invalidate all; on PostgreSQL a TEXT[] so
#                                                                elements are strings), invalidation_ts int
#  device_lists            DeviceListsStreamRow                  user_id str, is_signature bool, hosts_calculated bool*
#                                                                (1.110 on; up to 1.109 the row was [entity str, is_signature bool],
#                                                                entity a user id or a remote server name: see generate_releases.py)
#  to_device               ToDeviceStreamRow                     entity str (a user id, or a remote server name)
#  federation              FederationStreamRow                   type str ("pd"|"k"|"e", federation/send_queue.py), data dict (JSON object)
#  account_data            AccountDataStreamRow                  user_id str, room_id str? (null = global), data_type str
#  profile_updates         ProfileUpdatesStreamRow               user_id str (typed UserID, str on the wire), action str
#                                                                ("joined_room"|"left_room"|"update"), affected_fields list[str]?
#                                                                (frozenset in Python: order = set order; null unless action is update)
#  sticky_events           StickyEventsStreamRow                 room_id str, event_id str
#  thread_subscriptions    ThreadSubscriptionsStreamRow          user_id str, room_id str, event_id str
#  un_partial_stated_room  UnPartialStatedRoomStreamRow          room_id str
#  un_partial_stated_event UnPartialStatedEventStreamRow         event_id str, rejection_status_changed bool
#  quarantined_media       QuarantinedMediaStreamRow             origin str? (typed str, but null in practice for local media:
#                                                                quarantined_media_changes.origin is NULL for local media),
#                                                                media_id str, quarantined bool*
#
# No row class has default values: every field is required (too few -> TypeError,
# too many -> TypeError). Nothing is type-checked on parse: a 0/1 stays an int.

# (field, type, optional, bool_kind) with bool_kind None, "bool" or "bool*".
SHAPES = {
    "events": [("type_id", "str", False, None), ("data", "array", False, None)],
    "backfill": [("event_id", "str", False, None), ("room_id", "str", False, None),
                 ("type", "str", False, None), ("state_key", "str", True, None),
                 ("redacts", "str", True, None), ("relates_to", "str", True, None)],
    "presence": [("user_id", "str", False, None), ("state", "str", False, None),
                 ("last_active_ts", "int", False, None),
                 ("last_federation_update_ts", "int", False, None),
                 ("last_user_sync_ts", "int", False, None),
                 ("status_msg", "str", True, None),  # typed str, null in practice
                 ("currently_active", "bool", False, "bool*")],
    "presence_federation": [("destination", "str", False, None), ("user_id", "str", False, None)],
    "typing": [("room_id", "str", False, None), ("user_ids", "list[str]", False, None)],
    "receipts": [("room_id", "str", False, None), ("receipt_type", "str", False, None),
                 ("user_id", "str", False, None), ("event_id", "str", False, None),
                 ("thread_id", "str", True, None), ("data", "dict", False, None)],
    "push_rules": [("user_id", "str", False, None)],
    "pushers": [("user_id", "str", False, None), ("app_id", "str", False, None),
                ("pushkey", "str", False, None), ("deleted", "bool", False, "bool")],
    "caches": [("cache_func", "str", False, None), ("keys", "list[Any]", True, None),
               ("invalidation_ts", "int", False, None)],
    "device_lists": [("user_id", "str", False, None), ("is_signature", "bool", False, "bool"),
                     ("hosts_calculated", "bool", False, "bool*")],
    "to_device": [("entity", "str", False, None)],
    "federation": [("type", "str", False, None), ("data", "dict", False, None)],
    "account_data": [("user_id", "str", False, None), ("room_id", "str", True, None),
                     ("data_type", "str", False, None)],
    "profile_updates": [("user_id", "str", False, None), ("action", "str", False, None),
                        ("affected_fields", "list[str]", True, None)],
    "sticky_events": [("room_id", "str", False, None), ("event_id", "str", False, None)],
    "thread_subscriptions": [("user_id", "str", False, None), ("room_id", "str", False, None),
                             ("event_id", "str", False, None)],
    "un_partial_stated_room": [("room_id", "str", False, None)],
    "un_partial_stated_event": [("event_id", "str", False, None),
                                ("rejection_status_changed", "bool", False, "bool")],
    "quarantined_media": [("origin", "str", True, None),  # typed str, null for local media
                          ("media_id", "str", False, None),
                          ("quarantined", "bool", False, "bool*")],
}
EVENT_SHAPES = {
    "ev": (EventsStreamEventRow, [
        ("event_id", "str", False, None), ("room_id", "str", False, None),
        ("type", "str", False, None), ("state_key", "str", True, None),
        ("redacts", "str", True, None), ("relates_to", "str", True, None),
        ("membership", "str", True, None), ("rejected", "bool", False, "bool*"),
        ("outlier", "bool", False, "bool*")]),
    "state": (EventsStreamCurrentStateRow, [
        ("room_id", "str", False, None), ("type", "str", False, None),
        ("state_key", "str", False, None), ("event_id", "str", True, None)]),
    "state-all": (EventsStreamAllStateRow, [("room_id", "str", False, None)]),
}


def check_shapes():
    assert sorted(SHAPES) == sorted(STREAMS_MAP), sorted(set(SHAPES) ^ set(STREAMS_MAP))
    for name, stream in STREAMS_MAP.items():
        if name == "events":
            assert stream.ROW_TYPE is None
            assert [f.name for f in attr.fields(EventsStreamRow)] == ["type", "data"]
            continue
        names = [f.name for f in attr.fields(stream.ROW_TYPE)]
        assert names == [s[0] for s in SHAPES[name]], (name, names)
        for f in attr.fields(stream.ROW_TYPE):
            assert f.default is attr.NOTHING, (name, f.name)  # no defaults anywhere
    for tid, (cls, shape) in EVENT_SHAPES.items():
        assert cls.TypeId == tid
        assert [f.name for f in attr.fields(cls)] == [s[0] for s in shape], tid


def rdata_row_json(stream, row_tuple):
    """Encode through the real RdataCommand and return the row JSON text."""
    cmd = C.RdataCommand(stream, "master", 5, row_tuple)
    line = wire(cmd)
    prefix = "RDATA %s master 5 " % stream
    assert line.startswith(prefix)
    row_json = line[len(prefix):]
    assert row_json == json_encoder.encode(row_tuple)
    return line, row_json


def build_rows():
    check_shapes()
    objs = []

    def bool_fields(stream, type_id=None):
        shape = EVENT_SHAPES[type_id][1] if type_id else SHAPES[stream]
        return [s[0] for s in shape if s[3] is not None]

    def add(stream, name, values, *, sqlite=False, extra=None, too_few=False,
            type_id=None, hand_built=None):
        """values: the field values in wire order (as the update function gives them).

        extra: extra trailing values (forward compatibility), too_few: values is
        shorter than the class. type_id: events row kind. hand_built: why a
        row that contradicts the class's annotations is real (which storage
        function produces it); written to the vector as "hand_built".
        """
        if type_id is not None:
            cls, shape = EVENT_SHAPES[type_id]
        else:
            cls, shape = STREAMS_MAP[stream].ROW_TYPE, SHAPES[stream]
        order = [s[0] for s in shape]
        data = list(values) + list(extra or [])
        if type_id is not None:
            # EventsStream._update_function: (TypeId, rest) with rest a list
            # (or, for state-all, the tuple (room_id,)); both encode as arrays.
            row_tuple = (type_id, data if type_id != "state-all" else tuple(data))
        else:
            row_tuple = tuple(data)
        line, row_json = rdata_row_json(stream, row_tuple)
        parsed_cmd = parse_command_from_line(line)
        assert wire(parsed_cmd) == line
        decoded = parsed_cmd.row
        obj = {"stream": stream, "name": name, "row_json": row_json}
        if hand_built:
            obj["hand_built"] = hand_built
        if extra or too_few:
            try:
                STREAMS_MAP[stream].parse_row(decoded)
            except Exception as e:
                obj["python_error"] = repr(e)
            else:
                raise AssertionError("parse_row accepted %s %r" % (stream, name))
            if extra:
                obj["extra_fields"] = True
            if too_few:
                obj["too_few"] = True
        else:
            parsed = STREAMS_MAP[stream].parse_row(decoded)
            if type_id is not None:
                assert isinstance(parsed, EventsStreamRow) and parsed.type == type_id
                inner = parsed.data
                assert type(inner) is cls
            else:
                inner = parsed
                assert type(inner) is cls
            # every attribute equals the decoded JSON value (parse_row does no
            # type conversion: a SQLite 0/1 stays an int); the one converter
            # (profile_updates affected_fields) turns the list into a frozenset.
            re_values = []
            for fname, v in zip(order, values):
                got = getattr(inner, fname)
                if isinstance(got, frozenset):
                    assert got == frozenset(v), (stream, name, fname)
                    # ProfileUpdatesStream sends list(field_names): a frozenset
                    # has no stable order, keep the sender's list to re-encode.
                    got = v
                else:
                    assert got == v and type(got) is type(v), (stream, name, fname, got, v)
                re_values.append(got)
            # re-encoding the parsed row gives the same text
            if type_id is None:
                re = tuple(re_values)
            elif type_id == "state-all":
                re = (parsed.type, tuple(re_values))
            else:
                re = (parsed.type, re_values)
            assert json_encoder.encode(re) == row_json, (stream, name, re, row_json)
        # fields: the named values (bools as bools; the SQLite 0/1 is in row_json)
        bools = bool_fields(stream, type_id)
        named = dict(zip(order, values))
        if sqlite:
            assert any(isinstance(named[b], int) and not isinstance(named[b], bool) for b in bools if b in named)
            typed = {k: (bool(v) if k in bools else v) for k, v in named.items()}
            canon_values = [typed[k] for k in order]
            if type_id is not None:
                canon_tuple = (type_id, canon_values)
            else:
                canon_tuple = tuple(canon_values)
            _, canonical_json = rdata_row_json(stream, canon_tuple)
            # Synapse reads both forms as the same row
            a = STREAMS_MAP[stream].parse_row(json_decoder.decode(row_json))
            b = STREAMS_MAP[stream].parse_row(json_decoder.decode(canonical_json))
            assert a == b, (stream, name)
            obj["sqlite"] = True
            obj["canonical_json"] = canonical_json
            named = typed
        else:
            for b in bools:
                if b in named:
                    assert isinstance(named[b], bool), (stream, name, b)
        if type_id is not None:
            obj["fields"] = {"type_id": type_id, "data": named}
            obj["field_order"] = ["type_id", "data"]
            obj["data_field_order"] = order
        else:
            obj["fields"] = named
            obj["field_order"] = order
        if too_few:
            obj["missing_fields"] = order[len(values):]
        if extra:
            obj["extra_values"] = list(extra)
        objs.append(obj)

    E = "example.com"
    BIG62 = 2**62

    # --- events ----------------------------------------------------------------
    add("events", "ev message", ["$Ab9_-x:" + E, "!room:" + E, "m.room.message", None, None, None, None, False, False], type_id="ev")
    add("events", "ev member join", ["$j:" + E, "!room:" + E, "m.room.member", "@alice:" + E, None, None, "join", False, False], type_id="ev")
    add("events", "ev redaction", ["$r:" + E, "!room:" + E, "m.room.redaction", None, "$Ab9_-x:" + E, None, None, False, False], type_id="ev")
    add("events", "ev relation", ["$t:" + E, "!room:" + E, "m.room.message", None, None, "$root:" + E, None, False, False], type_id="ev")
    add("events", "ev rejected outlier", ["$o:remote.org", "!room:" + E, "m.room.member", "@x:remote.org", None, None, "leave", True, True], type_id="ev")
    add("events", "ev all optionals set", ["$a:" + E, "!room:" + E, "m.room.member", "@b:" + E, "$c:" + E, "$d:" + E, "invite", False, True], type_id="ev")
    add("events", "ev empty state_key", ["$c:" + E, "!room:" + E, "m.room.create", "", None, None, None, False, False], type_id="ev")
    add("events", "ev non-ASCII", ["$\u00e9v\u00e9nement:" + E, "!salle-\u4e2d:" + E, "org.example.\u00e9\U0001f600", "\u05e9", None, None, None, False, False], type_id="ev")
    add("events", "ev SQLite booleans 0 0", ["$s:" + E, "!room:" + E, "m.room.message", None, None, None, None, 0, 0], type_id="ev", sqlite=True)
    add("events", "ev SQLite booleans 1 1", ["$s:" + E, "!room:" + E, "m.room.member", "@a:" + E, None, None, "ban", 1, 1], type_id="ev", sqlite=True)
    add("events", "state row", ["!room:" + E, "m.room.member", "@alice:" + E, "$j:" + E], type_id="state")
    add("events", "state row removed (event_id null)", ["!room:" + E, "m.room.topic", "", None], type_id="state")
    add("events", "state row non-ASCII", ["!r:" + E, "m.room.name", "\u00e9\U0001f600", "$n:" + E], type_id="state")
    add("events", "state-all row", ["!room:" + E], type_id="state-all")
    add("events", "ev extra trailing fields", ["$e:" + E, "!room:" + E, "m.room.message", None, None, None, None, False, False], type_id="ev", extra=["future", 1])
    add("events", "ev too few fields (pre-membership layout)", ["$e:" + E, "!room:" + E, "m.room.message", None, None], type_id="ev", too_few=True)
    add("events", "state extra trailing field", ["!room:" + E, "m.room.name", "", "$n:" + E], type_id="state", extra=[None])
    add("events", "state-all too few (empty)", [], type_id="state-all", too_few=True)

    # --- backfill --------------------------------------------------------------
    add("backfill", "typical", ["$old:" + E, "!room:" + E, "m.room.message", None, None, None])
    add("backfill", "state event with relation", ["$m:" + E, "!room:" + E, "m.room.member", "@a:" + E, None, "$root:" + E])
    add("backfill", "all optionals set", ["$r:" + E, "!room:" + E, "m.room.redaction", "", "$x:" + E, "$y:" + E])
    add("backfill", "non-ASCII", ["$\u4e2d:" + E, "!\u00e9:" + E, "m.room.message", None, None, None])
    add("backfill", "extra trailing fields", ["$old:" + E, "!room:" + E, "m.room.message", None, None, None], extra=["join", False])
    add("backfill", "too few fields", ["$old:" + E, "!room:" + E], too_few=True)

    # --- presence --------------------------------------------------------------
    add("presence", "online", ["@alice:" + E, "online", TS, TS - 1000, TS - 5, "in a meeting", True])
    add("presence", "offline no status (null)", ["@bob:" + E, "offline", TS, 0, 0, None, False])
    add("presence", "busy non-ASCII status", ["@c:" + E, "org.matrix.msc3026.busy", TS, TS, TS, "\u00e9t\u00e9 \u4e2d\u6587 \U0001f3d6\ufe0f \u05e9\u05dc\u05d5\u05dd", True])
    add("presence", "large timestamps 2**62", ["@d:" + E, "unavailable", BIG62, BIG62, BIG62, "", False])
    add("presence", "SQLite boolean 1", ["@e:" + E, "online", TS, TS, TS, None, 1], sqlite=True)
    add("presence", "SQLite boolean 0", ["@e:" + E, "offline", TS, TS, TS, "bye", 0], sqlite=True)
    add("presence", "status with quotes and control chars", ["@f:" + E, "online", 1, 2, 3, QUOTES + "\t\n\x7f", True])
    add("presence", "extra trailing fields", ["@a:" + E, "online", TS, TS, TS, None, True], extra=[{"future": True}])
    add("presence", "too few fields", ["@a:" + E, "online", TS], too_few=True)

    # --- presence_federation ---------------------------------------------------
    add("presence_federation", "typical", ["remote.org", "@alice:" + E])
    add("presence_federation", "non-ASCII", ["xn--bcher-kva.example", "@\u00e9l\u00e8ve:" + E])
    add("presence_federation", "extra trailing field", ["remote.org", "@alice:" + E], extra=["x"])
    add("presence_federation", "too few fields", ["remote.org"], too_few=True)

    # --- typing ----------------------------------------------------------------
    add("typing", "two users", ["!room:" + E, ["@a:" + E, "@b:" + E]])
    add("typing", "nobody typing", ["!room:" + E, []])
    add("typing", "non-ASCII user", ["!\u4e2d:" + E, ["@\u00e9:" + E, "@\U0001f600:" + E]])
    add("typing", "extra trailing field", ["!room:" + E, ["@a:" + E]], extra=[0])
    add("typing", "too few fields", ["!room:" + E], too_few=True)

    # --- receipts --------------------------------------------------------------
    add("receipts", "read unthreaded", ["!room:" + E, "m.read", "@a:" + E, "$e:" + E, None, {"ts": TS}])
    add("receipts", "read threaded", ["!room:" + E, "m.read", "@a:" + E, "$e:" + E, "main", {"ts": TS, "thread_id": "main"}])
    add("receipts", "private, thread is event id", ["!room:" + E, "m.read.private", "@a:" + E, "$e:" + E, "$root:" + E, {"ts": TS}])
    add("receipts", "empty data", ["!room:" + E, "m.fully_read", "@a:" + E, "$e:" + E, None, {}])
    add("receipts", "large ts 2**62 and nested data", ["!room:" + E, "m.read", "@a:" + E, "$e:" + E, None, {"ts": BIG62, "hidden": True, "x": {"y": [1, "\u00e9"]}}])
    add("receipts", "non-ASCII", ["!\u00e9:" + E, "m.read", "@\u4e2d:" + E, "$\U0001f600:" + E, "\u05e9", {"ts": 1}])
    add("receipts", "extra trailing field", ["!room:" + E, "m.read", "@a:" + E, "$e:" + E, None, {"ts": 1}], extra=[None])
    add("receipts", "too few fields (no thread_id, data)", ["!room:" + E, "m.read", "@a:" + E, "$e:" + E], too_few=True)

    # --- push_rules ------------------------------------------------------------
    add("push_rules", "typical", ["@alice:" + E])
    add("push_rules", "non-ASCII", ["@\u00e9\u4e2d:" + E])
    add("push_rules", "extra trailing field", ["@alice:" + E], extra=[1, 2])
    add("push_rules", "too few fields (empty)", [], too_few=True)

    # --- pushers ---------------------------------------------------------------
    add("pushers", "added", ["@a:" + E, "m.http", "https://push.example.com/_matrix/push/v1/notify?x", False])
    add("pushers", "deleted", ["@a:" + E, "com.example.app.ios", "dGVzdA+/==", True])
    add("pushers", "SQLite-form deleted 1 (Synapse writes a literal, for completeness)", ["@a:" + E, "m.http", "k", 1], sqlite=True)
    add("pushers", "non-ASCII", ["@\u00e9:" + E, "app.\u4e2d", "\U0001f600", False])
    add("pushers", "extra trailing field", ["@a:" + E, "m.http", "k", False], extra=["x"])
    add("pushers", "too few fields", ["@a:" + E, "m.http", "k"], too_few=True)

    # --- caches ----------------------------------------------------------------
    add("caches", "get_user_by_id", ["get_user_by_id", ["@alice:" + E], TS])
    add("caches", "invalidate all (keys null)", ["get_rooms_for_user", None, TS])
    add("caches", "empty keys", ["get_monthly_active_count", [], TS])
    add("caches", "cs_cache_fake room and members", ["cs_cache_fake", ["!room:" + E, "@a:" + E, "@b:" + E], TS])
    add("caches", "ph_cache_fake", ["ph_cache_fake", ["!room:" + E], TS])
    add("caches", "dr_cache_fake", ["dr_cache_fake", ["!room:" + E], TS])
    add("caches", "_get_state_group_for_events", ["_get_state_group_for_events", ["$e:" + E], TS])
    add("caches", "JSON text inside key (cross-signing)", [
        "_get_e2e_cross_signing_signatures_for_device",
        [json.dumps(["@alice:" + E, "DEVICEID"])], TS])
    add("caches", "JSON text inside key (server keys)", [
        "_get_server_keys_json", [json.dumps(["remote.org", "ed25519:abc"])], TS])
    add("caches", "multi-arg key", ["get_e2e_device_keys_for_federation_query", ["@a:" + E, "DEV"], TS])
    add("caches", "non-ASCII keys", ["get_aliases_for_room", ["!\u00e9\u4e2d\U0001f600:" + E], TS])
    add("caches", "large ts 2**62", ["get_user_by_id", ["@a:" + E], BIG62])
    add("caches", "ts 0", ["is_user_erased", ["@a:" + E], 0])
    add("caches", "extra trailing field", ["get_user_by_id", ["@a:" + E], TS], extra=["x"])
    add("caches", "too few fields (no ts)", ["get_user_by_id", ["@a:" + E]], too_few=True)

    # --- device_lists ----------------------------------------------------------
    add("device_lists", "device change", ["@alice:" + E, False, False])
    add("device_lists", "hosts calculated", ["@alice:" + E, False, True])
    add("device_lists", "signature", ["@alice:" + E, True, False])
    add("device_lists", "SQLite hosts_calculated 1", ["@alice:" + E, False, 1], sqlite=True)
    add("device_lists", "SQLite hosts_calculated 0", ["@alice:" + E, False, 0], sqlite=True)
    add("device_lists", "SQLite-form is_signature 1 (Synapse writes a literal, for completeness)", ["@alice:" + E, 1, 0], sqlite=True)
    add("device_lists", "non-ASCII", ["@\u00e9:" + E, False, False])
    add("device_lists", "extra trailing field", ["@a:" + E, False, False], extra=[True])
    # Two fields is the shape of releases up to 1.109 (rows-<version>.jsonl);
    # 1.163.2's class refuses it, and one field is too few for every release.
    add("device_lists", "too few fields", ["@a:" + E], too_few=True)

    # --- to_device -------------------------------------------------------------
    add("to_device", "local user", ["@alice:" + E])
    add("to_device", "remote destination", ["remote.example.org"])
    add("to_device", "non-ASCII", ["@\u00e9\U0001f600:" + E])
    add("to_device", "extra trailing field", ["@a:" + E], extra=["DEV"])
    add("to_device", "too few fields (empty)", [], too_few=True)

    # --- federation ------------------------------------------------------------
    def fed(row):
        # to_data() as FederationRemoteSendQueue.get_replication_rows sends it;
        # the JSON round trip turns its tuples (KeyedEduRow.key) into lists,
        # which is what a reader sees.
        data = json_decoder.decode(json_encoder.encode(row.to_data()))
        assert json_encoder.encode(data) == json_encoder.encode(row.to_data())
        # Synapse's federation sender parses it back with the send_queue row class
        send_queue.TypeToRow[row.TypeId].from_data(data)
        return [row.TypeId, data]

    add("federation", "presence destinations", fed(send_queue.PresenceDestinationsRow(
        state=UserPresenceState("@alice:" + E, "online", TS, TS, TS, "hi \u00e9", True),
        destinations=["remote.org", "other.org"])))
    add("federation", "presence destinations null status", fed(send_queue.PresenceDestinationsRow(
        state=UserPresenceState("@alice:" + E, "offline", BIG62, 0, 0, None, False),
        destinations=[])))
    add("federation", "keyed typing edu", fed(send_queue.KeyedEduRow(
        key=("!room:" + E,),
        edu=Edu(edu_type="m.typing", content={"room_id": "!room:" + E, "user_id": "@a:" + E, "typing": True},
                origin=E, destination="remote.org"))))
    add("federation", "keyed receipt edu", fed(send_queue.KeyedEduRow(
        key=("!room:" + E, "m.read", "@a:" + E),
        edu=Edu(edu_type="m.receipt",
                content={"!room:" + E: {"m.read": {"@a:" + E: {"event_ids": ["$e:" + E], "data": {"ts": TS}}}}},
                origin=E, destination="remote.org"))))
    add("federation", "edu nested arbitrary JSON", fed(send_queue.EduRow(Edu(
        edu_type="m.direct_to_device",
        content={"sender": "@a:" + E, "type": "m.room_key_request", "message_id": "mid",
                 "messages": {"@b:remote.org": {"*": {"n": [1, 2.5, -0.0, 1e16, None, True, {"deep": [[[]]]}],
                                                       "s": NON_ASCII + ASTRAL, "big": BIG62}}}},
        origin=E, destination="remote.org"))))
    add("federation", "unknown type, arbitrary data", ["zz", {"z": 1, "a": [], "\u00e9": {"": None}}])
    add("federation", "extra trailing field", ["e", {}], extra=[1])
    add("federation", "too few fields", ["e"], too_few=True)

    # --- account_data ----------------------------------------------------------
    add("account_data", "global", ["@alice:" + E, None, "m.push_rules"])
    add("account_data", "room", ["@alice:" + E, "!room:" + E, "m.fully_read"])
    add("account_data", "tag", ["@alice:" + E, "!room:" + E, "m.tag"])
    add("account_data", "non-ASCII custom type", ["@\u00e9:" + E, None, "org.example.\u4e2d\U0001f600"])
    add("account_data", "extra trailing field", ["@a:" + E, None, "m.direct"], extra=[{}])
    add("account_data", "too few fields", ["@a:" + E, None], too_few=True)

    # --- profile_updates -------------------------------------------------------
    add("profile_updates", "update", ["@alice:" + E, ProfileUpdateAction.UPDATE.value, ["displayname", "avatar_url"]])
    add("profile_updates", "update one field", ["@alice:" + E, "update", ["m.tz"]])
    add("profile_updates", "update empty fields", ["@alice:" + E, "update", []])
    add("profile_updates", "joined_room", ["@alice:" + E, ProfileUpdateAction.JOINED_ROOM.value, None])
    add("profile_updates", "left_room", ["@alice:" + E, ProfileUpdateAction.LEFT_ROOM.value, None])
    add("profile_updates", "non-ASCII custom field", ["@\u00e9:" + E, "update", ["org.example.\u4e2d"]])
    add("profile_updates", "extra trailing field", ["@a:" + E, "left_room", None], extra=[0])
    add("profile_updates", "too few fields", ["@a:" + E, "left_room"], too_few=True)

    # --- sticky_events ---------------------------------------------------------
    add("sticky_events", "typical", ["!room:" + E, "$sticky:" + E])
    add("sticky_events", "non-ASCII", ["!\u00e9:" + E, "$\U0001f600:" + E])
    add("sticky_events", "extra trailing field", ["!room:" + E, "$s:" + E], extra=[TS])
    add("sticky_events", "too few fields", ["!room:" + E], too_few=True)

    # --- thread_subscriptions --------------------------------------------------
    add("thread_subscriptions", "typical", ["@alice:" + E, "!room:" + E, "$root:" + E])
    add("thread_subscriptions", "non-ASCII", ["@\u00e9:" + E, "!\u4e2d:" + E, "$\U0001f600:" + E])
    add("thread_subscriptions", "extra trailing field", ["@a:" + E, "!room:" + E, "$root:" + E], extra=[True])
    add("thread_subscriptions", "too few fields", ["@a:" + E, "!room:" + E], too_few=True)

    # --- un_partial_stated_room ------------------------------------------------
    add("un_partial_stated_room", "typical", ["!room:" + E])
    add("un_partial_stated_room", "non-ASCII", ["!\u00e9\u4e2d:" + E])
    add("un_partial_stated_room", "extra trailing field", ["!room:" + E], extra=["x"])
    add("un_partial_stated_room", "too few fields (empty)", [], too_few=True)

    # --- un_partial_stated_event -----------------------------------------------
    add("un_partial_stated_event", "rejection changed", ["$e:" + E, True])
    add("un_partial_stated_event", "rejection unchanged", ["$e:" + E, False])
    add("un_partial_stated_event", "non-ASCII", ["$\u00e9:" + E, False])
    add("un_partial_stated_event", "SQLite-form 1 (Synapse writes bool(), for completeness)", ["$e:" + E, 1], sqlite=True)
    add("un_partial_stated_event", "extra trailing field", ["$e:" + E, True], extra=[None])
    add("un_partial_stated_event", "too few fields", ["$e:" + E], too_few=True)

    # --- quarantined_media -----------------------------------------------------
    add("quarantined_media", "quarantined", [E, "abcDEF123", True])
    add("quarantined_media", "unquarantined remote", ["remote.org", "xyz", False])
    add("quarantined_media", "SQLite 1", [E, "m1", 1], sqlite=True)
    add("quarantined_media", "SQLite 0", [E, "m1", 0], sqlite=True)
    add("quarantined_media", "non-ASCII", ["\u00e9.example", "\u4e2d", True])
    add("quarantined_media", "extra trailing field", [E, "m", True], extra=["reason"])
    add("quarantined_media", "too few fields", [E, "m"], too_few=True)
    add("quarantined_media", "local media (origin null)", [None, "abcDEF123", True],
        hand_built="annotated str, but _get_quarantined_media_changes_txn reads "
        "quarantined_media_changes.origin, which is NULL for local media")
    add("quarantined_media", "local media released, SQLite 0", [None, "abcDEF123", 0], sqlite=True,
        hand_built="origin NULL for local media; quarantined is a BOOLEAN column")

    # every stream covered, typical + extra + too few for each
    for s in STREAMS_MAP:
        mine = [o for o in objs if o["stream"] == s]
        assert any(not o.get("extra_fields") and not o.get("too_few") for o in mine), s
        assert any(o.get("extra_fields") for o in mine), s
        assert any(o.get("too_few") for o in mine), s
    # every optional field has a null somewhere
    for s, shape in SHAPES.items():
        for fname, _t, optional, _b in shape:
            if optional:
                assert any(o["stream"] == s and fname in o["fields"] and o["fields"][fname] is None
                           for o in objs if not o.get("too_few")), (s, fname)
    for tid, (_cls, shape) in EVENT_SHAPES.items():
        for fname, _t, optional, _b in shape:
            if optional:
                assert any(o["stream"] == "events" and o["fields"]["type_id"] == tid
                           and o["fields"]["data"].get(fname, 0) is None for o in objs), (tid, fname)
    # unique names per file
    return [dict(o, name="%s: %s" % (o["stream"], o["name"])) for o in objs]


def main():
    counts = {}
    commands = build_commands()
    noncanonical = build_noncanonical()
    rejected = build_rejected()
    rows = build_rows()
    counts["commands.jsonl"] = write_jsonl("commands.jsonl", commands)
    counts["noncanonical.jsonl"] = write_jsonl("noncanonical.jsonl", noncanonical)
    counts["rejected.jsonl"] = write_jsonl("rejected.jsonl", rejected)
    counts["rows.jsonl"] = write_jsonl("rows.jsonl", rows)
    for k, v in counts.items():
        print("%-20s %d vectors" % (k, v))


if __name__ == "__main__":
    sys.exit(main())
