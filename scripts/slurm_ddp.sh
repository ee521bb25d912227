#!/bin/bash
# Several learner devices with Lightning's DDP, each rank with its own local actor processes.
#
# Every DDP rank runs `data.num_workers` actor processes on its node (TorchRL's multi-process
# collectors) and trains on its own batches; gradients are all-reduced by DDP, the observation
# statistics are all-gathered, so every rank pushes the same policy version.
#
#   sbatch --nodes=2 --ntasks-per-node=2 --cpus-per-task=8 scripts/slurm_ddp.sh \
#       --config configs/env/hopper.yaml --config configs/algo/vaco.yaml \
#       --config configs/collection/async2.yaml --data.init_args.collection.init_args.num_workers 7 \
#       --data.init_args.num_envs 56 --data.init_args.num_steps 256
#
# (One CPU per rank for the learner, the rest for its actors; on GPU nodes add
# --trainer.accelerator gpu, untested here.) Lightning reads the SLURM
# environment: --trainer.num_nodes and --trainer.devices must match the allocation.
#SBATCH --job-name=vaco-ddp
#SBATCH --time=24:00:00
set -euo pipefail

VENV=${VENV:-.venv}
export OMP_NUM_THREADS=1
srun --kill-on-bad-exit=1 "$VENV/bin/vaco" fit "$@" \
    --trainer.strategy ddp \
    --trainer.num_nodes "$SLURM_JOB_NUM_NODES" \
    --trainer.devices "$SLURM_NTASKS_PER_NODE"
