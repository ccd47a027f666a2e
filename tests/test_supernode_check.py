"""A SuperNode whose TLS settings could never join its SuperLink is refused before it starts, saying why
(``fedrepro.fl.flower.supernode``); one whose settings fit, or whose SuperLink cannot be reached yet, is let through to
Flower's node. The SuperLinks here are stand-ins: a TLS listener with the federation's certificates, and a plain one."""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from fedrepro.fl.flower.certificates import make_certificates
from fedrepro.fl.flower.federation import NodeTimings, supernode_command
from fedrepro.fl.flower.supernode import REFUSED_EXIT, tls_problem


class Listener:
    """Accepts connections on loopback until closed; with ``certificates``, finishes a TLS handshake on each."""

    def __init__(self, certificates: dict[str, Path] | None) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.server.getsockname()[1]}"
        self.context = None
        if certificates is not None:
            self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.context.load_cert_chain(certificates["cert"], certificates["key"])
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            try:
                if self.context is not None:
                    self.context.wrap_socket(connection, server_side=True).close()
                else:
                    connection.recv(4096)  # a ClientHello this end does not understand
                    connection.close()
            except (OSError, ssl.SSLError):
                connection.close()

    def close(self) -> None:
        self.server.close()


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    folder = tmp_path_factory.mktemp("certificates")
    certificates = make_certificates(folder / "ours")
    strangers = make_certificates(folder / "strangers")
    tls, plain = Listener(certificates), Listener(None)
    yield {"ca": str(certificates["ca"]), "other ca": str(strangers["ca"]), "tls": tls.address, "plain": plain.address}
    tls.close()
    plain.close()


def test_a_plain_text_node_against_a_tls_superlink_is_told_to_pass_the_ca(federation):
    problem = tls_problem(federation["tls"], insecure=True, root_certificates=None)
    assert problem is not None and "speaks TLS" in problem and "--root-certificates" in problem, problem


def test_a_ca_that_does_not_verify_the_superlink_is_named(federation):
    problem = tls_problem(federation["tls"], insecure=False, root_certificates=federation["other ca"])
    assert problem is not None and "do not verify" in problem and federation["other ca"] in problem, problem


def test_a_tls_node_against_a_plain_superlink_is_told_so(federation):
    problem = tls_problem(federation["plain"], insecure=False, root_certificates=federation["ca"])
    assert problem is not None and "no TLS handshake" in problem, problem


def test_fitting_settings_and_an_unreachable_superlink_pass(federation):
    assert tls_problem(federation["tls"], insecure=False, root_certificates=federation["ca"]) is None
    assert tls_problem(federation["plain"], insecure=True, root_certificates=None) is None
    with socket.socket() as probe:  # a port nothing listens on: the node starts and retries, as Flower's does
        probe.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{probe.getsockname()[1]}"
    assert tls_problem(closed, insecure=True, root_certificates=None) is None


def test_the_refused_node_exits_at_once_with_the_reason(federation):
    command = supernode_command(["--superlink", federation["tls"], "--insecure"], NodeTimings(pull_interval=0.5))
    assert command[:3] == [sys.executable, "-m", "fedrepro.fl.flower.supernode"]
    refused = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert refused.returncode == REFUSED_EXIT, refused.stderr
    assert "SuperNode refused before it starts" in refused.stderr and "speaks TLS" in refused.stderr, refused.stderr
