#!/usr/bin/env bash
# Run an MPI job whose ranks live on two simulated nodes.
#
#   bash jobs/tests/mpi/netns.sh <np> <program> [args...]
#
# The two "nodes" are Linux network namespaces joined by a veth pair on a
# private /24, so the ranks of one node reach the ranks of the other only
# over TCP on that link (OpenMPI's tcp BTL), never through shared memory
# or the host's interfaces. ceil(np/2) ranks run on node A (ranks 0..),
# the rest on node B (or as NETNS_SLOTS says: see the hostfile below).
#
# How the launch works: mpirun itself runs inside namespace A, with a
# hostfile naming the two veth addresses. For the address that is not its
# own it starts a daemon (orted) through its "rsh" launcher, whose agent
# (normally ssh) is a small generated script that runs the command inside
# the namespace owning that address. Both namespaces share the host's
# filesystem, working directory and environment, so relative paths and
# environment variables mean the same on both nodes. Each node also gets its
# own hostname (a UTS namespace, named like its network namespace): with
# one shared hostname OpenMPI takes ranks of both nodes for neighbours, and
# MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) disagrees between the nodes.
#
# The program's stdout and stderr pass through; the exit status is
# mpirun's (the program's, or non-zero if a rank failed). Namespaces,
# veth pair, leftover processes and temporary files are removed on every
# exit, including failures and signals (SIGINT/SIGTERM/SIGHUP: the job is
# stopped first, then the script exits with 128 + the signal number).
#
# NETNS_B_BIND="SRC:DST" gives node B a filesystem of its own at one path:
# its commands run in a mount namespace where the file SRC is bind-mounted
# over DST (a stale copy of an input on one node, say).
#
# Exit 77 (with one line on stderr) means skipped: not root, no `ip netns`,
# namespaces cannot be created, or no mpirun/orted.
# Exit 2 is a usage error.

set -u

me=netns.sh

skip() {
    echo "$me: skipped: $*" >&2
    exit 77
}

usage() {
    echo "usage: $me <np> <program> [args...]" >&2
    exit 2
}

# --- arguments and prerequisites -------------------------------------------

[[ $# -ge 2 ]] || usage
np=$1
shift
[[ $np =~ ^[1-9][0-9]*$ ]] || usage

[[ $(id -u) -eq 0 ]] || skip "needs root (network namespaces)"
if ! command -v ip >/dev/null 2>&1 || ! ip netns list >/dev/null 2>&1; then
    skip "\`ip netns\` is unavailable"
fi
command -v mpirun >/dev/null 2>&1 || skip "mpirun not found"
# Absolute path of the daemon, so that node B finds it whatever its PATH.
orted=$(command -v orted) || skip "orted not found"

# --- names -----------------------------------------------------------------

# Unique per run ($$), short (interface names are limited to 15 bytes; the
# veth ends live inside the namespaces, so their names cannot clash).
ns_a="ocmpi$$a"
ns_b="ocmpi$$b"
if_a=veth0
if_b=veth1
# A private /24. Each run's subnet is isolated in its own namespaces, so a
# coincidence with a concurrent run would be harmless anyway.
net="10.213.$(($$ % 250))"
addr_a="$net.1"
addr_b="$net.2"
subnet="$net.0/24"

# --- cleanup ---------------------------------------------------------------

created_a=0
created_b=0
tmp=""
job=""

# Ends every process still inside namespace $1 (mpirun, orted, ranks: all
# started by this script), politely first. This is the safety net when
# mpirun did not end its job (killed, or a signal came before $job was set).
kill_in_ns() {
    local ns=$1 pids
    pids=$(ip netns pids "$ns" 2>/dev/null) || return 0
    [[ -n $pids ]] || return 0
    # shellcheck disable=SC2086 # word splitting of the pid list is wanted
    kill -TERM $pids 2>/dev/null
    for _ in $(seq 50); do
        pids=$(ip netns pids "$ns" 2>/dev/null)
        [[ -n $pids ]] || return 0
        sleep 0.1
    done
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null
    sleep 0.2
}

cleanup() {
    local rc=$?
    trap - EXIT INT TERM HUP
    # Stop the job if it is still running (signal, or the script failed):
    # SIGTERM makes mpirun end every rank on both nodes; SIGKILL after 10 s.
    if [[ -n $job ]] && kill -0 "$job" 2>/dev/null; then
        kill -TERM "$job" 2>/dev/null
        for _ in $(seq 100); do
            kill -0 "$job" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$job" 2>/dev/null
        wait "$job" 2>/dev/null
    fi
    if [[ $created_a == 1 ]]; then
        kill_in_ns "$ns_a"
        # Deleting one veth end deletes both.
        ip -n "$ns_a" link del "$if_a" 2>/dev/null
        ip netns del "$ns_a" 2>/dev/null
    fi
    if [[ $created_b == 1 ]]; then
        kill_in_ns "$ns_b"
        ip netns del "$ns_b" 2>/dev/null
    fi
    [[ -n $tmp ]] && rm -rf "$tmp"
    exit "$rc"
}

# A signal stops the job (cleanup does it) and exits with 128 + signal.
on_signal() {
    trap - INT TERM HUP
    exit $((128 + $1))
}

trap cleanup EXIT
trap 'on_signal 1' HUP
trap 'on_signal 2' INT
trap 'on_signal 15' TERM

# --- the two nodes ---------------------------------------------------------

# Each flag is set just before its `ip netns add`: a signal during the add
# runs the trap only once the add is done, and cleanup then removes it.
created_a=1
ip netns add "$ns_a" 2>/dev/null || {
    created_a=0
    skip "cannot create network namespaces"
}
created_b=1
ip netns add "$ns_b" 2>/dev/null || {
    created_b=0
    skip "cannot create network namespaces"
}

# The veth pair is created directly inside the namespaces: nothing appears
# in the host's namespace, even for a moment.
ip -n "$ns_a" link add "$if_a" type veth peer name "$if_b" netns "$ns_b" \
    2>/dev/null || skip "cannot create a veth pair"
set -e
ip -n "$ns_a" addr add "$addr_a/24" dev "$if_a"
ip -n "$ns_b" addr add "$addr_b/24" dev "$if_b"
for ns in "$ns_a" "$ns_b"; do
    # IPv4 only on the link (no IPv6 link-local addresses for OpenMPI to
    # consider); best effort.
    ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 \
        net.ipv6.conf.default.disable_ipv6=1 >/dev/null 2>&1 || true
    ip -n "$ns" link set lo up
done
ip -n "$ns_a" link set "$if_a" up
ip -n "$ns_b" link set "$if_b" up
# Wait (up to 5 s) until the kernel reports both ends up.
for _ in $(seq 50); do
    if [[ $(ip netns exec "$ns_a" cat "/sys/class/net/$if_a/operstate") == up &&
        $(ip netns exec "$ns_b" cat "/sys/class/net/$if_b/operstate") == up ]]; then
        break
    fi
    sleep 0.1
done

# Temporary files (hostfile, agent, OpenMPI's session directories). In /tmp,
# not $TMPDIR: OpenMPI splits the agent's path at spaces. The program's own
# TMPDIR is left as it is.
tmp=$(mktemp -d /tmp/ocmpi.XXXXXX)

# Hostfile: ceil(np/2) slots on node A (which gets ranks 0..), the rest on B.
# NETNS_SLOTS="A B" gives the nodes A and B slots of their own instead
# (more than np: free slots for MPI_Comm_spawn to start ranks in).
n_a=$(((np + 1) / 2))
n_b=$((np - n_a))
if [[ -n ${NETNS_SLOTS:-} ]]; then
    read -r n_a n_b <<<"$NETNS_SLOTS"
fi
hostfile="$tmp/hostfile"
{
    echo "$addr_a slots=$n_a"
    if ((n_b > 0)); then echo "$addr_b slots=$n_b"; fi
} >"$hostfile"

# The launch agent, called by mpirun the way it would call ssh:
#   agent [ssh options] <host> <command words...>
# It runs the command (joined into one shell command line, as ssh does) in
# the network namespace that owns <host>, in a new UTS namespace with that
# node's hostname.
# Node B's extra setup (NETNS_B_BIND), run before its command.
b_unshare="--uts"
b_setup=":"
if [[ -n ${NETNS_B_BIND:-} ]]; then
    b_unshare="--uts --mount --propagation private"
    b_setup="mount --bind '${NETNS_B_BIND%%:*}' '${NETNS_B_BIND#*:}' || exit 255"
fi
agent="$tmp/agent"
cat >"$agent" <<EOF
#!/bin/sh
# Generated by $me: ssh stand-in running commands in a network namespace.
while [ \$# -gt 0 ]; do
    case \$1 in
        --) shift; break ;;
        # ssh options taking a value as the next word
        -[BbcDEeFIiJLlmOoPpQRSWw])
            [ \$# -ge 2 ] || break
            shift 2 ;;
        -?*) shift ;;
        *) break ;;
    esac
done
if [ \$# -lt 2 ]; then
    echo "$me agent: usage: agent [options] <host> <command...>" >&2
    exit 255
fi
host=\$1
shift
case \$host in
    $addr_a|$ns_a) ns=$ns_a; opts="--uts"; setup=":" ;;
    $addr_b|$ns_b) ns=$ns_b; opts="$b_unshare"; setup="$b_setup" ;;
    *) echo "$me agent: unknown host: \$host" >&2; exit 255 ;;
esac
exec ip netns exec "\$ns" unshare \$opts sh -c \
    "echo \$ns >/proc/sys/kernel/hostname || exit 255; \$setup; \$*"
EOF
chmod 700 "$agent"
set +e

# --- the job ---------------------------------------------------------------

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# Node B's daemon inherits this environment through the agent, so its ranks
# see it too; the project's own variables are also forwarded explicitly.
forward=()
while read -r name; do
    forward+=(-x "$name")
done < <(compgen -e | grep -E '^(OUTCORE_|RUST_)' || true)

# mpirun runs in namespace A, whose only interfaces are lo and the veth end.
# - plm rsh with our agent; the daemon by absolute path. (mpirun itself is
#   called by name: called by absolute path, it would act as with --prefix
#   and prepend /usr/bin and /usr/lib to PATH and LD_LIBRARY_PATH on B.)
# - pml ob1 + btl tcp,self: every message between ranks, on the same node
#   or not, goes over TCP (no shared memory, no UCX); TCP and the
#   out-of-band channel only on the veth subnet.
# - no binding: the two "nodes" share the machine's cores.
# - OpenMPI's session directory inside our temporary directory, so that a
#   hard kill leaves nothing behind in /tmp either.
# - the working directory is the caller's on both nodes.
# - its own hostname, as on node B (see the agent).
# It runs in the background so that a signal to this script is handled at
# once (trap above); stdin is passed on explicitly (a background command
# would otherwise read /dev/null).
# shellcheck disable=SC2016 # $1 and $@ are the inner shell's
ip netns exec "$ns_a" unshare --uts sh -c \
    'echo "$1" >/proc/sys/kernel/hostname && shift && exec "$@"' sh "$ns_a" \
    mpirun \
    -np "$np" \
    --hostfile "$hostfile" \
    --map-by slot \
    --oversubscribe \
    --bind-to none \
    --wdir "$PWD" \
    --mca plm rsh \
    --mca plm_rsh_agent "$agent" \
    --mca orte_launch_agent "$orted" \
    --mca pml ob1 \
    --mca btl tcp,self \
    --mca btl_tcp_if_include "$subnet" \
    --mca oob_tcp_if_include "$subnet" \
    --mca orte_tmpdir_base "$tmp" \
    "${forward[@]}" \
    "$@" <&0 &
job=$!

wait "$job" 2>/dev/null # (no "Killed" notice from bash on stderr)
rc=$?
job=""
exit "$rc"
