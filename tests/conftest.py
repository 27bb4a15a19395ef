import sys
from pathlib import Path

# Let tests import their small shared helpers (gradcheck.py, ...) by module name.
sys.path.insert(0, str(Path(__file__).parent))
