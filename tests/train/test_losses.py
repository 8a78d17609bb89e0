"""Losses: VSE++ hinge against a loop reference, ratio loss values and gradients, CMC on a hand example."""

from __future__ import annotations

import pytest
import torch

from patchword.losses import CMCLoss, HingeLoss, RatioLoss


def reference_hinge(
    sims: torch.Tensor, img_ids: list[int], ignore: list[list[bool]], margin: float, max_violation: bool
) -> float:
    """The official ContrastiveLoss written as a plain double loop."""
    s = sims.tolist()
    n = len(s)

    def negative(i: int, j: int) -> bool:
        return img_ids[i] != img_ids[j] and not ignore[i][j]

    cost_s = [
        [max(0.0, margin + s[i][j] - s[i][i]) if negative(i, j) else 0.0 for j in range(n)] for i in range(n)
    ]
    cost_im = [
        [max(0.0, margin + s[i][j] - s[j][j]) if negative(i, j) else 0.0 for j in range(n)] for i in range(n)
    ]
    if max_violation:
        return sum(max(cost_s[i]) for i in range(n)) + sum(
            max(cost_im[i][j] for i in range(n)) for j in range(n)
        )
    return sum(map(sum, cost_s)) + sum(map(sum, cost_im))


def random_batch(seed: int, batch: int = 7) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    sims = torch.randn(batch, batch, generator=gen, dtype=torch.float64) * 0.3
    img_ids = torch.tensor([0, 1, 1, 2, 3, 3, 3][:batch])  # duplicate images in the batch
    ignore = torch.rand(batch, batch, generator=gen) < 0.15
    return sims, img_ids, ignore


# ------------------------------------------------------------------------------------------------ hinge


@pytest.mark.parametrize("max_violation", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_hinge_matches_loop_reference(seed: int, max_violation: bool) -> None:
    sims, img_ids, ignore = random_batch(seed)
    loss = HingeLoss(margin=0.2, max_violation=max_violation)(sims, img_ids, ignore)
    want = reference_hinge(sims, img_ids.tolist(), ignore.tolist(), 0.2, max_violation)
    assert loss.item() == pytest.approx(want, abs=1e-12)
    assert loss.dim() == 0


def test_hinge_defaults_mask_only_the_diagonal() -> None:
    sims, _, _ = random_batch(9)
    no_ignore = [[False] * 7 for _ in range(7)]
    loss = HingeLoss(margin=0.3)(sims)
    assert loss.item() == pytest.approx(reference_hinge(sims, list(range(7)), no_ignore, 0.3, False))
    assert torch.equal(loss, HingeLoss(margin=0.3)(sims, torch.arange(7)))


def test_hinge_call_argument_overrides_max_violation() -> None:
    sims, img_ids, _ = random_batch(2)
    summed, hardest = HingeLoss(max_violation=False), HingeLoss(max_violation=True)
    assert torch.equal(summed(sims, img_ids, max_violation=True), hardest(sims, img_ids))
    assert torch.equal(hardest(sims, img_ids, max_violation=False), summed(sims, img_ids))
    assert summed.max_violation is False  # the override does not stick


def test_hinge_hand_value() -> None:
    sims = torch.tensor([[0.5, 0.6], [0.1, 0.4]])
    # cost_s: (0,1) 0.2+0.6-0.5 = 0.3; (1,0) 0.2+0.1-0.4 -> 0. cost_im: (1,0) 0.2+0.1-0.5 -> 0;
    # (0,1) 0.2+0.6-0.4 = 0.4.
    assert HingeLoss()(sims).item() == pytest.approx(0.7)
    assert HingeLoss()(sims, img_ids=[7, 7]).item() == 0.0


@pytest.mark.parametrize("max_violation", [False, True])
def test_hinge_gradient(max_violation: bool) -> None:
    sims, img_ids, ignore = random_batch(4)
    sims.requires_grad_(True)
    loss_fn = HingeLoss(max_violation=max_violation)
    assert torch.autograd.gradcheck(lambda s: loss_fn(s, img_ids, ignore), (sims,))
    (grad,) = torch.autograd.grad(loss_fn(sims, img_ids, ignore), sims)
    off_diagonal_positive = (img_ids[:, None] == img_ids[None, :]) & ~torch.eye(7, dtype=torch.bool)
    assert torch.all(grad[off_diagonal_positive | (ignore & ~torch.eye(7, dtype=torch.bool))] == 0)
    assert torch.all(grad.diagonal() <= 0)  # raising a positive never raises the loss
    assert grad.abs().sum() > 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sims": torch.zeros(3)}, "sims"),
        ({"sims": torch.zeros(2, 3)}, "sims"),
        ({"sims": torch.zeros(0, 0)}, "sims"),
        ({"sims": torch.tensor([[0.0, float("nan")], [0.0, 0.0]])}, "sims"),
        ({"sims": torch.zeros(2, 2), "img_ids": torch.zeros(3)}, "img_ids"),
        ({"sims": torch.zeros(2, 2), "img_ids": "ab"}, "img_ids"),
        ({"sims": torch.zeros(2, 2), "ignore": torch.zeros(2, 2)}, "ignore"),
        ({"sims": torch.zeros(2, 2), "ignore": torch.zeros(2, 3, dtype=torch.bool)}, "ignore"),
    ],
)
def test_hinge_invalid_inputs(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        HingeLoss()(**kwargs)


# ------------------------------------------------------------------------------------------------ ratio


def test_ratio_hand_values() -> None:
    masks = [torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.tensor([[1.0, 0.0], [0.0, 0.0]])]  # means 0.5, 0.25
    assert RatioLoss(0.4, mode="sum_masks")(masks).item() == pytest.approx((0.75 - 0.4) ** 2)
    assert RatioLoss(0.4, mode="per_branch")(masks).item() == pytest.approx(0.1**2 + 0.15**2)
    assert RatioLoss(0.5)(masks[0]).item() == 0.0  # a single tensor is one branch


def test_ratio_official_constants() -> None:
    # LAPS ViT keeps 98 of 196 patches with target 0.5; SEPS sums the sparse and dense masks.
    keep = torch.zeros(4, 196)
    keep[:, :98] = 1
    assert RatioLoss(0.5)([keep]).item() == 0.0
    assert RatioLoss(0.5, mode="sum_masks")([keep, keep]).item() == pytest.approx(0.25)
    assert RatioLoss(0.5, mode="per_branch")([keep, keep.bool()]).item() == 0.0


def test_ratio_hard_mask_has_zero_gradient_soft_mask_does_not() -> None:
    scores = torch.randn(3, 10, generator=torch.Generator().manual_seed(0), requires_grad=True)
    # Official hard top-k: the mask is built from indices, so the loss is a constant w.r.t. the scores.
    hard = torch.zeros_like(scores).scatter(1, scores.topk(4, dim=1).indices, 1.0)
    for mode in RatioLoss.MODES:
        loss = RatioLoss(0.5, mode=mode)([hard, hard])
        (grad,) = torch.autograd.grad(loss + 0 * scores.sum(), scores)
        assert torch.all(grad == 0)
        # Straight-through soft decisions (paper variant) do carry a gradient.
        soft = torch.sigmoid(scores)
        straight_through = (soft > 0.5).float() - soft.detach() + soft
        (grad,) = torch.autograd.grad(RatioLoss(0.3, mode=mode)([straight_through, soft]), scores)
        assert grad.abs().sum() > 0


@pytest.mark.parametrize(
    ("decisions", "match"),
    [
        ([], "decisions"),
        ("mask", "decisions"),
        ([torch.tensor([0.5, 1.5])], r"decisions\[0\]"),
        ([torch.ones(2), torch.tensor([-0.1])], r"decisions\[1\]"),
        ([torch.ones(2), torch.tensor([float("nan")])], r"decisions\[1\]"),
        ([torch.ones(0)], r"decisions\[0\]"),
        ([[1.0, 0.0]], r"decisions\[0\]"),
    ],
)
def test_ratio_invalid_inputs(decisions: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RatioLoss(0.5)(decisions)


def test_ratio_invalid_arguments() -> None:
    with pytest.raises(ValueError, match="mode"):
        RatioLoss(0.5, mode="mean")
    with pytest.raises(ValueError, match="target_ratio"):
        RatioLoss(-0.1)
    with pytest.raises(ValueError, match="target_ratio"):
        RatioLoss(float("nan"))


# -------------------------------------------------------------------------------------------------- CMC

# Hand example (B = 3, C = 2). The loss normalises the rows:
# [3, 4] -> [0.6, 0.8], [4, 3] -> [0.8, 0.6], [0, 2] -> [0, 1].
CMC_IMG = torch.tensor([[1.0, 0.0], [0.0, 1.0], [3.0, 4.0]])
CMC_TXT = torch.tensor([[4.0, 3.0], [0.0, 2.0], [1.0, 0.0]])
# S = I T^T = [[0.8, 0, 1], [0.6, 1, 0], [0.96, 0.8, 0.6]], positives 0.8, 1, 0.6 (margin 0.2)
#   hardest i2t: row 0 max(0, 0.4) = 0.4; row 1 max(0, 0) = 0; row 2 max(0.56, 0.4) = 0.56  -> 0.96
#   hardest t2i: col 0 max(0, 0.36) = 0.36; col 1 max(0, 0) = 0; col 2 max(0.6, 0) = 0.6     -> 0.96
#   L_r (max_violation) = 1.92; summed over all negatives: (0.4 + 0.56 + 0.4) + (0.36 + 0.6) = 2.32
# S^I = [[1, 0, 0.6], [0, 1, 0.8], [0.6, 0.8, 1]], S^T = [[1, 0.6, 0.8], [0.6, 1, 0], [0.8, 0, 1]]
# |S^T - S^I| = [[0, 0.6, 0.2], [0.6, 0, 0.8], [0.2, 0.8, 0]], column max 0.6, 0.8, 0.8
#   L_a = (0.6 - 0.3) + (0.8 - 0.3) + (0.8 - 0.3) = 1.3
CMC_RANKING, CMC_RANKING_SUM, CMC_CONSISTENCY = 1.92, 2.32, 1.3


def test_cmc_hand_example() -> None:
    loss_fn = CMCLoss(margin=0.2, sigma=0.3)
    parts = loss_fn.components(CMC_IMG, CMC_TXT)
    assert parts["ranking"].item() == pytest.approx(CMC_RANKING, abs=1e-6)
    assert parts["consistency"].item() == pytest.approx(CMC_CONSISTENCY, abs=1e-6)
    assert parts["total"].item() == pytest.approx(CMC_RANKING + CMC_CONSISTENCY, abs=1e-6)
    assert torch.equal(loss_fn(CMC_IMG, CMC_TXT), parts["total"])
    summed = CMCLoss(max_violation=False).components(CMC_IMG, CMC_TXT)
    assert summed["ranking"].item() == pytest.approx(CMC_RANKING_SUM, abs=1e-6)
    # Images 0 and 2 shared: pairs (0, 2) and (2, 0) stop being negatives; only row 2's 0.4 remains.
    masked = loss_fn.components(CMC_IMG, CMC_TXT, img_ids=[5, 6, 5])
    assert masked["ranking"].item() == pytest.approx(0.4, abs=1e-6)
    assert masked["consistency"].item() == pytest.approx(CMC_CONSISTENCY, abs=1e-6)


def test_cmc_ranking_is_the_hinge_on_normalised_embeddings() -> None:
    gen = torch.Generator().manual_seed(3)
    img, txt = torch.randn(6, 8, generator=gen), torch.randn(6, 8, generator=gen)
    sims = torch.nn.functional.normalize(img, dim=-1) @ torch.nn.functional.normalize(txt, dim=-1).T
    want = HingeLoss(margin=0.1, max_violation=True)(sims)
    assert torch.allclose(CMCLoss(margin=0.1).components(img, txt)["ranking"], want)


def test_cmc_gradient_flows_to_both_modalities() -> None:
    gen = torch.Generator().manual_seed(1)
    img = torch.randn(5, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    txt = torch.randn(5, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    loss = CMCLoss(sigma=0.0)(img, txt)
    loss.backward()
    assert img.grad.abs().sum() > 0 and txt.grad.abs().sum() > 0
    assert torch.autograd.gradcheck(lambda a, b: CMCLoss(sigma=0.05)(a, b), (img, txt))


@pytest.mark.parametrize(
    ("img", "txt", "match"),
    [
        (torch.zeros(3), torch.zeros(3), "img"),
        (torch.zeros(3, 2), torch.zeros(3, 4), "txt"),
        (torch.zeros(3, 2), torch.zeros(2, 2), "txt"),
        (torch.full((2, 2), float("nan")), torch.ones(2, 2), "img"),
    ],
)
def test_cmc_invalid_inputs(img: torch.Tensor, txt: torch.Tensor, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        CMCLoss()(img, txt)


@pytest.mark.parametrize(
    ("variant", "num_patches", "sparse_ratio", "constant"),
    [
        ("code", 16, 0.5, True),  # hard masks: always constant
        ("code", 49, 0.8, True),
        ("paper", 16, 0.5, True),  # straight-through, but K/N = rho: the coefficient is zero
        ("paper", 49, 0.8, False),  # K = 40 of 49 = 0.816: a (small) gradient
    ],
)
def test_the_ratio_loss_is_reported_constant_exactly_when_a_training_step_gives_it_no_gradient(
    variant, num_patches, sparse_ratio, constant
) -> None:
    """README/SPEC said the paper variant's ratio loss has a gradient; with top-K selection it has none
    whenever rho * N is an integer (every shipped preset). The log line says so, checked against a step."""
    from patchword.matching import build_matcher
    from patchword.train.step import constant_ratio_loss

    torch.manual_seed(0)
    matcher = build_matcher(
        "seps",
        embed_dim=16,
        num_patches=num_patches,
        has_cls=True,
        sparse_ratio=sparse_ratio,
        variant=variant,
    ).train()
    img = torch.randn(3, num_patches + 1, 16, requires_grad=True)
    caps, lens = torch.randn(4, 6, 16), torch.tensor([6, 4, 5, 3])
    dense, dense_lens = torch.randn(3, 9, 16), torch.tensor([9, 7, 8])
    out = matcher(img, caps, lens, dense, dense_lens)
    loss = RatioLoss(sparse_ratio, mode=matcher.ratio_mode)(out.decisions)
    note = constant_ratio_loss(matcher, weight=2.0)
    (grad,) = torch.autograd.grad(loss + 0 * img.sum(), img)
    assert (note is not None) == constant == bool(torch.all(grad == 0))
    if note is not None:
        assert f"the constant {loss.item():.4g} with zero gradient" in note
    assert constant_ratio_loss(matcher, weight=0.0) is None
    assert constant_ratio_loss(build_matcher("vse", embed_dim=16), weight=2.0) is None
