#!/usr/bin/env bash
# Drives the real `sft-tui` binary in a detached tmux pane (80×24 unless COLS/ROWS say otherwise) through a whole
# tiny-cpu run with the keyboard only: the wizard from its first step (Model) through every step to Launch,
# launch, the dashboard, the summary (the record's path on screen), the records browser (the run's whole id in the
# table), the record opened (its lock verified), quit. Prints the screens it checked and `record: <path>`; exits
# non-zero (with the screen) when a step times out.
#
# With HANGUP=1 it closes the terminal (kills the tmux server: SIGHUP to the wizard) once the dashboard shows a step,
# prints `hung up` and exits 0: the run must go on to its record without any view.
#
#   tests/tui/tmux_drive.sh [WORK_DIR]   # env: SFT_TUI (binary), MAX_STEPS (default 6), TIMEOUT_S (150), COLS, ROWS,
#                                        #      HANGUP
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SESSION_NAME="drive"
# shellcheck source=tests/tui/tmux_lib.sh
. "$REPO/tests/tui/tmux_lib.sh"
WORK="${1:-$(mktemp -d)}"
mkdir -p "$WORK"

# Run from the work folder with relative runs/ and records/: paths on screen are as short as a user's would be.
tmux_ new-session -d -s "$SESSION" -x "$COLS" -y "$ROWS" -c "$WORK" \
    "TERM=xterm-256color '$SFT_TUI' --set train.max_steps=$MAX_STEPS; echo EXITED \$?; sleep 30"

# tmux holds a lone Esc for escape-time (500 ms by default) and sends it glued to the next key, which then reads
# as Alt+key: Esc would be lost. A terminal without tmux sends it at once; so does this server.
tmux_ set-option -g escape-time 0
wait_for 'sft-tui — new run' 30 "the wizard"
wait_for 'architecture' 60 "the Model step's architecture"
key C-o                                    # the load dialog, closed with Escape (^q must still quit at the end)
wait_for 'Load a recipe' 10 "the load dialog"
key Escape
for _ in $(seq 50); do screen | grep -q 'Load a recipe' || break; sleep 0.2; done
screen | grep -q 'Load a recipe' && { echo "Escape did not close the load dialog" >&2; screen >&2; exit 1; }
for step in Dataset Hardware Method Plan Launch; do
    key C-n
    wait_for "▕ $step" 20 "the $step step"
done
wait_for 'ready: 2 rank\(s\) on cpu' 90 "the Launch step's checks (plan and preflight)"
key C-l                                    # launch
wait_for 'step [0-9]+/'"$MAX_STEPS" 90 "the dashboard"
echo "--- dashboard"; screen
if [[ "${HANGUP:-}" == 1 ]]; then
    tmux_ kill-server
    echo "hung up"
    exit 0
fi
wait_for 'SUCCEEDED' "$TIMEOUT_S" "the summary"
echo "--- summary"; screen
run_id="$(screen | grep -oE 'summary of [^ ]+' | head -n 1 | awk '{print $3}')"
screen | grep -q "records/$run_id\.json" || { echo "the record path of $run_id is not on the screen" >&2; exit 1; }
key C-r                                    # records browser
wait_for "$run_id" 20 "the run's whole id in the records table"
wait_for "succeeded +$MAX_STEPS " 5 "the run's status and steps in the records table"
wait_for 'more columns' 5 "the hint that the table scrolls sideways"
echo "--- records"; screen
key Enter                                  # open the record (the cursor is on the newest)
wait_for '✓ verified' 20 "the record, its lock verified"
echo "--- record"; screen
key C-q
wait_for 'EXITED 0' 20 "sft-tui to exit"
record_path="$WORK/records/$run_id.json"
test -f "$record_path" || { echo "no record file at $record_path" >&2; exit 1; }
echo "record: $record_path"
