"""Per-layer sizes and FLOPs in the three-matrix-product view (SPEC section 1).

Every weighted layer is a fully connected layer with batch ``B``, input features ``Di`` and
output features ``Do``; convolutions keep their spatial extent as a size multiplier only.
One training step of a layer runs forward, backward and gradient products:
``FLOPs = 3 * 2 * B * Do * Hout*Wout * Di * kh*kw / groups``.

Example:
    >>> d = LayerDims(batch=4, in_features=3, out_features=8, in_spatial=32 * 32, out_spatial=32 * 32, kernel=9)
    >>> d.flops == 3 * 2 * 4 * 8 * 1024 * 3 * 9
    True
    >>> d.weight_elements, d.in_elements, d.out_elements
    (216.0, 12288, 32768)
"""

from __future__ import annotations

from dataclasses import dataclass

from parplan.costmodel.graph import Graph


@dataclass(frozen=True)
class LayerDims:
    """Sizes of one layer (or one join) at one level of the hierarchy; floats because shares scale them.

    For a join (add/concat) ``kernel`` is 0: no weights, no FLOPs, and ``in_features`` ==
    ``out_features`` == its channels.
    """

    batch: float
    in_features: float
    out_features: float
    in_spatial: int
    out_spatial: int
    kernel: int
    groups: int = 1

    @property
    def flops(self) -> float:
        """FLOPs of forward + backward + gradient."""
        return 6.0 * self.batch * self.out_features * self.out_spatial * self.in_features * self.kernel / self.groups

    @property
    def weight_elements(self) -> float:
        """|W| = |dW| = Di * Do * kh*kw / groups (biases are not partitioned and not counted)."""
        return self.in_features * self.out_features * self.kernel / self.groups

    @property
    def in_elements(self) -> float:
        """|F[l]| = |E[l]| = B * Di * Hin*Win."""
        return self.batch * self.in_features * self.in_spatial

    @property
    def out_elements(self) -> float:
        """|F[l+1]| = |E[l+1]| = B * Do * Hout*Wout."""
        return self.batch * self.out_features * self.out_spatial

    def scaled(self, batch: float = 1.0, in_features: float = 1.0, out_features: float = 1.0) -> "LayerDims":
        """A copy with B, Di, Do multiplied by the given factors."""
        return LayerDims(self.batch * batch, self.in_features * in_features, self.out_features * out_features,
                         self.in_spatial, self.out_spatial, self.kernel, self.groups)


@dataclass(frozen=True)
class LayerProfile:
    """Whole-layer figures of one layer of a graph at a batch size (every layer, weighted or not)."""

    name: str
    op: str
    flops: float
    weight_elements: int
    in_elements: float
    out_elements: float


def layer_dims(graph: Graph, name: str, batch: float) -> LayerDims:
    """The :class:`LayerDims` of a weighted or join layer of ``graph`` at ``batch``."""
    info = graph.analyze()
    layer = graph.layer(name)
    x, y = info.in_shapes[name][0], info.out_shape[name]
    if layer.weighted:
        return LayerDims(batch, x.channels, y.channels, x.spatial, y.spatial, layer.kernel_elements(), layer.groups)
    return LayerDims(batch, y.channels, y.channels, y.spatial, y.spatial, 0)


def layer_profiles(graph: Graph, batch: float) -> list[LayerProfile]:
    """Per-layer FLOPs (training step), parameters and activation sizes in topological order.

    Non-weighted layers have 0 FLOPs here (the cost model treats them as free).
    """
    info = graph.analyze()
    out = []
    for name in info.order:
        layer = graph.layer(name)
        ins = list(info.in_shapes[name])
        flops = layer_dims(graph, name, batch).flops if layer.weighted else 0.0
        out.append(
            LayerProfile(
                name=name,
                op=type(layer).__name__,
                flops=flops,
                weight_elements=layer.weight_elements(ins),
                in_elements=batch * sum(s.elements for s in ins),
                out_elements=batch * info.out_shape[name].elements,
            )
        )
    return out
