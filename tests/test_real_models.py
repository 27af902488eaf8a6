"""Real models from public libraries (issue 13): torchvision and Hugging Face models, random
weights on the meta device, captured with torch.export. Each imports with exactly its
parameter count, training FLOPs within 1% of 3x torch's FLOP counter on the same forward (with
grad enabled, attention included), and plans with ``accpar``. Skipped without the extras."""

import math

import pytest

torch = pytest.importorskip("torch")
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from parplan.costmodel.dims import layer_profiles  # noqa: E402
from parplan.costmodel.evaluate import evaluate  # noqa: E402
from parplan.costmodel.hardware import parse_array  # noqa: E402
from parplan.costmodel.layout import Layout  # noqa: E402
from parplan.costmodel.problem import Problem  # noqa: E402
from parplan.errors import ConfigError  # noqa: E402
from parplan.models.importers import from_torch  # noqa: E402
from parplan.models.importers.hub import hf_model, import_torchvision, native_image  # noqa: E402
from parplan.solvers.planners import make_plan  # noqa: E402

try:
    tv = import_torchvision()  # before transformers, which imports it
except ConfigError:
    tv = None
try:
    import transformers
except ModuleNotFoundError:
    transformers = None

VISION = [
    "resnet50",
    "mobilenet_v2",
    pytest.param("efficientnet_b0", marks=pytest.mark.slow),
    pytest.param("convnext_tiny", marks=pytest.mark.slow),
    "vit_b_16",
    pytest.param("swin_t", marks=pytest.mark.slow),
    # cosine attention, a position-bias MLP on a constant table; 8 x 8 windows at 256 pixels
    pytest.param("swin_v2_t", marks=pytest.mark.slow),
    # halves of the channels (chunk) read by a convolution and a concat; channel shuffles
    pytest.param("shufflenet_v2_x0_5", marks=pytest.mark.slow),
    pytest.param("densenet121", marks=pytest.mark.slow),
    pytest.param("maxvit_t", marks=pytest.mark.slow),  # attention written with einsum
]
SMALL = dict(
    num_hidden_layers=2,
    hidden_size=64,
    num_attention_heads=4,
    intermediate_size=128,
    vocab_size=1000,
)
HF = {
    "gpt2": dict(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=128),
    "bert": dict(SMALL),
    "llama": dict(SMALL, num_key_value_heads=4),
    "mistral": dict(SMALL, num_key_value_heads=2),  # grouped-query attention
    "mixtral": dict(SMALL, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2),
    "t5": dict(num_layers=2, d_model=64, num_heads=4, d_kv=16, d_ff=128, vocab_size=1000),
    # its own fused q/k/v split per head, with rotary embedding on a quarter of the head dim
    "gpt_neox": dict(SMALL),  # default partial rotary factor 0.25
    # q, k, v sliced by index out of one projection, grouped-query attention on the slices
    "phi3": dict(SMALL, num_key_value_heads=2, pad_token_id=0),
    # q, k, v selected per head from a stacked view of one projection; ALiBi scores (baddbmm)
    "bloom": dict(n_layer=2, hidden_size=64, n_head=4, vocab_size=1000),
    # routed experts and a shared expert scaled per token by a sigmoid gate (a per-position Mul)
    "qwen2_moe": dict(
        SMALL,
        num_key_value_heads=2,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=64,
    ),
    # an RMS norm per head on q and k before RoPE: folded into the attention (qk_norm)
    "qwen3": dict(SMALL, num_key_value_heads=2, head_dim=16),
    # pooled at the end-of-text token: one position per sample picked by the token ids
    "clip_text_model": dict(SMALL),
    # x @ W.T projections; multi-query attention: q, k, v heads of a per-head view (slice, index)
    "falcon": dict(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        ffn_hidden_size=256,
        vocab_size=1000,
    ),
    # an encoder-decoder model: its encoder (the IR has no cross-attention)
    "bart": dict(
        encoder_layers=2,
        decoder_layers=1,
        d_model=64,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        vocab_size=1000,
    ),
}


def forward_flops(model, example, **kwargs) -> float:
    """torch's FLOP counter on one forward with grad enabled, on the meta device (shapes only);
    scaled dot-product attention as matmul + softmax, and experts as plain products, so that
    the counter sees every product."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("eager")
    with (
        FlopCounterMode(display=False) as counter,
        sdpa_kernel(SDPBackend.MATH),
        torch.enable_grad(),
    ):
        model(example, **kwargs)
    return counter.get_total_flops()


def check(graph, model, example, array: str, batch: int, **kwargs):
    """Parameters exact, FLOPs within 1%, and an accpar plan no slower than data parallelism."""
    assert graph.parameter_count() == sum(p.numel() for p in model.parameters())
    ours = sum(p.flops for p in layer_profiles(graph, 1))
    assert math.isclose(ours, 3 * forward_flops(model, example, **kwargs), rel_tol=0.01)
    problem = Problem(graph, parse_array(array), batch=batch)
    plan = make_plan(problem, "accpar")
    assert evaluate(problem, plan).step_time_s <= evaluate(
        problem, make_plan(problem, "data")
    ).step_time_s * (1 + 1e-9)
    return plan


@pytest.mark.skipif(tv is None, reason="torchvision not installed")
@pytest.mark.parametrize("name", VISION)
def test_torchvision_model(name):
    with torch.device("meta"):
        model = tv.models.get_model(name, weights=None)
    size = native_image(name)  # what tv:<name> imports at
    graph = from_torch(model, (3, size, size), name=name)
    plan = check(
        graph, model, torch.zeros(1, 3, size, size, device="meta"), "a100:1,h100:1", batch=32
    )
    if name == "densenet121":
        assert "fallback" in plan.info  # too large for the exact DP: planned anyway, and said so


@pytest.mark.skipif(tv is None, reason="torchvision not installed")
def test_torchvision_specs_default_to_the_image_size_of_the_models_weights():
    """``tv:<name>`` without ``image=`` imports at the size torchvision evaluates the model's
    weights at (Swin V2's 8 x 8 windows do not tile 224 pixels' stages, Inception V3 takes 299);
    a model without weights at 224."""
    from parplan.models.importers.hub import DEFAULT_IMAGE

    from parplan.models.importers.hub import torchvision_model

    sizes = [native_image(n) for n in ("resnet50", "inception_v3", "swin_v2_t", "vit_h_14")]
    assert sizes == [224, 299, 256, 518] and DEFAULT_IMAGE == 224
    # a builder that fixes its image size (a vision transformer's position table) gets it
    tables = [torchvision_model("vit_h_14", image=i).encoder.pos_embedding for i in (518, None)]
    assert [t.shape[1] for t in tables] == [(518 // 14) ** 2 + 1, (224 // 14) ** 2 + 1]


@pytest.mark.skipif(tv is None, reason="torchvision not installed")
def test_a_torchvision_model_that_needs_values_is_built_without_drawing_its_weights():
    """RegNet computes its widths from tensors, so it cannot be built on the meta device: it is
    built on the CPU with torch's initialisers idle (RegNet-Y-128GF drew 644 M random weights
    for 9 s), and imports as the model with drawn weights does; the initialisers come back."""
    import torch.nn.init as init

    from parplan.models.importers.hub import torchvision_model

    normal = init.normal_
    model = torchvision_model("regnet_y_400mf")  # meta asked, CPU used
    assert init.normal_ is normal
    assert next(model.parameters()).device.type == "cpu"
    drawn = torchvision_model("regnet_y_400mf", device="cpu")
    # the same tensors' shapes, which are all the import reads
    assert [(k, v.shape) for k, v in model.state_dict().items()] == [
        (k, v.shape) for k, v in drawn.state_dict().items()
    ]
    graph = from_torch(model, (3, 224, 224), name="regnet")
    assert graph.parameter_count() == sum(p.numel() for p in drawn.parameters())


#: Checked in the slow run only (each import and FLOP count takes 1-2 s; the default run keeps
#: one model per importer feature: fused pieces with GQA (phi3), per-head norms (qwen3), ...).
SLOW_HF = {"gpt_neox", "bloom", "clip_text_model", "bart"}


@pytest.mark.skipif(transformers is None, reason="transformers not installed")
@pytest.mark.parametrize(
    "kind", [pytest.param(k, marks=pytest.mark.slow) if k in SLOW_HF else k for k in HF]
)
def test_hugging_face_model(kind):
    model, _ = hf_model(
        kind, HF[kind], seq=32, device="cpu"
    )  # tiny; the counter needs values for masks
    graph = from_torch(model, (32,), name=kind)
    import inspect

    takes_cache = "use_cache" in inspect.signature(model.forward).parameters
    kwargs = {"use_cache": False} if takes_cache else {}
    check(graph, model, torch.zeros(1, 32, dtype=torch.long), "a100:1,h100:1", batch=8, **kwargs)
    kinds = {type(layer).__name__ for layer in graph.layers}
    expect = {
        "gpt2": {"Attention", "Embedding"},
        "bert": {"Attention", "Pool2d"},
        "t5": {"Attention"},
        "llama": {"Glu", "Attention"},
        "mistral": {"Glu", "Attention"},
        "mixtral": {"Glu"},
        "gpt_neox": {"Attention", "Embedding"},
        "phi3": {"Glu", "Attention"},
        "bloom": {"Attention", "Embedding"},
        "qwen3": {"Glu", "Attention"},
        "clip_text_model": {"Attention", "Pool2d"},
        "bart": {"Attention", "Embedding"},
        "falcon": {"Attention", "Embedding"},
        "qwen2_moe": {"Glu", "Mul"},
    }[kind]
    assert expect <= kinds
    if kind == "qwen2_moe":  # the shared expert's per-token gate: a product kept by rows
        gates = [
            n for n in Problem(graph, parse_array("h100:2"), batch=1).planning.nodes if n.layouts
        ]
        assert len(gates) == 2 and all(n.choices == (Layout.ROWS, Layout.WHOLE) for n in gates)
    if kind in ("mistral", "gpt_neox", "phi3", "qwen3", "falcon"):
        attn = [layer for layer in graph.layers if type(layer).__name__ == "Attention"][0]
        kv = {"gpt_neox": 4, "falcon": 1}.get(kind, 2)
        assert (attn.heads, attn.kv_heads or attn.heads, attn.rotary) == (4, kv, True)
        assert attn.qk_norm == (kind == "qwen3")
    if kind == "mixtral":
        banks = [layer for layer in graph.layers if getattr(layer, "experts", 1) > 1]
        assert len(banks) == 4 and all((b.experts, b.top_k) == (4, 2) for b in banks)


@pytest.mark.skipif(transformers is None, reason="transformers not installed")
def test_falcon_new_decoder_architecture_imports_its_interleaved_qkv():
    """Falcon's new decoder architecture views its fused projection as (groups, heads per
    group + 2, d) and takes q, then k and v per key/value group: grouped-query attention on
    one projection whose features are [q | k | v] permuted."""
    cfg = dict(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_kv_heads=2,
        new_decoder_architecture=True,
        ffn_hidden_size=256,
        vocab_size=1000,
    )
    model, _ = hf_model("falcon", cfg, seq=32, device="cpu")
    graph = from_torch(model, (32,), name="falcon-new")
    attn = [layer for layer in graph.layers if type(layer).__name__ == "Attention"]
    assert len(attn) == 2 and (attn[0].heads, attn[0].kv_heads) == (4, 2)
    example = torch.zeros(1, 32, dtype=torch.long)
    check(graph, model, example, "a100:1,h100:1", batch=8, use_cache=False)


@pytest.mark.skipif(transformers is None, reason="transformers not installed")
def test_whisper_encoder_imports_its_1d_convolutions():
    """Whisper's encoder: two 1-D convolutions over (mel bins, frames), their output transposed
    into the blocks' (positions, features); the graph input is taken as (bins, frames)."""
    cfg = dict(
        d_model=64,
        encoder_layers=2,
        decoder_layers=1,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        num_mel_bins=16,
        max_source_positions=32,
    )
    model, _ = hf_model("whisper", cfg, device="meta")
    graph = from_torch(model, (16, 64), name="whisper")
    assert (graph.input_shape.channels, graph.input_shape.height) == (16, 64)
    convs = [layer for layer in graph.layers if type(layer).__name__ == "Conv2d"]
    assert [(c.kernel, c.stride, c.padding) for c in convs] == [
        ((3, 1), (1, 1), (1, 0)),
        ((3, 1), (2, 1), (1, 0)),
    ]
    check(graph, model, torch.zeros(1, 16, 64, device="meta"), "a100:1,h100:1", batch=8)


@pytest.mark.slow
@pytest.mark.skipif(transformers is None, reason="transformers not installed")
def test_phi3_without_grouped_query_attention_imports():
    """Phi-3 with as many key/value heads as query heads (its default configuration's form):
    q, k, v sliced by index out of one projection, rotary, plain multi-head attention."""
    cfg = dict(SMALL, num_key_value_heads=4, pad_token_id=0)
    model, _ = hf_model("phi3", cfg, seq=32, device="cpu")
    graph = from_torch(model, (32,), name="phi3")
    attn = [layer for layer in graph.layers if type(layer).__name__ == "Attention"]
    assert [(a.heads, a.key_heads, a.rotary) for a in attn] == [(4, 4, True)] * 2
    example = torch.zeros(1, 32, dtype=torch.long)
    check(graph, model, example, "a100:1,h100:1", batch=8, use_cache=False)


@pytest.mark.skipif(transformers is None, reason="transformers not installed")
def test_deberta_v3_imports_its_disentangled_attention():
    """DeBERTa-v3's relative attention: q against learned position keys and k against position
    queries (the relative embeddings, layer-normed, through the q and k projections), each
    gathered per query and key and added to the scores, becomes ``Attention(relative=R,
    relative_terms=2)``. Parameters exact (the relative embeddings and their norm counted once,
    at the first layer). FLOPs: the two products with the position keys and queries per
    sample (docs/costmodel.md section 1); the projections of the position embeddings run once
    per step on no sample and are not priced, so torch's counter at batch 1 is above the
    model's by exactly them."""
    from parplan.costmodel.graph import Attention

    layers, hidden, buckets, seq = 2, 64, 16, 32
    cfg = dict(
        num_hidden_layers=layers,
        hidden_size=hidden,
        num_attention_heads=4,
        intermediate_size=128,
        vocab_size=1000,
        relative_attention=True,
        pos_att_type=["p2c", "c2p"],
        # not a field of the configuration class, but read by the model: accepted as an override
        position_buckets=buckets,
        max_relative_positions=-1,
        share_att_key=True,
        norm_rel_ebd="layer_norm",
    )
    model, _ = hf_model("deberta-v2", cfg, seq=seq, device="cpu")
    assert type(model).__name__ == "DebertaV2Model" and model.config.position_buckets == buckets
    with pytest.raises(ConfigError, match="its configuration has no 'position_bukets'"):
        hf_model("deberta-v2", {"position_bukets": buckets})  # a typo stays refused
    with pytest.raises(ConfigError, match="its configuration has no 'hidden'"):
        hf_model("deberta-v2", {"hidden": 64})  # the model reads hidden_size, not hidden
    graph = from_torch(model, (seq,), name="deberta-v3")
    assert graph.parameter_count() == sum(p.numel() for p in model.parameters())
    attn = [layer for layer in graph.layers if isinstance(layer, Attention)]
    span = 2 * buckets
    assert [(a.relative, a.relative_terms) for a in attn] == [(span, 2)] * layers
    assert [a.bias_params for a in attn] == [span * hidden + 2 * hidden, 0]
    ours = sum(p.flops for p in layer_profiles(graph, 1))
    counted = 3 * forward_flops(model, torch.zeros(1, seq, dtype=torch.long))
    positions = 3 * 2 * (2 * span * hidden * hidden)  # q and k projections of the embeddings
    assert math.isclose(ours, counted - layers * positions, rel_tol=1e-12)
    problem = Problem(graph, parse_array("a100:1,h100:1"), batch=8)
    assert evaluate(problem, make_plan(problem, "accpar")).step_time_s <= evaluate(
        problem, make_plan(problem, "data")
    ).step_time_s * (1 + 1e-9)


#: Mamba-style models: their mixer's inner size, state size and convolution kernel are 128, 8
#: and 4 in each (Jamba: one Mamba layer, then one attention layer with 4 experts).
MAMBAS = {
    "mamba": dict(time_step_rank=4, intermediate_size=128, state_size=8),
    "falcon_mamba": dict(time_step_rank=4, intermediate_size=128, state_size=8),
    "jamba": dict(
        mamba_dt_rank=4,
        mamba_expand=2,
        mamba_d_state=8,
        intermediate_size=128,
        attn_layer_period=2,
        attn_layer_offset=1,
        expert_layer_period=2,
        expert_layer_offset=1,
        num_experts=4,
        num_attention_heads=4,
        num_key_value_heads=2,
    ),
}


@pytest.mark.skipif(transformers is None, reason="transformers not installed")
@pytest.mark.parametrize(
    "kind", ["mamba", *(pytest.param(k, marks=pytest.mark.slow) for k in MAMBAS if k != "mamba")]
)
def test_mamba_imports_its_selective_scan_and_causal_convolution(kind):
    """Mamba's mixer: the selective scan (a Python loop per position without its CUDA kernel)
    is traced as one operator and becomes a Scan join, kept by rows; the depthwise 1-D
    convolution cropped back to the sequence is a causal convolution; the time step's
    projection is ``dt_proj.weight @ x`` (FalconMamba and Jamba also RMS-normalise dt, B and C,
    slices of one projection). Parameters exact. FLOPs: torch's counter sees the convolution
    at ``L + k - 1`` positions and, of the scan, only its output products (``2 I N`` per
    position forward); the model counts the convolution at ``L`` positions and the scan's
    ``7 N + 3`` per channel and position (docs/costmodel.md section 1), so the two differ by
    exactly that per Mamba layer."""
    from parplan.costmodel.graph import Conv2d, Scan

    hidden, inner, state, kernel, seq = 64, 128, 8, 4, 32
    cfg = dict(MAMBAS[kind], num_hidden_layers=2, hidden_size=hidden, vocab_size=1000)
    model, _ = hf_model(kind, cfg, seq=seq, device="cpu")
    graph = from_torch(model, (seq,), name=kind, kwargs={"use_cache": False})
    assert graph.parameter_count() == sum(p.numel() for p in model.parameters())
    scans = [layer for layer in graph.layers if isinstance(layer, Scan)]
    convs = [layer for layer in graph.layers if isinstance(layer, Conv2d)]
    mixers = 1 if kind == "jamba" else 2
    assert len(scans) == len(convs) == mixers
    assert all((s.state, s.skip, s.dt_bias, len(s.inputs)) == (state, True, True, 5) for s in scans)
    assert all(c.causal and c.groups == inner and c.kernel == (kernel, 1) for c in convs)
    assert graph.analyze().out_shape[convs[0].name].height == seq
    names = {layer.name for layer in graph.layers}
    assert any(n.endswith(".conv1d") for n in names) and any(n.endswith(".dt_proj") for n in names)

    ours = sum(p.flops for p in layer_profiles(graph, 1))
    counted = 3 * forward_flops(model, torch.zeros(1, seq, dtype=torch.long), use_cache=False)
    scan_extra = 3 * (7 * state + 3 - 2 * state) * inner * seq
    conv_extra = -6 * inner * kernel * (kernel - 1)
    assert math.isclose(ours, counted + mixers * (scan_extra + conv_extra), rel_tol=1e-12)

    problem = Problem(graph, parse_array("h100:2"), batch=8)
    kept = [n for n in problem.planning.nodes if n.layouts]
    assert [n.name for n in kept] == [s.name for s in scans]
    assert all(n.choices == (Layout.ROWS, Layout.WHOLE) for n in kept)
    plan = make_plan(problem, "accpar")
    assert evaluate(problem, plan).step_time_s <= evaluate(
        problem, make_plan(problem, "data")
    ).step_time_s * (1 + 1e-9)


@pytest.mark.skipif(transformers is None, reason="transformers not installed")
def test_hub_specs_and_their_mistakes():
    from parplan.models.importers import load_external

    g = load_external("hf:gpt2,n_layer=1,n_embd=64,n_head=4,vocab_size=500,seq=16")
    assert g.name == "hf:gpt2" and g.input_shape.height == 16
    assert (
        g.parameter_count() == 500 * 64 + 1024 * 64 + (12 * 64 * 64 + 13 * 64) + 2 * 64
    )  # GPT-2's own formula
    for spec, message in (
        ("hf:lama", "no model type 'lama'"),
        ("hf:gpt2,n_layerz=2", "has no 'n_layerz'"),
        ("hf:gpt2,n_layer", "options are key=value"),
        ("hf:", "name a model after the prefix"),
        ("tv:resnet", "torchvision has no model 'resnet'"),
        ("tv:resnet18,image=abc", "image must be a whole number of pixels > 0"),
        ("tv:resnet18,image=0", "image must be a whole number of pixels > 0"),
        ("hf:phi3,vocab_size=1000", "transformers cannot build it with these options"),
    ):
        if spec.startswith("tv:") and tv is None:
            continue
        with pytest.raises(ConfigError, match=message):
            load_external(spec)


@pytest.mark.skipif(transformers is None, reason="transformers not installed")
def test_a_model_without_a_position_limit_fails_fast(monkeypatch):
    """Mamba names no position limit, and without its selective scan traced as one operator it
    steps through positions in Python: at the default 2,048 positions that trace ran for more
    than 5 minutes before the importer's error. Such a model is imported at 16 positions
    first, and what the importer cannot map fails from there; with the scan as an operator,
    the same spec imports at 2,048 positions."""
    from parplan.errors import GraphError
    from parplan.models.importers import api, kernels, load_external

    seen = []
    real = api.from_torch
    monkeypatch.setattr(
        api, "from_torch", lambda m, shape, **k: seen.append(shape) or real(m, shape, **k)
    )
    spec = "hf:mamba,num_hidden_layers=1,hidden_size=16,state_size=4,vocab_size=100"
    with monkeypatch.context() as m:
        m.setattr(kernels, "SCANS", ())  # the scan as the library's Python loop
        with pytest.raises(GraphError, match="found in a first import at seq=16.*2048 positions"):
            load_external(spec)
    assert seen == [(16,)]  # the long trace never started
    assert load_external(spec).input_shape.height == 2048
    assert seen == [(16,), (16,), (2048,)]


@pytest.mark.skipif(transformers is None, reason="transformers not installed")
def test_encoder_decoder_specs_are_their_encoder_and_partial_imports_are_refused(monkeypatch):
    """hf:bart is its encoder, named so (issue 36: it used to be BartForCausalLM, whose unused
    cross-attention weights went unplanned without a word); a forward that reads fewer
    parameters than the model holds is refused, never planned in part."""
    from parplan.errors import ConfigError
    from parplan.models.importers import hub, load_external

    g = load_external("hf:bart,encoder_layers=1,d_model=64,encoder_attention_heads=4,seq=16")
    assert g.name == "hf:bart (encoder)" and g.layers[0].name.startswith("embed_tokens")
    real = hub.hf_model

    def with_spare_head(*args, **kwargs):
        model, seq = real(*args, **kwargs)
        model.spare = torch.nn.Linear(64, 64, device="meta")  # never read by forward
        return model, seq

    monkeypatch.setattr(hub, "hf_model", with_spare_head)
    with pytest.raises(ConfigError, match=r"its forward reads [\d,]+ of the model's [\d,]+ param"):
        load_external("hf:gpt2,n_layer=1,n_embd=64,n_head=4,vocab_size=500,seq=16")


def test_hub_spec_reads_a_checkpoints_own_config_json(tmp_path):
    """hf:path/to/config.json builds the model a checkpoint's configuration describes (its model
    type and every setting it gives; the checkpoint's records ignored), also given its folder."""
    import json

    from parplan.models.importers import load_external

    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 176,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "vocab_size": 512,
        "max_position_embeddings": 128,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.40.0",
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    g = load_external(f"hf:{tmp_path / 'config.json'},seq=32")
    assert g.input_shape.height == 32
    h, ffn, kv = 64, 176, 2 * 16
    per_layer = (
        h * (h + 2 * kv) + h * h + 3 * h * ffn + 2 * h
    )  # q, k, v, o, gate/up/down, two RMS norms
    assert (
        g.parameter_count() == 2 * 512 * h + 2 * per_layer + h
    )  # embedding, head (not tied), final norm
    assert load_external(f"hf:{tmp_path}").parameter_count() == g.parameter_count()
    (tmp_path / "bad.json").write_text(json.dumps({"hidden_size": 8}))
    for spec, message in (
        (f"hf:{tmp_path / 'bad.json'}", 'names its "model_type"'),
        (f"hf:{tmp_path / 'none.json'}", "no such file"),
        ("hf:meta-llama/Meta-Llama-3-8B", "hub id needs the network"),
    ):
        with pytest.raises(ConfigError, match=message):
            load_external(spec)


@pytest.mark.slow
@pytest.mark.skipif(transformers is None, reason="transformers not installed")
def test_llama3_70b_size_config_plans_on_the_meta_device():
    """Llama-3-70B's shape (80 x 8192, GQA 64/8, SwiGLU 28672, vocabulary 128256), weights on the
    meta device: captured, imported with its exact parameter count, and planned (measured: about
    35 s and 0.7 GB on 2 cores; docs/importers.md)."""
    model, seq = hf_model(
        "llama",
        dict(
            hidden_size=8192,
            num_hidden_layers=80,
            num_attention_heads=64,
            num_key_value_heads=8,
            intermediate_size=28672,
            vocab_size=128256,
        ),
        seq=2048,
    )
    g = from_torch(model, (seq,), name="llama-70b")
    assert g.parameter_count() == sum(p.numel() for p in model.parameters()) == 70_553_706_496
    problem = Problem(g, parse_array("h100:8"), batch=8)
    assert evaluate(problem, make_plan(problem, "accpar")).step_time_s > 0
