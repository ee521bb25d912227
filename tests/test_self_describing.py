"""Objectives and advantage modules describe themselves; the learner, the sweep and the report ask
them and name no concrete class (issue 32, item 1). In-process: the real loader, grid and report
code on real module classes, some of them defined by a "user" module written into a temp folder."""

from __future__ import annotations

import shutil
import sys

import numpy as np
import pytest
import torch
import yaml

from helpers.report_runs import make_run
from helpers.runs import REPO
from vaco import sweep as S
from vaco.advantages import GAE, VTrace
from vaco.learners.vaco_module import VacoModule, default_algorithm_name
from vaco.objectives import IMPALA, PPOKL, SPO, Objective, PPOClip, TVFilter
from vaco.report.runs import Run, runs_from_frame, runs_to_frame
from vaco.report.scores import is_variant

USER_MODULE = '''
import torch
from vaco.advantages import VTrace
from vaco.objectives import Objective, TVFilter


class MyVTrace(VTrace):
    """A V-trace subclass: realigns, as its parent does (the sweep used to compare class paths)."""


class Capped(Objective):
    sweep_axes = {"rho_bar": "rho", "cap": "cap"}
    names = {"vtrace": "capped", "gae": "capped_gae"}
    variants = {"capped_gae": "capped"}

    def __init__(self, cap: float = 2.0, rho_bar: float = 1.0, **kwargs):
        super().__init__(**kwargs)
        self.cap, self.rho_bar = cap, rho_bar

    def surrogate(self, *, ratio, log_ratio, advantage, batch):
        return -ratio.clamp(max=self.cap) * advantage, {}


class QuietFilter(TVFilter):
    """A TV-filter subclass that does not name itself: another algorithm, not vaco."""
'''


@pytest.fixture
def user(tmp_path, monkeypatch):
    (tmp_path / "user_algos.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import user_algos

    yield user_algos
    sys.modules.pop("user_algos", None)


def test_the_paper_pairs_are_named_by_their_objectives():
    pairs = {
        "ppo_clip": (PPOClip(), GAE()),
        "ppo_kl": (PPOKL(), GAE()),
        "spo": (SPO(), GAE()),
        "impala": (IMPALA(), VTrace()),
        "vaco": (TVFilter(), VTrace()),
        "vaco_no_realign": (TVFilter(), GAE()),
        "PPOClip+VTrace": (PPOClip(), VTrace()),  # unnamed pair
    }
    for name, (objective, advantage) in pairs.items():
        assert default_algorithm_name(objective, advantage) == name
    assert TVFilter.algorithm_name("group") == "vaco_grpo" and PPOClip.algorithm_name("group") == "grpo"
    assert PPOKL.algorithm_name("group") == "PPOKL"  # PPOKL subclasses PPOClip but is not GRPO
    assert VTrace.realigns and not GAE.realigns and TVFilter.needs_minibatch_tv and not PPOClip.needs_minibatch_tv


def test_a_subclass_is_another_algorithm_until_it_names_itself(user):
    assert default_algorithm_name(user.QuietFilter(), VTrace()) == "QuietFilter+VTrace"
    assert user.QuietFilter.variants == {} and user.QuietFilter.needs_minibatch_tv  # behaviour is inherited
    assert default_algorithm_name(user.Capped(), user.MyVTrace()) == "capped"  # family inherited from VTrace
    module = VacoModule(objective=user.Capped(), advantage=GAE())
    assert module.algorithm == "capped_gae" and module.variant_of == "capped"
    module = VacoModule(objective=user.Capped(), advantage=VTrace(), variant_of="ppo_clip")
    assert module.algorithm == "capped" and module.variant_of == "ppo_clip"


def test_an_axis_declared_by_both_modules_must_agree(user):
    with pytest.raises(ValueError, match=r"`model.objective.init_args.rho_bar` \(2.0\) must equal `model.advantage"):
        VacoModule(objective=user.Capped(rho_bar=2.0), advantage=VTrace(rho_bar=1.0))
    with pytest.raises(ValueError, match=r"`model.objective.init_args.rho_bar` \(2.0\) must equal"):
        VacoModule(objective=IMPALA(rho_bar=2.0), advantage=VTrace(rho_bar=1.0))
    with pytest.raises(ValueError, match="needs a realigning module"):
        VacoModule(objective=IMPALA(), advantage=GAE())
    VacoModule(objective=IMPALA(), advantage=user.MyVTrace())  # a realigning subclass is accepted


def _configs(tmp_path, algos: dict[str, dict]):
    configs = tmp_path / "configs"
    (configs / "algo").mkdir(parents=True)
    shutil.copytree(REPO / "configs" / "env", configs / "env")
    for name, model in algos.items():
        body = {"model": {"class_path": "vaco.VacoModule", "init_args": model}}
        (configs / "algo" / f"{name}.yaml").write_text(yaml.safe_dump(body))
    return configs


def test_the_sweep_asks_the_advantage_whether_it_realigns(tmp_path, user):
    configs = _configs(
        tmp_path,
        {
            "capped": {
                "objective": {"class_path": "user_algos.Capped", "init_args": {"cap": 3.0}},
                "advantage": {"class_path": "user_algos.MyVTrace", "init_args": {"gamma": 0.98, "lmbda": 0.9}},
            }
        },
    )
    body = {
        "experiment": "x",
        "configs_dir": str(configs),
        "grid": {"main": {"algorithm": ["capped"], "env": ["inverted_pendulum"], "realign": [True, False]}},
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(body))
    sweep = S.load_sweep(path, output_dir=str(tmp_path / "out"))
    algo = sweep.algorithms["capped"]
    assert algo.realigned and algo.realign_optional  # a V-trace subclass realigns, as the learner says
    cells = {c.algorithm: c for c in S.expand(sweep)}
    assert set(cells) == {"capped", "capped-realign"}
    assert cells["capped"].realign and not cells["capped-realign"].realign
    # both modules take rho_bar: one axis value, set in both (and only where V-trace is used)
    assert dict(cells["capped"].settings) == {"rho_bar": 1.0, "cap": 3.0}
    config = S.cell_config(sweep, cells["capped-realign"])
    assert config["model"]["init_args"]["advantage"] == {
        "class_path": "vaco.advantages.GAE",  # MyVTrace's realign_twin, inherited
        "init_args": {"gamma": 0.98, "lmbda": 0.9},  # what both accept, carried over
    }


def _run(algorithm: str, variant_of: str | None = None) -> Run:
    steps, values = np.array([1.0, 2.0]), np.array([0.0, 1.0])
    histories = {"eval/return": (steps, values)}
    return make_run(
        algorithm, "Hopper-v5", 1, 1, histories, run_id=algorithm, name=algorithm, objective="X", variant_of=variant_of
    )


def test_a_run_says_it_is_a_variant_and_old_data_files_still_load():
    assert not is_variant("capped") and is_variant("capped", variant_of="ppo_clip")
    assert is_variant("vaco_tv_matched")  # data logged before runs said so (the committed files)
    frame = runs_to_frame([_run("capped", "ppo_clip"), _run("mine")])
    assert [r.variant_of for r in runs_from_frame(frame)] == ["ppo_clip", None]
    old = frame.drop(columns="variant_of")  # a file saved before the column existed
    assert [r.variant_of for r in runs_from_frame(old)] == [None, None]


def test_the_shipped_control_configs_say_what_they_control(tmp_path):
    for name, of in (("ppo_clip_tv_matched", "ppo_clip"), ("vaco_tv_matched", "vaco")):
        init = yaml.safe_load((REPO / "configs" / "algo" / f"{name}.yaml").read_text())["model"]["init_args"]
        assert init["variant_of"] == of


def test_no_learner_tracking_sweep_or_report_module_names_a_concrete_module_class():
    concrete = [
        cls.__name__
        for cls in (*vars(sys.modules["vaco.objectives"]).values(), *vars(sys.modules["vaco.advantages"]).values())
        if isinstance(cls, type)
        and issubclass(cls, (Objective, torch.nn.Module))
        and cls.__module__.startswith("vaco.")
        and cls.__name__ not in ("Objective", "AdvantageModule")
    ]
    assert {"TVFilter", "PPOClip", "VTrace", "GAE", "IMPALA"} <= set(concrete)
    files = [
        REPO / "vaco" / "learners" / "learner.py",
        REPO / "vaco" / "learners" / "vaco_module.py",
        REPO / "vaco" / "learners" / "update.py",
        REPO / "vaco" / "tracking.py",
        REPO / "vaco" / "llm" / "rlvr_module.py",
        *sorted((REPO / "vaco" / "sweep").glob("*.py")),
        *sorted((REPO / "vaco" / "report").glob("*.py")),
    ]
    import ast

    for file in files:
        for node in ast.walk(ast.parse(file.read_text())):
            # code, not prose: names and attributes (docstrings and comments may mention them)
            used = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
            assert used not in concrete, f"{file.relative_to(REPO)}:{node.lineno} uses {used}"
            if isinstance(node, ast.ImportFrom) and node.module in ("vaco.objectives", "vaco.advantages"):
                imported = {alias.name for alias in node.names}
                assert not imported & set(concrete), f"{file.relative_to(REPO)} imports {imported & set(concrete)}"
