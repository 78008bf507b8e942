"""`python -m grpolab` runs the `grpolab` command."""

import sys

from grpolab.cli import main

sys.exit(main())
