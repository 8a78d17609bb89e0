"""Training losses: the VSE++ hinge (SEPS/LAPS, NAAF, TGDT), the SEPS/LAPS ratio loss, TGDT's CMC loss, the
CLIP-style contrastive loss (:mod:`.retrieval`) and the UCMFH hashing losses (InfoNCE, the "balanced"
InfoNCE variant, HashNet's weighted pairwise loss; :mod:`.hashing`).

All losses are ``nn.Module`` s without I/O that return a scalar tensor on the device of their inputs.
Following the official code, the hinge-based losses are *summed* over the batch, not averaged, so their
scale grows with the batch size.
"""

from patchword.losses.hashing import BalancedInfoNCE, HashNetLoss, InfoNCE
from patchword.losses.retrieval import CMCLoss, ContrastiveLoss, HingeLoss, RatioLoss

__all__ = [
    "HingeLoss",
    "ContrastiveLoss",
    "RatioLoss",
    "CMCLoss",
    "InfoNCE",
    "BalancedInfoNCE",
    "HashNetLoss",
]
