#!/usr/bin/env bash
# Run a campaign on this machine reached over SSH on loopback, as on a board: in a private network namespace
# (only lo, so nothing outside can reach it), Debian's sshd on 127.0.0.1:8022 with keys made here (key auth
# only), then `bmoe-bench deploy CAMPAIGN` and `bmoe-bench run CAMPAIGN ARGS...`. Needs root (unshare, sshd).
#
#   scripts/ssh-loopback.sh [CAMPAIGN [bmoe-bench run ARGS...]]     (default campaigns/ssh-loopback.yaml)
#
# DEPLOY_FROM=target: deploy builds llama-cpp-python on the target from its package index (deploy --from target),
# as on a board whose binaries differ from the harness's; the namespace then keeps this machine's network (sshd
# still listens on 127.0.0.1 only), since the index is not on loopback; the venv goes to a folder of its own
# ($BMOE_SSH_LOOPBACK/target-built, the run told so with --set target.dir=...). Default: --from auto.
# Keys, sshd's files and the target folder live in $BMOE_SSH_LOOPBACK (default ~/.cache/bmoe/ssh-loopback), the
# paths campaigns/ssh-loopback.yaml names. PYTHON: the harness's python (default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" != --inside ]; then
    [ "$(id -u)" -eq 0 ] || { echo "ssh-loopback: needs root (unshare --net, sshd)" >&2; exit 1; }
    [ -x /usr/sbin/sshd ] || { echo "ssh-loopback: needs Debian's openssh-server (.ci/run installs it)" >&2; exit 1; }
    net=--net; [ "${DEPLOY_FROM:-auto}" = target ] && net=
    # shellcheck disable=SC2086  # $net: one flag or none
    exec unshare $net --mount --propagation private -- "$0" --inside "$@"
fi
shift
campaign="${1:-campaigns/ssh-loopback.yaml}"
[ "$#" -gt 0 ] && shift
py="${PYTHON:-.venv/bin/python}"
dir="${BMOE_SSH_LOOPBACK:-$HOME/.cache/bmoe/ssh-loopback}"
mkdir -p "$dir" /run/sshd
ip link set lo up
for k in host_key client_key; do [ -f "$dir/$k" ] || ssh-keygen -q -t ed25519 -N "" -C bmoe-loopback -f "$dir/$k"; done
cp "$dir/client_key.pub" "$dir/authorized_keys"
cat > "$dir/sshd_config" <<CONF
ListenAddress 127.0.0.1:8022
HostKey $dir/host_key
PidFile $dir/sshd.pid
AuthorizedKeysFile $dir/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
MaxSessions 64
CONF
/usr/sbin/sshd -D -e -f "$dir/sshd_config" 2>>"$dir/sshd.log" &
sshd_pid=$!
trap 'kill "$sshd_pid" 2>/dev/null || true' EXIT
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/8022) 2>/dev/null && break; sleep 0.1; done
base="$("$py" -c 'import sys; print(sys.base_prefix)')/bin/python3"  # this machine's own Python for the venv
if [ "${DEPLOY_FROM:-auto}" = target ]; then
    "$py" -m harness.bench_cli deploy "$campaign" --python "$base" --from target --dir "$dir/target-built"
    "$py" -m harness.bench_cli run "$campaign" --set "target.dir=$dir/target-built" "$@"
else
    "$py" -m harness.bench_cli deploy "$campaign" --python "$base" --from "${DEPLOY_FROM:-auto}"
    "$py" -m harness.bench_cli run "$campaign" "$@"
fi
