import os
import sys
import tempfile
from pathlib import Path

import pytest
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).parent))

# Cells the tests' pipeline runs keep (fedrepro.cell_store) go to a store of this test session, never the user's.
os.environ["FEDREPRO_CELL_STORE"] = tempfile.mkdtemp(prefix="fedrepro-test-cells-")

# No tqdm monitor thread in the test process: once any test shows a bar it runs for good, and a cell worker that a later
# test forks (fedrepro.grid) can inherit tqdm's lock held by it and hang (a CI run hung so in test_grid).
tqdm.monitor_interval = 0

# The suite runs on two pytest-xdist workers (scripts/test.sh), each taking one group of tests at a time
# (``GroupScheduling``):
# - a test module is one group, so a module-scoped fixture (a pipeline run, a federation) runs once, in one worker;
# - the modules that start Flower federations (Ray, SuperLinks, SuperNodes, network namespaces) are one group, so two
#   federations never start at once and compete for the same cores and timeouts;
# - the two longest groups start first (the end-to-end pipeline run and the Flower modules, about 29 min each in CI
#   on 2 cores: both compute, so they slow each other; overlap alone does not bring CI under 20 min), and the short
#   modules fill in around them.
FLOWER_MODULES = {"test_flower.py", "test_flower_hosts.py", "test_flower_long_running.py", "test_vfl_nodes.py"}
LONGEST_FIRST = ("test_pipeline_e2e.py", "flower")


def group_of(nodeid: str) -> str:
    module = nodeid.split("::")[0]
    return "flower" if Path(module).name in FLOWER_MODULES else module


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        group = group_of(item.nodeid)
        return next((i for i, first in enumerate(LONGEST_FIRST) if group.endswith(first)), len(LONGEST_FIRST))

    items.sort(key=rank)


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """xdist's own ``--dist loadgroup`` reads ``xdist_group`` marks into node ids that pytest 9 no longer takes, so
    the groups are drawn here: each group (``group_of``) is one unit of work, handed out in collection order."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return GroupScheduling(config, log)
