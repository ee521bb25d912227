"""The learner contract's pure parts (no env, no trainer): the resume check's wording."""

from __future__ import annotations

from vaco.learners.learner import same_run_problem


def test_a_resume_refusal_names_both_sides_and_never_prints_none_for_a_missing_field():
    """A field the checkpoint's run had and the config lacks (or the other way round) is said to be
    missing, not printed as "None"; a changed value names both values; an equal definition passes."""
    assert same_run_problem({"a": 1, "b": 2}, {"a": 1, "b": 2}) is None
    changed = same_run_problem({"delta": 0.2}, {"delta": 0.4})
    assert changed.startswith("`delta` cannot change when resuming (the checkpoint's run has 0.2, the config has 0.4)")
    gone = same_run_problem({"a": 1, "b": 2}, {"a": 1})
    assert "`b` cannot change" in gone and "the checkpoint's run has 2, the config has no such field" in gone
    new = same_run_problem({"a": 1}, {"a": 1, "c": 0.5})
    assert "the checkpoint's run has no such field, the config has 0.5" in new
    assert "None" not in gone + new
