"""The engine's algorithms on Flower (Message API): ``server.py`` runs the engine's round loop as a ServerApp,
``client.py`` the engine's client step as a ClientApp, ``node_state.py`` keeps each client's private state
on its own node, ``simulation.py`` runs both on Ray on loopback; ``deployment.py`` runs them on a real local
federation (``federation.py``: the SuperLink and SuperNode processes, ``certificates.py``: their keys, ``apps.py``:
the apps ``flwr run`` loads). ``vertical.py`` and ``vertical_deployment.py`` (with ``party_service.py``) run
SS-VFNAS's parties as nodes; ``common.py`` holds what both kinds share, so the vertical ones import none of the
engine. Needs the ``flower`` extra (flwr[simulation])."""

import os

from fedrepro.fl.flower.ray_head import RAY_ENVIRONMENT

# Here, before any module of this package imports Flower: Flower reads FLWR_TELEMETRY_ENABLED once, as it is imported,
# and posts an event to its server at every run it starts unless it was "0" then (set later, it changed nothing); a
# Ray this process starts passes the rest to its workers.
for _name, _value in RAY_ENVIRONMENT.items():
    os.environ.setdefault(_name, _value)
