#!/usr/bin/env bash
# A new user's walk, recorded: the real `sft-tui` binary in a detached 80×24 tmux pane (COLS/ROWS to change),
# driven by keys only. The user's own data is the alpaca fixture with its columns renamed (question / context /
# answer), so the wizard's Dataset step must be told the format and the columns: the path typed in, format alpaca
# picked, the columns mapped; then Launch, the dashboard, the summary, the records browser and the record. Prints
# every screen it checked, headed `--- <what>`, and `record: <path>` last; exits non-zero (with the screen) when a
# step times out.
#
#   tests/tui/newuser_walk.sh [WORK_DIR]   # env: SFT_TUI (binary), MAX_STEPS (default 6), TIMEOUT_S (150), COLS, ROWS
#   tests/tui/newuser_walk.sh > benchmarks/newuser-walk-80x24.txt   # the committed recording
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SESSION_NAME="walk"
# shellcheck source=tests/tui/tmux_lib.sh
. "$REPO/tests/tui/tmux_lib.sh"
PYTHON="$(dirname "$SFT_TUI")/python"
show() { echo "--- $1"; screen; }
WORK="${1:-$(mktemp -d)}"
mkdir -p "$WORK"

# The user's data: alpaca rows under their own column names.
"$PYTHON" - "$REPO/tests/fixtures/data/alpaca_en_demo.json" "$WORK/qa.json" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1], encoding="utf-8"))
names = {"instruction": "question", "input": "context", "output": "answer"}
json.dump([{names[k]: v for k, v in r.items()} for r in rows], open(sys.argv[2], "w", encoding="utf-8"), indent=1)
EOF

echo "\$ tests/tui/newuser_walk.sh   # sft-tui --set train.max_steps=$MAX_STEPS in a ${COLS}x${ROWS} tmux pane"
tmux_ new-session -d -s "$SESSION" -x "$COLS" -y "$ROWS" -c "$WORK" \
    "TERM=xterm-256color '$SFT_TUI' --set train.max_steps=$MAX_STEPS; echo EXITED \$?; sleep 30"
tmux_ set-option -g escape-time 0          # a lone Esc reaches the app at once, as in a terminal without tmux
wait_for 'sft-tui — new run' 30 "the wizard"
wait_for 'architecture' 60 "the Model step's architecture"
key C-n
wait_for '▕ Dataset' 20 "the Dataset step"
wait_for 'first conversation' 60 "the embedded data's preview"
# The help line under the pane names the focused field: each key waits for the focus it expects.
focus() { wait_for "^ $1 \\(default" 10 "the focus on $1"; }
focus dataset.id
key Tab
focus dataset.path
key C-e C-u
wait_for 'local path *$' 10 "the local path cleared"
key -l 'qa.json'
wait_for 'local path +qa\.json' 10 "the path typed"
wait_for "cannot tell the dataset's format" 60 "the new file read, its format unknown"
show "dataset: the user's file typed in"
key Tab Tab Tab                            # revision, split → format
focus dataset.format
pick_alpaca() {  # the format list: auto, messages, sharegpt, alpaca, ...; keys sent while it opens can be lost
    key Enter
    wait_for 'prompt_completion' 10 "the format list" || return 1
    key Down Down Down Enter
    for _ in $(seq 25); do screen | grep -Eq 'format +alpaca' && return 0; sleep 0.2; done
    screen | grep -q 'prompt_completion' && key Escape
    return 1
}
pick_alpaca 2>/dev/null || pick_alpaca 2>/dev/null || pick_alpaca
wait_for 'format +alpaca' 10 "format alpaca picked"
wait_for "needs columns" 60 "the rows read as alpaca without its columns"
show "dataset: format alpaca picked, the columns not yet mapped"
key Tab
focus dataset.columns
key -l 'instruction=question, input=context, output=answer'
wait_for 'alpaca \(set\): question, context, answer' 60 "the rows read through the mapped columns"
wait_for 'first conversation' 60 "the mapped data's preview"
show "dataset: format alpaca, columns mapped"
for step in Hardware Method Plan Launch; do
    key C-n
    wait_for "▕ $step" 20 "the $step step"
done
wait_for 'ready: 2 rank\(s\) on cpu' 90 "the Launch step's checks (plan and preflight)"
show "launch"
key C-l
wait_for 'step [1-9][0-9]*/'"$MAX_STEPS" 120 "the dashboard's first steps"
show "dashboard"
wait_for 'SUCCEEDED' "$TIMEOUT_S" "the summary"
show "summary"
run_id="$(screen | grep -oE 'summary of [^ ]+' | head -n 1 | awk '{print $3}')"
screen | grep -q "records/$run_id\.json" || { echo "the record path of $run_id is not on the screen" >&2; exit 1; }
key C-r
wait_for "succeeded +$MAX_STEPS " 20 "the run's status and steps in the records table"
wait_for "$run_id" 5 "the run's whole id in the records table"
show "records"
key Enter
wait_for '✓ verified' 20 "the record, its lock verified"
show "record"
key C-q
wait_for 'EXITED 0' 20 "sft-tui to exit"
record_path="$WORK/records/$run_id.json"
test -f "$record_path" || { echo "no record file at $record_path" >&2; exit 1; }
echo "record: $record_path"
