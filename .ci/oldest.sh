#!/usr/bin/env bash
# The engine-facing tests at the lowest supported versions (.ci/oldest.txt, runner/versions.py's lower bounds), so the
# declared minimums are ones that work. See .ci/versions.sh.
exec "$(dirname "$0")/versions.sh" oldest
