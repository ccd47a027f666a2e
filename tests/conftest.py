import os
import sys
import tempfile
from pathlib import Path

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).parent))

# Cells the tests' pipeline runs keep (fedrepro.cell_store) go to a store of this test session, never the user's.
os.environ["FEDREPRO_CELL_STORE"] = tempfile.mkdtemp(prefix="fedrepro-test-cells-")

# No tqdm monitor thread in the test process: once any test shows a bar it runs for good, and a cell worker that a later
# test forks (fedrepro.grid) can inherit tqdm's lock held by it and hang (a CI run hung so in test_grid).
tqdm.monitor_interval = 0
