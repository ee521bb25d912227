#!/bin/bash
# Real asynchronous VACO on a SLURM cluster: one learner task, N-1 actor tasks on any nodes.
#
# The actors are ranks 1..N-1 of a torch.distributed (gloo) group whose rank 0 is the learner
# (TorchRL's DistributedCollector with launcher=submitit_delayed): batches travel with
# TensorDict.isend/irecv, the policy-version buffer with TorchRL's DistributedWeightSyncScheme.
# Each actor steps num_envs / (N-1) envs with one CPU.
#
#   sbatch --nodes=3 --ntasks=65 --cpus-per-task=1 scripts/slurm_async.sh \
#       --config configs/env/hopper.yaml --config configs/algo/vaco.yaml \
#       --data.init_args.num_envs 512 --data.init_args.num_steps 256 --data.init_args.total_steps 100000000
#
# Extra arguments go to `vaco fit`. --kill-on-bad-exit makes a crashed actor (or learner) end the
# whole job instead of leaving the others waiting; resume with `--ckpt_path <dir>/last.ckpt`.
#SBATCH --job-name=vaco-async
#SBATCH --cpus-per-task=1
#SBATCH --time=24:00:00
set -euo pipefail

VENV=${VENV:-.venv}
PORT=${PORT:-29610}                     # the learner uses PORT, PORT+1 and PORT+2
ACTORS=$(( SLURM_NTASKS - 1 ))
LEARNER=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export OMP_NUM_THREADS=1

# rank 0: the learner, on the first node
srun --nodes=1 --ntasks=1 --nodelist="$LEARNER" --kill-on-bad-exit=1 \
    "$VENV/bin/vaco" fit "$@" \
    --config configs/collection/distributed2.yaml \
    --data.init_args.collection.init_args.launcher submitit_delayed \
    --data.init_args.collection.init_args.num_workers "$ACTORS" \
    --data.init_args.collection.init_args.tcp_port "$PORT" &

# ranks 1..ACTORS: the actors, wherever SLURM puts them
srun --ntasks="$ACTORS" --kill-on-bad-exit=1 bash -c \
    "exec $VENV/bin/python -m vaco.data.parallel.distributed --rank \$((SLURM_PROCID + 1)) \
     --world-size $(( ACTORS + 1 )) --learner-host $LEARNER --tcp-port $PORT" &

wait
