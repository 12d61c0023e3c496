"""Incremental classification heads: one block of weights per task, concatenated in task order."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dfcil.registry import Registry

HEADS: Registry = Registry("head")


def cosines(features: Tensor, weight: Tensor) -> Tensor:
    """(B, n) cosine similarities of features (B, d) and weight rows (n, d); a zero row's are 0."""
    return F.linear(F.normalize(features, dim=1), F.normalize(weight, dim=1))


def ucir_uniform_(weight: Tensor) -> Tensor:
    """UCIR's ``CosineLinear.reset_parameters``, in place: U(−1/√d, 1/√d) for a (n, d) weight."""
    stdv = 1.0 / math.sqrt(weight.shape[1])
    return nn.init.uniform_(weight, -stdv, stdv)


class BlockHead(nn.Module):
    """Weights in per-task blocks (bias-free ``nn.Linear`` used as weight holders); a new block never changes
    the old ones. Subclasses define how a block is initialised and how features become logits."""

    rows_per_class = 1

    def __init__(self, in_features: int, init_std: float = 0.001) -> None:
        super().__init__()
        self.in_features = in_features
        self.init_std = init_std
        self.blocks = nn.ModuleList()

    @property
    def sizes(self) -> list[int]:
        """Classes of each block."""
        return [b.out_features // self.rows_per_class for b in self.blocks]

    @property
    def out_features(self) -> int:
        return sum(self.sizes)

    def init_block(self, block: nn.Linear) -> None:
        nn.init.normal_(block.weight, std=self.init_std)

    def expand(self, n_new: int, device: torch.device | None = None) -> None:
        block = nn.Linear(self.in_features, n_new * self.rows_per_class, bias=False)
        self.init_block(block)
        self.blocks.append(block.to(device))

    def truncate(self, n_classes: int) -> None:
        """Keep only the blocks that cover the first ``n_classes`` classes (must fall on a block boundary)."""
        kept, total = [], 0
        for block, size in zip(self.blocks, self.sizes, strict=True):
            if total >= n_classes:
                break
            kept.append(block)
            total += size
        if total != n_classes:
            raise ValueError(f"{n_classes} classes do not end on a head block boundary")
        self.blocks = nn.ModuleList(kept)

    def weight(self) -> Tensor:
        return torch.cat([b.weight for b in self.blocks])

    mask: Tensor | None = None  # every column is a seen class's (a static head masks the unseen ones)

    def reset_parameters(self) -> None:
        for block in self.blocks:
            self.init_block(block)


@HEADS.register("linear")
class IncrementalLinear(BlockHead):
    """Bias-free linear classifiers, N(0, init_std²) (cl-lite ``DynamicSimpleHead``; R-DFCIL, ABD, LwF, ...)."""

    def forward(self, features: Tensor) -> Tensor:
        if not self.blocks:
            return features.new_zeros(features.shape[0], 0)
        return F.linear(features, self.weight())


@HEADS.register("cosine")
class CosineIncremental(BlockHead):
    """UCIR's cosine classifier: logits = σ · cos(f, w_c), one learned scale σ (init 1) shared by all blocks."""

    def __init__(self, in_features: int, init_std: float = 0.001) -> None:
        super().__init__(in_features, init_std)
        self.sigma = nn.Parameter(torch.ones(()))

    def init_block(self, block: nn.Linear) -> None:
        ucir_uniform_(block.weight)

    def cosine(self, features: Tensor) -> Tensor:
        """(B, n_classes) cosine similarities before σ."""
        return cosines(features, self.weight())

    def forward(self, features: Tensor) -> Tensor:
        return self.sigma * self.cosine(features)


@HEADS.register("lsc")
class LocalSimilarity(BlockHead):
    """PODNet's local similarity classifier: K proxies per class; similarity to a proxy = −‖f̂ − p̂‖² (= 2cos − 2)
    of the L2-normalised feature and proxy; a class's similarity is the softmax(γ=1)-weighted sum over its proxies;
    logits = η · similarity with one learned η (init 1)."""

    rows_per_class = 10

    def __init__(self, in_features: int, init_std: float = 0.001) -> None:
        super().__init__(in_features, init_std)
        self.eta = nn.Parameter(torch.ones(()))

    def init_block(self, block: nn.Linear) -> None:
        nn.init.kaiming_normal_(block.weight, nonlinearity="linear")

    def similarities(self, features: Tensor) -> Tensor:
        """(B, n_classes) class similarities before η."""
        cos = cosines(features, self.weight())
        sim = (2.0 * cos - 2.0).view(features.shape[0], -1, self.rows_per_class)  # (B, classes, K)
        return (F.softmax(sim, dim=2) * sim).sum(dim=2)

    def forward(self, features: Tensor) -> Tensor:
        if not self.blocks:
            return features.new_zeros(features.shape[0], 0)
        return self.eta * self.similarities(features)


MASKED_LOGIT = -1e9  # a masked column's logit: exp(MASKED_LOGIT - max) is exactly 0 in fp32 and bf16, so it adds
# nothing to a softmax, a log-sum-exp or an argmax; finite, so 0 · log-probability stays 0 (an entropy, soft KD)


class StaticHead(nn.Module):
    """A growing head allocated for all ``capacity`` classes of the run at once, so that its shape, and a training
    step's graph with it, never changes between tasks (``model.static_head``); :class:`StaticLinear` and
    :class:`StaticCosine` say how a block is drawn and how features become logits, as their growing heads do.

    The rows of classes not yet seen are zero and their logits are ``MASKED_LOGIT``: they add nothing to a softmax,
    CE or argmax, and receive no gradient. With zero weight and zero gradient, SGD's update and weight decay leave
    them exactly zero, until :meth:`expand` initialises a task's rows from the same random draws as the growing head.
    Losses that compare columns take :attr:`old_mask` / :attr:`new_mask` (fixed shapes, updated in place) instead
    of slices. Its ``state_dict`` is the growing head's (its own parameters such as σ, then ``blocks.<i>.weight``,
    one per task), so checkpoints, saved models and teachers load into either layout.
    """

    rows_per_class = 1

    def __init__(self, in_features: int, capacity: int, init_std: float = 0.001) -> None:
        super().__init__()
        self.in_features, self.capacity, self.init_std = in_features, capacity, init_std
        # zeros, not nn.Linear's random init: building it draws no random numbers, as building the growing head
        self.table = nn.Parameter(torch.zeros(capacity, in_features))
        self.sizes: list[int] = []
        # which columns are seen, of old tasks, of the newest task: derived from sizes, not saved
        for name in ("mask", "old_mask", "new_mask"):
            self.register_buffer(name, torch.zeros(capacity, dtype=torch.bool), persistent=False)

    def init_weight(self, weight: Tensor) -> None:
        """Draw a block's (n, d) weight in place, as the growing head's ``init_block``."""
        raise NotImplementedError

    def scores(self, features: Tensor) -> Tensor:
        """(B, capacity) logits of every row, the unseen ones included."""
        raise NotImplementedError

    @property
    def out_features(self) -> int:
        return self.capacity

    @property
    def n_seen(self) -> int:
        return sum(self.sizes)

    def _update_masks(self) -> None:
        seen, last = self.n_seen, self.sizes[-1] if self.sizes else 0
        spans = ((0, seen), (0, seen - last), (seen - last, seen))
        with torch.no_grad():
            for mask, (a, b) in zip((self.mask, self.old_mask, self.new_mask), spans, strict=True):
                mask.zero_()
                mask[a:b] = True

    def expand(self, n_new: int, device: torch.device | None = None) -> None:
        start = self.n_seen
        if start + n_new > self.capacity:
            raise ValueError(f"a static head for {self.capacity} classes cannot grow to {start + n_new}")
        block = nn.Linear(self.in_features, n_new, bias=False)  # the growing head's random draws, in its order
        self.init_weight(block.weight)
        with torch.no_grad():
            self.table[start : start + n_new].copy_(block.weight)
        self.sizes.append(n_new)
        self._update_masks()

    def truncate(self, n_classes: int) -> None:
        """Keep the first ``n_classes`` classes (a block boundary); the other rows become zero and masked."""
        bounds = [sum(self.sizes[: i + 1]) for i in range(len(self.sizes))]
        if n_classes not in (0, *bounds):
            raise ValueError(f"{n_classes} classes do not end on a head block boundary")
        self.sizes = self.sizes[: bounds.index(n_classes) + 1] if n_classes else []
        with torch.no_grad():
            self.table[n_classes:].zero_()
        self._update_masks()

    def weight(self) -> Tensor:
        """The seen classes' rows, (n_seen, d)."""
        return self.table[: self.n_seen]

    def reset_parameters(self) -> None:
        """Every seen block re-initialised, in order, as the growing head's :meth:`BlockHead.reset_parameters`."""
        start = 0
        with torch.no_grad():
            for n in self.sizes:
                self.init_weight(self.table[start : start + n])
                start += n

    def forward(self, features: Tensor) -> Tensor:
        return self.scores(features).masked_fill(~self.mask, MASKED_LOGIT)

    def _layout(self, prefix: str, table: Tensor) -> dict[str, Tensor]:
        """The growing head's state-dict entries, each a view of this head's tensors: its own parameters but the
        table (σ), then one ``blocks.<i>.weight`` per task, rows of ``table``."""
        own = {f"{prefix}{k}": p for k, p in self._parameters.items() if k != "table" and p is not None}
        starts = [sum(self.sizes[:i]) for i in range(len(self.sizes))]
        blocks = zip(starts, self.sizes, strict=True)
        return own | {f"{prefix}blocks.{i}.weight": table[a : a + n] for i, (a, n) in enumerate(blocks)}

    def _save_to_state_dict(self, destination, prefix, keep_vars) -> None:  # noqa: ANN001
        for key, value in self._layout(prefix, self.table).items():
            destination[key] = value if keep_vars else value.detach()

    def _load_from_state_dict(self, state_dict, prefix, metadata, strict, missing, unexpected, errors) -> None:  # noqa: ANN001
        expected = self._layout(prefix, self.table)
        for key, target in expected.items():
            if key not in state_dict:
                missing.append(key)
            elif state_dict[key].shape != target.shape:
                errors.append(f"{key}: shape {tuple(state_dict[key].shape)}, expected {tuple(target.shape)}")
            else:
                with torch.no_grad():
                    target.copy_(state_dict[key])
        unexpected += [k for k in state_dict if k.startswith(prefix) and k not in expected]


class StaticLinear(StaticHead):
    """:class:`IncrementalLinear` as a :class:`StaticHead`: bias-free linear logits, rows drawn N(0, init_std²)."""

    def init_weight(self, weight: Tensor) -> None:
        nn.init.normal_(weight, std=self.init_std)

    def scores(self, features: Tensor) -> Tensor:
        return F.linear(features, self.table)


class StaticCosine(StaticHead):
    """:class:`CosineIncremental` as a :class:`StaticHead`: σ · cos(f, w_c), one learned σ (init 1), rows drawn
    U(−1/√d, 1/√d). An unseen row is zero: its cosine is 0 (F.normalize divides by ε), then masked."""

    def __init__(self, in_features: int, capacity: int, init_std: float = 0.001) -> None:
        super().__init__(in_features, capacity, init_std)
        self.sigma = nn.Parameter(torch.ones(()))

    def init_weight(self, weight: Tensor) -> None:
        ucir_uniform_(weight)

    def scores(self, features: Tensor) -> Tensor:
        return self.sigma * cosines(features, self.table)


STATIC_HEADS: dict[str, type[StaticHead]] = {"linear": StaticLinear, "cosine": StaticCosine}
