import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

# Cells the tests' pipeline runs keep (fedrepro.cell_store) go to a store of this test session, never the user's.
os.environ["FEDREPRO_CELL_STORE"] = tempfile.mkdtemp(prefix="fedrepro-test-cells-")
