"""`python sweeps/launch.py`: the sweep's command line (sweeps/cli.py), runnable as a script from a checkout."""

import sys
from pathlib import Path

if __name__ == "__main__":
    # the repository root importable, sweeps/ itself off the path (its modules must not shadow top-level ones)
    _here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _here]
    sys.path.insert(0, str(_here.parent))
    from sweeps.cli import main

    sys.exit(main())
