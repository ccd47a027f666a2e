"""The ServerApp and ClientApp of a real deployment, at module level, as ``flwr run`` loads them by name.

A deployment starts them in processes of their own (the SuperLink's ServerApp process, each SuperNode's ClientApp
process), so they rebuild the cell from its recipe spec: a JSON file named by the run config key ``recipe``, holding
``{"factory": "module:function", "kwargs": {...}}``; the factory returns the ``CellRecipe``. The server writes its
checkpoints under the run config's ``checkpoint-dir``, which it holds as its sole writer for the whole run
(``writer_lock``: a second ServerApp on the folder is refused, naming the first), waits at most ``reply-timeout``
seconds for a round's replies (0: until every node answers) and at most ``nodes-timeout`` seconds for one node per
client before its first round (``common.NODES_TIMEOUT`` if not given). A node serves the client named by its node
config's ``client-id``, or the n-th client of the run by its ``partition-id`` (the numbered nodes a local
deployment's cells share); it keeps its client's state under its node config's ``state-dir``, or else under the
cell's ``<checkpoint-dir>/nodes/<client id>``; on silo-local data (``CellRecipe.silo``) it loads that client's rows
from its node config's ``data-dir`` only (else from the recipe's silos folder, ``<root>/<client id>``).
A run stopped by a client's diverged training leaves the reason in ``DIVERGED_FILE`` for the stage to raise.
"""

from __future__ import annotations

from pathlib import Path

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedrepro.errors import TrainingDiverged
from fedrepro.fl.flower.client import NodeHandlers
from fedrepro.fl.flower.common import CHECKPOINT_KEY, NODES_TIMEOUT, NODES_TIMEOUT_KEY, RECIPE_KEY, REPLY_TIMEOUT_KEY
from fedrepro.fl.flower.node_state import NODES
from fedrepro.fl.flower.server import FlowerServer
from fedrepro.fl.flower.writer_lock import sole_writer
from fedrepro.fl.recipe import load_recipe

DIVERGED_FILE = "diverged.txt"
"""In the checkpoint folder: the ``TrainingDiverged`` text that stopped the ServerApp (which runs in a process of
its own: Flower only reports that the run failed)."""


server_app = ServerApp()


@server_app.main()
def serve(grid: Grid, context: Context) -> None:
    checkpoint_dir = Path(str(context.run_config[CHECKPOINT_KEY]))
    timeout = float(context.run_config.get(REPLY_TIMEOUT_KEY, 0)) or None
    nodes_timeout = float(context.run_config.get(NODES_TIMEOUT_KEY, NODES_TIMEOUT))
    with sole_writer(checkpoint_dir):  # before the checkpoint is read: an older ServerApp may still be writing it
        recipe = load_recipe(str(context.run_config[RECIPE_KEY]))
        task, algorithm = recipe.build_server()
        try:
            FlowerServer(
                recipe,
                task,
                algorithm,
                checkpoint_dir,
                progress=False,
                reply_timeout=timeout,
                nodes_timeout=nodes_timeout,
            ).serve(grid)
        except TrainingDiverged as error:
            (checkpoint_dir / DIVERGED_FILE).write_text(str(error))
            raise


client_app = ClientApp()


def _handlers(context: Context) -> NodeHandlers:
    """A node with no ``state-dir`` of its own keeps its client's state under ``<checkpoint-dir>/nodes/<client id>``,
    in the folder of the cell it runs (the local deployment's nodes serve a stage's cells one after another)."""
    return NodeHandlers(
        load_recipe(str(context.run_config[RECIPE_KEY])), Path(str(context.run_config[CHECKPOINT_KEY])) / NODES
    )


@client_app.query()
def identify(message: Message, context: Context) -> Message:
    return _handlers(context).identify(message, context)


@client_app.train()
def train(message: Message, context: Context) -> Message:
    return _handlers(context).train(message, context)


@client_app.evaluate()
def evaluate(message: Message, context: Context) -> Message:
    return _handlers(context).evaluate(message, context)
