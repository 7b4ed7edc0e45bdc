#!/usr/bin/env bash
# A fast typist's walk: the real `sft-tui` binary in a detached 80×24 tmux pane, keys sent with no pause after ^n
# (tmux hands them to the app in one read). A model folder of config.json and tokenizer alone (the wizard proposes
# random init for it), the user's own alpaca-style file with "Klämbt" in it, the method changed from full to LoRA;
# Launch, the summary. Prints every screen it checked, headed `--- <what>`, and `record: <path>` last; exits
# non-zero (with the screen) when a step times out.
#
#   tests/tui/fast_keys_walk.sh [WORK_DIR]   # env: SFT_TUI (binary), MAX_STEPS (default 6), TIMEOUT_S (150)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SESSION_NAME="fastkeys"
# shellcheck source=tests/tui/tmux_lib.sh
. "$REPO/tests/tui/tmux_lib.sh"
PYTHON="$(dirname "$SFT_TUI")/python"
show() { echo "--- $1"; screen; }
WORK="${1:-$(mktemp -d)}"
mkdir -p "$WORK"

# A config-only model folder (the embedded model without its weights) and alpaca rows of the user's own.
mkdir -p "$WORK/tiny-config"
cp "$REPO"/recipes/embedded/model/*.json "$REPO"/recipes/embedded/model/*.jinja "$WORK/tiny-config/"
"$PYTHON" - "$WORK/names.jsonl" <<'EOF'
import json, sys
with open(sys.argv[1], "w", encoding="utf-8") as f:
    for i in range(60):
        f.write(json.dumps({"instruction": f"Who is Klämbt? ({i})", "input": "",
                            "output": f"Klämbt ({i}) is a name: façade, naïve."}, ensure_ascii=False) + "\n")
EOF

echo "\$ tests/tui/fast_keys_walk.sh   # sft-tui --set train.max_steps=$MAX_STEPS in a ${COLS}x${ROWS} tmux pane"
tmux_ new-session -d -s "$SESSION" -x "$COLS" -y "$ROWS" -c "$WORK" \
    "TERM=xterm-256color '$SFT_TUI' --set train.max_steps=$MAX_STEPS; echo EXITED \$?; sleep 30"
tmux_ set-option -g escape-time 0
wait_for 'sft-tui — new run' 30 "the wizard"
wait_for '^ model.id \(default' 30 "the focus on model.id"
# Model: Tab to the local path and the folder typed over it (a field selects its text when Tab reaches it), sent at
# once. (Not C-e C-u: the app applies those keys as bindings, after the letters typed behind them.)
key Tab
key -l "$WORK/tiny-config"
wait_for 'init weights +random' 60 "random init proposed for the folder without weights"
show "model: a config-only folder, random init proposed"
# ^n, Tab and the data's path, sent at once: they land in the Dataset step's local path.
key C-n Tab
key -l "$WORK/names.jsonl"
wait_for 'local path +.*names\.jsonl' 20 "the data's path in the Dataset step's local path"
wait_for 'first conversation' 90 "the data's preview"
show "dataset: the path typed right after ^n"
# ^n twice and Tab to the method, sent at once; then pick lora (the list: full, lora).
key C-n C-n Tab
wait_for '^ method.kind \(default' 20 "the focus on method.kind"
pick_lora() {  # keys sent while the list opens can be lost
    key Enter
    wait_for 'Dismiss menu' 10 "the method list" || return 1
    key Down Enter
    for _ in $(seq 25); do screen | grep -Eq 'method +lora' && return 0; sleep 0.2; done
    screen | grep -q 'Dismiss menu' && key Escape
    return 1
}
pick_lora 2>/dev/null || pick_lora 2>/dev/null || pick_lora
wait_for 'LoRA r' 10 "the LoRA fields"
show "method: lora"
key C-n C-n
wait_for '▕ Launch' 20 "the Launch step"
wait_for 'ready: 2 rank\(s\) on cpu' 120 "the Launch step's checks (plan and preflight)"
show "launch"
key C-l
wait_for 'step [1-9][0-9]*/'"$MAX_STEPS" 180 "the dashboard's first steps"
show "dashboard"
wait_for 'SUCCEEDED' "$TIMEOUT_S" "the summary"
show "summary"
key C-q
wait_for 'EXITED 0' 20 "sft-tui to exit"
# The one record of this walk (a long run id is cut on the summary's title at 80 columns).
record_path="$(ls "$WORK"/records/*.json)"
test -f "$record_path" || { echo "no single record under $WORK/records" >&2; exit 1; }
echo "record: $record_path"
