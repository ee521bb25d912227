"""CleanRL's ``ppo_continuous_action.py`` (v1.0, gymnasium 1.x port), trimmed to its hot loops.

Used by ``throughput.py`` as a same-machine, same-run reference: the agent, the env wrappers
(FlattenObservation, RecordEpisodeStatistics, ClipAction, NormalizeObservation,
TransformObservation clip, NormalizeReward, TransformReward clip), the rollout loop and the
update loop follow CleanRL line by line; logging, seeding flags and checkpoints are left out.
CleanRL itself is not a dependency of vaco (it pins its own gym stack), so its two loops are
reproduced here rather than imported.
"""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
from torch.distributions.normal import Normal


def make_env(env_id: str, gamma: float):
    def thunk():
        env = gym.make(env_id)
        env = gym.wrappers.FlattenObservation(env)
        env = gym.wrappers.RecordEpisodeStatistics(env)
        env = gym.wrappers.ClipAction(env)
        env = gym.wrappers.NormalizeObservation(env)
        env = gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10), env.observation_space)
        env = gym.wrappers.NormalizeReward(env, gamma=gamma)
        env = gym.wrappers.TransformReward(env, lambda reward: np.clip(reward, -10, 10))
        return env

    return thunk


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):  # noqa: B008 - CleanRL's own signature
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, envs):
        super().__init__()
        obs = np.array(envs.single_observation_space.shape).prod()
        act = np.prod(envs.single_action_space.shape)
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor_mean = nn.Sequential(
            layer_init(nn.Linear(obs, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, act), std=0.01),
        )
        self.actor_logstd = nn.Parameter(torch.zeros(1, act))

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        action_mean = self.actor_mean(x)
        action_logstd = self.actor_logstd.expand_as(action_mean)
        action_std = torch.exp(action_logstd)
        probs = Normal(action_mean, action_std)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action).sum(1), probs.entropy().sum(1), self.critic(x)


def run(
    env_id: str,
    num_envs: int,
    num_steps: int,
    iterations: int,
    *,
    update_epochs: int = 10,
    num_minibatches: int = 32,
    seed: int = 1,
) -> dict[str, float]:
    """Run ``iterations`` CleanRL iterations; return median seconds per phase per iteration."""
    gamma, gae_lambda, clip_coef, ent_coef, vf_coef, max_grad_norm = 0.99, 0.95, 0.2, 0.0, 0.5, 0.5
    batch_size = num_envs * num_steps
    minibatch_size = batch_size // num_minibatches
    torch.manual_seed(seed)
    envs = gym.vector.SyncVectorEnv([make_env(env_id, gamma) for _ in range(num_envs)])
    agent = Agent(envs)
    optimizer = torch.optim.Adam(agent.parameters(), lr=3e-4, eps=1e-5)

    obs = torch.zeros((num_steps, num_envs) + envs.single_observation_space.shape)
    actions = torch.zeros((num_steps, num_envs) + envs.single_action_space.shape)
    logprobs = torch.zeros((num_steps, num_envs))
    rewards = torch.zeros((num_steps, num_envs))
    dones = torch.zeros((num_steps, num_envs))
    values = torch.zeros((num_steps, num_envs))

    next_obs, _ = envs.reset(seed=seed)
    next_obs = torch.Tensor(next_obs)
    next_done = torch.zeros(num_envs)
    collect, update = [], []
    for iteration in range(1, iterations + 1):
        frac = 1.0 - (iteration - 1.0) / iterations
        optimizer.param_groups[0]["lr"] = frac * 3e-4
        start = time.perf_counter()
        for step in range(num_steps):
            obs[step] = next_obs
            dones[step] = next_done
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[step] = value.flatten()
            actions[step] = action
            logprobs[step] = logprob
            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            next_done = np.logical_or(terminations, truncations)
            rewards[step] = torch.tensor(reward).view(-1)
            next_obs, next_done = torch.Tensor(next_obs), torch.Tensor(next_done)
        middle = time.perf_counter()

        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
            advantages = torch.zeros_like(rewards)
            lastgaelam = 0
            for t in reversed(range(num_steps)):
                if t == num_steps - 1:
                    nextnonterminal = 1.0 - next_done
                    nextvalues = next_value
                else:
                    nextnonterminal = 1.0 - dones[t + 1]
                    nextvalues = values[t + 1]
                delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
                advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
            returns = advantages + values

        b_obs = obs.reshape((-1,) + envs.single_observation_space.shape)
        b_logprobs = logprobs.reshape(-1)
        b_actions = actions.reshape((-1,) + envs.single_action_space.shape)
        b_advantages = advantages.reshape(-1)
        b_returns = returns.reshape(-1)
        b_values = values.reshape(-1)
        b_inds = np.arange(batch_size)
        for _epoch in range(update_epochs):
            np.random.shuffle(b_inds)
            for start_i in range(0, batch_size, minibatch_size):
                mb_inds = b_inds[start_i : start_i + minibatch_size]
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb_inds], b_actions[mb_inds])
                logratio = newlogprob - b_logprobs[mb_inds]
                ratio = logratio.exp()
                with torch.no_grad():
                    approx_kl = ((ratio - 1) - logratio).mean()  # noqa: F841 - CleanRL logs it
                    clipfrac = ((ratio - 1.0).abs() > clip_coef).float().mean().item()  # noqa: F841
                mb_advantages = b_advantages[mb_inds]
                mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
                pg_loss1 = -mb_advantages * ratio
                pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)
                pg_loss = torch.max(pg_loss1, pg_loss2).mean()
                newvalue = newvalue.view(-1)
                v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                v_clipped = b_values[mb_inds] + torch.clamp(newvalue - b_values[mb_inds], -clip_coef, clip_coef)
                v_loss_clipped = (v_clipped - b_returns[mb_inds]) ** 2
                v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
                loss = pg_loss - ent_coef * entropy.mean() + v_loss * vf_coef
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), max_grad_norm)
                optimizer.step()
        end = time.perf_counter()
        collect.append(middle - start)
        update.append(end - middle)
    envs.close()
    skip = 1 if iterations > 1 else 0  # the first iteration warms caches and allocators up
    collect_s, update_s = float(np.median(collect[skip:])), float(np.median(update[skip:]))
    return {
        "collect_seconds": collect_s,
        "update_seconds": update_s,
        "collect_sps": batch_size / collect_s,
        "update_samples_per_second": batch_size / update_s,
        "sps": batch_size / (collect_s + update_s),
    }
