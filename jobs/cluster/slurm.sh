#!/usr/bin/env bash
# A private Slurm on this machine, for CI and for trying the jobs/ scripts: one node, or two
# simulated nodes in network namespaces. Needs root and the Debian packages
# slurmctld slurmd slurm-client munge (plus iproute2 for two nodes); installs nothing.
#
#   jobs/cluster/slurm.sh up [--nodes 1|2] [--dir DIR] [--cpus N] [--port P] [--name NAME]
#   jobs/cluster/slurm.sh exec [--dir DIR] -- sbatch --wait jobs/demo.sbatch
#   jobs/cluster/slurm.sh status [--dir DIR]
#   jobs/cluster/slurm.sh down [--dir DIR]
#
# Why it looks like this: a CI machine has no systemd and may have a Slurm or munge of its own,
# so everything lives in one state directory (DIR, default $TMPDIR/mpicomm-slurm): a munge key
# and munged on a socket of its own, a generated slurm.conf (SLURM_CONF points the client
# commands at it), the daemons' state, spool, logs and PID files. The daemons are started by
# hand, as root; "down" cancels the cluster's jobs, stops exactly the daemons whose PID files
# are in DIR (after checking each PID still runs that daemon with DIR's configuration), removes
# the namespaces "up" made, and deletes DIR.
#
# One node (default): slurmctld and one slurmd named after this host on 127.0.0.1, ports P and
# P+1 (default 6917, 6918: not the standard ones, so a site Slurm is not disturbed).
#
# Two nodes (--nodes 2): three network namespaces NAME-hub, NAME-nodeA, NAME-nodeB (NAME default
# mpicomm). The hub holds a bridge and the controller; each node namespace is joined to it by a
# veth pair and runs its own slurmd under its own host name (UTS namespace) with a hosts file
# naming ctl, nodeA and nodeB (mount namespace). The private addresses (10.199.7.0/24) exist only
# inside these namespaces: nothing is added to this machine's own network. Client commands
# must run in the hub, which "exec" does (nsenter); "sbatch -N 2 --ntasks-per-node=2" then puts
# ranks on nodeA and nodeB. One two-node cluster per NAME at a time.
set -euo pipefail
PATH=$PATH:/usr/sbin:/sbin  # where Debian puts the daemons, munged and ip

usage() { sed -n '2,9s/^# \{0,1\}//p' "$0"; }

die() { echo "slurm.sh: $*" >&2; exit 1; }

action=${1:-}
[[ -n "$action" ]] || { usage; exit 2; }
shift
dir=${MPICOMM_SLURM_DIR:-${TMPDIR:-/tmp}/mpicomm-slurm}
nodes=1 cpus=16 port=6917 name=mpicomm
while [[ $# -gt 0 ]]; do
    case $1 in
        --nodes) nodes=${2:?--nodes needs 1 or 2}; shift 2 ;;
        --dir) dir=${2:?--dir needs a directory}; shift 2 ;;
        --cpus) cpus=${2:?--cpus needs a count}; shift 2 ;;
        --port) port=${2:?--port needs a port number}; shift 2 ;;
        --name) name=${2:?--name needs a name}; shift 2 ;;
        --) shift; break ;;
        -h|--help) usage; exit 0 ;;
        *) [[ $action == exec ]] && break
           die "unknown option '$1'; see: $0 --help" ;;
    esac
done
[[ $nodes == 1 || $nodes == 2 ]] || die "--nodes $nodes: must be 1 or 2"
[[ $cpus =~ ^[1-9][0-9]*$ ]] || die "--cpus $cpus: must be a positive whole number"
[[ $port =~ ^[1-9][0-9]*$ && $port -lt 65535 ]] || die "--port $port: must be a port number below 65535"
[[ $name =~ ^[A-Za-z][A-Za-z0-9-]{0,20}$ ]] || die "--name $name: letters, digits and '-', at most 21 characters"
[[ $dir == /* ]] || dir=$PWD/$dir
[[ $dir =~ ^[A-Za-z0-9/._+-]+$ ]] || die "--dir $dir: use a path of letters, digits and /._+- only (slurm.conf has no quoting)"
dir=${dir%/}
conf=$dir/slurm.conf
subnet=10.199.7            # .1 the hub (controller), .2 nodeA, .3 nodeB: only inside the namespaces

# ---------------------------------------------------------------- functions

# The value of KEY in DIR's cluster.env (written by "up"), or empty.
state() { [[ -f $dir/cluster.env ]] && sed -n "s/^$1=//p" "$dir/cluster.env" || true; }

# True if PID is a live process (not a zombie) whose command line contains TEXT.
runs() {
    local pid=$1 text=$2
    [[ $pid =~ ^[0-9]+$ && -r /proc/$pid/cmdline ]] || return 1
    [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) != Z ]] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$text"
}

# The PID files of the daemons "up" starts, each with the text its command line must contain.
pidfiles() {
    local f
    for f in "$dir"/slurmd-*.pid; do [[ -e $f ]] && echo "$f $conf"; done
    echo "$dir/slurmctld.pid $conf"
    echo "$dir/munge/munged.pid $dir/munge/munge.socket"
}

# Stop the daemon in PID file $1 if it is ours (command line contains $2): TERM, then KILL.
stop() {
    local file=$1 text=$2 pid
    [[ -f $file ]] || return 0
    pid=$(cat "$file")
    runs "$pid" "$text" || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do runs "$pid" "$text" || return 0; sleep 0.1; done
    echo "slurm.sh: $file: PID $pid did not stop on TERM; sending KILL" >&2
    kill -KILL "$pid" 2>/dev/null || true
}

# Run "$@" as a client of this cluster (in the hub namespace for two nodes).
client() {
    local hub
    hub=$(state HUB)
    if [[ -n $hub ]]; then
        SLURM_CONF=$conf nsenter --net="/run/netns/$hub" "$@"
    else
        SLURM_CONF=$conf "$@"
    fi
}

up_already() {
    local pidfile text
    [[ -f $conf && -f $dir/cluster.env ]] || return 1
    while read -r pidfile text; do
        runs "$(cat "$pidfile" 2>/dev/null || true)" "$text" || return 1
    done < <(pidfiles)
}

network_down() {
    local ns
    for ns in "$@"; do
        [[ -e /run/netns/$ns ]] || continue
        # Anything still inside was started by this cluster (a job's step): end it by PID.
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
        # Deleting the links first lets the namespace go even if something still holds it.
        for link in $(ip -n "$ns" -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
            [[ $link == lo ]] || ip -n "$ns" link del "$link" 2>/dev/null || true
        done
        ip netns del "$ns" 2>/dev/null || true
    done
}

network_up() {
    local hub=$name-hub node k=1
    network_down "$hub" "$name-nodeA" "$name-nodeB"
    ip netns add "$hub"
    ip -n "$hub" link set lo up
    ip -n "$hub" link add br0 type bridge
    ip -n "$hub" addr add "$subnet.1/24" dev br0
    ip -n "$hub" link set br0 up
    for node in nodeA nodeB; do
        k=$((k + 1))
        ip netns add "$name-$node"
        ip -n "$name-$node" link set lo up
        # Both ends are created inside namespaces: this machine's own network never sees them.
        ip -n "$hub" link add "v$node" type veth peer name eth0 netns "$name-$node"
        ip -n "$hub" link set "v$node" master br0 up
        ip -n "$name-$node" addr add "$subnet.$k/24" dev eth0
        ip -n "$name-$node" link set eth0 up
    done
}

write_conf() {
    local ctl_name ctl_addr
    if [[ $nodes == 2 ]]; then
        ctl_name=ctl ctl_addr=$subnet.1
    else
        ctl_name=$(hostname -s) ctl_addr=127.0.0.1
    fi
    cat >"$conf" <<EOF
# Generated by jobs/cluster/slurm.sh up --nodes $nodes (a private test cluster; see that script).
ClusterName=$name
SlurmctldHost=$ctl_name($ctl_addr)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
# Our own munged; cred_expire also sets how long a requeued job waits before it may start again
# (default 120 s; with 5 and scheduling every 1-2 s a requeued job starts again within about 6 s).
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket,cred_expire=5
SchedulerParameters=bf_interval=1,sched_interval=2
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
TmpFS=$dir/tmp/%n
# No cgroups, no systemd: track processes by parentage, bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# What the PyPI MPICH speaks to srun.
MpiDefault=pmi2
# Declared CPUs win over the machine's count (else the node drains as "Low CPUs").
SlurmdParameters=config_overrides
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# Finished jobs are kept 3 s at least: "sbatch --wait" polls every 2 s as long as MinJobAge/2 < 2
# (else it backs off to 8 and 32 s), and still sees every array task's exit code before it goes.
MinJobAge=3
KillWait=5
MailProg=/bin/true
# Job ids start at a random point: MPICH names its shared-memory segments after the PMI job
# (Slurm's job id), and a segment left in /dev/shm by a killed job of an earlier cluster on
# this machine would otherwise collide with a new job of the same id and fail MPI_Init.
FirstJobId=$(( (RANDOM * 32768 + RANDOM) % 60000000 + 1000 ))
EOF
    if [[ $nodes == 2 ]]; then
        echo "NodeName=nodeA NodeAddr=$subnet.2 CPUs=$cpus State=UNKNOWN" >>"$conf"
        echo "NodeName=nodeB NodeAddr=$subnet.3 CPUs=$cpus State=UNKNOWN" >>"$conf"
    else
        echo "NodeName=$ctl_name NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN" >>"$conf"
    fi
    echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES" >>"$conf"
    printf '127.0.0.1 localhost\n%s.1 ctl\n%s.2 nodeA\n%s.3 nodeB\n' "$subnet" "$subnet" "$subnet" >"$dir/hosts"
}

logs_tail() {
    local f
    for f in "$dir"/log/*.log "$dir"/munge/private/munged.log; do
        [[ -f $f ]] || continue
        echo "---- $f (last 15 lines)" >&2
        tail -n 15 "$f" >&2
    done
}

# ---------------------------------------------------------------- actions

do_down() {
    local pidfile text hub jobs
    hub=$(state HUB)
    if up_already; then
        jobs=$(client squeue -h -o %A 2>/dev/null | sort -u | tr '\n' ' ' || true)
        # shellcheck disable=SC2086 # one word per job id
        [[ -n ${jobs// /} ]] && client scancel --quiet $jobs 2>/dev/null || true
        for _ in $(seq 50); do
            [[ -z $(client squeue -h -o %i 2>/dev/null) ]] && break
            sleep 0.2
        done
    fi
    while read -r pidfile text; do stop "$pidfile" "$text"; done < <(pidfiles)
    if [[ -n $hub ]]; then
        network_down "$hub" "$(state NODE_NAMESPACES | cut -d' ' -f1)" "$(state NODE_NAMESPACES | cut -d' ' -f2)"
    fi
    # Only a directory this script made (it has our marker) is removed.
    if [[ -f $dir/.mpicomm-slurm ]]; then
        rm -rf "$dir"
    fi
}

do_up() {
    local missing=() cmd d perm
    [[ $(id -u) == 0 ]] || die "needs root: it starts munged, slurmctld and slurmd as root (and, for two nodes, makes network namespaces)"
    for cmd in munged mungekey munge slurmctld slurmd sinfo srun sbatch squeue scontrol scancel; do
        command -v "$cmd" >/dev/null || missing+=("$cmd")
    done
    if [[ $nodes == 2 ]]; then
        for cmd in ip nsenter unshare; do command -v "$cmd" >/dev/null || missing+=("$cmd"); done
    fi
    if [[ ${#missing[@]} -gt 0 ]]; then
        die "missing ${missing[*]}; install: apt-get install slurmctld slurmd slurm-client munge iproute2"
    fi
    if up_already; then
        if [[ $(state NODES) != "$nodes" ]]; then
            die "a $(state NODES)-node cluster is already up in $dir; run: $0 down --dir $dir"
        fi
        echo "slurm.sh: already up in $dir"
        do_usage
        return 0
    fi
    if [[ -d $dir && ! -f $dir/.mpicomm-slurm && -n $(ls -A "$dir") ]]; then
        die "--dir $dir exists, is not empty and was not made by this script; pick another directory"
    fi
    do_down  # what a crashed earlier run left
    # munged refuses a socket that not every user can reach: every directory above it must be searchable.
    d=$(dirname "$dir")
    while [[ $d != / ]]; do
        if [[ -d $d ]]; then
            perm=$(stat -c %a "$d")
            (( ${perm: -1} & 1 )) || die "--dir $dir: $d is not searchable by all users (mode $perm), which munged requires; pick a directory under /tmp"
        fi
        d=$(dirname "$d")
    done
    mkdir -p "$dir"
    chmod 755 "$dir"
    touch "$dir/.mpicomm-slurm"
    mkdir -p "$dir/ctld" "$dir/log" "$dir/spool" "$dir/tmp/nodeA" "$dir/tmp/nodeB" "$dir/tmp/$(hostname -s)"
    mkdir -m 755 "$dir/munge"
    mkdir -m 700 "$dir/munge/private"
    mungekey --create --keyfile="$dir/munge/private/munge.key" --bits=1024
    munged --socket="$dir/munge/munge.socket" --key-file="$dir/munge/private/munge.key" \
        --pid-file="$dir/munge/munged.pid" --seed-file="$dir/munge/private/munged.seed" \
        --log-file="$dir/munge/private/munged.log" || { logs_tail; do_down; die "munged did not start"; }
    write_conf
    local hub=""
    if [[ $nodes == 2 ]]; then
        hub=$name-hub
        network_up
        # The controller in the hub, under the name slurm.conf gives it.
        nsenter --net="/run/netns/$hub" unshare --uts --mount sh -c \
            "mount --bind '$dir/hosts' /etc/hosts && hostname ctl && exec slurmctld -f '$conf'" \
            || { logs_tail; do_down; die "slurmctld did not start"; }
        for node in nodeA nodeB; do
            # nsenter, not "ip netns exec": that remounts /sys and slurmd then fails to start.
            nsenter --net="/run/netns/$name-$node" unshare --uts --mount sh -c \
                "mount --bind '$dir/hosts' /etc/hosts && hostname $node && exec slurmd -f '$conf' -N $node" \
                || { logs_tail; do_down; die "slurmd for $node did not start"; }
        done
    else
        slurmctld -f "$conf" || { logs_tail; do_down; die "slurmctld did not start"; }
        slurmd -f "$conf" -N "$(hostname -s)" || { logs_tail; do_down; die "slurmd did not start"; }
    fi
    cat >"$dir/cluster.env" <<EOF
NODES=$nodes
SLURM_CONF=$conf
HUB=$hub
NODE_NAMESPACES=$([[ $nodes == 2 ]] && echo "$name-nodeA $name-nodeB")
EOF
    local states=""
    for _ in $(seq 150); do
        states=$(client sinfo -h -N -o %T 2>/dev/null | sort -u | tr '\n' ' ' || true)
        if [[ $states == "idle " && $(client sinfo -h -N -o %N 2>/dev/null | sort -u | wc -l) == "$nodes" ]]; then
            break
        fi
        sleep 0.2
    done
    if [[ $states != "idle " ]]; then
        logs_tail
        do_down
        die "the node(s) did not become idle within 30 s (state: ${states:-no answer}); logs above"
    fi
    echo "slurm.sh: up: $nodes node(s), $cpus CPUs each, in $dir"
    do_usage
}

do_usage() {
    if [[ -n $(state HUB) ]]; then
        cat <<EOF
Run client commands in the hub namespace (SLURM_CONF set), for example:
  $0 exec --dir $dir -- sbatch --wait -N 2 --ntasks-per-node=2 jobs/bench.sbatch
  (the same as: SLURM_CONF=$conf nsenter --net=/run/netns/$(state HUB) sbatch ...)
The two nodes share one kernel: with the PyPI MPICH, export MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp
first, so MPICH sends between them over the network instead of trying shared memory across them.
Stop it: $0 down --dir $dir
EOF
    else
        cat <<EOF
Use it:  export SLURM_CONF=$conf
         sbatch --wait jobs/demo.sbatch; sinfo; squeue
Stop it: $0 down --dir $dir
EOF
    fi
}

case $action in
    up) do_up ;;
    down) do_down; echo "slurm.sh: down ($dir)" ;;
    status)
        up_already || { echo "slurm.sh: not up ($dir)"; exit 1; }
        client sinfo
        client squeue ;;
    exec)
        up_already || die "not up in $dir; start it: $0 up --dir $dir"
        [[ $# -gt 0 ]] || die "exec needs a command, e.g.: $0 exec -- sinfo"
        client "$@" ;;
    -h|--help|help) usage ;;
    *) die "unknown action '$action': use up, down, status or exec" ;;
esac
