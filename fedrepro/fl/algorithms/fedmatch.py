"""FedMatch (Chen et al., CIKM'21): a shared BERT backbone plus a private patch per client.

The patch (``fedrepro/models/patches.py``: PAL or low-rank, inserted inner/outer/vertical/horizontal) is
injected into the model by name and never leaves its client; the server averages the backbone uniformly
(theta = 1/T sum theta_t). ``shared_layers = L`` also keeps the encoder layers above the L-th private (Fig 5).
Under ``fidelity = released_code`` every LayerNorm is private too, which is the authors' code's key rule.
"""

from torch import nn

from fedrepro.fl.algorithm import Algorithm
from fedrepro.models.patches import encoder_layer_index, inject_patch, is_patch_parameter


class FedMatch(Algorithm):
    name = "fedmatch"

    def adapt_model(self, model: nn.Module) -> nn.Module:
        if self.settings.patch is None:
            raise ValueError("FedMatch needs AlgorithmSettings.patch")
        return inject_patch(model, self.settings.patch)

    def is_private(self, name: str) -> bool:
        if is_patch_parameter(name):
            return True
        layer, shared = encoder_layer_index(name), self.settings.shared_layers
        if shared is not None and layer is not None and layer >= shared:
            return True
        return self.settings.fidelity == "released_code" and "LayerNorm" in name
