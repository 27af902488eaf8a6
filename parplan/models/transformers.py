"""Transformer zoo: BERT and GPT-2 / GPT-3-style decoders as layer graphs (docs/costmodel.md section 1).

A transformer is expressed in the graph IR with the sequence in the spatial slot: token ids
are a ``(1, S, 1)`` input, activations are ``(hidden, S, 1)``, and every projection is a
``per_position`` :class:`~parplan.costmodel.graph.Linear`. A weighted layer's batch in the
three-product view is therefore ``B = batch x sequence``, so the three partition types are
data parallelism (BATCH), the Megatron row split (IN, Di) and the Megatron column split (OUT,
Do). One block (pre-LN, GPT-2; BERT is post-LN, the norms after the adds):

    ln1 -> qkv (h -> 3h) -> attn (SDPA on fused Q, K, V) -> proj (h -> h) -> add1 (residual)
        -> ln2 -> fc1 (h -> 4h) -> act (gelu) -> fc2 (4h -> h) -> add2 (residual)

Embeddings are :class:`~parplan.costmodel.graph.Embedding` lookups on the token ids joined by
an :class:`~parplan.costmodel.graph.Add`; they carry parameters but no partition choice. The
attention core (QK^T, softmax, AV) has no weights and passes its layout through (heads split
with columns).

GPT-2 ties its LM head to the token embedding: the graph keeps the head as a bias-free weighted
layer (it costs FLOPs and communication like any projection) and :class:`TiedGraph` counts the
shared matrix once, so parameter counts equal the published (Hugging Face) ones:

=============  ======  ======  =====  ===  =================
model          layers  hidden  heads  seq  parameters
=============  ======  ======  =====  ===  =================
bert-base      12      768     12     512  109,482,240 (110M)
bert-large     24      1024    16     512  335,141,888 (340M)
gpt2           12      768     12     1024 124,439,808
gpt2-medium    24      1024    16     1024 354,823,168
gpt2-large     36      1280    20     1024 774,030,080
gpt2-xl        48      1600    25     1024 1,557,611,200
=============  ======  ======  =====  ===  =================

Example:
    >>> g = TRANSFORMER_MODELS["gpt2"]()
    >>> g.parameter_count()
    124439808
    >>> g.analyze().out_shape["h0.fc1"]
    Shape(channels=3072, height=1024, width=1)
    >>> gpt_config(layers=2, hidden=256, heads=4, seq=128, vocab=1000).parameter_count()
    1868800
"""

from __future__ import annotations

from typing import Callable

from parplan.costmodel.graph import (
    INPUT,
    Activation,
    Add,
    Attention,
    Bias,
    Conv2d,
    Embedding,
    Glu,
    Graph,
    Layer,
    Linear,
    Norm,
    Pool2d,
    Shape,
    TiedGraph,
    Tokens,
)
from parplan.errors import GraphError

__all__ = [
    "GPT3_SIZES",
    "TRANSFORMER_MODELS",
    "TRANSFORMER_TITLES",
    "TiedGraph",
    "bert_config",
    "gpt3",
    "gpt_config",
]


class _Builder:
    """Appends layers; each reads the previous one unless ``inputs`` is given."""

    def __init__(self) -> None:
        self.layers: list[Layer] = []
        self.last = INPUT

    def add(
        self, layer_cls: type[Layer], name: str, inputs: tuple[str, ...] | None = None, **attrs
    ) -> str:
        self.layers.append(layer_cls(name, inputs if inputs else (self.last,), **attrs))
        self.last = name
        return name

    def linear(self, name: str, out: int, bias: bool = True) -> str:
        return self.add(Linear, name, out_features=out, bias=bias, per_position=True)


def _check(
    name: str, layers: int, hidden: int, heads: int, seq: int, vocab: int, positions: int
) -> None:
    for what, v in (
        ("layers", layers),
        ("hidden", hidden),
        ("heads", heads),
        ("seq", seq),
        ("vocab", vocab),
    ):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise GraphError(f"model '{name}': {what} must be a positive int (got {v!r})")
    if hidden % heads:
        raise GraphError(f"model '{name}': hidden ({hidden}) must be divisible by heads ({heads})")
    if seq > positions:
        raise GraphError(
            f"model '{name}': seq ({seq}) exceeds the {positions} learned positions; "
            f"lower seq or raise positions"
        )


def _attention(b: _Builder, p: str, hidden: int, heads: int) -> str:
    b.linear(f"{p}.qkv", 3 * hidden)
    b.add(Attention, f"{p}.attn", heads=heads)
    return b.linear(f"{p}.proj", hidden)


def _pre_ln_blocks(
    b: _Builder, x: str, prefix: str, layers: int, hidden: int, heads: int, ffn: int
) -> str:
    """``layers`` pre-LN blocks (GPT-2, ViT) after ``x``, named ``prefix.format(i)``; the last add."""
    for i in range(layers):
        p = prefix.format(i)
        b.add(Norm, f"{p}.ln1", (x,), kind="layer")
        attn = _attention(b, p, hidden, heads)
        x = b.add(Add, f"{p}.add1", (x, attn))
        b.add(Norm, f"{p}.ln2", (x,), kind="layer")
        mlp = _mlp(b, p, hidden, ffn)
        x = b.add(Add, f"{p}.add2", (x, mlp))
    return x


def _mlp(b: _Builder, p: str, hidden: int, ffn: int) -> str:
    b.linear(f"{p}.fc1", ffn)
    b.add(Activation, f"{p}.act", function="gelu")
    return b.linear(f"{p}.fc2", hidden)


def gpt_config(
    layers: int,
    hidden: int,
    heads: int,
    seq: int,
    vocab: int = 50257,
    name: str | None = None,
    positions: int | None = None,
    ffn: int | None = None,
) -> TiedGraph:
    """A GPT-2 / GPT-3-style decoder (pre-LN, learned positions, LM head tied to the token embedding).

    ``seq`` is the training sequence length (tokens per sample); ``positions`` the learned
    position table (default ``seq``); ``ffn`` the MLP width (default ``4 * hidden``). Layers
    ``wte``, ``wpe``, ``embed`` (add), blocks ``h{i}.ln1 ... h{i}.add2``, ``ln_f`` and
    ``lm_head`` (bias-free, tied to ``wte``). Parameters:
    ``vocab*h + positions*h + layers*(4h^2 + 2h*ffn + 9h + ffn) + 2h`` (with ``ffn = 4h``:
    ``12h^2 + 13h`` per block).

    Example (GPT-3 175B, Brown et al. 2020, table 2.1):
        >>> round(gpt_config(96, 12288, 96, 2048).parameter_count() / 1e9, 1)
        174.6
    """
    name = name or f"gpt-{layers}x{hidden}"
    positions = seq if positions is None else positions
    ffn = 4 * hidden if ffn is None else ffn
    _check(name, layers, hidden, heads, seq, vocab, positions)
    b = _Builder()
    b.add(Embedding, "wte", (INPUT,), num=vocab, dim=hidden)
    b.add(Embedding, "wpe", (INPUT,), num=positions, dim=hidden)
    x = b.add(Add, "embed", ("wte", "wpe"))
    x = _pre_ln_blocks(b, x, "h{}", layers, hidden, heads, ffn)
    b.add(Norm, "ln_f", (x,), kind="layer")
    b.linear("lm_head", vocab, bias=False)
    return TiedGraph(name, Shape(1, seq, 1), tuple(b.layers), tied=(("lm_head", "wte"),))


def bert_config(
    layers: int,
    hidden: int,
    heads: int,
    seq: int = 512,
    vocab: int = 30522,
    name: str | None = None,
    positions: int = 512,
    token_types: int = 2,
    ffn: int | None = None,
) -> Graph:
    """A BERT encoder with pooler (post-LN; Devlin et al. 2019), as Hugging Face ``BertModel``.

    Word, position and token-type embeddings (all three look up the single token-id input:
    the IR has one graph input; the lookups' shapes and parameters are the real ones) are
    summed (``embed``) and normalised (``embed.ln``); blocks ``layer{i}.qkv ... layer{i}.ln2``
    with the norms after the residual adds; then the pooler: ``pooler.cls`` (an adaptive
    pool to one position, standing in for taking the [CLS] token: same shapes, no
    parameters), ``pooler.dense`` (h -> h) and ``pooler.act`` (tanh). No pre-training heads.
    """
    name = name or f"bert-{layers}x{hidden}"
    ffn = 4 * hidden if ffn is None else ffn
    _check(name, layers, hidden, heads, seq, vocab, positions)
    b = _Builder()
    b.add(Embedding, "word", (INPUT,), num=vocab, dim=hidden)
    b.add(Embedding, "position", (INPUT,), num=positions, dim=hidden)
    b.add(Embedding, "token_type", (INPUT,), num=token_types, dim=hidden)
    b.add(Add, "embed", ("word", "position", "token_type"))
    x = b.add(Norm, "embed.ln", kind="layer")
    for i in range(layers):
        p = f"layer{i}"
        attn = _attention(b, p, hidden, heads)
        b.add(Add, f"{p}.add1", (x, attn))
        x = b.add(Norm, f"{p}.ln1", kind="layer")
        mlp = _mlp(b, p, hidden, ffn)
        b.add(Add, f"{p}.add2", (x, mlp))
        x = b.add(Norm, f"{p}.ln2", kind="layer")
    b.add(Pool2d, "pooler.cls", mode="avg", output_size=(1, 1))
    b.linear("pooler.dense", hidden)
    b.add(Activation, "pooler.act", function="tanh")
    return Graph(name, Shape(1, seq, 1), tuple(b.layers))


def llama_config(
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    ffn: int,
    seq: int,
    vocab: int,
    experts: int = 1,
    top_k: int = 1,
    name: str | None = None,
) -> Graph:
    """A Llama-style decoder (pre-RMSNorm, rotary positions, grouped-query attention, SwiGLU MLP,
    untied LM head), as Hugging Face ``LlamaForCausalLM`` / ``MistralForCausalLM``; with
    ``experts > 1`` a Mixtral-style mixture of experts (a router per block and SwiGLU experts,
    each token routed to ``top_k``; priced with balanced routing, docs/costmodel.md section 1).

    Layers: ``embed``; blocks ``layers.{i}.norm1``, ``.qkv`` (q, k, v fused: (heads + 2 kv_heads)
    x d outputs), ``.attn``, ``.o``, ``.add1``, ``.norm2``, [``.router``, ``.router.softmax``],
    ``.gate_up`` (gate and up fused), ``.glu``, ``.down``, ``.add2``; ``norm``, ``lm_head``.

    Example (Llama-3-8B: 8,030,261,248 parameters):
        >>> llama_config(32, 4096, 32, 8, 14336, 2048, 128256).parameter_count()
        8030261248
    """
    name = name or f"llama-{layers}x{hidden}"
    _check(name, layers, hidden, heads, seq, vocab, seq)
    if kv_heads <= 0 or heads % kv_heads:
        raise GraphError(f"model '{name}': kv_heads ({kv_heads}) must divide heads ({heads})")
    d = hidden // heads
    b = _Builder()
    x = b.add(Embedding, "embed", (INPUT,), num=vocab, dim=hidden)
    moe = {"experts": experts, "top_k": top_k} if experts > 1 else {}
    for i in range(layers):
        p = f"layers.{i}"
        b.add(Norm, f"{p}.norm1", (x,), kind="rms")
        b.add(
            Linear,
            f"{p}.qkv",
            out_features=(heads + 2 * kv_heads) * d,
            bias=False,
            per_position=True,
        )
        b.add(
            Attention,
            f"{p}.attn",
            heads=heads,
            kv_heads=kv_heads if kv_heads != heads else 0,
            rotary=True,
        )
        b.add(Linear, f"{p}.o", out_features=hidden, bias=False, per_position=True)
        x = b.add(Add, f"{p}.add1", (x, b.last))
        norm = b.add(Norm, f"{p}.norm2", (x,), kind="rms")
        if experts > 1:
            b.add(Linear, f"{p}.router", out_features=experts, bias=False, per_position=True)
            b.add(Activation, f"{p}.router.softmax", function="softmax")
        b.add(
            Linear,
            f"{p}.gate_up",
            (norm,),
            out_features=2 * ffn,
            bias=False,
            per_position=True,
            **moe,
        )
        b.add(Glu, f"{p}.glu", function="silu")
        b.add(Linear, f"{p}.down", out_features=hidden, bias=False, per_position=True, **moe)
        x = b.add(Add, f"{p}.add2", (x, b.last))
    b.add(Norm, "norm", (x,), kind="rms")
    b.linear("lm_head", vocab, bias=False)
    return Graph(name, Shape(1, seq, 1), tuple(b.layers))


def vit_config(
    layers: int,
    hidden: int,
    heads: int,
    patch: int = 16,
    image: int = 224,
    ffn: int | None = None,
    classes: int = 1000,
    name: str | None = None,
) -> Graph:
    """A Vision Transformer (Dosovitskiy et al. 2021) as torchvision's ``vit_b_16``: a patch
    convolution, a class token and a learned position table, pre-LN blocks, the class token's
    final norm to a linear head.

    Example (ViT-B/16: 86,567,656 parameters, as torchvision's):
        >>> vit_config(12, 768, 12).parameter_count()
        86567656
    """
    name = name or f"vit-{layers}x{hidden}"
    ffn = 4 * hidden if ffn is None else ffn
    if image % patch:
        raise GraphError(f"model '{name}': image ({image}) must be a multiple of patch ({patch})")
    b = _Builder()
    b.add(Conv2d, "patch", (INPUT,), out_channels=hidden, kernel=patch, stride=patch)
    b.add(Tokens, "class_token", count=1)
    x = b.add(Bias, "positions", full=True)
    x = _pre_ln_blocks(b, x, "layers.{}", layers, hidden, heads, ffn)
    b.add(Norm, "ln", (x,), kind="layer")
    b.add(
        Pool2d, "class", mode="avg", output_size=(1, 1)
    )  # the class token: same shapes, no parameters
    b.linear("head", classes)
    return Graph(name, Shape(3, image, image), tuple(b.layers))


def llama3_8b() -> Graph:
    """Llama-3-8B: 32 layers, hidden 4096, 32 heads (8 key/value), MLP 14336, vocabulary 128256,
    sequence 2048; 8,030,261,248 parameters."""
    return llama_config(32, 4096, 32, 8, 14336, 2048, 128256, name="llama3-8b")


def llama3_70b() -> Graph:
    """Llama-3-70B: 80 layers, hidden 8192, 64 heads (8 key/value), MLP 28672, vocabulary 128256,
    sequence 2048; 70,553,706,496 parameters."""
    return llama_config(80, 8192, 64, 8, 28672, 2048, 128256, name="llama3-70b")


def mistral_7b() -> Graph:
    """Mistral-7B: 32 layers, hidden 4096, 32 heads (8 key/value), MLP 14336, vocabulary 32000,
    sequence 2048 (inside its 4096-token sliding window); 7,241,732,096 parameters."""
    return llama_config(32, 4096, 32, 8, 14336, 2048, 32000, name="mistral-7b")


def mixtral_8x7b() -> Graph:
    """Mixtral-8x7B: Mistral-7B's shape with 8 SwiGLU experts per block, 2 per token;
    46,702,792,704 parameters."""
    return llama_config(
        32, 4096, 32, 8, 14336, 2048, 32000, experts=8, top_k=2, name="mixtral-8x7b"
    )


def vit_b16() -> Graph:
    """ViT-B/16: 12 layers, hidden 768, 12 heads, 224 x 224 images in 16 x 16 patches;
    86,567,656 parameters."""
    return vit_config(12, 768, 12, name="vit-b16")


#: GPT-3 model sizes (Brown et al. 2020, table 2.1): name -> (layers, hidden, heads); seq 2048.
#: Two rows of the table are inconsistent with its own d_head = 128; corrected as noted.
GPT3_SIZES: dict[str, tuple[int, int, int]] = {
    "small": (12, 768, 12),
    "medium": (24, 1024, 16),
    "large": (24, 1536, 16),
    "xl": (24, 2048, 16),  # the table prints 24 heads of 128, which is not 2048: 16 x 128
    "2.7b": (32, 2560, 32),
    "6.7b": (32, 4096, 32),
    "13b": (40, 5120, 40),  # the table prints 5140, a typo: 40 heads x 128
    "175b": (96, 12288, 96),
}


def gpt3(size: str, seq: int = 2048) -> TiedGraph:
    """A GPT-3 configuration from :data:`GPT3_SIZES` (``"175b"``, ``"6.7b"``, ...), sequence ``seq``.

    Example:
        >>> gpt3("6.7b").name
        'gpt3-6.7b'
    """
    key = size.strip().lower()
    if key not in GPT3_SIZES:
        raise GraphError(f"unknown GPT-3 size '{size}'; valid sizes: {', '.join(GPT3_SIZES)}")
    layers, hidden, heads = GPT3_SIZES[key]
    return gpt_config(
        layers, hidden, heads, seq, positions=2048 if seq <= 2048 else seq, name=f"gpt3-{key}"
    )


def bert_base() -> Graph:
    """BERT-base: 12 layers, hidden 768, 12 heads, sequence 512; 109,482,240 parameters."""
    return bert_config(12, 768, 12, name="bert-base")


def bert_large() -> Graph:
    """BERT-large: 24 layers, hidden 1024, 16 heads, sequence 512; 335,141,888 parameters."""
    return bert_config(24, 1024, 16, name="bert-large")


def gpt2() -> TiedGraph:
    """GPT-2 small: 12 layers, hidden 768, 12 heads, sequence 1024; 124,439,808 parameters."""
    return gpt_config(12, 768, 12, 1024, name="gpt2")


def gpt2_medium() -> TiedGraph:
    """GPT-2 medium: 24 layers, hidden 1024, 16 heads, sequence 1024; 354,823,168 parameters."""
    return gpt_config(24, 1024, 16, 1024, name="gpt2-medium")


def gpt2_large() -> TiedGraph:
    """GPT-2 large: 36 layers, hidden 1280, 20 heads, sequence 1024; 774,030,080 parameters."""
    return gpt_config(36, 1280, 20, 1024, name="gpt2-large")


def gpt2_xl() -> TiedGraph:
    """GPT-2 XL: 48 layers, hidden 1600, 25 heads, sequence 1024; 1,557,611,200 parameters."""
    return gpt_config(48, 1600, 25, 1024, name="gpt2-xl")


#: Zoo name -> builder, to be merged into :data:`parplan.models.zoo.MODELS`.
TRANSFORMER_MODELS: dict[str, Callable[[], Graph]] = {
    "bert-base": bert_base,
    "bert-large": bert_large,
    "gpt2": gpt2,
    "gpt2-medium": gpt2_medium,
    "gpt2-large": gpt2_large,
    "gpt2-xl": gpt2_xl,
    "llama3-8b": llama3_8b,
    "llama3-70b": llama3_70b,
    "mistral-7b": mistral_7b,
    "mixtral-8x7b": mixtral_8x7b,
    "vit-b16": vit_b16,
}

#: Zoo name -> one-line title (for ``parplan models``), to be merged into the zoo's titles.
TRANSFORMER_TITLES: dict[str, str] = {
    "bert-base": "BERT-base encoder + pooler (12 x 768, 12 heads, seq 512)",
    "bert-large": "BERT-large encoder + pooler (24 x 1024, 16 heads, seq 512)",
    "gpt2": "GPT-2 small (12 x 768, 12 heads, seq 1024, tied LM head)",
    "gpt2-medium": "GPT-2 medium (24 x 1024, 16 heads, seq 1024, tied LM head)",
    "gpt2-large": "GPT-2 large (36 x 1280, 20 heads, seq 1024, tied LM head)",
    "gpt2-xl": "GPT-2 XL (48 x 1600, 25 heads, seq 1024, tied LM head)",
    "llama3-8b": "Llama-3-8B (32 x 4096, GQA 32/8 heads, SwiGLU 14336, RMSNorm, RoPE, seq 2048)",
    "llama3-70b": "Llama-3-70B (80 x 8192, GQA 64/8 heads, SwiGLU 28672, RMSNorm, RoPE, seq 2048)",
    "mistral-7b": "Mistral-7B (32 x 4096, GQA 32/8 heads, SwiGLU 14336, vocab 32000, seq 2048)",
    "mixtral-8x7b": "Mixtral-8x7B (Mistral-7B with 8 SwiGLU experts, top-2 routing, seq 2048)",
    "vit-b16": "ViT-B/16 (12 x 768, 12 heads, 224 x 224 images, 16 x 16 patches, class token)",
}
