"""The engine's algorithms on Flower (Message API): ``server.py`` runs the engine's round loop as a ServerApp,
``client.py`` the engine's client step as a ClientApp, ``node_state.py`` keeps each client's private state
on its own node, ``simulation.py`` runs both on Ray on loopback. Needs the ``flower`` extra (flwr[simulation])."""
