"""FedMatch (Chen et al., CIKM'21): a shared BERT backbone plus a private patch per client.

The patch (``fedrepro/models/patches.py``: PAL or low-rank, inserted inner/outer/vertical/horizontal) is
injected into the model by name and never leaves its client; the server averages the backbone uniformly
(theta = 1/T sum theta_t). ``shared_layers = L`` also keeps the encoder layers above the L-th private (Fig 5).
Under ``fidelity = released_code`` every LayerNorm is private too, which is the authors' code's key rule.
"""

from typing import ClassVar, Literal

from pydantic import Field
from torch import nn

from fedrepro.fl.algorithm import Algorithm
from fedrepro.models.patches import PatchSpec, encoder_layer_index, inject_patch, is_patch_parameter


class FedMatch(Algorithm):
    name, label = "fedmatch", "FedMatch"

    class Settings(Algorithm.Settings):
        set_per_cell: ClassVar[dict[str, str]] = {
            "patch": "the method (fedmatch_<insertion>_<structure>) with fedmatch.settings.patch_size and patch_heads",
            "shared_layers": "fedmatch.settings.shared_layers",
            "fidelity": "fedmatch.settings.fidelity",
        }
        patch: PatchSpec | None = Field(None, description="the private patch injected into the backbone")
        shared_layers: int | None = Field(
            None, ge=0, description="bottom encoder layers shared; the layers above are private too (None: all shared)"
        )
        fidelity: Literal["paper", "released_code"] = Field(
            "paper", description="released_code also keeps every LayerNorm private, as the authors' code does"
        )

    def adapt_model(self, model: nn.Module) -> nn.Module:
        if self.settings.patch is None:
            raise ValueError("FedMatch needs a patch (FedMatch.Settings.patch)")
        return inject_patch(model, self.settings.patch)

    def is_private(self, name: str) -> bool:
        if is_patch_parameter(name):
            return True
        layer, shared = encoder_layer_index(name), self.settings.shared_layers
        if shared is not None and layer is not None and layer >= shared:
            return True
        return self.settings.fidelity == "released_code" and "LayerNorm" in name
