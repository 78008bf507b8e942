"""`python -m grpolab.diagnose.logdoctor FILE…`: `grpolab diagnose log` without the `grpolab` CLI's imports."""

import sys

from grpolab.diagnose.logdoctor.command import main

sys.exit(main())
