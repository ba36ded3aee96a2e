#!/bin/bash
# How much of an order the kernel's CPU controller delivers to real Keras jobs (issue 12).
#
# Four real training processes (eval/realjobs/train_keras.py) in four cgroups of the host's
# cgroup v1 cpu controller, two "served first" and two "held back", for each way of holding
# back: weights alone (cpu.shares 2334/1567 against 102, what the shortest-left policy writes for
# a plan of ~1 core each against a floor), SCHED_IDLE groups (cpu.idle = 1) for the held-back
# pair, and hard caps (cfs quota 5% of a core) on them. Prints each group's cores over 15 s
# after a 12 s warm-up. Needs root, the host's v1 cpu controller at /sys/fs/cgroup/cpu, and
# the benchmark's environment (`cargo xtask bench-real` creates target/bench/venv). The way
# `spin` holds back with weights too but runs busy loops instead of Keras: the control.
#
#   sudo eval/realjobs/enforcement.sh            # all four ways, ~2 min
#   sudo WAYS="weights cap" eval/realjobs/enforcement.sh
#
# It creates /sys/fs/cgroup/cpu/govexp and removes it on exit; nothing else is touched.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-$ROOT/target/bench/venv/bin/python}
SCRIPT=$ROOT/eval/realjobs/train_keras.py
BASE=/sys/fs/cgroup/cpu/govexp
GROUPS_=(first second back1 back2)
TASKS=(digits teacher teacher digits)
[ -d /sys/fs/cgroup/cpu ] || { echo "no cgroup v1 cpu controller at /sys/fs/cgroup/cpu" >&2; exit 1; }
[ -x "$PY" ] || { echo "no $PY: run cargo xtask bench-real once" >&2; exit 1; }

cleanup() {
    for g in "${GROUPS_[@]}"; do
        for p in $(cat "$BASE/$g/cgroup.procs" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
    done
    sleep 1
    for g in "${GROUPS_[@]}"; do rmdir "$BASE/$g" 2>/dev/null; done
    rmdir "$BASE" 2>/dev/null
}
trap cleanup EXIT

# CPU ticks (utime + stime) of every process in a group.
ticks() {
    local t=0 p
    for p in $(cat "$BASE/$1/cgroup.procs"); do
        t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0)))
    done
    echo "$t"
}

run() {
    local way=$1 i
    mkdir -p "$BASE"
    for g in "${GROUPS_[@]}"; do mkdir -p "$BASE/$g"; done
    echo 2334 > "$BASE/first/cpu.shares"
    echo 1567 > "$BASE/second/cpu.shares"
    if [ "$way" = fair ]; then
        # The control for throughput: every group at the same weight.
        for g in "${GROUPS_[@]}"; do echo 1024 > "$BASE/$g/cpu.shares"; done
    fi
    for g in back1 back2; do
        [ "$way" = fair ] || echo 102 > "$BASE/$g/cpu.shares"
        case $way in
            idle) echo 1 > "$BASE/$g/cpu.idle" ;;
            cap) echo 5000 > "$BASE/$g/cpu.cfs_quota_us" ;;
        esac
    done
    for i in 0 1 2 3; do
        if [ "$way" = spin ]; then
            job="exec python3 -c 'while True: pass'"
        else
            job="exec $PY $SCRIPT --task ${TASKS[$i]} --lr 1e-3 --epochs 500 --log /tmp/govexp-${GROUPS_[$i]}.log"
        fi
        sh -c "echo \$\$ > $BASE/${GROUPS_[$i]}/cgroup.procs; $job >/dev/null 2>&1" &
        disown
    done
    sleep 12
    declare -A before
    declare -A lines
    for g in "${GROUPS_[@]}"; do
        before[$g]=$(ticks "$g")
        lines[$g]=$(cat "/tmp/govexp-$g.log" 2>/dev/null | wc -l)
    done
    local t0 t1
    t0=$(date +%s.%N)
    sleep 15
    t1=$(date +%s.%N)
    local line="$way:"
    local hz
    hz=$(getconf CLK_TCK)
    for g in "${GROUPS_[@]}"; do
        line="$line $g $(echo "($(ticks "$g") - ${before[$g]}) / $hz / ($t1 - $t0)" | bc -l | xargs printf '%.2f')"
        line="$line ($(( $(cat "/tmp/govexp-$g.log" 2>/dev/null | wc -l) - ${lines[$g]} )) epochs)"
    done
    echo "$line"
    cleanup
}

for way in ${WAYS:-weights idle cap spin}; do run "$way"; done
