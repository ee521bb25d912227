#!/usr/bin/env bash
# The GPU checks of ../shared/gpu-kit/README.md as one script, for a device call that has just
# installed the kit (PYTHONPATH=/tmp/site:$PWD). Each check has its own time limit so that one
# that hangs or compiles for too long still leaves the others' logs under $OUT. Figures it
# prints go to docs/gpu.md and docs/performance.md with the card's name (info.log).
#   CHECKS="population llm warp test fit update" (the default, in this order)  GRAPH=true|false (the fit's cuda_graph)
#   Measured: warp, test, fit, update on an H100 (2026-11-27); population_worlds and test on an H200 (2026-11-28);
#   population_fit (POPS="1 16 32") and population_collection (MEMBERS="1 16 32") on an H200 (2026-12-04): docs/gpu.md.
#   Never run on a GPU: llm (the LLM track's decoders) and update's --collect-on warp.
#   POP=16 (the population compared with one run: see check_population)  MEMBERS="1 4 16" (population_collection's sizes)
#   DEADLINE=<epoch seconds>: no check runs past it (each one's limit is cut to the time left; one with
#   under 10 s left is skipped and says so), so that a device call's own limit never kills the script
#   before its logs are written. population = population_worlds population_fit population_collection.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
T_TEST=${T_TEST:-100} T_UPDATE=${T_UPDATE:-75} T_FIT=${T_FIT:-140} T_WARP=${T_WARP:-140}
GRAPH=${GRAPH:-true} WORLDS=${WORLDS:-64 512 4096}
T_LLM=${T_LLM:-240} T_POP_WARP=${T_POP_WARP:-90} T_POP_COLLECT=${T_POP_COLLECT:-150} T_POP_FIT=${T_POP_FIT:-240} POP=${POP:-16}
step() { echo "== $1 ($(date +%T))"; }
lim() {  # the limit for a check: its own ($1) or the seconds left before DEADLINE, whichever is less
  local t=$1
  if [ -n "${DEADLINE:-}" ]; then local left=$((DEADLINE - $(date +%s))); [ "$left" -lt "$t" ] && t=$left; fi
  [ "$t" -lt 10 ] && { echo "skipped: under 10 s left before DEADLINE" >&2; echo 0; return; }
  echo "$t"
}
run_for() {  # run_for SECONDS CMD...: the command under `timeout`, or nothing when no time is left
  local t; t=$(lim "$1"); shift
  [ "$t" = 0 ] && { echo "rc=skipped (DEADLINE)"; return 124; }
  timeout "$t" "$@"
}
{
  step info
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, warp, mujoco_warp, lightning; warp.init(); print('torch', torch.__version__, torch.cuda.get_device_name(0), '| warp', warp.__version__, 'driver', warp.get_cuda_driver_version(), '| lightning', lightning.__version__)"
  nproc; grep -m1 'model name' /proc/cpuinfo
} 2>&1 | tee "$OUT/info.log"

check_warp() {
  step "Warp env throughput, with and without a CUDA graph"
  run_for "$T_WARP" python3 benchmarks/warp_throughput.py --device cuda --skip-fit --seconds 2 --worlds $WORLDS \
    --out "$OUT/warp_throughput.json" 2>&1 | tee "$OUT/warp_throughput.log"
  echo "rc=$?" | tee -a "$OUT/warp_throughput.log"
}
check_test() {
  step "pytest -m gpu"
  run_for "$T_TEST" python3 -m pytest -q -m gpu tests --ignore=tests/test_notebook.py -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu.log"
  echo "rc=$?" | tee -a "$OUT/pytest_gpu.log"
}
check_fit() {
  step "vaco fit on Warp on cuda (Hopper, VACO, 500 x 1,000, cuda_graph $GRAPH)"
  rm -rf /tmp/run; mkdir -p /tmp/run
  MLFLOW_TRACKING_URI=sqlite:////tmp/run/mlflow.db run_for "$T_FIT" python3 -m vaco.commands.cli fit --config configs/env/hopper.yaml \
    --config configs/algo/vaco.yaml --config configs/collection/warp.yaml --config configs/hardware/gpu.yaml \
    --data.init_args.num_envs 500 --data.init_args.num_steps 1000 --data.init_args.collection.init_args.device cuda \
    --data.init_args.collection.init_args.cuda_graph "$GRAPH" --data.init_args.collection.init_args.evaluate_on gymnasium \
    --data.init_args.total_steps 1000000 --data.init_args.eval_every 0 --data.init_args.eval_episodes 2 \
    --trainer.default_root_dir /tmp/run --trainer.enable_progress_bar false 2>&1 | tee "$OUT/fit_warp_cuda.log"
  echo "rc=$?" | tee -a "$OUT/fit_warp_cuda.log"
  python3 - <<'PY' 2>&1 | tee -a "$OUT/fit_warp_cuda.log"
import mlflow
c = mlflow.MlflowClient("sqlite:////tmp/run/mlflow.db")
for r in c.search_runs([e.experiment_id for e in c.search_experiments()]):
    print(r.info.status, {k: round(v, 3) for k, v in sorted(r.data.metrics.items()) if k.startswith(("perf/", "eval/", "train/episode"))})
    for key in ("perf/collect_seconds", "perf/update_seconds", "perf/sps"):
        print(key, [round(m.value, 3) for m in c.get_metric_history(r.info.run_id, key)])
PY
}
check_update() {
  step "paper-scale update (VACO, 500 x 1,000, learner on cuda)"
  run_for "$T_UPDATE" python3 benchmarks/profile_update.py --algorithm vaco --num-envs 500 --num-steps 1000 --iterations 2 \
    --no-profile --device cuda --collect-on warp 2>&1 | tee "$OUT/profile_update.log"
  echo "rc=$?" | tee -a "$OUT/profile_update.log"
}
check_llm() {
  # The LLM track's GPU figures: the two decoders training can use (vaco's loop, model.generate with vaco's
  # draw; sampled, alternating pairs, the declared 5% rule), then transformers' paged continuous batching and a
  # StaticCache step under torch.compile(mode="reduce-overhead") (CUDA graphs), on Qwen2.5-0.5B's
  # architecture with random weights (no model files on the machine; the timing does not depend on them)
  step "LLM decoding on cuda (Qwen2.5-0.5B architecture, random weights, bf16)"
  run_for "$T_LLM" python3 benchmarks/llm_decoding.py --architecture qwen2.5-0.5b --device cuda --dtype bfloat16 \
    --rows 64 --slots 32 --max-new-tokens 256 --repeats 3 --extras --steps 64 --out "$OUT/llm_decoding.json" 2>&1 | tee "$OUT/llm_decoding.log"
  echo "rc=$?" | tee -a "$OUT/llm_decoding.log"
}
check_population() {
  # The populations' GPU check. (1) env steps/s of one Warp env of 500, 2,000 and 8,000 Hopper worlds: the
  # simulator of populations of 1, 4 and 16 x 500 worlds (a population's members step as blocks of
  # one model, vaco.population.lockstep). (1b) the collection of 1, 4 and 16 members x 500 worlds in turn
  # against lockstep, side by side in one process (batches compared; on cuda equality is reported,
  # not required: Warp's atomics). (2) two iterations of `vaco fit` at the paper's 500 x 1,000 as a
  # population of 1 and of $POP: the aggregate end-to-end steps/s (collection in lockstep, the update
  # batched; the members' policy calls and learner passes one after another). Goal: POP=16 >= 10x POP=1.
  check_population_worlds; check_population_fit; check_population_collection
}
check_population_worlds() {
  step "populations on Warp on cuda: one env of 500 / 2,000 / 8,000 worlds"
  run_for "$T_POP_WARP" python3 benchmarks/warp_throughput.py --device cuda --skip-fit --seconds 2 --worlds 500 2000 8000 \
    --out "$OUT/population_worlds.json" 2>&1 | tee "$OUT/population_worlds.log"
  echo "rc=$?" | tee -a "$OUT/population_worlds.log"
}
check_population_collection() {
  step "populations on Warp on cuda: S members x 500 worlds collected in turn and in lockstep, side by side"
  run_for "$T_POP_COLLECT" python3 benchmarks/population_collection.py --device cuda --members ${MEMBERS:-1 4 16} --worlds 500 \
    --steps 32 --iterations 3 --rounds 1 --out "$OUT/population_collection.json" 2>&1 | tee "$OUT/population_collection.log"
  echo "rc=$?" | tee -a "$OUT/population_collection.log"
}
check_population_fit() {
  for p in ${POPS:-1 $POP}; do  # POPS="16": only that population
    step "vaco fit --population $p on Warp on cuda (Hopper, VACO, 500 x 1,000, 2 iterations, cuda_graph $GRAPH)"
    rm -rf /tmp/runp; mkdir -p /tmp/runp
    start=$(date +%s.%N)
    MLFLOW_TRACKING_URI=sqlite:////tmp/runp/mlflow.db run_for "$T_POP_FIT" python3 -m vaco.commands.cli fit --config configs/env/hopper.yaml \
      --config configs/algo/vaco.yaml --config configs/collection/warp.yaml --config configs/hardware/gpu.yaml \
      --data.init_args.num_envs 500 --data.init_args.num_steps 1000 --data.init_args.collection.init_args.device cuda \
      --data.init_args.collection.init_args.cuda_graph "$GRAPH" --data.init_args.collection.init_args.evaluate_on gymnasium \
      --data.init_args.total_steps 1000000 --data.init_args.eval_every 0 --data.init_args.eval_episodes 2 \
      --trainer.default_root_dir /tmp/runp --trainer.enable_progress_bar false --population "$p" 2>&1 | tee "$OUT/population_fit_$p.log"
    rc=$?; end=$(date +%s.%N)
    python3 - "$p" "$start" "$end" "$rc" <<'PY' 2>&1 | tee -a "$OUT/population_fit_$p.log"
import sys, mlflow
p, start, end, rc = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
wall = end - start
print(f"population {p}: rc={rc}, wall {wall:.1f} s (start-up, compile and both iterations), aggregate {p * 1_000_000 / wall:,.0f} env steps/s")
c = mlflow.MlflowClient("sqlite:////tmp/runp/mlflow.db")
per = []
for r in c.search_runs([e.experiment_id for e in c.search_experiments()]):
    hist = {k: [round(m.value, 3) for m in c.get_metric_history(r.info.run_id, k)] for k in ("perf/collect_seconds", "perf/update_seconds", "perf/sps")}
    print(r.info.status, r.data.tags.get("vaco.population_member"), hist)
    per.append(hist)
for i in range(min((len(h["perf/collect_seconds"]) for h in per), default=0)):
    busy = sum(h["perf/collect_seconds"][i] + h["perf/update_seconds"][i] for h in per)  # each member's share
    print(f"iteration {i + 1}: {len(per)} member(s), collect + update {busy:.2f} s, aggregate {len(per) * 500_000 / busy:,.0f} steps/s")
PY
  done
}
for c in ${CHECKS:-population llm warp test fit update}; do "check_$c"; done  # check_test: `test` is a shell builtin
step done
