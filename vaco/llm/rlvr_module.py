"""The RLVR LightningModule: one generation batch with the policy beta, then N minibatches in turn.

The paper's "Forward Policy Lag in RLVR" experiment (GRPO vs VACO-GRPO on GSM8k):

1. draw N prompt minibatches from the data module; generate G completions per prompt with the
   current policy beta (temperature 1.0), recording ``behavior_log_prob`` of every token;
2. score each completion with the verifiable reward and compute the group-relative advantage
   (once, for the whole generation batch);
3. train the N minibatches one after another, one optimiser step each: minibatch k is trained
   by a policy k-1 steps ahead of beta (forward lag). The objective (PPO-clip with DAPO's
   clip-higher = GRPO, or the TV filter = VACO-GRPO) is token-level with token-mean aggregation;
   there is no critic. As there is no backward lag, no advantage realignment is needed (the
   paper sets the realignment ratio to 1);
4. every ``data.eval_every`` optimiser steps: greedy decoding on the test split, ``eval/accuracy``.

MLflow steps are optimiser steps; every minibatch logs its own clip/filter fraction and TV.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from typing import Any, ClassVar

import torch
from tensordict import TensorDict

from vaco import _checks
from vaco.learners.learner import Learner, NonFiniteLossError, plain_fields
from vaco.learners.step_size import StepSize, log_importance_weights, scaled_step
from vaco.lightning_private import reopen_finished_epoch, uncount_current_batch
from vaco.llm.advantage import GroupRelative
from vaco.llm.batches import SEQUENCE_KEYS, LagTally, batch_metrics, to_device, trim
from vaco.llm.policy import (
    DECODERS,
    GenerationStopped,
    check_model_dir,
    completion_log_probs,
    cut_at_stop_strings,
    encode_prompts,
    generate,
    load_causal_lm,
    load_tokenizer,
    resolve_compute_dtype,
)
from vaco.llm.reward import STOP_STRINGS, answer_span
from vaco.llm.stopped import StoppedBatch
from vaco.objectives import Objective, metric_name
from vaco.objectives.objective_math import total_variation
from vaco.tracking import AXES_PARAM, FRACTION_PARAM, SCORE_PARAM, declared_axes

__all__ = ["RLVRModule"]


def _algorithm_name(objective: Objective, step_size: StepSize | None = None) -> str:
    """The objective's name with the group-relative advantage (``grpo``, ``vaco_grpo``); with a
    step-size rule, its suffix after it (``grpo_ess_step``)."""
    name = objective.algorithm_name("group")
    return name if step_size is None else f"{name}_{step_size.suffix}"


class RLVRModule(Learner):
    """GRPO-style RL with a verifiable reward, with swappable token-level objectives.

    Args:
        objective: the policy objective (``class_path`` in YAML): ``vaco.objectives.PPOClip``
            (GRPO: ``clip_epsilon`` 0.2, ``clip_epsilon_high`` 0.272) or ``vaco.objectives.TVFilter``
            (VACO-GRPO: ``delta`` 0.05), with ``normalize_advantage: false`` (GRPO's advantages are
            already normalised per group).
        model_path: local directory of a ``transformers`` causal LM and its tokenizer
            (``save_pretrained`` layout, e.g. a download of Qwen/Qwen2.5-0.5B).
        num_minibatches: N, minibatches (= optimiser steps) per generation batch; minibatch k
            is trained k-1 steps after the policy that generated it (the paper: 1 to 32).
        completions_per_prompt: G, completions per prompt (the paper: 8).
        lr: AdamW learning rate, constant (the paper: 1e-6).
        adam_eps: AdamW epsilon.
        weight_decay: AdamW weight decay.
        max_grad_norm: global gradient-norm clip (null: none).
        temperature: sampling temperature of beta (the paper: 1.0); the learner's log-probs use the
            same temperature so the ratio compares like with like.
        max_prompt_length: prompts longer than this many tokens keep their end (the paper: 512).
        max_completion_length: generation stops here if no EOS came (the paper: 512).
        eval_max_completion_length: the same for greedy evaluation (default: max_completion_length).
        micro_batch_size: sequences per forward/backward (gradient accumulation inside a
            minibatch, to fit a GPU); default: the whole minibatch. The loss stays the token mean
            over the minibatch, and the TV filter still tests the minibatch's TV: it is measured in
            one no-grad pass before the micro-batched backward (one optimiser step per minibatch
            makes that exact).
        generation_batch_size: sequences decoding at once (default: the whole generation batch). A
            sequence that ends leaves at once and a waiting prompt takes its slot (continuous batching);
            the samples do not depend on it (each sequence has its own random stream; up to float32
            rounding of the logits).
        eval_batch_size: prompts decoded at once during evaluation.
        decoder: ``vaco`` (its own loop: continuous batching, a finished row's slot refilled) or
            ``transformers`` (``model.generate`` on padded chunks, vaco's per-row draw and stop check
            around it). The same per-row draws either way, so the same samples up to float32 rounding
            of the logits (:func:`vaco.llm.policy.generate`); which is faster
            depends on the machine and how long rows run (docs/llm.md, ``benchmarks/llm_decoding.py``).
        dtype: the compute dtype (``float32``; ``bfloat16`` on GPUs, as the paper trains). The weights
            and AdamW's state stay float32 (master weights) and the forward passes run under
            ``torch.autocast`` in this dtype: Lightning's ``bf16-mixed``, owned by the module so that
            the config's one field sets it. (Weights stored in bfloat16 and updated in place would
            not move at lr 1e-6: a step is below bfloat16's resolution for nearly every weight.)
            On a CPU, ``bfloat16`` falls back to float32 with a warning (bfloat16 matmuls there
            are many times slower). ``float16`` is refused: it needs loss scaling.
        gradient_checkpointing: trade compute for memory in the backward pass.
        rescore_behavior: replace the behaviour log-probs of the KV-cached generation pass by the
            training forward's (no grad), so that pi/beta compares one computation with itself: in
            bfloat16 the two passes differ, which would show up as lag at lag 0.
            ``lag/rescore_tv`` logs the TV between the two.
        stop_strings: a completion ends at the token that completes the first of these (default
            :data:`vaco.llm.reward.STOP_STRINGS`: a new ``Question:`` and chat templates' end
            markers): the tokens after it are neither trained on nor scored, and the answer is read
            from the text before it (``####``-marked, else the last number). ``[]``: EOS only.
        algorithm_name: the ``algorithm`` MLflow param; by default the name the objective declares
            for the group-relative advantage (``grpo`` for PPOClip, ``vaco_grpo`` for TVFilter).
        variant_of: the algorithm this run is an ablation or control of (see ``VacoModule``).
    """

    stop_boundary = "this minibatch (in generation or evaluation: the next token)"

    #: the config key a sweep's ``K`` axis sets: N minibatches per generation batch (the lag)
    lag_key: ClassVar[str] = "model.init_args.num_minibatches"
    #: the metric a run is scored by (the report's final score)
    score_metric: ClassVar[str] = "eval/accuracy"
    score_format: ClassVar[str] = ".3f"
    #: hyperparameters a resumed run may change: evaluation, and the run's label
    resumable_hparams: ClassVar[tuple[str, ...]] = (
        "algorithm_name",
        "variant_of",
        "dtype",  # the compute dtype: the weights are float32 either way
        "eval_batch_size",
        "eval_max_completion_length",
        "micro_batch_size",
        "gradient_checkpointing",
        "decoder",  # the same draws with either (a resume that changes it is correct, not bit-exact)
    )

    def __init__(
        self,
        objective: Objective,
        model_path: str,
        num_minibatches: int = 1,
        completions_per_prompt: int = 8,
        lr: float = 1e-6,
        adam_eps: float = 1e-8,
        weight_decay: float = 0.0,
        max_grad_norm: float | None = 1.0,
        temperature: float = 1.0,
        max_prompt_length: int = 512,
        max_completion_length: int = 512,
        eval_max_completion_length: int | None = None,
        micro_batch_size: int | None = None,
        generation_batch_size: int | None = None,
        eval_batch_size: int = 256,
        decoder: str = "vaco",
        dtype: str = "float32",
        gradient_checkpointing: bool = False,
        rescore_behavior: bool = True,
        stop_strings: list[str] | None = None,
        algorithm_name: str | None = None,
        variant_of: str | None = None,
        step_size: StepSize | None = None,
    ) -> None:
        super().__init__(objective, algorithm_name or _algorithm_name(objective, step_size), variant_of)
        if step_size is not None and not isinstance(step_size, StepSize):
            raise TypeError(
                f"`model.step_size` must be a vaco.learners.step_size.StepSize, got {type(step_size).__name__}"
            )
        if objective.reestimate_advantage:
            raise ValueError(
                f"`model.objective`: {type(objective).__name__} re-estimates V-trace with a critic; RLVR has none"
            )
        problem = objective.unsupported("llm")
        if problem is not None:
            raise ValueError(f"`model.objective`: {problem}")
        optional = (
            ("eval_max_completion_length", eval_max_completion_length),
            ("micro_batch_size", micro_batch_size),
            ("generation_batch_size", generation_batch_size),
        )
        _checks.integers(
            "model",
            ("num_minibatches", num_minibatches, 1),
            ("completions_per_prompt", completions_per_prompt, 2),
            ("max_prompt_length", max_prompt_length, 1),
            ("max_completion_length", max_completion_length, 1),
            ("eval_batch_size", eval_batch_size, 1),
            *((name, value, 1) for name, value in optional if value is not None),
        )
        if not (isinstance(lr, (int, float)) and lr > 0 and math.isfinite(lr)):
            raise ValueError(f"`model.lr` must be > 0, got {lr!r}")
        if not (adam_eps > 0 and weight_decay >= 0):
            raise ValueError(
                f"`model.adam_eps` must be > 0 and `model.weight_decay` >= 0, got {adam_eps!r}, {weight_decay!r}"
            )
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise ValueError(f"`model.max_grad_norm` must be > 0 or null, got {max_grad_norm!r}")
        if not (isinstance(temperature, (int, float)) and temperature > 0 and math.isfinite(temperature)):
            raise ValueError(
                f"`model.temperature` must be > 0 (the behaviour policy must be stochastic), got {temperature!r}"
            )
        if decoder not in DECODERS:
            raise ValueError(f"`model.decoder` must be one of {', '.join(DECODERS)}, got {decoder!r}")
        if dtype not in ("float32", "bfloat16"):
            raise ValueError(
                f"`model.dtype` must be float32 or bfloat16 (float16 would need loss scaling), got {dtype!r}"
            )
        if stop_strings is not None and not (
            isinstance(stop_strings, (list, tuple)) and all(isinstance(x, str) and x for x in stop_strings)
        ):
            raise ValueError(f"`model.stop_strings` must be a list of non-empty strings, got {stop_strings!r}")
        check_model_dir(model_path, "model.model_path")
        self.save_hyperparameters(ignore=["objective", "step_size"])
        #: the learner-side correction: a factor on each optimiser step (vaco.learners.step_size); None for none
        self.step_size = step_size
        self.advantage = GroupRelative()
        self.policy: torch.nn.Module | None = None
        self.tokenizer = None
        self._generator: torch.Generator | None = None
        self._generator_state: torch.Tensor | None = None
        self.initial_eval_accuracy = float("nan")
        self.last_eval_accuracy = float("nan")
        self._pending: StoppedBatch | None = None  # a generation batch a stop interrupted
        self._initial_eval_pending = False  # a stop came during the first evaluation
        self.compute_dtype: torch.dtype = torch.float32  # resolved for the device in on_fit_start

    # ------------------------------------------------------------------ construction
    @property
    def stop_strings(self) -> tuple[str, ...]:
        stops = self.hparams.stop_strings
        return STOP_STRINGS if stops is None else tuple(stops)

    @property
    def num_minibatches(self) -> int:
        return self.hparams.num_minibatches

    def total_iterations(self) -> int | None:
        """Generation batches: ``data.num_steps`` optimiser steps, N per batch."""
        return self.data.num_steps // self.num_minibatches if self.data is not None else None

    @property
    def last_score(self) -> float:
        return self.last_eval_accuracy

    def configure_model(self) -> None:
        if self.policy is not None:
            return
        path = self.hparams.model_path
        self.tokenizer = load_tokenizer(path)
        # float32 master weights whatever the compute dtype (see `dtype`)
        self.policy = load_causal_lm(path, "float32")
        self.policy.train()
        if self.hparams.gradient_checkpointing:  # transformers 5.x's name (gradient_checkpointing_enable goes in 6)
            enable = getattr(self.policy, "activation_checkpointing_enable", None)
            (enable or self.policy.gradient_checkpointing_enable)()

    def autocast(self):
        """The forward passes' precision context: ``torch.autocast`` in the compute dtype, or nothing in float32."""
        if self.compute_dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.compute_dtype)

    def check_data(self, data) -> None:
        """Cross-field checks between this module and the data module (before any generation)."""
        if data.num_steps % self.num_minibatches:
            raise ValueError(
                f"`data.num_steps` ({data.num_steps}) must be a multiple of `model.num_minibatches` "
                f"({self.num_minibatches}): every generation batch is trained as N minibatches"
            )

    def configure_optimizers(self):
        return torch.optim.AdamW(
            self.policy.parameters(),
            lr=self.hparams.lr,
            eps=self.hparams.adam_eps,
            weight_decay=self.hparams.weight_decay,
        )

    # ------------------------------------------------------------------ fit hooks
    def on_fit_start(self) -> None:
        if self.trainer.world_size > 1:
            raise NotImplementedError("the RLVR module runs on one device (`trainer.devices: 1`)")
        data = self.data
        self.compute_dtype = resolve_compute_dtype(self.hparams.dtype, self.device.type)
        self._generator = torch.Generator(device=self.device)
        if self._generator_state is not None:  # a resumed run continues its sampling stream
            self._generator.set_state(self._generator_state)
        else:
            self._generator.manual_seed(data.seed)
        self.log_run_params()
        if not self._restored or self._initial_eval_pending:  # the supervised start, at step 0
            try:
                metrics = self.evaluate(should_stop=self._stop_during_generation)
            except GenerationStopped:
                # a stop signal during the first evaluation: nothing is logged; the first training
                # step's generation stops at once and checkpoints (the batch to generate again, and
                # this evaluation still to do), so the run exits within a token, as during training
                self._initial_eval_pending = True
            else:
                self._initial_eval_pending = False
                self.initial_eval_accuracy = self.last_eval_accuracy
                self.log_metrics(metrics, step=0)

    def defining_modules(self) -> dict[str, torch.nn.Module]:
        out = {"objective": self.objective}
        if self.step_size is not None:  # a run without one keeps the definition it had before the setting existed
            out["step_size"] = self.step_size
        return out

    def run_params(self) -> dict[str, Any]:
        """The coordinates a user compares runs by, as flat MLflow params."""
        data = self.data
        params: dict[str, Any] = {
            "algorithm": self.algorithm,
            "objective": type(self.objective).__name__,
            "step_size": None if self.step_size is None else type(self.step_size).__name__,
            "task": "gsm8k",
            "env": "gsm8k",  # the report's task
            "N": self.num_minibatches,
            "K": self.num_minibatches,  # the report's degree of asynchrony: N minibatches per batch
            "G": self.hparams.completions_per_prompt,
            "prompts_per_minibatch": data.prompts_per_minibatch,
            "num_steps": data.num_steps,
            "seed": data.seed,
            "delta": getattr(self.objective, "delta", None),
            "clip_epsilon": getattr(self.objective, "clip_epsilon", None),
            "clip_epsilon_high": getattr(self.objective, "clip_epsilon_high", None),
            "model_path": self.hparams.model_path,
            "train_path": data.train_path,
            AXES_PARAM: ",".join(declared_axes(self.objective)),
            FRACTION_PARAM: f"train/{self.objective.fraction_metric}",
            SCORE_PARAM: self.score_metric,
        }
        for key, value in plain_fields(self.objective, buffers=True).items():
            params[f"objective.{key}"] = value
        return params

    def default_run_name(self, data) -> str:
        """The MLflow run's name from its coordinates, e.g. ``vaco_grpo gsm8k N=4 delta=0.05 s1``."""
        delta = getattr(self.objective, "delta", None)
        return (
            f"{self.algorithm} gsm8k N={self.num_minibatches}"
            + (f" delta={delta:g}" if delta is not None else "")
            + f" s{data.seed}"
        )

    def summary(self) -> str | None:
        line = super().summary()
        return line and f"{line} (supervised start {self.initial_eval_accuracy:.3f})"

    # ------------------------------------------------------------------ the generation batch
    def training_step(self, dataloader_iter) -> None:
        """One generation batch: generate (or take the batch a stop interrupted), train its N
        minibatches (minibatch k k-1 steps after beta), then the batch's metrics. A stop during
        generation or between minibatches leaves :attr:`_pending` for the checkpoint written then."""
        stopped, self._pending = self._pending, None
        if stopped is not None and stopped.minibatches is not None:  # resumed inside a batch: its remaining minibatches
            batch = dataclasses.replace(stopped, minibatches=[to_device(m, self.device) for m in stopped.minibatches])
        else:
            batch = self._generate(dataloader_iter, None if stopped is None else stopped.regenerate)
            if batch is None:
                return
        if not self._train(batch):
            return
        self.version += 1
        metrics = batch_metrics(
            batch,
            int(self.version),
            self.num_minibatches,
            self.data.prompts_per_minibatch * self.hparams.completions_per_prompt,
        )
        if self.should_evaluate():
            metrics.update(self.evaluate())
        self.log_metrics(metrics, step=int(self.version) * self.num_minibatches)

    def _generate(self, dataloader_iter, regenerate: int | None) -> StoppedBatch | None:
        """The next generation batch's minibatches, generated with the policy as it is after the
        last update (pulled here, not prefetched), or the batch ``regenerate`` (its stream index) a
        stop abandoned; None where a stop comes during generation."""
        data = self.data
        if regenerate is not None:
            index, prompt_batches = regenerate, data.stream.item(regenerate)
        else:
            prompt_batches, _, _ = next(dataloader_iter)
            index = data.stream.position - 1  # the generation batch just pulled
        start = time.perf_counter()
        self.policy.eval()
        before = self._generator.get_state() if self._generator is not None else None
        try:
            minibatches = [self._rollout(batch, should_stop=self._stop_during_generation) for batch in prompt_batches]
        except GenerationStopped:
            # SIGTERM/SIGUSR2 during generation: abandon the batch (nothing of it trained or logged), put
            # the sampler back where the batch began, keep its index; the checkpoint written now
            # (IterationCheckpoint) is the state after the last finished step, and the resume
            # regenerates the same batch
            if before is not None:
                self._generator.set_state(before)
            self._pending = StoppedBatch(regenerate=index)
            uncount_current_batch(self.trainer)
            return None
        return StoppedBatch(minibatches=minibatches, generate_seconds=time.perf_counter() - start)

    def _train(self, batch: StoppedBatch) -> bool:
        """The batch's minibatches from ``batch.next``, one optimiser step each; False where a stop
        comes between two (the batch is kept in :attr:`_pending` and a resume trains the rest)."""
        start = time.perf_counter()
        self.policy.train()
        steps_before = int(self.version) * self.num_minibatches
        minibatches = batch.minibatches
        for k in range(batch.next, len(minibatches)):
            metrics = self._train_minibatch(minibatches[k], k)
            metrics["lag/steps_behind"] = k
            batch.tvs.append(metrics["train/tv"])
            self.log_metrics(metrics, step=steps_before + k + 1)
            if k + 1 < len(minibatches) and self._stop_requested():
                # SIGTERM/SIGUSR2 mid-batch: stop at this minibatch boundary; the checkpoint written
                # now (IterationCheckpoint) holds the batch's minibatches, and a resume trains the rest
                self._pending = dataclasses.replace(
                    batch,
                    minibatches=[to_device(m, "cpu") for m in minibatches],
                    next=k + 1,
                    update_seconds=batch.update_seconds + time.perf_counter() - start,
                )
                uncount_current_batch(self.trainer)
                return False
        batch.update_seconds += time.perf_counter() - start
        return True

    def _stop_during_generation(self) -> bool:
        """A stop signal, asked before every generated token (one process only: under DDP the ranks
        would have to agree at every token, and they decode different numbers of them; they stop at
        the next minibatch boundary instead)."""
        return self.trainer.world_size == 1 and self._stop_requested()

    @torch.no_grad()
    def _rollout(self, batch: dict[str, list], should_stop=None) -> dict[str, Any]:
        """G completions of every prompt with beta, their rewards and token advantages."""
        G = self.hparams.completions_per_prompt
        prompt_ids, prompt_mask, n_truncated = encode_prompts(
            self.tokenizer, batch["prompt"], self.hparams.max_prompt_length
        )
        prompt_ids = prompt_ids.repeat_interleave(G, 0).to(self.device)
        prompt_mask = prompt_mask.repeat_interleave(G, 0).to(self.device)
        with self.autocast():
            generated = generate(
                self.policy,
                prompt_ids,
                prompt_mask,
                max_new_tokens=self.hparams.max_completion_length,
                eos_token_id=self.tokenizer.eos_token_id,
                pad_token_id=self.tokenizer.pad_token_id,
                temperature=self.hparams.temperature,
                generator=self._generator,
                tokenizer=self.tokenizer,  # a row ends at EOS or a stop string, and its slot is refilled
                stop_strings=self.stop_strings,
                should_stop=should_stop,
                slots=self.hparams.generation_batch_size,
                decoder=self.hparams.decoder,
            )
        out = self._cut(generated)
        texts = self.tokenizer.batch_decode(out["completion_ids"], skip_special_tokens=True)
        targets = [t for t in batch["target"] for _ in range(G)]
        spans = [answer_span(x, self.stop_strings) for x in texts]
        reward = torch.tensor(self.data.score(spans, targets), device=self.device).view(-1, G)
        groups = self.advantage(TensorDict({"reward": reward}, batch_size=reward.shape))
        mask = out["completion_mask"]
        behavior_log_prob, rescore_tv = out["behavior_log_prob"], None
        if self.hparams.rescore_behavior:
            rescored = self._score(
                {
                    "prompt_ids": prompt_ids,
                    "prompt_mask": prompt_mask,
                    "completion_ids": out["completion_ids"],
                    "completion_mask": mask,
                }
            )
            rescore_tv = total_variation(rescored - behavior_log_prob, mask)
            behavior_log_prob = rescored
        return {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "completion_ids": out["completion_ids"],
            "completion_mask": mask,
            "behavior_log_prob": behavior_log_prob,
            "rescore_tv": rescore_tv,
            "advantage": self.advantage.per_token(groups["advantage"].reshape(-1), mask),
            "reward": reward,
            "truncated": out["truncated"],
            "prompt_truncated": n_truncated,
        }

    def _cut(self, out: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """End the completions at their first stop string (:func:`vaco.llm.policy.cut_at_stop_strings`)."""
        mask, stopped = cut_at_stop_strings(
            self.tokenizer, out["completion_ids"], out["completion_mask"], self.stop_strings
        )
        out = dict(out)
        out["completion_mask"] = mask
        out["completion_ids"] = out["completion_ids"].masked_fill(~mask, self.tokenizer.pad_token_id)
        if "behavior_log_prob" in out:
            out["behavior_log_prob"] = out["behavior_log_prob"].masked_fill(~mask, 0.0)
        out["truncated"] = out["truncated"] & ~stopped
        return out

    def _log_probs(self, part: dict[str, torch.Tensor], **kwargs):
        """The policy's completion log-probs (and entropy) of a micro-batch, in the compute dtype."""
        with self.autocast():
            return completion_log_probs(
                self.policy,
                part["prompt_ids"],
                part["prompt_mask"],
                part["completion_ids"],
                part["completion_mask"],
                temperature=self.hparams.temperature,
                **kwargs,
            )

    @torch.no_grad()
    def _score(self, mb: dict[str, torch.Tensor]) -> torch.Tensor:
        """The training forward's log-probs of the completions ``[B, T]``, no grad, micro-batched."""
        B = mb["completion_ids"].shape[0]
        micro = self.hparams.micro_batch_size or B
        out = torch.zeros(mb["completion_ids"].shape, dtype=torch.float32, device=mb["completion_ids"].device)
        for i in range(0, B, micro):
            part = trim(
                {
                    key: mb[key][i : i + micro]
                    for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")
                }
            )
            log_prob, _ = self._log_probs(part)
            out[i : i + micro, : log_prob.shape[-1]] = log_prob
        return out

    def _train_minibatch(self, mb: dict[str, Any], k: int) -> dict[str, float]:
        """One optimiser step on one minibatch (micro-batched), token-mean loss over the minibatch."""
        optimizer = self.optimizers()
        optimizer.zero_grad(set_to_none=True)
        B = mb["completion_ids"].shape[0]
        micro = self.hparams.micro_batch_size or B
        total_tokens = mb["completion_mask"].sum().clamp(min=1)
        entropy_grad = self.objective.entropy_coef > 0 and not self.objective.entropy_in_surrogate
        minibatch_tv = None
        if micro < B and self.objective.needs_minibatch_tv:
            # the filter's test is on the minibatch's TV (one optimiser step), not each micro-batch's
            minibatch_tv = total_variation(self._score(mb) - mb["behavior_log_prob"], mb["completion_mask"])
        sums: dict[str, torch.Tensor] = {}
        weights: list[torch.Tensor] = []  # the minibatch's log importance weights, for a step-size rule that reads them
        lag = LagTally(self.objective) if micro < B else None  # the lag diagnostics over the whole minibatch
        for i in range(0, B, micro):
            part = trim({key: mb[key][i : i + micro] for key in SEQUENCE_KEYS})
            log_prob, entropy = self._log_probs(part, with_entropy=True, entropy_grad=entropy_grad)
            log_ratio = log_prob.detach() - part["behavior_log_prob"]
            if self.step_size is not None and self.step_size.reads_weights:
                weights.append(log_importance_weights(log_ratio, part["completion_mask"], self.step_size.level))
            inputs = {
                "log_prob": log_prob,
                "behavior_log_prob": part["behavior_log_prob"],
                "advantage": part["advantage"],
                "entropy": entropy,
                "mask": part["completion_mask"],
            }
            if minibatch_tv is not None:
                inputs["minibatch_tv"] = minibatch_tv
            if lag is not None:
                lag.add(log_ratio, inputs)
            out = self.objective(inputs)
            weight = part["completion_mask"].sum() / total_tokens
            loss = sum(v for key, v in out.items() if key.startswith("loss_"))
            if not torch.isfinite(loss):
                raise NonFiniteLossError(
                    f"non-finite loss ({float(loss)}) at generation batch {int(self.version)}, minibatch {k}; "
                    "nothing was applied"
                )
            self.manual_backward(loss * weight)
            for key, value in out.items():
                value = value.detach()
                if key == "ratio_max":
                    sums[key] = torch.maximum(sums.get(key, value), value)
                else:
                    sums[key] = sums.get(key, 0.0) + value * weight
        if (
            lag is not None
        ):  # micro-batched: the minibatch's own ESS and tail, not a weighted mean of the micro-batches'
            sums.update(lag.finish())
        grad_norm = torch.nn.utils.clip_grad_norm_(
            self.policy.parameters(), self.hparams.max_grad_norm if self.hparams.max_grad_norm is not None else math.inf
        )
        factor = None
        if (
            self.step_size is not None
        ):  # minibatch k of a generation batch is k optimiser steps behind its behaviour policy
            factor = self.step_size.factor(torch.cat(weights) if weights else None, torch.tensor(float(k)))
            sums["step_factor"] = factor.detach()
        if factor is None:
            optimizer.step()
        else:
            scaled_step(optimizer.step, optimizer.optimizer, factor)
        metrics = {metric_name(key): float(value) for key, value in sums.items()}
        metrics["train/grad_norm"] = float(grad_norm)
        return metrics

    # ------------------------------------------------------------------ evaluation and logging
    def should_evaluate(self) -> bool:
        """At the last step, and at each step a multiple of ``data.eval_every`` passed in this batch."""
        steps, data = int(self.version) * self.num_minibatches, self.data
        if steps >= data.num_steps:
            return True
        every = data.eval_every
        return every > 0 and steps // every > (steps - self.num_minibatches) // every

    def evaluate(self, should_stop=None) -> dict[str, float]:
        """Greedy decoding on the test split; ``eval/accuracy`` is the fraction answered correctly
        (:func:`vaco.llm.evaluation.answer`, what ``vaco evaluate`` runs on a checkpoint).
        ``should_stop``: asked before every token (:class:`GenerationStopped` when it answers true)."""
        from vaco.llm.evaluation import answer

        prompts, targets = self.data.test_set()
        greedy = answer(
            self.policy,
            self.tokenizer,
            prompts,
            targets,
            max_prompt_length=self.hparams.max_prompt_length,
            max_new_tokens=self.hparams.eval_max_completion_length or self.hparams.max_completion_length,
            stop_strings=self.stop_strings,
            batch_size=self.hparams.eval_batch_size,
            decoder=self.hparams.decoder,
            device=self.device,
            autocast=self.autocast,
            should_stop=should_stop,
            reward=self.data.reward,
        )
        self.last_eval_accuracy = sum(greedy.rewards) / len(greedy.rewards)
        return {
            "eval/accuracy": self.last_eval_accuracy,
            "eval/completion_length": sum(greedy.lengths) / len(greedy.lengths),
        }

    def progress_fields(self, metrics: dict[str, float], step: int) -> dict[str, str]:
        """Optimiser steps done/total, the latest mean reward and eval accuracy."""
        progress = dict(self.progress)
        progress["step"] = f"{step}/{self.data.num_steps}"
        if "train/reward" in metrics:
            progress["reward"] = f"{metrics['train/reward']:.2f}"
        if not math.isnan(self.last_eval_accuracy):
            progress["eval"] = f"{self.last_eval_accuracy:.3f}"
        return progress

    # ------------------------------------------------------------------ checkpoints
    # All sampling goes through the module's generator and the data stream is a function of its
    # position, so those two (and torch's global state, for any dropout) make the resume exact.
    def extra_state(self) -> dict[str, Any]:
        return {
            "generator": self._generator.get_state() if self._generator is not None else None,
            "initial_eval_accuracy": self.initial_eval_accuracy,
            "last_eval_accuracy": self.last_eval_accuracy,
            "num_steps": self.data.num_steps if self.data is not None else None,
            # a run stopped inside a generation batch: the batch and how far its minibatches got, or
            # (stopped during generation) the index of the batch to generate again
            "pending": None if self._pending is None else self._pending.state(),
            # stopped during the first evaluation (before any step): the resume runs it first
            "initial_eval_pending": self._initial_eval_pending,
        }

    def _stop_requested(self) -> bool:
        """Whether SIGTERM/SIGUSR2 asked the run to stop (:class:`vaco.run.callbacks.IterationCheckpoint`)."""
        callback = self._trainer.checkpoint_callback if self._trainer is not None else None
        stop = getattr(callback, "stop_requested", None)
        return bool(stop(self.trainer)) if stop is not None else False

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.configure_model()
        super().on_load_checkpoint(checkpoint)
        saved = checkpoint.get("vaco", {}).get("num_steps")
        if self._trainer is not None and self.data is not None and saved is not None and self.data.num_steps > saved:
            reopen_finished_epoch(checkpoint)  # a larger budget extends a finished run

    def restore_state(self, state: dict[str, Any]) -> None:
        super().restore_state(state)
        self._generator_state = state["generator"]
        self.initial_eval_accuracy = state["initial_eval_accuracy"]
        self.last_eval_accuracy = state["last_eval_accuracy"]
        self._pending = StoppedBatch.from_state(state.get("pending"))
        self._initial_eval_pending = bool(state.get("initial_eval_pending", False))
