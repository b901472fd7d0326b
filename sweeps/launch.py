"""`python sweeps/launch.py`: the sweep's command line (sweeps/cli.py), runnable as a script from a checkout."""

import sys
from pathlib import Path

if __name__ == "__main__":
    # the repository root importable, sweeps/ itself off the path (its modules must not shadow top-level ones)
    _here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _here]
    sys.path.insert(0, str(_here.parent))
    # Ctrl+C and SIGTERM stop the sweep from here on, whatever this process inherited (sweeps/start_steps.py)
    from sweeps.start_steps import launched

    launched()
    try:
        from sweeps.cli import main
    except KeyboardInterrupt:  # during the imports: nothing has been read or written yet
        print("interrupted before the sweep started; nothing was written", file=sys.stderr)
        sys.exit(130)
    try:
        code = main()  # a stop is reported there (exit 130, the --resume hint where there is something to resume)
    except KeyboardInterrupt:  # one more Ctrl+C while main reported the first
        print("interrupted", file=sys.stderr)
        code = 130
    sys.exit(code)
