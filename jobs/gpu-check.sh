#!/bin/bash
# jobs/gpu-check.sh: everything one short loan of a GPU machine should run, in at most 8 minutes, into one folder.
#
# The machine: one H100/H200, Python 3.12 (python3) with CuPy and PyTorch, no MPI runtime and no network. So the
# MPI wheels travel with the project, in jobs/wheels/ (or --wheels DIR). Fetch them on a machine with network:
#
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
#       --platform manylinux_2_17_x86_64 --platform manylinux_2_5_x86_64 -d jobs/wheels mpich mpi4py pytest-mpi
#
# (all three --platform tags: mpi4py's Linux wheels are manylinux_2_5, MPICH's manylinux_2_28.)
#
# Usage, from the project directory:
#   bash jobs/gpu-check.sh                   # on the GPU machine: every step below; writes gpu-check-<UTC time>/
#   bash jobs/gpu-check.sh --out DIR         # the output folder (must not exist yet)
#   bash jobs/gpu-check.sh --dry-run         # anywhere: check every step that needs no GPU, print what would run
#
# Steps, each under its own timeout (seconds), its output in DIR/NN-<step>.log, every table in DIR, and
# DIR/summary.md listing each step's status and time. A step that would overrun the 480 s budget is skipped.
#   mpi         install the wheels with pip --prefix DIR/mpi; mpi4py prints the MPI library      30
#   machine     nvidia-smi; Python, NumPy, CuPy, PyTorch, numba, mpi4py versions                 20
#   gpu-tests   python -m tests --gpu (CuPy, stream-contract, application, torch-on-CUDA tests)  180
#   kernels     the kernel tests on the GPU: CuPy paths, SIMT kernels on CuPy arrays, NVRTC       45
#   coll-*      python -m mpicomm.bench allreduce, device buffers (staged) next to host buffers  3 x 35
#   torch       python -m mpicomm.torch.bench: all_reduce on CUDA tensors                       40
#   kbench      python -m kernels.gpubench: every kernel against its bound                       50
# Several ranks share the one GPU (local rank modulo the visible GPUs); the PyPI MPICH is not CUDA-aware, so
# device buffers take mpicomm's staging path, and NCCL refuses two ranks on one GPU (no NCCL baseline).
# Environment: PYTHON (default python3), GPU_CHECK_WHEELS (default jobs/wheels).
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
PYTHON="${PYTHON:-python3}"
WHEELS="${GPU_CHECK_WHEELS:-$HERE/wheels}"
OUT=""
DRY=0
BUDGET=480
FETCH="pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_5_x86_64 -d $WHEELS mpich mpi4py pytest-mpi"

while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY=1 ;;
        --out) OUT="${2:?--out needs a folder}"; shift ;;
        --wheels) WHEELS="${2:?--wheels needs a folder}"; shift ;;
        -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu-check.sh: error: unknown argument '$1'; valid: --dry-run, --out DIR, --wheels DIR, --help" >&2
           exit 2 ;;
    esac
    shift
done
OUT="${OUT:-gpu-check-$(date -u +%Y%m%d-%H%M%S)}"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
cd "$REPO" || exit 2

# ---------------------------------------------------------------- what runs (one line per step)
# name|timeout|command (run by bash -c inside the repository, with DIR as $OUT)
TORCH_DEVICE=""
STEPS=(
    "machine|20|nvidia-smi; \"\$PYTHON\" -c 'import sys, numpy, cupy, torch, numba, mpi4py; from mpi4py import MPI; print(\"Python\", sys.version.split()[0], \"| NumPy\", numpy.__version__, \"| CuPy\", cupy.__version__, \"| PyTorch\", torch.__version__, \"CUDA\", torch.version.cuda, \"| numba\", numba.__version__, \"| mpi4py\", mpi4py.__version__); print(MPI.Get_library_version().splitlines()[0]); d = cupy.cuda.runtime.getDeviceProperties(0); print(\"GPU 0:\", d[\"name\"], \"cc\", cupy.cuda.Device(0).compute_capability, \"NVRTC\", cupy.cuda.nvrtc.getVersion())'"
    "gpu-tests|180|\"\$PYTHON\" -m tests --gpu --timeout 80"
    "kernels|45|\"\$PYTHON\" -m pytest -q -p no:cacheprovider tests/kernels -k 'not compiled'"
    "coll-host-p2|35|mpiexec -n 2 \"\$PYTHON\" -m mpicomm.bench allreduce --backend numpy --sizes 1K,64K,1M,16M --iters 10 --repeat 1 --quiet --out \"\$OUT/allreduce-host-p2.md\" --json \"\$OUT/allreduce-host-p2.json\""
    "coll-device-p2|35|mpiexec -n 2 \"\$PYTHON\" -m mpicomm.bench allreduce --backend cupy --sizes 1K,64K,1M,16M --iters 10 --repeat 1 --quiet --out \"\$OUT/allreduce-device-p2.md\" --json \"\$OUT/allreduce-device-p2.json\""
    "coll-device-p4|35|mpiexec -n 4 \"\$PYTHON\" -m mpicomm.bench allreduce --backend cupy --sizes 1K,1M,16M --iters 10 --repeat 1 --quiet --out \"\$OUT/allreduce-device-p4.md\" --json \"\$OUT/allreduce-device-p4.json\""
    "torch|40|mpiexec -n 2 \"\$PYTHON\" -m mpicomm.torch.bench @TORCH_DEVICE@ --sizes 1K:16M --repeat 1 --quiet --out \"\$OUT/torch-allreduce-p2.md\" --json \"\$OUT/torch-allreduce-p2.json\""
    "kbench|50|\"\$PYTHON\" -m kernels.gpubench --iters 10 --repeat 3 --quiet --out \"\$OUT/kernels.md\" --json \"\$OUT/kernels.json\""
)
MPI_TIMEOUT=30

fail=0
check() {  # description, then a command: prints ok/FAIL and counts failures
    local what="$1"; shift
    local out
    if out="$("$@" 2>&1)"; then
        echo "  ok    $what"
    else
        echo "  FAIL  $what"
        if [ -z "$out" ] && [ -f "${*: -1}" ]; then out="$(cat "${*: -1}")"; fi  # a probe: show what it printed
        echo "$out" | tail -5 | sed 's/^/          /'
        fail=$((fail + 1))
    fi
}

wheels_present() {
    local missing=()
    for name in mpich mpi4py pytest_mpi; do
        compgen -G "$WHEELS/${name}-*.whl" > /dev/null || missing+=("$name")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "no ${missing[*]} wheel in $WHEELS; fetch them (on a machine with network) with: $FETCH"
        return 1
    fi
    compgen -G "$WHEELS/mpi4py-*cp312*.whl" > /dev/null || {
        echo "the mpi4py wheel in $WHEELS is not built for CPython 3.12 (the GPU machine's); fetch it with: $FETCH"
        return 1
    }
}

total_timeouts() {
    local sum=$MPI_TIMEOUT step
    for step in "${STEPS[@]}"; do
        IFS='|' read -r _ limit _ <<< "$step"
        sum=$((sum + limit))
    done
    echo "$sum"
}

resolve_torch() {  # the torch step's device option: --device cuda once mpicomm.torch.bench has it
    TORCH_DEVICE=""
    if "$PYTHON" -m mpicomm.torch.bench --help 2>/dev/null | grep -q -- "--device"; then
        TORCH_DEVICE="--device cuda"
    fi
}

command_of() {
    local cmd="${1//@TORCH_DEVICE@/$TORCH_DEVICE}"
    echo "$cmd"
}

if [ "$DRY" = 1 ]; then
    echo "gpu-check.sh --dry-run: the checks that need no GPU, then what a run would do (output folder $OUT)"
    # The probes that start Python run side by side (importing PyTorch alone takes seconds); results in $PROBE.
    PROBE="$(mktemp -d)"
    trap 'rm -rf "$PROBE"' EXIT
    "$PYTHON" -m tests --help > "$PROBE/tests" 2>&1 &
    "$PYTHON" -m mpicomm.bench allreduce --help > "$PROBE/bench" 2>&1 &
    "$PYTHON" -m mpicomm.torch.bench --help > "$PROBE/torch" 2>&1 &
    "$PYTHON" -m kernels.gpubench --simulator --tiny --iters 1 --repeat 1 --quiet > "$PROBE/kbench" 2>&1 &
    wait
    check "the MPI wheels are in $WHEELS (mpich, mpi4py for cp312, pytest-mpi)" wheels_present
    check "python -m tests has --gpu (the GPU tier)" grep -q -- "--gpu" "$PROBE/tests"
    check "python -m mpicomm.bench allreduce takes --backend cupy" grep -q -- "{numpy,cupy}" "$PROBE/bench"
    check "python -m mpicomm.torch.bench runs (--help)" grep -q -- "--sizes" "$PROBE/torch"
    check "python -m kernels.gpubench runs every SIMT kernel's steps (numba's CUDA simulator, tiny sizes)" \
        grep -q "^| spmv" "$PROBE/kbench"
    check "the timeouts add up to at most $BUDGET s ($(total_timeouts) s)" test "$(total_timeouts)" -le "$BUDGET"
    TORCH_DEVICE=""
    grep -q -- "--device" "$PROBE/torch" && TORCH_DEVICE="--device cuda"
    if [ -z "$TORCH_DEVICE" ]; then
        echo "  note  python -m mpicomm.torch.bench has no --device option: the torch step would measure CPU tensors" \
             "and say so in its log"
    fi
    echo "would run, in $REPO (PYTHON=$PYTHON):"
    echo "  [mpi] (<= ${MPI_TIMEOUT}s) $PYTHON -m pip install --no-index --no-deps --prefix $OUT/mpi $WHEELS/*.whl;" \
         "$PYTHON -c 'from mpi4py import MPI; print(MPI.Get_library_version())'"
    for step in "${STEPS[@]}"; do
        IFS='|' read -r name limit cmd <<< "$step"
        echo "  [$name] (<= ${limit}s) $(command_of "$cmd" | sed "s|\\\$OUT|$OUT|g; s|\\\$PYTHON|$PYTHON|g; s|\\\\\"|\"|g")"
    done
    if [ "$fail" -gt 0 ]; then
        echo "gpu-check.sh --dry-run: $fail check(s) failed; fix them before the GPU run"
        exit 1
    fi
    echo "gpu-check.sh --dry-run: every check passed"
    exit 0
fi

# ---------------------------------------------------------------- the run (fails fast without a GPU)
if ! why="$(wheels_present)"; then
    echo "gpu-check.sh: error: $why" >&2
    exit 2
fi
gpus="$("$PYTHON" -c 'import cupy; print(cupy.cuda.runtime.getDeviceCount())' 2>&1 | tail -1)"
if ! [[ "$gpus" =~ ^[1-9][0-9]*$ ]]; then
    echo "gpu-check.sh: error: no GPU visible to CuPy ($gpus); run this on the GPU machine, or --dry-run here" >&2
    exit 2
fi
if [ -e "$OUT" ]; then
    echo "gpu-check.sh: error: $OUT exists; pass --out with a new folder" >&2
    exit 2
fi
mkdir -p "$OUT" || exit 2
OUT="$(cd "$OUT" && pwd)"
export OUT PYTHON
START=$SECONDS
SUMMARY="$OUT/summary.md"
printf '# gpu-check %s\n\n| step | status | seconds | log |\n|---|---|---:|---|\n' "$(date -u +%FT%TZ)" > "$SUMMARY"
n=0

run_step() {  # name, timeout, command
    local name="$1" limit="$2" cmd="$3" log status rc t0
    n=$((n + 1))
    log="$(printf '%02d' "$n")-$name.log"
    if [ $((BUDGET - (SECONDS - START))) -lt "$limit" ]; then
        status="skipped: under ${limit} s of the budget left"
        echo "| $name | $status | 0 | |" >> "$SUMMARY"
        echo "[$name] $status"
        return
    fi
    echo "[$name] (<= ${limit}s) $cmd"
    { echo "\$ $cmd"; echo; } > "$OUT/$log"
    t0=$SECONDS
    timeout -k 5 "$limit" bash -c "$cmd" >> "$OUT/$log" 2>&1
    rc=$?
    case $rc in
        0) status="ok" ;;
        124|137) status="timed out" ;;
        *) status="failed (exit $rc)" ;;
    esac
    echo "| $name | $status | $((SECONDS - t0)) | $log |" >> "$SUMMARY"
    echo "[$name] $status after $((SECONDS - t0)) s"
}

P="$OUT/mpi"
run_step mpi "$MPI_TIMEOUT" "\"\$PYTHON\" -m pip install --no-index --no-deps --prefix '$P' '$WHEELS'/*.whl && \"\$PYTHON\" -c 'import mpi4py' "
SITE="$("$PYTHON" -c "import sysconfig; print(sysconfig.get_path('purelib', vars={'base': '$P', 'platbase': '$P'}))")"
export PATH="$P/bin:$PATH" LD_LIBRARY_PATH="$P/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONPATH="$REPO:$SITE${PYTHONPATH#"$REPO"}"
"$PYTHON" -c "from mpi4py import MPI; print(MPI.Get_library_version())" >> "$OUT/01-mpi.log" 2>&1 \
    || echo "| mpi | mpi4py does not load MPI: see 01-mpi.log | | 01-mpi.log |" >> "$SUMMARY"
resolve_torch
if [ -z "$TORCH_DEVICE" ]; then
    echo "note: mpicomm.torch.bench has no --device option; its table is on CPU tensors" >> "$SUMMARY"
fi
for step in "${STEPS[@]}"; do
    IFS='|' read -r name limit cmd <<< "$step"
    run_step "$name" "$limit" "$(command_of "$cmd")"
done
echo "" >> "$SUMMARY"
echo "total: $((SECONDS - START)) s" >> "$SUMMARY"
cat "$SUMMARY"
echo "everything is in $OUT"
grep -q "| ok |" "$SUMMARY" && ! grep -Eq "\| (failed|timed out)" "$SUMMARY"
