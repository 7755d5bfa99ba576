"""`python -m kvfleet_sandbox up|down|status`: the same as the `kvfleet-sandbox` command."""

import sys

from kvfleet_sandbox.cli import main

sys.exit(main())
