#!/bin/bash
# Regenerate every collective figure of BENCHMARKS.md on this machine, in one go:
#
#   bash jobs/benchmarks.sh            # p = 2 and p = 4
#   bash jobs/benchmarks.sh 2 4 8      # also p = 8 (on a machine with 8 or more cores)
#
# For each rank count p: fit the cost model (python -m mpicomm.tune) and measure every
# algorithm of every collective into decisions (python -m mpicomm.tune --collectives), both in
# a private cache directory, so auto follows what was measured here and nothing of the user's
# own cache is read or changed; then run every collective benchmark (native and every
# algorithm interleaved, validated against the library) and the ping-pong, and judge the speed
# targets from the JSON (python -m mpicomm.bench.summary).
# Writes jobs/results/p<N>/: tune.txt, collectives.md, neighbors.md, bench-<collective>.json/.png, and
# jobs/results/targets.md (the summary BENCHMARKS.md quotes), replacing what an earlier run wrote
# there (--force). Iterations and warm-ups are the benchmarks' defaults, OSU's (python -m
# mpicomm.bench BENCHMARK --help). On 2 cores it took 1 minute at p = 2 and 5 at p = 4. With more
# ranks than cores, MPICH is asked to sleep while it polls.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
ranks=("$@")
[[ ${#ranks[@]} -gt 0 ]] || ranks=(2 4)
cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
export MPICOMM_CACHE_DIR=$cache
big=(allreduce bcast allgather alltoall reduce_scatter)
small=(reduce gather scatter scan barrier)
started=$SECONDS
json=()
for p in "${ranks[@]}"; do
    out=jobs/results/p$p
    mkdir -p "$out"
    rm -f "$out"/tune.txt "$out"/bench-*.json "$out"/bench-*.png
    report=(--out "$out/collectives.md" --force)  # the first table replaces the file, the others add to it
    if (( p > $(nproc) )); then export MPIR_CVAR_CH4_PROGRESS_THROTTLE=1; else unset MPIR_CVAR_CH4_PROGRESS_THROTTLE; fi
    run=(mpiexec -n "$p" "$python")
    echo "[p=$p] fitting the model and measuring the algorithms ($((SECONDS - started)) s elapsed)"
    { "${run[@]}" -m mpicomm.tune && "${run[@]}" -m mpicomm.tune --collectives --repeat 5 --quiet; } \
        | sed "s|$cache|\$MPICOMM_CACHE_DIR|g" >"$out/tune.txt"
    i=0
    for c in "${big[@]}" "${small[@]}"; do
        i=$((i + 1))
        extra=(--sizes 8:16M --pool)
        [[ " ${small[*]} " == *" $c "* ]] && extra=(--sizes 8:1M)
        [[ $c == allreduce ]] && extra+=(--persistent)
        [[ $c == barrier ]] && extra=()  # no data: no sizes
        echo "[p=$p $i/$(( ${#big[@]} + ${#small[@]} ))] $c ($((SECONDS - started)) s elapsed)"
        "${run[@]}" -m mpicomm.bench "$c" "${extra[@]}" --validate --quiet \
            --json "$out/bench-$c.json" --plot "$out/bench-$c.png" "${report[@]}" >/dev/null
        report=(--out "$out/collectives.md" --append)
        json+=("$out/bench-$c.json")
    done
    if [[ $p == 2 ]]; then
        "${run[@]}" -m mpicomm.bench pingpong --sizes 8:1M --quiet "${report[@]}" >/dev/null
    fi
    # The neighbourhood collectives, on a periodic ring (their own table: the library's topology calls beside
    # mpicomm's algorithms; the persistent form is the stencil's halo exchange)
    neighbors=(--out "$out/neighbors.md" --force)
    for c in neighbor_allgather neighbor_alltoall; do
        echo "[p=$p] $c ($((SECONDS - started)) s elapsed)"
        "${run[@]}" -m mpicomm.bench "$c" --sizes 8:1M --persistent --validate --quiet \
            --json "$out/bench-$c.json" --plot "$out/bench-$c.png" "${neighbors[@]}" >/dev/null
        neighbors=(--out "$out/neighbors.md" --append)
    done
done
"$python" -m mpicomm.bench.summary "${json[@]}" --out jobs/results/targets.md --force >/dev/null
echo "done in $((SECONDS - started)) s: jobs/results/targets.md, jobs/results/p*/"
