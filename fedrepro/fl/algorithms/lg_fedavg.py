"""LG-FedAvg (Liang et al., 2020): local representations, a global top.

Each client keeps the lower part of the network (embeddings and the bottom encoder layers) private, so it
learns its own representation of its data; the upper encoder layers and the scoring head are averaged.
The split point is ``local_layers`` (None: the bottom half of the encoder layers).
"""

from pydantic import Field
from torch import nn

from fedrepro.fl.algorithm import Algorithm
from fedrepro.models.patches import encoder_layer_index


class LGFedAvg(Algorithm):
    name, label = "lg_fedavg", "LG-FedAvg"
    local_layers = 0

    class Settings(Algorithm.Settings):
        local_layers: int | None = Field(
            ge=0, description="bottom encoder layers kept local with the embeddings; None: half"
        )

    def adapt_model(self, model: nn.Module) -> nn.Module:
        layers = {encoder_layer_index(name) for name, _ in model.named_parameters()} - {None}
        chosen = self.settings.local_layers
        self.local_layers = (len(layers) + 1) // 2 if chosen is None else chosen
        return model

    def is_private(self, name: str) -> bool:
        layer = encoder_layer_index(name)
        return ".embeddings." in f".{name}" or (layer is not None and layer < self.local_layers)
