"""SS-VFNAS's parties on a real Flower deployment: the label party in the ServerApp, every other party a SuperNode.

``VerticalDeployment.run()`` is ``VerticalSimulation.run()`` on a ``LocalFederation`` (TLS, authenticated SuperNodes,
loopback): it pickles the run's recipe (``RECIPE_FILE``, what every party reads) and, apart from it, the label
party's drive (``LABEL_FILE``: its data and what it runs, which no other party's process opens), starts for each
other party its service (``fedrepro.fl.flower.party_service``: the party's own long-lived process, holding its
networks, optimizers and forward graph between messages) and its SuperNode, and ``flwr run``s the app below. Every
message's ClientApp process hands the label party's command to its node's service and replies with the answer, so
every activation and gradient is a Flower message, as in the simulation. The ServerApp writes what the drive returned
to ``RESULT_FILE``; the run returns it.

Module-level, as ``flwr run`` loads them by name: ``server_app`` (run config ``recipe``, ``label``) and
``client_app`` (node config ``party-id``, ``party-socket``).
"""

from __future__ import annotations

import pickle
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedrepro.errors import FederationError
from fedrepro.fl.flower import messages as m
from fedrepro.fl.flower.certificates import make_node_key
from fedrepro.fl.flower.common import NODES_TIMEOUT
from fedrepro.fl.flower.federation import LocalFederation, stopped_cleanly_on_sigterm, wait_until, write_flower_app
from fedrepro.fl.flower.party_service import ask, load_recipe
from fedrepro.fl.flower.vertical import COMMAND, OP, PARTY, PARTY_ID_KEY, FlowerTransport
from fedrepro.io import atomic_file
from fedrepro.vfl.nodes import VerticalHub, VerticalRecipe, party_directory
from fedrepro.vfl.protocol import party_name

RECIPE_KEY, LABEL_KEY, PARTY_SOCKET_KEY = "recipe", "label", "party-socket"
RECIPE_FILE, LABEL_FILE, RESULT_FILE = "recipe.pkl", "label.pkl", "result.pkl"


def _load(path: str | Path) -> Any:
    with open(path, "rb") as file:
        return pickle.load(file)


server_app = ServerApp()


@server_app.main()
def serve_label_party(grid: Grid, context: Context) -> None:
    recipe = load_recipe(str(context.run_config[RECIPE_KEY]))
    label = _load(str(context.run_config[LABEL_KEY]))
    torch.set_num_threads(recipe.threads)
    transport = FlowerTransport(grid, recipe, label["reply_timeout"], label["nodes_timeout"])
    hub = VerticalHub(recipe, recipe.build_party(recipe.label), transport, Path(label["directory"]))
    result = label["drive"](hub)
    hub.save_parties()
    with atomic_file(label["result"], "wb") as file:
        pickle.dump(result, file)


client_app = ClientApp()


@client_app.query()
def identify(message: Message, context: Context) -> Message:
    recipe = load_recipe(str(context.run_config[RECIPE_KEY]))
    if message.content[m.CONFIG][m.FINGERPRINT] != recipe.fingerprint:
        raise FederationError(
            f"this node was given run {recipe.fingerprint[:12]}'s recipe, the label party runs "
            f"{str(message.content[m.CONFIG][m.FINGERPRINT])[:12]}"
        )
    index = int(context.node_config[PARTY_ID_KEY])
    return Message(RecordDict({m.CONFIG: ConfigRecord({PARTY: index})}), reply_to=message)


@client_app.train()
def command(message: Message, context: Context) -> Message:
    config = message.content[m.CONFIG]
    tensors = m.to_tensors(message.content[m.TENSORS]) if m.TENSORS in message.content else {}
    reply = ask(
        str(context.node_config[PARTY_SOCKET_KEY]),
        str(context.run_config[RECIPE_KEY]),
        str(config[OP]),
        str(config[COMMAND]),
        tensors,
    )
    return Message(RecordDict({m.TENSORS: m.to_record(reply)}), reply_to=message)


class VerticalDeployment:
    """``run()`` runs ``drive(hub)`` with the label party in a deployment's ServerApp and each other party a
    SuperNode with its service; returns what ``drive`` returned. Each party keeps its files in ``party_directory``
    under ``root``."""

    def __init__(
        self,
        recipe: VerticalRecipe,
        root: str | Path,
        drive: Callable[[VerticalHub], Any],
        timeout: float = 86400,
        reply_timeout: float | None = None,
        nodes_timeout: float = NODES_TIMEOUT,
    ) -> None:
        self.recipe, self.drive, self.root = recipe, drive, Path(root).resolve()
        self.timeout, self.reply_timeout, self.nodes_timeout = timeout, reply_timeout, nodes_timeout

    def run(self) -> Any:
        self.root.mkdir(parents=True, exist_ok=True)
        result = self.root / RESULT_FILE
        result.unlink(missing_ok=True)
        with atomic_file(self.root / RECIPE_FILE, "wb") as file:
            pickle.dump(self.recipe, file)
        with atomic_file(self.root / LABEL_FILE, "wb") as file:
            pickle.dump(
                {
                    "drive": self.drive,
                    "result": str(result),
                    "reply_timeout": self.reply_timeout,
                    "directory": str(party_directory(self.root, self.recipe.label)),
                    "nodes_timeout": self.nodes_timeout,
                },
                file,
            )
        sockets = Path(tempfile.mkdtemp(prefix="fedrepro-parties-"))  # a Unix socket's path is short
        try:
            self._federate(sockets, result)
        finally:
            shutil.rmtree(sockets, ignore_errors=True)
        if not result.exists():
            raise FederationError(f"the label party's ServerApp ended without writing {result}")
        return _load(result)

    def _federate(self, sockets: Path, result: Path) -> None:
        with stopped_cleanly_on_sigterm(), LocalFederation(self.root / "federation") as federation:
            federation.start_launcher(1, [__name__])
            for j in self.recipe.others:
                socket_path = sockets / party_name(j)
                service = federation.start_service(
                    f"party-{j}",
                    [
                        sys.executable,
                        "-m",
                        "fedrepro.fl.flower.party_service",
                        str(socket_path),
                        str(party_directory(self.root, j)),
                        str(j),
                    ],
                )
                wait_until(
                    lambda: socket_path.exists() or service.poll() is not None, 120, f"{party_name(j)}'s service"
                )
                if service.poll() is not None:
                    raise FederationError(f"{party_name(j)}'s service failed: see {federation.logs}/party-{j}.log")
                private, public = make_node_key(federation.node_keys, party_name(j))
                federation.register(public)
                federation.start_supernode(
                    party_name(j),
                    private,
                    {
                        PARTY_ID_KEY: str(j),
                        PARTY_SOCKET_KEY: str(socket_path),
                        "state-dir": str(party_directory(self.root, j)),
                    },
                )
            app = write_flower_app(
                self.root / "app",
                f"{__name__}:server_app",
                f"{__name__}:client_app",
                {RECIPE_KEY: str(self.root / RECIPE_FILE), LABEL_KEY: str(self.root / LABEL_FILE)},
            )
            federation.run(app, self.timeout, result.exists)
