"""A direct TCP replication peer made of Synapse's own protocol classes.

Runs `ClientReplicationStreamProtocol` or `ServerReplicationStreamProtocol`
from `synapse/replication/tcp/protocol.py` (Synapse 1.163.2) on a real
Twisted reactor, with the smallest stubs they need (a `hs` that can run a
background process, a command handler that accepts connections), so that
tests/tcp_synapse.rs can check this crate against the reference.

    tcp_peer.py client PORT NAME...   connect to 127.0.0.1:PORT once per NAME,
                                      expecting that server name each time
    tcp_peer.py server SERVER_NAME    listen on 127.0.0.1, print "LISTENING <port>"

Output, one line each, flushed:
    SYNAPSE <version>         first
    CONNECTED                 a connection is made
    RECV <wire line>          a command received (after Synapse parsed it and
                              checked its direction)
    CLOSED                    the connection ended
    DONE / TIMEOUT            the script ends

Scripted reactions:
- client: on `RDATA caches ... 3 ...` it sends `FEDERATION_ACK python 3`
  and `USER_SYNC python @alice:example.com DEVICE start 1700000000000`.
- server: on `REPLICATE` it sends `POSITION caches master 5 5`, three RDATA
  (token 6, then a batch of two rows with token 7), `POSITION caches master
  7 9`; on `USER_SYNC` it writes a line of 17000 bytes, which the client
  must refuse with `ERROR Line length exceeded`.
"""

import sys

from twisted.internet import defer, protocol, reactor

import synapse
from synapse.replication.tcp.commands import (
    FederationAckCommand,
    PositionCommand,
    RdataCommand,
    UserSyncCommand,
)
from synapse.replication.tcp.protocol import (
    ClientReplicationStreamProtocol,
    ServerReplicationStreamProtocol,
)
from synapse.util.clock import Clock

TIMEOUT_SECONDS = 20


def out(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class StubHomeServer:
    """What the protocol classes ask of `hs`."""

    def run_as_background_process(self, desc, func, *args, **kwargs):
        return defer.ensureDeferred(func(*args, **kwargs))


class StubHandler:
    """What the protocol classes ask of the `ReplicationCommandHandler`."""

    def __init__(self, on_lost):
        self.on_lost = on_lost
        self.lost = False

    def new_connection(self, connection):
        out("CONNECTED")

    def lost_connection(self, connection):
        # Synapse calls this twice per connection (stopProducing, then
        # connectionLost).
        if self.lost:
            return
        self.lost = True
        out("CLOSED")
        reactor.callLater(0, self.on_lost)


def received(command):
    out("RECV %s %s" % (command.NAME, command.to_line()))


class PeerClient(ClientReplicationStreamProtocol):
    def handle_command(self, cmd):
        received(cmd)
        super().handle_command(cmd)
        if cmd.NAME == "RDATA" and cmd.stream_name == "caches" and cmd.token == 3:
            self.send_command(FederationAckCommand("python", 3))
            self.send_command(
                UserSyncCommand(
                    "python", "@alice:example.com", "DEVICE", True, 1700000000000
                )
            )


class PeerServer(ServerReplicationStreamProtocol):
    def handle_command(self, cmd):
        received(cmd)
        super().handle_command(cmd)
        if cmd.NAME == "REPLICATE":
            self.send_command(PositionCommand("caches", "master", 5, 5))
            self.send_command(RdataCommand("caches", "master", 6, ["a", ["k"], 6]))
            self.send_command(
                RdataCommand("caches", "master", None, ["b", None, 7])
            )
            self.send_command(
                RdataCommand("caches", "master", 7, ["c\u00e9", [], 7])
            )
            self.send_command(PositionCommand("caches", "master", 7, 9))
        elif cmd.NAME == "USER_SYNC":
            self.transport.write(b"PING " + b"x" * 17000 + b"\n")


finished = []


def finish(message):
    if finished:
        return
    finished.append(message)
    out(message)
    if reactor.running:
        reactor.stop()


def run_client(port, names):
    hs = StubHomeServer()
    clock = Clock(reactor, server_name="python")
    remaining = list(names)

    def connect_next():
        if not remaining:
            finish("DONE")
            return
        server_name = remaining.pop(0)
        handler = StubHandler(connect_next)

        class Factory(protocol.ClientFactory):
            def buildProtocol(self, addr):
                return PeerClient(hs, "python", server_name, clock, handler)

            def clientConnectionFailed(self, connector, reason):
                finish("FAILED %s" % (reason.getErrorMessage(),))

        reactor.connectTCP("127.0.0.1", port, Factory(), timeout=10)

    connect_next()


def run_server(server_name):
    hs = StubHomeServer()
    clock = Clock(reactor, server_name=server_name)
    handler = StubHandler(lambda: finish("DONE"))

    class Factory(protocol.ServerFactory):
        def buildProtocol(self, addr):
            return PeerServer(hs, server_name, clock, handler)

    listening = reactor.listenTCP(0, Factory(), interface="127.0.0.1")
    out("LISTENING %d" % (listening.getHost().port,))


def main():
    out("SYNAPSE %s" % (synapse.__version__,))
    mode = sys.argv[1]
    if mode == "client":
        run_client(int(sys.argv[2]), sys.argv[3:])
    elif mode == "server":
        run_server(sys.argv[2])
    else:
        raise SystemExit("usage: tcp_peer.py client PORT NAME... | server SERVER_NAME")
    reactor.callLater(TIMEOUT_SECONDS, finish, "TIMEOUT")
    reactor.run()


if __name__ == "__main__":
    main()
