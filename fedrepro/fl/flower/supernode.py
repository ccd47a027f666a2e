"""Flower's ``flower-supernode``, refused with a reason before it starts when its TLS settings cannot reach the
SuperLink, and with Flower's two fixed timings settable (``federation.NodeTimings``).

Why the check: a SuperNode started with ``--insecure`` against a SuperLink that speaks TLS (or with a CA that does not
verify the SuperLink's certificate) retries for ever, logging only "Failed to initialize the connection", and an
operator cannot tell a wrong flag from a network down. So before Flower's node starts, this entry point connects once
to ``--superlink`` and tries a TLS handshake the way the node would: a plain-text node whose SuperLink answers TLS, a
TLS node whose SuperLink does not, and a certificate the given CA does not verify each exit with status
``REFUSED_EXIT`` and one line saying what is wrong and what to pass instead. A SuperLink not reachable yet proves
nothing: the node starts and retries, as Flower's does.

Why the timings: a SuperNode tells its SuperLink it is alive every ``HEARTBEAT_DEFAULT_INTERVAL`` (30 s; the SuperLink
marks it offline after two missed, so a dead node is seen only up to a minute later), and when it finds no message for
it, it sleeps 3 s before asking again (then waits for its ClientApp's reply in 0.5-s sleeps). Flower offers no flag for
either: given ``--heartbeat-interval`` or ``--pull-interval``, this entry point sets the interval in the modules that
read it and caps the node loop's sleeps at the pull interval. Every other argument goes to Flower's SuperNode
unchanged; the node's protocol, its TLS and its authentication stay Flower's.

    python -m fedrepro.fl.flower.supernode [--heartbeat-interval S] [--pull-interval S] [flower-supernode arguments]
"""

from __future__ import annotations

import argparse
import socket
import ssl
import sys
import time
from typing import Any

REFUSED_EXIT = 2
"""The exit status of a node refused before it starts (Flower's own node exits 1 once its ``--max-wait-time`` runs
out)."""
PROBE_SECONDS = 10.0
"""How long the check waits for the SuperLink to accept a connection and finish a handshake."""


class SleepsAtMost:
    """Stands for the ``time`` module in Flower's node loop (``flwr.supernode.start_client_internal``, which uses it for
    its sleeps alone): every sleep is cut to ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def sleep(self, seconds: float) -> None:
        time.sleep(min(seconds, self.seconds))

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def tls_problem(
    address: str, insecure: bool, root_certificates: str | None, timeout: float = PROBE_SECONDS
) -> str | None:
    """Why a SuperNode could never join the SuperLink at ``address`` (``host:port``) with these flags (``--insecure``;
    ``--root-certificates``, None: the system's CAs, as Flower's node then uses), or None where the handshake goes as
    the node's would, or where the SuperLink cannot be reached (yet) to tell."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        connection = socket.create_connection((host, int(port)), timeout=timeout)
    except (OSError, ValueError):
        return None
    authorities = f"--root-certificates {root_certificates}" if root_certificates else "the system's CA certificates"
    if insecure:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    else:
        try:
            context = ssl.create_default_context(cafile=root_certificates)
        except (OSError, ssl.SSLError) as error:
            connection.close()
            return f"{authorities} cannot be read as CA certificates ({error})"
    context.set_alpn_protocols(["h2", "http/1.1"])
    try:
        with context.wrap_socket(connection, server_hostname=host):
            pass
    except ssl.SSLCertVerificationError as error:
        return (
            f"the SuperLink at {address} presents a certificate that {authorities} do not verify "
            f"({error.verify_message}): pass the CA that signed the SuperLink's certificate (--root-certificates), "
            f"and check that the certificate names {host}"
        )
    except (ssl.SSLError, OSError) as error:
        if insecure:
            return None  # no TLS spoken there: a plain-text node is what the SuperLink expects
        return (
            f"no TLS handshake with the SuperLink at {address} ({getattr(error, 'reason', None) or error}): it may "
            "have been started without TLS (--insecure); start both ends with TLS, or neither"
        )
    finally:
        connection.close()
    if insecure:
        return (
            f"the SuperLink at {address} speaks TLS and this node was started with --insecure (plain text), so it "
            "would be refused at every try: start it with --root-certificates <the federation's CA certificate>"
        )
    return None


def main(argv: list[str]) -> None:
    ours = argparse.ArgumentParser(prog="python -m fedrepro.fl.flower.supernode", add_help=False)
    ours.add_argument("--heartbeat-interval", type=float)
    ours.add_argument("--pull-interval", type=float)
    timings, flowers = ours.parse_known_args(argv)
    connection = argparse.ArgumentParser(add_help=False)
    connection.add_argument("--superlink", default="127.0.0.1:9092")
    connection.add_argument("--root-certificates")
    connection.add_argument("--insecure", action="store_true")
    settings, _ = connection.parse_known_args(flowers)
    problem = tls_problem(settings.superlink, settings.insecure, settings.root_certificates)
    if problem is not None:
        print(f"SuperNode refused before it starts: {problem}", file=sys.stderr, flush=True)
        sys.exit(REFUSED_EXIT)

    from flwr.supercore import heartbeat
    from flwr.supernode import fleet_http_connection, start_client_internal
    from flwr.supernode.cli import flower_supernode

    if timings.heartbeat_interval is not None:
        heartbeat.HEARTBEAT_DEFAULT_INTERVAL = timings.heartbeat_interval  # the pace of the node's heartbeats
        fleet_http_connection.HEARTBEAT_DEFAULT_INTERVAL = timings.heartbeat_interval  # what the SuperLink expects
    if timings.pull_interval is not None:
        start_client_internal.time = SleepsAtMost(timings.pull_interval)
    sys.argv = ["flower-supernode", *flowers]
    flower_supernode()


if __name__ == "__main__":
    main(sys.argv[1:])
