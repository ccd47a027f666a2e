"""The engine's algorithms on Flower (Message API): ``server.py`` runs the engine's round loop as a ServerApp,
``client.py`` the engine's client step as a ClientApp, ``node_state.py`` keeps each client's private state
on its own node, ``simulation.py`` runs both on Ray on loopback; ``deployment.py`` runs them on a real local
federation (``federation.py``: the SuperLink and SuperNode processes, ``certificates.py``: their keys, ``apps.py``:
the apps ``flwr run`` loads). Needs the ``flower`` extra (flwr[simulation])."""
