"""`python -m rcdiag` is the `rcdiag` command."""
import sys

from rcdiag.cli import main

sys.exit(main())
