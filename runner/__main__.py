"""`python -m runner` is the `runner` command."""

import sys

from runner.cli import main

sys.exit(main())
