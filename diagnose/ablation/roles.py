"""Each head's role, named from its attention statistics by clustering the model's own heads.

A head's pattern is described by where its weight goes: the first token (a sink, or [CLS]),
the last real token ([SEP] in BERT-style inputs), itself, the previous token, the next token,
two positions away (a local window), or anywhere else (broad). Where one fixed cut-off
("60 % on the previous token") would be arbitrary, the heads of the model are clustered on
those shares (k-means, k chosen by silhouette) and each cluster is named after the share in
which its centre stands out most from the model's average head (in standard deviations across
heads; a cluster that stands out nowhere is named by a share holding most of its weight, else
"broad"); a head takes its cluster's name. In a model where every head sends half its weight to
[CLS], the cluster that also looks at the previous token is "previous token": heads are named
relative to each other, the way a reader compares maps side by side.

The shares are the statistics that name a role in the statistics registry (`Statistic.role`, in
registry order): a new one is clustered on, and named, with no change here.
"""

from __future__ import annotations

import math
import warnings
from typing import Sequence

import numpy as np

from ..statistics import BROAD, STATISTICS, roles
from .result import HeadEffect

MAX_CLUSTERS = 8
SPREAD_FLOOR = 0.02  # a share that hardly varies across heads names no cluster
STANDS_OUT = 1.0  # a centre at least one standard deviation (across heads) above the average head ...
MAJORITY = 0.5  # ... else the cluster is named by a share it gives at least half its weight, else "broad"
OWN_Z = 3.0  # a single head named by its own share: far out of the model's crowd (name_own)


def names() -> list[str]:
    """The shares heads are described by: every statistic that names a role (the statistics registry,
    in its order), then "broad", the weight that none of them holds."""
    return [*roles(), BROAD]


def shares(att: dict[str, float | None]) -> np.ndarray | None:
    """[n_roles + 1] weight on each of names(): a role that counts within others (local: the previous and next
    tokens) has theirs taken out; they overlap a little on short rows; broad is what is left."""
    table = roles()
    att = {k: _known(k, att.get(k)) for k in table}
    if any(v is None or not math.isfinite(v) for v in att.values()):
        return None
    named = [att[k] - sum(att[w] for w in r.within if w in table) for k, r in table.items()]
    named = [max(0.0, x) if r.within else x for x, r in zip(named, table.values())]
    return np.array([*named, max(0.0, 1.0 - sum(named))])


def _known(name: str, value: float | None) -> float | None:
    """A share as roles count it: one that needs token ids is 0 where the data had none (image
    patches, embeddings: no head can copy a token there), so the other roles are still named."""
    if value is not None and not math.isfinite(value) and STATISTICS[name].needs_tokens:
        return 0.0
    return value


def assign(heads: Sequence[HeadEffect]) -> None:
    """Set `role` on every head whose statistics are known (None otherwise)."""
    known = [(h, shares(h.attention)) for h in heads]
    known = [(h, x) for h, x in known if x is not None]
    if not known:
        return
    X = np.stack([x for _, x in known])  # [n_heads, n_roles + 1]
    for (h, _), role in zip(known, name_own(X, name_clusters(X))):
        h.role = role


def name_own(X: np.ndarray, named: list[str]) -> list[str]:
    """A head that gives most of its weight to one position (a role on one key: first, last, itself,
    previous, next), far beyond the model's typical head (robust z >= OWN_Z), has that role whatever
    cluster it fell in: a lone next-token head is too rare to form a cluster of its own."""
    out = list(named)
    columns = names()
    one_key = [j for j, r in enumerate(roles().values()) if r.one_key]
    for j in one_key:
        col = X[:, j]
        centre = np.median(col)
        spread = max(1.4826 * float(np.median(np.abs(col - centre))), 0.05)
        for i in np.flatnonzero((col >= MAJORITY) & ((col - centre) / spread >= OWN_Z)):
            if X[i, j] >= X[i, one_key].max():
                out[i] = columns[j]
    return out


def name_clusters(X: np.ndarray) -> list[str]:
    """One role per row of X [n, len(names())]: the share in which its cluster's centre most exceeds the
    average head."""
    columns = names()
    labels, centres = _cluster(X)
    spread = np.maximum(X.std(0), SPREAD_FLOOR)
    named = []
    for c in centres:
        z = (c - X.mean(0)) / spread
        if z.max() >= STANDS_OUT:
            named.append(columns[int(np.argmax(z))])
        else:  # a cluster like the average head: named by where most of its weight goes, if anywhere
            named.append(columns[int(np.argmax(c))] if c.max() >= MAJORITY else BROAD)
    return [named[k] for k in labels]


def _cluster(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    distinct = len(np.unique(X.round(6), axis=0))
    if distinct < 3:
        return np.arange(len(X)), X  # too few distinct heads to cluster: each is its own group
    from sklearn.cluster import KMeans
    from sklearn.metrics import silhouette_score

    best = None
    for k in range(2, min(MAX_CLUSTERS, distinct - 1) + 1):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            km = KMeans(n_clusters=k, n_init=4, random_state=0).fit(X)
        score = silhouette_score(X, km.labels_)
        if best is None or score > best[0] + 1e-9:
            best = (score, km)
    return best[1].labels_, best[1].cluster_centers_
