"""Whole training steps measured on the local device, to set against the cost model's
prediction (docs/calibration.md, "Checking the model on whole steps").

Each case is a model spec as ``--model`` takes it and a batch. A step here is the forward and
backward pass (what docs/costmodel.md section 5 prices on one device), timed apart from the
optimizer's update (which the model does not price), in bf16 on the GPU with
``torch.autograd`` (gradients set to None between steps: no accumulation kernels). The
predicted side, :func:`predict_step_seconds`, sums the section 5 compute time of every node
on one device of a device file (one device: no communication).

Run on a GPU: ``python -m parplan.calibration.steps --out steps.csv``.

With ``--memory`` the same cases' memory is measured instead (:func:`measure_memory`: what
autograd keeps after the forward, the peak of forward + backward, the optimizer's state), to set
against section 6's memory (:func:`predict_memory_bytes`; docs/calibration.md, "Memory").
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time

from parplan.errors import ConfigError

#: (model spec, batch): Llama-class decoders of several widths, GPT-2, BERT, ResNet-50.
STEP_CASES = (
    (
        "hf:llama,hidden_size=1024,intermediate_size=2816,num_attention_heads=8,num_key_value_heads=8,"
        "num_hidden_layers=8,seq=1024",
        8,
    ),
    (
        "hf:llama,hidden_size=2048,intermediate_size=5632,num_attention_heads=16,num_key_value_heads=16,"
        "num_hidden_layers=8,seq=2048",
        4,
    ),
    (
        "hf:llama,hidden_size=4096,intermediate_size=14336,num_attention_heads=32,num_key_value_heads=8,"
        "num_hidden_layers=4,seq=4096",
        2,
    ),
    (
        "hf:llama,hidden_size=4096,intermediate_size=14336,num_attention_heads=32,num_key_value_heads=8,"
        "num_hidden_layers=4,seq=1024",
        8,
    ),
    ("hf:gpt2,seq=1024", 16),
    ("hf:bert,seq=512", 32),
    ("tv:resnet50", 128),
    ("tv:resnet50", 32),
)


def measure_step(
    spec: str,
    batch: int,
    device: str = "cuda",
    warmup: int = 3,
    steps: int = 10,
    compile: bool = False,
    checkpoint: bool = False,
) -> dict:
    """Median forward + backward and optimizer-update seconds of ``spec`` at ``batch``;
    ``compile``: through ``torch.compile`` (fused element-wise ops), else eager; ``checkpoint``:
    with Hugging Face's per-block activation checkpointing."""
    import torch

    dtype = torch.bfloat16 if device != "cpu" else torch.float32
    model, x = _build(spec, batch, device, dtype)
    if checkpoint:
        if not hasattr(model, "gradient_checkpointing_enable"):
            raise ConfigError(f"{spec}: no per-block checkpointing to switch on")
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5, fused=device != "cpu")
    if compile:
        model = torch.compile(model)
    sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)

    def output():
        out = model(x)
        return out if torch.is_tensor(out) else out[0]

    grad = torch.randn_like(output()).detach()
    fwd_bwd, update = [], []
    for i in range(warmup + steps):
        for p in params:
            p.grad = None
        sync()
        t = time.perf_counter()
        output().backward(grad)
        sync()
        t1 = time.perf_counter()
        opt.step()
        sync()
        if i >= warmup:
            fwd_bwd.append(t1 - t)
            update.append(time.perf_counter() - t1)
    out = {
        "model": spec,
        "batch": batch,
        "params": sum(p.numel() for p in params),
        "dtype": str(dtype).split(".")[-1],
        "mode": ("compiled" if compile else "eager") + (", checkpointed" if checkpoint else ""),
        "fwd_bwd_ms": statistics.median(fwd_bwd) * 1e3,
        "optimizer_ms": statistics.median(update) * 1e3,
        "device": torch.cuda.get_device_name() if device != "cpu" else "cpu",
        "torch": torch.__version__,
    }
    model = x = None  # output() reads them; the device's memory goes back before the next case
    del opt, params, grad
    if device != "cpu":
        torch.cuda.empty_cache()
    return out


#: (model spec, batch, block checkpointing) for ``--memory``: the step cases, and the decoders
#: again with Hugging Face's per-block activation checkpointing.
MEMORY_CASES = tuple((spec, batch, False) for spec, batch in STEP_CASES) + tuple(
    (spec, batch, True) for spec, batch in STEP_CASES if spec.startswith("hf:")
)


def _build(spec: str, batch: int, device: str, dtype):
    """(model in train mode on ``device`` in ``dtype``, example input) for an hf: or tv: spec."""
    import torch

    from parplan.models.importers.hub import parse_spec

    source, name, overrides = parse_spec(spec)  # hf: or tv: (anything else is refused there)
    seq = overrides.pop("seq", None)
    if source == "hf:":
        from parplan.models.importers.hub import hf_model

        model, seq = hf_model(name, overrides, seq, device="cpu")
        x = torch.randint(0, model.config.vocab_size, (batch, seq), device=device)
    else:
        from parplan.models.importers.hub import import_torchvision

        model = import_torchvision().models.get_model(name, weights=None)
        x = torch.randn(batch, 3, 224, 224, device=device, dtype=dtype)
    model = model.to(device=device, dtype=dtype).train()
    if source == "tv:" and device != "cpu":
        model = model.to(memory_format=torch.channels_last)
        x = x.to(memory_format=torch.channels_last)
    return model, x


def measure_memory(
    spec: str, batch: int, checkpoint: bool = False, device: str = "cuda", compile: bool = False
) -> dict:
    """Bytes of one bf16 training step of ``spec`` at ``batch`` on a GPU, read from the caching
    allocator (``torch.cuda.memory_allocated`` / ``max_memory_allocated``), after one warm-up
    step: ``state`` (weights and AdamW's two moments, gradients freed), ``saved`` (what the
    forward leaves allocated: the tensors autograd keeps for backward, and the output), ``peak``
    (the most allocated during forward + backward, above ``state``: the saved tensors, the
    gradients as backward writes them, and backward's temporaries), ``reserved`` (the most the
    allocator held). ``checkpoint``: Hugging Face's per-block activation checkpointing;
    ``compile``: through ``torch.compile`` (fused element-wise ops; its partitioner chooses what
    to save)."""
    import torch

    model, x = _build(spec, batch, device, torch.bfloat16)
    if checkpoint:
        if not hasattr(model, "gradient_checkpointing_enable"):
            raise ConfigError(f"{spec}: no per-block checkpointing to switch on")
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5, fused=True)
    if compile:
        model = torch.compile(model)

    def output():
        out = model(x)
        return out if torch.is_tensor(out) else out[0]

    grad = torch.randn_like(output()).detach()
    out_bytes = grad.numel() * grad.element_size()
    for p in params:
        p.grad = None
    output().backward(grad)
    opt.step()  # the moments exist from here on
    for p in params:
        p.grad = None
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    state = torch.cuda.memory_allocated() - out_bytes  # ``grad`` is the output's size
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    y = output()
    torch.cuda.synchronize()
    saved = torch.cuda.memory_allocated() - base
    y.backward(grad)
    del y
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    reserved = torch.cuda.max_memory_reserved()
    grads = sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
    out = {
        "model": spec,
        "batch": batch,
        "checkpoint": int(checkpoint),
        "mode": "compiled" if compile else "eager",
        "params": sum(p.numel() for p in params),
        "state_bytes": state,
        "saved_bytes": saved,
        "output_bytes": out_bytes,
        "peak_bytes": peak,
        "grad_bytes": grads,
        "reserved_bytes": reserved,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
    }
    model = x = None
    del opt, params, grad
    torch.cuda.empty_cache()
    return out


def predict_memory_bytes(
    spec: str,
    batch: int,
    recompute: bool = False,
    bytes_per_element: float = 2.0,
    optimizer_bytes_per_param: float = 4.0,
) -> tuple[float, float, float]:
    """(weights, gradients and optimizer state; stored activations; what a recomputed block
    holds again during its backward) in bytes of ``spec`` at ``batch`` on one device, by
    docs/costmodel.md section 6 (every node whole; section 6.3's checkpointing when
    ``recompute``). The defaults are what :func:`measure_memory` runs: bf16 weights and
    gradients, AdamW's two moments in bf16 (4 bytes per parameter)."""
    from parplan.costmodel.evaluate import recomputed_block_bytes
    from parplan.costmodel.hardware import parse_array
    from parplan.costmodel.problem import Problem
    from parplan.models.modelfile import load_model

    problem = Problem(
        load_model(spec),
        parse_array("h200:2"),
        batch=batch,
        bytes_per_element=bytes_per_element,
        optimizer_bytes_per_param=optimizer_bytes_per_param,
        recompute=recompute,
    )
    dims = problem.root_dims()
    bpe, opt = bytes_per_element, optimizer_bytes_per_param
    state = sum(d.state_bytes(bpe, opt) for d in dims)
    stored = sum(d.memory_bytes(bpe, opt) for d in dims) - state
    return state, stored, recomputed_block_bytes(problem, dims)


def predict_step_seconds(
    spec: str,
    batch: int,
    device_kind: str,
    devices_file=None,
    bytes_per_element: float = 2.0,
    recompute: bool = False,
) -> float:
    """Section 5's compute time of one training step of ``spec`` at ``batch`` on one device of
    kind ``device_kind`` (its every node whole: no split, no communication); ``recompute``: with
    section 6.3's forward again (per block)."""
    from parplan.costmodel.hardware import load_devices
    from parplan.costmodel.problem import Problem
    from parplan.costmodel.hardware import parse_array
    from parplan.models.modelfile import load_model

    kinds = load_devices(devices_file)
    if device_kind.lower() not in kinds:
        raise ConfigError(f"unknown device '{device_kind}'")
    problem = Problem(
        load_model(spec),
        parse_array(f"{device_kind}:2", devices=kinds),
        batch=batch,
        bytes_per_element=bytes_per_element,
        recompute=recompute,
    )
    device = kinds[device_kind.lower()].as_device()
    return sum(d.compute_seconds(device, bytes_per_element) for d in problem.root_dims())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description="measure whole training steps of STEP_CASES on this device"
    )
    parser.add_argument("--out", required=True, help="CSV to write")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--cases", default=None, help="comma-separated case numbers (default: all)")
    parser.add_argument(
        "--compile", action="store_true", help="run the models through torch.compile"
    )
    parser.add_argument(
        "--memory", action="store_true", help="measure MEMORY_CASES' memory instead of time"
    )
    parser.add_argument(
        "--checkpoint",
        action="store_true",
        help="time the Hugging Face cases with per-block activation checkpointing",
    )
    args = parser.parse_args(argv)
    if args.memory and not args.device.startswith("cuda"):
        print(
            "steps --memory reads a CUDA GPU's allocator: --device must be cuda or cuda:N",
            file=sys.stderr,
        )
        return 2
    every = MEMORY_CASES if args.memory else STEP_CASES
    if args.checkpoint and not args.memory:
        every = tuple(c for c in STEP_CASES if c[0].startswith("hf:"))
    if args.memory and args.compile:  # Hugging Face's checkpointing is not compiled here
        every = tuple(c for c in every if not c[2])
    cases = every if args.cases is None else [every[int(i)] for i in args.cases.split(",")]
    rows = []
    for case in cases:
        spec, batch = case[:2]
        try:
            if args.memory:
                rows.append(measure_memory(spec, batch, case[2], args.device, args.compile))
                said = (
                    f"checkpoint={case[2]}: saved {rows[-1]['saved_bytes'] / 2**30:.2f} GiB, "
                    f"peak {rows[-1]['peak_bytes'] / 2**30:.2f} GiB"
                )
            else:
                rows.append(
                    measure_step(
                        spec, batch, args.device, compile=args.compile, checkpoint=args.checkpoint
                    )
                )
                said = (
                    f"{rows[-1]['fwd_bwd_ms']:.2f} ms fwd+bwd, "
                    f"{rows[-1]['optimizer_ms']:.2f} ms update"
                )
            print(f"{spec} b{batch}: {said}", file=sys.stderr, flush=True)
        except Exception as e:  # one case failing leaves the others measured
            print(f"{spec} b{batch}: failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        with open(
            args.out, "w", newline=""
        ) as f:  # after every case: a run cut short keeps what it measured
            w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["model"])
            w.writeheader()
            w.writerows(rows)
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
