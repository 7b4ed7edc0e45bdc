#!/usr/bin/env bash
# Drives the real `sft-tui` binary in a detached tmux pane (120×40) through a whole tiny-cpu run:
# opens at the Plan step, goes to Launch, launches, waits for the summary, checks the record path is on screen,
# quits. Prints the final screen and `record: <path>`; exits non-zero (with the screen) when a step times out.
#
#   tests/tui/tmux_drive.sh [WORK_DIR]        # env: SFT_TUI (binary), MAX_STEPS (default 6), TIMEOUT_S (default 150)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SFT_TUI="${SFT_TUI:-$REPO/.venv/bin/sft-tui}"
MAX_STEPS="${MAX_STEPS:-6}"
TIMEOUT_S="${TIMEOUT_S:-150}"
WORK="${1:-$(mktemp -d)}"
SOCKET="sft-tui-drive-$$"  # a private tmux server: nothing else's sessions are touched
SESSION="drive"
mkdir -p "$WORK"

tmux_() { tmux -L "$SOCKET" "$@"; }
cleanup() { tmux_ kill-server 2>/dev/null || true; }
trap cleanup EXIT

screen() { tmux_ capture-pane -p -t "$SESSION"; }

wait_for() {  # wait_for REGEX SECONDS WHAT
    local deadline=$((SECONDS + $2))
    while ((SECONDS < deadline)); do
        if screen | grep -Eq "$1"; then return 0; fi
        sleep 0.2
    done
    echo "timed out after $2 s waiting for $3; the screen was:" >&2
    screen >&2
    return 1
}

tmux_ new-session -d -s "$SESSION" -x 120 -y 40 -c "$REPO" \
    "TERM=xterm-256color '$SFT_TUI' --recipe tiny-cpu --set train.max_steps=$MAX_STEPS \
     --runs-dir '$WORK/runs' --records-dir '$WORK/records'; echo EXITED \$?; sleep 30"

wait_for '5 Plan' 30 "the wizard"
wait_for 'torch\.distributed\.run' 60 "the plan's torchrun command"
tmux_ send-keys -t "$SESSION" C-n          # Plan → Launch
wait_for 'ready: 2 rank\(s\) on cpu' 30 "the Launch step"
tmux_ send-keys -t "$SESSION" C-l          # launch
wait_for 'step [0-9]+/'"$MAX_STEPS" 90 "the dashboard"
wait_for 'SUCCEEDED' "$TIMEOUT_S" "the summary"
screen
# The record path is on screen; a long one wraps, so match its file name and find the file where it must be.
run_id="$(screen | grep -oE 'summary of [^ ]+' | head -n 1 | awk '{print $3}')"
screen | grep -q "record .*$run_id" || screen | grep -q "$run_id\.json" \
    || { echo "the record path of $run_id is not on the screen" >&2; exit 1; }
record_path="$WORK/records/$run_id.json"
tmux_ send-keys -t "$SESSION" C-q
wait_for 'EXITED 0' 20 "sft-tui to exit"
test -f "$record_path" || { echo "no record file at $record_path" >&2; exit 1; }
echo "record: $record_path"
