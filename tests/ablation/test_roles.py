"""Head roles: clusters of the model's own heads, each named by where its centre stands out."""

from __future__ import annotations

import numpy as np

from diagnose.ablation.roles import assign, name_clusters, names, shares

from .test_contrast import head

ZERO = {"first_token": 0.0, "last_token": 0.0, "self": 0.0, "prev_token": 0.0, "next_token": 0.0, "local": 0.0,
        "duplicate_token": 0.0, "induction": 0.0}


OLD = ("first_token", "last_token", "self", "prev_token", "next_token", "local", "broad")  # the rows' order below


def matrix(rows):
    """Rows written in OLD's order, as columns in the registry's order (roles.names()); 0 for the rest."""
    rows = np.array(rows)
    return np.stack([rows[:, OLD.index(n)] if n in OLD else np.zeros(len(rows)) for n in names()], axis=1)


def att(**kw):
    out = dict(ZERO)
    out.update(kw)
    if "local" not in kw:
        out["local"] = out["prev_token"] + out["next_token"]
    return out


def test_shares_split_the_weight():
    x = shares(att(first_token=0.5, prev_token=0.2, next_token=0.1, local=0.4))
    assert dict(zip(names(), x.round(6))) == {"first_token": 0.5, "last_token": 0.0, "self": 0.0, "prev_token": 0.2,
                                             "next_token": 0.1, "local": 0.1, "duplicate_token": 0.0,
                                             "induction": 0.0, "broad": 0.1}
    no_ids = dict(att(first_token=0.5), duplicate_token=float("nan"), induction=float("nan"))
    assert dict(zip(names(), shares(no_ids).round(6)))["first_token"] == 0.5  # no token ids: those shares are 0
    assert shares({"first_token": None}) is None


def test_distinct_patterns_get_their_names():
    rng = np.random.default_rng(0)
    kinds = ["prev_token", "first_token", "last_token", "broad"]
    heads = []
    for i, kind in enumerate(kinds * 3):
        share = 0.75 + 0.05 * rng.random()
        heads.append(head(i // 4, i % 4, dacc=0.0, dloss=0.0, p=1.0,
                          att=att() if kind == "broad" else att(**{kind: share})))
    assign(heads)
    assert [h.role for h in heads] == kinds * 3


def test_roles_are_relative_to_the_model():
    """Every head sends about half its weight to [CLS]; the ones that also look back are previous-token heads."""
    rows = [[0.45, 0.0, 0.05, 0.05, 0.05, 0.0, 0.4]] * 6 + [[0.45, 0.0, 0.05, 0.4, 0.0, 0.0, 0.1]] * 3 + \
           [[0.8, 0.0, 0.05, 0.05, 0.05, 0.0, 0.05]] * 3
    got = name_clusters(matrix(rows) + np.random.default_rng(1).normal(0, 0.005, (12, len(names()))))
    assert got[6:9] == ["prev_token"] * 3 and got[9:] == ["first_token"] * 3 and got[0] == "broad"


def test_too_few_heads_name_themselves():
    got = name_clusters(matrix([[0.9, 0, 0, 0, 0, 0, 0.1], [0.1, 0, 0, 0.8, 0, 0, 0.1]]))
    assert got == ["first_token", "prev_token"]


def test_a_lone_positional_head_keeps_its_role():
    rows = [[0.5, 0.0, 0.1, 0.05, 0.05, 0.05, 0.25]] * 10 + [[0.2, 0.0, 0.05, 0.05, 0.6, 0.0, 0.1]]
    X = matrix(rows) + np.random.default_rng(2).normal(0, 0.01, (11, len(names())))
    assign_names = name_clusters(X)
    from diagnose.ablation.roles import name_own

    assert name_own(X, assign_names)[-1] == "next_token"
    assert name_own(X, ["broad"] * 11)[:10] == ["broad"] * 10
