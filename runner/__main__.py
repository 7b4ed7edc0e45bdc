"""`python -m runner` is the `runner` command."""

import sys

from runner.cli.main import main

sys.exit(main())
