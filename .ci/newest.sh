#!/usr/bin/env bash
# The engine-facing tests against the newest releases, installed fresh without constraints as a user who installs
# today gets them (`kernels` included): a release that breaks a family, packing, an engine or replay fails here
# before users meet it. See .ci/versions.sh.
exec "$(dirname "$0")/versions.sh" newest
