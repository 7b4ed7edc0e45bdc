# Shared by the tmux drivers (sourced, after they set REPO and SESSION_NAME): the sft-tui binary and the pane's
# size from the environment, a private tmux server, and waiting for the screen to show something.
SFT_TUI="${SFT_TUI:-$REPO/.venv/bin/sft-tui}"
MAX_STEPS="${MAX_STEPS:-6}"
TIMEOUT_S="${TIMEOUT_S:-150}"
COLS="${COLS:-80}"
ROWS="${ROWS:-24}"
SOCKET="sft-tui-$SESSION_NAME-$$"  # a private tmux server: nothing else's sessions are touched
SESSION="$SESSION_NAME"

tmux_() { tmux -L "$SOCKET" "$@"; }
cleanup() { tmux_ kill-server 2>/dev/null || true; }
trap cleanup EXIT

screen() { tmux_ capture-pane -p -t "$SESSION"; }
key() { tmux_ send-keys -t "$SESSION" "$@"; }

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
