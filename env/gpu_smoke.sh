#!/bin/bash
# The instructor's GPU smoke test of the course. Run it inside a 1-node GPU allocation, then inside a 2-node
# one, before teaching (see env/GPU_CLUSTER.md, "The smoke test"):
#
#   salloc --nodes=1 --ntasks-per-node=4 --gpus-per-node=4 --cpus-per-task=8 --time=5:00:00
#   bash env/gpu_smoke.sh                         # every check; nbval_cluster (every notebook at cluster scale)
#                                                 # takes most of it: give the allocation 5 hours (--time below)
#   bash env/gpu_smoke.sh --only build,ids,check  # a subset, a minute
#   sbatch --nodes=2 --ntasks-per-node=4 --gpus-per-node=4 --cpus-per-task=8 env/gpu_smoke.sh
#
#   bash env/gpu_smoke.sh --local                 # no Slurm: this machine's GPUs, one rank each (mpiexec); the
#                                                 # checks that need Slurm or more GPUs than it has are SKIPped
#   bash env/gpu_smoke.sh --dry-run               # no GPU, no Slurm: the same sequence on CPU ranks (mpiexec)
#   bash env/gpu_smoke.sh --list                  # the check ids
#
# One line per check, PASS / FAIL / SKIP with the reason; a summary; exit 1 when any check FAILs (2: bad usage).
# Each check writes its full output to <log dir>/<id>.log; the log dir is printed first.
# Counts come from the allocation (SLURM_NNODES, SLURM_NTASKS, SLURM_TASKS_PER_NODE, SLURM_GPUS_ON_NODE,
# SLURM_CPUS_PER_TASK). Settings (environment):
#   DDLCOURSE_PYTHON         the course's Python (default: .venv/bin/python of this checkout, else python)
#   DDLCOURSE_SRUN_MPI       srun --mpi plugin (default: detected from the MPI mpi4py was built with)
#   DDLCOURSE_MPIEXEC        the mpiexec for the mpiexec checks (default: beside the Python, else on PATH)
#   DDLCOURSE_SMOKE_DRY_RUN=1     same as --dry-run;  DDLCOURSE_SMOKE_RANKS  CPU ranks of a dry run (2)
#   DDLCOURSE_SMOKE_CASES    labs to run (default: maize seismic topology driving)
#   DDLCOURSE_SMOKE_NOTEBOOKS     what nbval runs (default: notebooks labs)
#   DDLCOURSE_SMOKE_TIMEOUT  seconds per check (default 900; nbval gets 4x)
#   DDLCOURSE_SMOKE_CLUSTER_TIMEOUT  seconds for nbval_cluster (default: twice its longest earlier PASS in
#                            results/gpu_smoke/, measured; before the first, 1.5 times a model of its run time)
# After the checks, every PASS's log is searched: a LaunchError or a timeout turns the PASS into a FAIL, a
# ClusterError into a WARN (notebook 25 kills a rank on purpose and prints its ClusterError).
#   DDLCOURSE_SMOKE_LOGS     log dir (default results/gpu_smoke/<job id or date>)
#SBATCH --job-name=ddl-gpu-smoke
#SBATCH --time=05:00:00
#SBATCH --output=ddl-gpu-smoke-%j.out
set -uo pipefail

# ------------------------------------------------------------------------------------------------ options
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ -d "$HERE/../ddlcourse" ]; then ROOT=$(cd "$HERE/.." && pwd); else ROOT=${SLURM_SUBMIT_DIR:-$PWD}; fi  # sbatch runs a copy
cd "$ROOT" || exit 2
case "${DDLCOURSE_SMOKE_DRY_RUN:-0}" in ""|0) DRY=0 ;; *) DRY=1 ;; esac
ONLY="" LAUNCHER="" LOGDIR=${DDLCOURSE_SMOKE_LOGS:-} LIST=0 LOCAL=0 RANKS=${DDLCOURSE_SMOKE_RANKS:-}
usage() { sed -n '2,/^#SBATCH/p' "$HERE/gpu_smoke.sh" 2>/dev/null | grep -v '^#SBATCH' | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --local) LOCAL=1 ;;
    --only) ONLY=${2:?--only needs a comma-separated list of check ids}; shift ;;
    --only=*) ONLY=${1#--only=} ;;
    --launcher) LAUNCHER=${2:?--launcher needs srun or mpiexec}; shift ;;
    --launcher=*) LAUNCHER=${1#--launcher=} ;;
    --log-dir) LOGDIR=${2:?--log-dir needs a directory}; shift ;;
    --log-dir=*) LOGDIR=${1#--log-dir=} ;;
    --ranks) RANKS=${2:?--ranks needs a number}; shift ;;
    --list) LIST=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_smoke: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

if [ -n "${DDLCOURSE_PYTHON:-}" ]; then PY=$DDLCOURSE_PYTHON
elif [ -x "$ROOT/.venv/bin/python" ]; then PY=$ROOT/.venv/bin/python
else PY=python; fi
CASES=(${DDLCOURSE_SMOKE_CASES:-maize seismic topology driving})
BACKENDS=(ddp horovod)
NOTEBOOKS=(${DDLCOURSE_SMOKE_NOTEBOOKS:-notebooks labs})
TIMEOUT=${DDLCOURSE_SMOKE_TIMEOUT:-900}

IDS=(build pmi ids.srun ids.mpiexec check profile plan engines)
for c in "${CASES[@]}"; do for b in "${BACKENDS[@]}"; do IDS+=("lab.$c.$b"); done; done
IDS+=(bench_ddp sbatch.lab sbatch.engines nbval_cluster bench.ddp bench.horovod nbval)
if [ "$LIST" = 1 ]; then printf '%s\n' "${IDS[@]}"; exit 0; fi

# --only a,b: an item selects the id itself and every id under it ("ids" -> ids.srun, ids.mpiexec; "lab.maize").
wanted() {
  [ -z "$ONLY" ] && return 0
  local item
  for item in ${ONLY//,/ }; do [ "$1" = "$item" ] || [[ "$1" == "$item".* ]] && return 0; done
  return 1
}
if [ -n "$ONLY" ]; then
  for item in ${ONLY//,/ }; do
    hit=0; for id in "${IDS[@]}"; do { [ "$id" = "$item" ] || [[ "$id" == "$item".* ]]; } && hit=1; done
    if [ "$hit" = 0 ]; then echo "gpu_smoke: --only $item matches no check; the checks are: ${IDS[*]}" >&2; exit 2; fi
  done
fi
case "$LAUNCHER" in ""|srun|mpiexec) ;; *) echo "gpu_smoke: --launcher must be srun or mpiexec" >&2; exit 2 ;; esac

# ------------------------------------------------------------------------------------------------ the allocation
IN_SLURM=0
if [ -n "${SLURM_JOB_ID:-}" ] && [ -n "${SLURM_NTASKS:-${SLURM_NPROCS:-}}" ] && command -v srun >/dev/null; then IN_SLURM=1; fi
[ "$LOCAL" = 1 ] && IN_SLURM=0                # --local: this machine alone, even inside an allocation
if [ "$DRY" = 0 ] && [ "$IN_SLURM" = 0 ] && [ "$LOCAL" = 0 ]; then
  echo "gpu_smoke: not inside a Slurm allocation with srun (SLURM_JOB_ID/SLURM_NTASKS unset)." >&2
  echo "  Run it under salloc or sbatch on GPU nodes, --local on a machine with GPUs, or --dry-run for the CPU form." >&2
  exit 2
fi
if [ "$IN_SLURM" = 1 ]; then
  NNODES=${SLURM_NNODES:-${SLURM_JOB_NUM_NODES:-1}}
  NTASKS=${SLURM_NTASKS:-$SLURM_NPROCS}
  TPN=${SLURM_NTASKS_PER_NODE:-}
  [ -z "$TPN" ] && [ -n "${SLURM_TASKS_PER_NODE:-}" ] && TPN=${SLURM_TASKS_PER_NODE%%[(,]*}  # "4(x2)" -> 4
  [ -z "$TPN" ] && TPN=$(( (NTASKS + NNODES - 1) / NNODES ))
  GPN=${SLURM_GPUS_ON_NODE:-${SLURM_GPUS_PER_NODE:-0}}; GPN=${GPN##*:}               # "h100:4" -> 4
  THREADS=${SLURM_CPUS_PER_TASK:-1}
elif [ "$DRY" = 0 ]; then                       # --local: one rank per GPU of this machine
  GPN=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  if [ "$GPN" = 0 ]; then
    echo "gpu_smoke: --local, but nvidia-smi lists no GPU on $(hostname); use --dry-run for the CPU form." >&2
    exit 2
  fi
  NNODES=1 NTASKS=${RANKS:-$GPN}
  TPN=$NTASKS THREADS=$(( $(nproc) / NTASKS )); [ "$THREADS" -lt 1 ] && THREADS=1
else
  NNODES=1 NTASKS=${RANKS:-2} TPN=${RANKS:-2} GPN=0 THREADS=1
fi
[ "$DRY" = 1 ] && GPN=0                       # the CPU form: no rank looks for a GPU it would not find
[ -z "$LAUNCHER" ] && { [ "$IN_SLURM" = 1 ] && [ "$DRY" = 0 ] && LAUNCHER=srun || LAUNCHER=mpiexec; }
export OMP_NUM_THREADS=$THREADS DDLCOURSE_THREADS=$THREADS MKL_NUM_THREADS=$THREADS
export NCCL_DEBUG=${NCCL_DEBUG:-WARN} TORCH_NCCL_ASYNC_ERROR_HANDLING=${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}
export PYTHONUNBUFFERED=1
if [ "$DRY" = 1 ]; then export CUDA_VISIBLE_DEVICES="" DDLCOURSE_ALLOW_CPU=1; fi   # CPU ranks even on a GPU node

SRUN_MPI=${DDLCOURSE_SRUN_MPI:-}
SRUN_MPI_WHY="set by DDLCOURSE_SRUN_MPI"
if [ -z "$SRUN_MPI" ]; then
  # one Python start for both: the plugin on stdout, why on stderr (a file, so neither stream is lost)
  WHY_FILE=$(mktemp)
  SRUN_MPI=$("$PY" -m ddlcourse srun-mpi --explain 2>"$WHY_FILE") || SRUN_MPI=""
  SRUN_MPI_WHY=$(cat "$WHY_FILE"); SRUN_MPI_WHY=${SRUN_MPI_WHY#*: }; rm -f "$WHY_FILE"
  if [ -z "$SRUN_MPI" ]; then SRUN_MPI=pmi2 SRUN_MPI_WHY="could not ask mpi4py which MPI it uses; pmi2 assumed"; fi
fi
export DDLCOURSE_SRUN_MPI=$SRUN_MPI            # MPICluster (nbval) passes it to srun as well

if [ -n "${DDLCOURSE_MPIEXEC:-}" ]; then MPIEXEC=$DDLCOURSE_MPIEXEC
elif [ -x "$(dirname "$PY")/mpiexec" ]; then MPIEXEC=$(dirname "$PY")/mpiexec
else MPIEXEC=$(command -v mpiexec || echo mpiexec); fi

if [ -z "$LOGDIR" ]; then LOGDIR=$ROOT/results/gpu_smoke/${SLURM_JOB_ID:+job$SLURM_JOB_ID-}$(date +%Y%m%d-%H%M%S)-$$; fi
mkdir -p "$LOGDIR" || exit 2
LOGDIR=$(cd "$LOGDIR" && pwd)
SUMMARY=$LOGDIR/summary.txt
: > "$SUMMARY"

# How each launcher starts the ranks, the same rule as the course: one rank per task (= per GPU).
# launch srun|mpiexec sets the array L to the launcher's command line (paths with spaces stay whole).
MPIEXEC_FLAVOR=$("$MPIEXEC" --version 2>&1 | head -5)
launch() {
  if [ "$1" = srun ]; then
    L=(srun --mpi="$SRUN_MPI" --ntasks="$NTASKS" --cpus-per-task="$THREADS" --cpu-bind="${DDLCOURSE_CPU_BIND:-cores}"
       --kill-on-bad-exit=1)
    [ "$GPN" != 0 ] && L+=(--gpu-bind=none)     # every GPU visible; dist maps local rank -> GPU, as under mpiexec
    return 0
  fi
  case "$MPIEXEC_FLAVOR" in
    *HYDRA*|*MPICH*) L=("$MPIEXEC" -n "$NTASKS" -ppn "$TPN" -bind-to none
                        -genv OMP_NUM_THREADS "$THREADS" -genv DDLCOURSE_THREADS "$THREADS") ;;
    *"Open MPI"*|*OpenRTE*|*PRRTE*) L=("$MPIEXEC" -n "$NTASKS" --map-by "ppr:$TPN:node" --bind-to none
                        -x OMP_NUM_THREADS="$THREADS" -x DDLCOURSE_THREADS="$THREADS") ;;
    *) L=("$MPIEXEC" -n "$NTASKS") ;;
  esac
}

# ------------------------------------------------------------------------------------------------ reporting
N_PASS=0 N_FAIL=0 N_SKIP=0 N_WARN=0 FAILED=() PASSED=()
report() {   # report ID STATUS REASON [SECONDS]
  local line
  line=$(printf '%-4s %-22s %s' "$2" "$1" "$3$RETRY_NOTE")
  RETRY_NOTE=
  [ -n "${4:-}" ] && line="$line [${4} s]"
  [ "$2" = FAIL ] && line="$line (log: $LOGDIR/$1.log)"
  echo "$line"; echo "$line" >> "$SUMMARY"
  case "$2" in PASS) N_PASS=$((N_PASS + 1)); PASSED+=("$1") ;; WARN) N_WARN=$((N_WARN + 1)) ;; FAIL) N_FAIL=$((N_FAIL + 1)); FAILED+=("$1") ;; *) N_SKIP=$((N_SKIP + 1)) ;; esac
}
# run_logged ID TIMEOUT_S CMD...: run with output to ID.log; sets RC and SECS. A launch whose MPI_Init aborted
# (seen with pip's MPICH under srun --mpi=pmi2 when a killed job had left a segment of the same job id in
# /dev/shm, on test clusters that reused job ids) is run once more; the report says so (RETRY_NOTE).
MPI_INIT_ABORT='internal_Init_thread|MPI_Init(_thread)?\(.*failed|UCX +ERROR failed to unpack address'
RETRY_NOTE=
run_logged() {
  local id=$1 t=$2; shift 2
  local log=$LOGDIR/$id.log t0 t1 attempt
  t0=$(date +%s.%N)
  for attempt in 1 2; do
    { echo "# $(date -Is) on $(hostname)"; printf '#'; printf ' %q' "$@"; echo; } > "$log"
    timeout -k 30 "$t" "$@" >> "$log" 2>&1
    RC=$?
    if [ "$RC" = 0 ] || [ "$attempt" = 2 ] || ! grep -qE "$MPI_INIT_ABORT" "$log"; then break; fi
    mv "$log" "$LOGDIR/$id.first.log"
    RETRY_NOTE="; MPI_Init aborted at the first launch, retried once (log: $LOGDIR/$id.first.log)"
  done
  t1=$(date +%s.%N)
  SECS=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}')
  [ "$RC" = 124 ] || [ "$RC" = 137 ] && echo "# timed out after $t s" >> "$log"
  return 0
}
logline() { grep -E "$2" "$LOGDIR/$1.log" | tail -1 | cut -c1-300; }   # last line of a log matching a regex
last_error() {
  local e
  e=$(grep -E "Error|error:|FAIL|Traceback|Aborted|killed|timed out" "$LOGDIR/$1.log" | grep -v '^# ' | tail -1 | cut -c1-240)
  [ -z "$e" ] && e=$(grep -v '^# ' "$LOGDIR/$1.log" | tail -1 | cut -c1-240)
  [ "$RC" = 124 ] || [ "$RC" = 137 ] && e="timed out after ${2:-$TIMEOUT} s; $e"
  echo "exit $RC: ${e:-no output}"
}
need_gpu() { [ "$DRY" = 1 ] && { report "$1" SKIP "no GPU (dry run on CPU ranks)"; return 1; }; return 0; }
need_srun() { [ "$IN_SLURM" = 1 ] || { report "$1" SKIP "no Slurm allocation (srun) here"; return 1; }; return 0; }
REQ_CUDA=(); [ "$DRY" = 0 ] && REQ_CUDA=(--require-cuda)

# ------------------------------------------------------------------------------------------------ the checks
check_build() {   # every node: torch sees the GPUs, torch has NCCL, Horovod was built with NCCL
  need_gpu build || return 0
  local on_nodes=(srun --ntasks="$NNODES" --ntasks-per-node=1 --gpu-bind=none)
  [ "$IN_SLURM" = 0 ] && on_nodes=()            # --local: this host
  run_logged build "$TIMEOUT" "${on_nodes[@]}" "$PY" -m ddlcourse build --require-gpu
  if [ "$RC" = 0 ]; then report build PASS "$(logline build '^host ' | cut -d: -f2-) $(logline build 'GPU\(s\)')" "$SECS"
  else
    local why; why=$(grep '^PROBLEM: ' "$LOGDIR/build.log" | sed 's/^PROBLEM: //' | sort -u | paste -sd ';' | sed 's/;/; /g')
    report build FAIL "${why:-$(last_error build)}" "$SECS"
  fi
}

check_pmi() {     # the plugin we pass to srun exists in this Slurm
  need_srun pmi || return 0
  run_logged pmi 60 srun --mpi=list
  if grep -qw -- "$SRUN_MPI" "$LOGDIR/pmi.log"; then report pmi PASS "srun --mpi=$SRUN_MPI: $SRUN_MPI_WHY"
  else report pmi FAIL "srun --mpi=list does not offer '$SRUN_MPI' ($SRUN_MPI_WHY); set DDLCOURSE_SRUN_MPI to one it lists"; fi
}

check_ids() {     # check_ids srun|mpiexec: one world, local ranks 0..k-1 per node, one GPU per rank
  local how=$1 id=ids.$1
  if [ "$how" = srun ]; then need_srun "$id" || return 0; fi
  launch "$how"
  run_logged "$id" "$TIMEOUT" "${L[@]}" "$PY" -m ddlcourse check --ids --expect-ranks "$NTASKS" "${REQ_CUDA[@]}"
  local verdict; verdict=$(grep -m1 '^placement: FAIL' "$LOGDIR/$id.log" || logline "$id" '^placement:')
  if [ "$RC" = 0 ] && [[ "$verdict" == "placement: OK"* ]]; then report "$id" PASS "${verdict#placement: OK: }" "$SECS"
  elif [ -n "$verdict" ]; then report "$id" FAIL "${verdict#placement: FAIL: }" "$SECS"
  else report "$id" FAIL "$(last_error "$id")" "$SECS"; fi
}

check_check() {   # allreduce: mpi4py, torch.distributed, Horovod; CPU tensor on the default group; CUDA tensors
  launch "$LAUNCHER"
  run_logged check "$TIMEOUT" "${L[@]}" "$PY" -m ddlcourse check --expect-ranks "$NTASKS" "${REQ_CUDA[@]}"
  local three dev tf32
  three=$(logline check '^all three agree'); dev=$(logline check '^device allreduces')
  tf32=$(grep -c 'TF32 allowed: matmul True\|cudnn True' "$LOGDIR/check.log")
  if [ "$RC" = 0 ]; then
    local note=""; [ "$tf32" != 0 ] && note="; TF32 allowed on $tf32 rank(s), see log"
    report check PASS "$NTASKS ranks via $LAUNCHER: mpi4py/torch.distributed/Horovod sums ${three##*: }; device allreduces ${dev#*): }$note" "$SECS"
  else
    local why; why=$(grep -m1 -E 'ERROR:|WRONG|^check: FAIL' "$LOGDIR/check.log" | cut -c1-240)
    report check FAIL "${why:-$(last_error check)}" "$SECS"
  fi
}

check_profile() { # notebook 24's profile of a DDP step: each phase read once per step; on GPUs from the device's kernels
  launch "$LAUNCHER"
  run_logged profile "$TIMEOUT" "${L[@]}" "$PY" -m ddlcourse profile step --steps 3
  local lines on_gpu; lines=$(grep -c '^profile: rank ' "$LOGDIR/profile.log"); on_gpu=$(grep -c '^profile: rank .* on cuda' "$LOGDIR/profile.log")
  if [ "$RC" != 0 ]; then
    local why; why=$(grep -m1 -oE 'PROBLEM: .*|expected [0-9]+ profiled steps.*' "$LOGDIR/profile.log" | cut -c1-200)
    report profile FAIL "${why:-$(last_error profile)}" "$SECS"
  elif [ "$lines" != "$NTASKS" ]; then report profile FAIL "$lines of $NTASKS rank(s) printed their profile" "$SECS"
  elif [ "$DRY" = 0 ] && [ "$on_gpu" != "$NTASKS" ]; then report profile FAIL "only $on_gpu of $NTASKS rank(s) profiled on a GPU" "$SECS"
  else report profile PASS "$NTASKS ranks: $(logline profile '^profile: rank 0 ' | cut -d: -f3- | cut -c1-150)" "$SECS"; fi
}

check_plan() {    # the planner's estimate against one real step of every workload at cluster scale, on one GPU
  need_gpu plan || return 0
  local on_gpu=(srun --ntasks=1 --nodes=1 --gpu-bind=none)
  [ "$IN_SLURM" = 0 ] && on_gpu=()
  run_logged plan "$TIMEOUT" env DDLCOURSE_SCALE=cluster "${on_gpu[@]}" "$PY" -m ddlcourse plan --scale cluster --measure
  local verdict; verdict=$(logline plan '^plan --measure')
  if [ "$RC" = 0 ] && [ -n "$verdict" ]; then report plan PASS "${verdict#*: }" "$SECS"
  elif [ -n "$verdict" ]; then report plan FAIL "${verdict#*: }; $(logline plan 'OVER the plan' | cut -c1-120)" "$SECS"
  else report plan FAIL "$(last_error plan)" "$SECS"; fi
}

check_lab() {     # check_lab CASE BACKEND: the lab's CLI at smoke scale; on GPUs every rank must use its GPU
  local case=$1 backend=$2 id=lab.$1.$2 results=$LOGDIR/results/$2
  launch "$LAUNCHER"
  run_logged "$id" "$TIMEOUT" env DDLCOURSE_RESULTS="$results" DDLCOURSE_SCALE=smoke "${L[@]}" \
      "$PY" -m ddlcourse device-use run "$case" --scale smoke --backend "$backend"
  local written; written=$(ls "$results/$case"/result*.json 2>/dev/null | head -1)
  local used; used=$(grep -c '^device-use: .* cuda:[0-9]* peak [1-9]' "$LOGDIR/$id.log")
  if [ "$RC" != 0 ]; then report "$id" FAIL "$(last_error "$id")" "$SECS"
  elif [ -z "$written" ]; then report "$id" FAIL "exit 0 but no result*.json under $results/$case/" "$SECS"
  elif [ "$DRY" = 0 ] && [ "$used" != "$NTASKS" ]; then
    report "$id" FAIL "only $used of $NTASKS rank(s) allocated CUDA memory: part of the lab stayed on the CPU" "$SECS"
  else
    local where="CPU ranks"; [ "$DRY" = 0 ] && where="all $NTASKS ranks on their GPU"
    report "$id" PASS "$NTASKS ranks via $LAUNCHER, $where; $(basename "$written")" "$SECS"
  fi
}

check_bench() {   # the synthetic benchmark; the figure is printed, never judged
  local backend=$1 id=bench.$1
  launch "$LAUNCHER"
  run_logged "$id" "$TIMEOUT" "${L[@]}" "$PY" -m ddlcourse synthetic-bench --model smallcnn \
      --batch-size 32 --backend "$backend" --num-warmup-batches 2 --num-batches-per-iter 3 --num-iters 3
  local total model; total=$(logline "$id" '^Total img/sec'); model=$(logline "$id" '^Model:')
  if [ "$RC" != 0 ] || [ -z "$total" ]; then report "$id" FAIL "$(last_error "$id")" "$SECS"
  elif [ "$DRY" = 0 ] && [[ "$model" != *"device: cuda"* ]]; then report "$id" FAIL "ran on ${model##*device: }, not on a GPU" "$SECS"
  else report "$id" PASS "${total}, ${model##*  }" "$SECS"; fi
}

check_nbval() {   # every notebook at smoke scale inside this allocation (engines via srun on GPU nodes)
  if [ "$IN_SLURM" = 1 ] || [ "$DRY" = 0 ]; then
    local need; need=$("$PY" -m ddlcourse engines --scale smoke 2>/dev/null || echo 0)
    if [ "$need" -gt "$NTASKS" ] && [ "$IN_SLURM" = 1 ]; then
      report nbval FAIL "the notebooks start up to $need engines at smoke scale; this allocation has $NTASKS task(s)"; return 0
    elif [ "$need" -gt "$NTASKS" ]; then
      report nbval SKIP "the notebooks start up to $need engines at smoke scale, one per GPU; this machine has $NTASKS"; return 0
    fi
  fi
  run_logged nbval $((4 * TIMEOUT)) env DDLCOURSE_SCALE=smoke DDLCOURSE_RUNTIME_DIR="$LOGDIR/runtime" \
      "$PY" -m pytest -p no:cacheprovider -o addopts="" --nbval-lax --nbval-sanitize-with tests/sanitize.cfg \
      "${NOTEBOOKS[@]}"
  local tally; tally=$(grep -E '[0-9]+ (passed|failed)' "$LOGDIR/nbval.log" | tail -1 | tr -d '=' | sed 's/^ *//')
  if [ "$RC" = 0 ]; then report nbval PASS "${NOTEBOOKS[*]}: $tally" "$SECS"
  else
    local bad; bad=$(grep -oE '^FAILED [^: ]+' "$LOGDIR/nbval.log" | awk '{print $2}' | sort -u | xargs)
    report nbval FAIL "${bad:+failed: $bad; }${tally:-$(last_error nbval $((4 * TIMEOUT)))}" "$SECS"
  fi
}

check_engines() { # the notebooks' engines: every rank allocates on its own GPU (one distinct GPU per local rank)
  local script=$LOGDIR/engines_check.py
  cat > "$script" <<'PYEOF'
import sys
from ddlcourse import cluster


def probe():
    import socket
    import torch
    from ddlcourse import dist
    info = dist.init()
    x = torch.ones(1 << 20, device=info.device)            # 4 MiB on the rank's device
    dev = torch.device(info.device)
    out = dict(rank=info.rank, host=socket.gethostname(), local_rank=info.local_rank, device=str(dev),
               allocated=0, uuid=None)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        out["allocated"] = int(torch.cuda.memory_allocated(dev))
        out["uuid"] = str(getattr(torch.cuda.get_device_properties(dev), "uuid", dev.index))
    del x
    return out


n, need_gpu = int(sys.argv[1]), sys.argv[2] == "1"
with cluster.MPICluster(n=n) as c:
    rows = c.run(probe)
problems = []
for r in rows:
    print(f"engine: rank {r['rank']} on {r['host']} local {r['local_rank']} {r['device']} gpu {r['uuid']} "
          f"allocated {r['allocated']} bytes")
if len(rows) != n:
    problems.append(f"{len(rows)} engines answered, {n} expected")
if need_gpu:
    cpu = [r["rank"] for r in rows if r["allocated"] <= 0]
    if cpu:
        problems.append(f"engine rank(s) {cpu} allocated no CUDA memory (stayed on the CPU)")
    seen = {}
    for r in rows:
        key = (r["host"], r["uuid"])
        if key in seen:
            problems.append(f"engine ranks {seen[key]} and {r['rank']} share one GPU ({r['uuid']} on {r['host']})")
        seen[key] = r["rank"]
        if r["device"] != f"cuda:{r['local_rank']}" and r["device"] != "cuda:0":
            problems.append(f"engine rank {r['rank']} (local {r['local_rank']}) uses {r['device']}")
print("engines: " + ("FAIL: " + "; ".join(problems) if problems else
                     f"OK: {len(rows)} engines, " + ("one distinct GPU each, memory allocated on it" if need_gpu
                                                       else "CPU ranks")))
sys.exit(1 if problems else 0)
PYEOF
  local need=1; [ "$DRY" = 1 ] && need=0
  run_logged engines "$TIMEOUT" env DDLCOURSE_RUNTIME_DIR="$LOGDIR/runtime-engines" "$PY" "$script" "$NTASKS" "$need"
  local verdict; verdict=$(logline engines '^engines: ')
  if [ "$RC" = 0 ] && [[ "$verdict" == "engines: OK"* ]]; then report engines PASS "${verdict#engines: OK: }" "$SECS"
  elif [ -n "$verdict" ]; then report engines FAIL "${verdict#engines: FAIL: }" "$SECS"
  else report engines FAIL "$(last_error engines)" "$SECS"; fi
}

check_bench_ddp() {   # python -m ddlcourse bench-ddp: DDP (gloo), DDP + MPI hook, Horovod side by side; timed, never judged
  launch "$LAUNCHER"
  run_logged bench_ddp "$TIMEOUT" "${L[@]}" "$PY" -m ddlcourse bench-ddp --steps 3 --reps 2
  if [ "$RC" = 0 ]; then report bench_ddp PASS "$NTASKS ranks via $LAUNCHER: $(grep -v '^# ' "$LOGDIR/bench_ddp.log" | grep -v '^ *$' | tail -1 | cut -c1-160)" "$SECS"
  else report bench_ddp FAIL "$(last_error bench_ddp)" "$SECS"; fi
}

# check_sbatch lab|engines: the template itself, run with `bash` inside this allocation (it reads the allocation's
# SLURM_* variables and starts its ranks with srun, as under sbatch). Not `sbatch --wait`: a job submitted from
# inside an allocation would wait for the nodes this allocation holds. Dry run: the template's own dry-run form.
check_sbatch() {
  local which=$1 id=sbatch.$1 tpl=$ROOT/env/slurm/$1.sbatch args=()
  if [ "$DRY" = 0 ]; then need_srun "$id" || return 0; fi
  [ "$which" = lab ] && args=(check)
  if [ "$DRY" = 1 ]; then
    run_logged "$id" 120 env DDLCOURSE_DRY_RUN=1 DDLCOURSE_PYTHON="$PY" bash "$tpl" "${args[@]}"
  else
    run_logged "$id" "$TIMEOUT" env DDLCOURSE_PYTHON="$PY" DDLCOURSE_SCALE=smoke DDLCOURSE_RESULTS="$LOGDIR/results/sbatch" \
        DDLCOURSE_RUNTIME_DIR="$LOGDIR/runtime-sbatch" bash "$tpl" "${args[@]}"
  fi
  if [ "$RC" = 0 ]; then
    local how="ran in this allocation"; [ "$DRY" = 1 ] && how="dry run: $(grep -v '^# ' "$LOGDIR/$id.log" | tail -1 | cut -c1-120)"
    report "$id" PASS "env/slurm/$which.sbatch ${args[*]}: $how" "$SECS"
  else report "$id" FAIL "$(last_error "$id")" "$SECS"; fi
}

# nbval_cluster's time limits, modelled: "PASS_S CELL_S", 1.5 times the modelled seconds of the whole pass and of
# its longest notebook (a cell's limit). A notebook's model: its laptop-scale time, measured on 2 CPU cores (its
# header), 3 times that for a lab, plus 60 s for each cluster it starts (engines, CUDA contexts and NCCL
# communicators on 2 nodes). Why: a notebook's cluster profile is small models, whose steps cost Python, kernel
# launches and collectives, which a rank with a GPU and 8 cores of its own pays no slower than laptop ranks sharing
# 2 cores; a lab's is real work: lab 4, the largest, does about 3600 times its laptop profile's convolution work
# (375 times the clip-epochs, 9.5 times the work per clip), which 8 GPUs of a T4's 8.1 TFLOP/s in fp32 do about
# 1300 times as fast as 2 cores at an assumed 50 GFLOP/s: 2.8 times its laptop time. More in env/GPU_CLUSTER.md.
cluster_limits() {
  "$PY" - "${NOTEBOOKS[@]}" <<'PYEOF'
import re
import sys
from pathlib import Path

import nbformat

from ddlcourse import checks

START_S, LAB_FACTOR, MARGIN = 60, 3, 1.5
paths = []
for arg in map(Path, sys.argv[1:]):
    paths += sorted(p for p in arg.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts) if arg.is_dir() else [arg]
model = []
for p in paths:
    header = re.search(r"about (\d+) minutes? at laptop scale", nbformat.read(p, as_version=4).cells[0].source)
    laptop = 60 * int(header.group(1)) if header else 300    # no figure: the course's 5 minutes per notebook
    factor = LAB_FACTOR if p.parent.name == "labs" else 1
    model.append(factor * laptop + START_S * len(checks.notebook_clusters(p, "cluster")["clusters"]))
print(round(MARGIN * sum(model)), round(MARGIN * max(model)))
PYEOF
}

# The longest nbval_cluster PASS of earlier runs in this checkout (whole seconds; nothing before the first).
measured_cluster_pass() {
  local f secs best=0
  for f in "$ROOT"/results/gpu_smoke/*/summary.txt; do
    [ -f "$f" ] && [ "$f" != "$SUMMARY" ] || continue
    grep -qE '^FAIL +nbval_cluster ' "$f" && continue          # a PASS the log check turned into a FAIL
    secs=$(grep -E '^PASS +nbval_cluster ' "$f" | grep -oE '\[[0-9]+(\.[0-9]+)? s\]' | tail -1 | tr -d '[] s')
    [ -n "$secs" ] && [ "${secs%.*}" -gt "$best" ] && best=${secs%.*}
  done
  [ "$best" -gt 0 ] && echo "$best"
}

check_nbval_cluster() {   # every notebook and lab at cluster scale: the sizes plan.py promises fit these GPUs
  need_gpu nbval_cluster || return 0
  local need; need=$("$PY" -m ddlcourse engines --scale cluster 2>/dev/null || echo 0)
  if [ "$need" -gt "$NTASKS" ]; then
    report nbval_cluster SKIP "the notebooks start up to $need engines at cluster scale; this allocation has $NTASKS task(s) (run it in the 2-node allocation)"; return 0
  fi
  local limits pass_s cell_s measured why
  limits=$(cluster_limits 2>"$LOGDIR/nbval_cluster.log") ||
    { report nbval_cluster FAIL "could not model its run time: $(tail -1 "$LOGDIR/nbval_cluster.log")"; return 0; }
  read -r pass_s cell_s <<< "$limits"
  why="1.5 x modelled"
  measured=$(measured_cluster_pass)
  if [ -n "$measured" ]; then pass_s=$((2 * measured)) why="2 x the ${measured} s measured before"; fi
  if [ -n "${DDLCOURSE_SMOKE_CLUSTER_TIMEOUT:-}" ]; then
    pass_s=$DDLCOURSE_SMOKE_CLUSTER_TIMEOUT why="set by DDLCOURSE_SMOKE_CLUSTER_TIMEOUT"
  fi
  run_logged nbval_cluster "$pass_s" env DDLCOURSE_SCALE=cluster DDLCOURSE_RUNTIME_DIR="$LOGDIR/runtime-cluster" \
      "$PY" -m pytest -p no:cacheprovider -o addopts="" --nbval-lax --nbval-sanitize-with tests/sanitize.cfg \
      --nbval-cell-timeout "$cell_s" --durations 20 "${NOTEBOOKS[@]}"
  local tally; tally=$(grep -E '[0-9]+ (passed|failed)' "$LOGDIR/nbval_cluster.log" | tail -1 | tr -d '=' | sed 's/^ *//')
  local limit="limit $pass_s s ($why), $cell_s s a cell"
  if [ "$RC" = 0 ]; then report nbval_cluster PASS "${NOTEBOOKS[*]} at cluster scale: $tally; $limit" "$SECS"
  else
    local bad; bad=$(grep -oE '^FAILED [^: ]+' "$LOGDIR/nbval_cluster.log" | awk '{print $2}' | sort -u | xargs)
    report nbval_cluster FAIL "${bad:+failed: $bad; }${tally:-$(last_error nbval_cluster "$pass_s")}; $limit" "$SECS"
  fi
}

# After every check: a PASS whose log shows a LaunchError or a timeout becomes a FAIL (something was retried or
# hidden: the run did not go the way it should); a ClusterError becomes a WARN (notebook 25 provokes one on purpose).
LOG_FAIL_RE='LaunchError|TimeoutError|TimeoutExpired|timed out'
LOG_WARN_RE='ClusterError'
recheck_logs() {
  local id hit
  for id in "${PASSED[@]}"; do
    [ -f "$LOGDIR/$id.log" ] || continue
    hit=$(grep -E "$LOG_FAIL_RE" "$LOGDIR/$id.log" | tail -1 | cut -c1-200)
    if [ -n "$hit" ]; then N_PASS=$((N_PASS - 1)); report "$id" FAIL "was PASS, but its log has: $hit"; continue; fi
    hit=$(grep -E "$LOG_WARN_RE" "$LOGDIR/$id.log" | tail -1 | cut -c1-200)
    [ -n "$hit" ] && report "$id" WARN "PASS, but its log has: $hit"
  done
}

# ------------------------------------------------------------------------------------------------ run them
MODE="GPU allocation"; [ "$LOCAL" = 1 ] && MODE="this machine's GPUs (--local, no Slurm)"
[ "$DRY" = 1 ] && MODE="dry run (CPU ranks, no GPU)"
echo "gpu_smoke: $MODE; $NNODES node(s), $NTASKS task(s), $TPN per node, $GPN GPU(s) per node, $THREADS thread(s) per rank"
echo "gpu_smoke: launcher $LAUNCHER; srun --mpi=$SRUN_MPI ($SRUN_MPI_WHY); mpiexec $MPIEXEC; python $PY"
echo "gpu_smoke: logs in $LOGDIR"
if [ "$DRY" = 0 ] && [ "$GPN" != 0 ] && [ "$TPN" != "$GPN" ]; then
  echo "gpu_smoke: note: $TPN task(s) per node but $GPN GPU(s) per node; the course runs one rank per GPU"
fi
for id in "${IDS[@]}"; do
  wanted "$id" || continue
  case "$id" in
    build) check_build ;;
    pmi) check_pmi ;;
    ids.srun) check_ids srun ;;
    ids.mpiexec) check_ids mpiexec ;;
    check) check_check ;;
    profile) check_profile ;;
    plan) check_plan ;;
    engines) check_engines ;;
    bench_ddp) check_bench_ddp ;;
    sbatch.*) check_sbatch "${id#sbatch.}" ;;
    nbval_cluster) check_nbval_cluster ;;
    lab.*) rest=${id#lab.}; check_lab "${rest%.*}" "${rest##*.}" ;;
    bench.*) check_bench "${id#bench.}" ;;
    nbval) check_nbval ;;
  esac
done
recheck_logs
WARNS=""; [ "$N_WARN" != 0 ] && WARNS=", $N_WARN WARN"
echo "gpu_smoke: $N_PASS PASS, $N_FAIL FAIL, $N_SKIP SKIP$WARNS ($MODE, $NNODES node(s), $NTASKS task(s)); logs in $LOGDIR" \
  | tee -a "$SUMMARY"
[ "$N_FAIL" = 0 ] || { echo "gpu_smoke: FAILED: ${FAILED[*]}"; exit 1; }
exit 0
