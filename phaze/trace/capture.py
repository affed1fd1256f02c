"""Build a model on the meta device and record forward + ``loss.backward()`` (imports torch).

``capture(spec, num_blocks, microbatch, seq, tp)`` returns a :class:`Capture`: the recorded
operators plus what the layer table needs (parameters per layer, activations saved for backward,
the tensors crossing each layer boundary).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from phaze.errors import PhazeError
from phaze.trace.models import ModelSpec
from phaze.trace.moe_layer import EXPERT_ATTR, EXPERT_PARAM, ROLE_ATTR, apply_moe
from phaze.trace.recorder import RawOp, Recorder, tensor_bytes
from phaze.trace.tensor_parallel import apply_tensor_parallel, apply_vocab_parallel


@dataclass
class Capture:
    ops: list[RawOp]
    layer_names: list[str]  # execution order: embedding, block.0 ..., head
    param_bytes: dict[str, int]  # per layer, one rank's share, counted once (tied weights)
    tied_param_bytes: dict[str, int]  # parameters a layer reads that another layer owns
    activation_bytes: dict[str, int]  # saved-for-backward activations per layer
    attention_bytes: dict[str, int]  # ... of which core attention saves
    replicated_bytes: dict[str, int]  # ... of which outside the tensor-parallel region (t > 1)
    input_bytes: dict[str, int]  # what enters each layer (the recompute stash)
    output_bytes: dict[str, int]  # what leaves each layer for the next one
    collapsed_views: int = 0  # view/reshape operators folded into edges
    expert_param_bytes: dict[str, int] = field(default_factory=dict)  # of param_bytes: experts'


def find_blocks(model: nn.Module, num_blocks: int) -> nn.ModuleList:
    """The ModuleList of transformer blocks: the one with ``num_blocks`` identical-class children
    holding the most parameters."""
    best, best_params = None, -1
    for module in model.modules():
        if (
            isinstance(module, nn.ModuleList)
            and len(module) == num_blocks
            and len({type(m) for m in module}) == 1
        ):
            n = sum(p.numel() for p in module.parameters())
            if n > best_params:
                best, best_params = module, n
    if best is None or best_params <= 0:
        raise PhazeError(
            f"cannot find the list of {num_blocks} transformer blocks in {type(model).__name__}"
        )
    return best


def build_model(
    spec: ModelSpec,
    num_blocks: int,
    tp: int = 1,
    seq: int | None = None,
    moe_imbalance: float = 1.0,
    ep: int = 1,
    etp: int | None = None,
    dense_blocks: int | None = None,
):
    """The model with ``num_blocks`` blocks (of them ``dense_blocks`` dense first blocks, for a
    model that has them; default its own count) on the meta device, train mode, rewritten to one
    rank's share of width-``tp`` tensor parallelism (blocks, word embedding and LM head); a
    mixture-of-experts model gets phaze's MoE layer in every block, with the rank's share of
    expert parallelism of size ``ep`` and the experts' tensor-parallel size ``etp`` (tp or 1),
    routing its tokens by the stated distribution with ``moe_imbalance`` (phaze.trace.moe).
    Returns (model, blocks)."""
    spec.check_tp(tp)
    spec.check_ep(ep)
    spec.check_etp(etp, tp, seq)
    if spec.moe is not None:
        spec.moe.check_imbalance(moe_imbalance, spec.name)
    config = spec.hf_config(num_blocks, seq, dense_blocks)
    dense = getattr(config, "first_k_dense_replace", 0) if spec.dense_blocks else 0
    cls = spec.model_class()
    try:
        with torch.device("meta"):
            model = cls(config)
    except Exception as exc:  # transformers raises many exception types for bad configs
        raise PhazeError(
            f"{spec.name}: cannot build {cls.__name__} on the meta device: {exc}"
        ) from exc
    model.train()  # the training graph: dropout as configured (see docs/trace.md)
    blocks = find_blocks(model, num_blocks)
    for i, block in enumerate(blocks):
        if spec.moe is not None and i >= dense:
            apply_moe(block, spec.moe, spec.hidden, tp, moe_imbalance, spec.name, ep, etp)
        apply_tensor_parallel(block, spec.family, tp)
    apply_vocab_parallel(model, tp)
    return model, blocks


def model_inputs(spec: ModelSpec, microbatch: int, seq: int) -> dict:
    ids = torch.zeros(microbatch, seq, dtype=torch.long, device="meta")
    # Causal LMs shift the labels inside HF; masked LMs predict every position (all are labels).
    inputs = {"input_ids": ids, "labels": ids}
    if spec.causal:
        # An explicit (all-ones) padding mask: without one, HF probes the position ids for packed
        # sequences, a data-dependent check that cannot run on the meta device.
        inputs["attention_mask"] = torch.ones(microbatch, seq, dtype=torch.long, device="meta")
    else:
        # Encoders: a ready 4-D additive padding mask, as BERT pre-training uses (sequences are
        # padded). A 2-D mask would make HF test whether it can be skipped (data-dependent).
        inputs["attention_mask"] = torch.zeros(microbatch, 1, seq, seq, device="meta")
    return inputs


def _hidden(args, kwargs, output=None):
    if output is not None:
        first = output[0] if isinstance(output, (tuple, list)) else output
        return first if isinstance(first, torch.Tensor) else None
    if args and isinstance(args[0], torch.Tensor):
        return args[0]
    return kwargs.get("hidden_states")


def capture(
    spec: ModelSpec,
    num_blocks: int,
    microbatch: int,
    seq: int,
    tp: int,
    moe_imbalance: float = 1.0,
    ep: int = 1,
    etp: int | None = None,
    dense_blocks: int | None = None,
) -> Capture:
    model, blocks = build_model(spec, num_blocks, tp, seq, moe_imbalance, ep, etp, dense_blocks)
    params = dict(model.named_parameters())  # de-duplicates tied weights
    recorder = Recorder(params, seq=seq)
    names = ["embedding"] + [f"block.{i}" for i in range(num_blocks)] + ["head"]
    input_bytes: dict[str, int] = {}
    output_bytes: dict[str, int] = {}

    def pre_hook(i):
        def hook(module, args, kwargs):
            x = _hidden(args, kwargs)
            if x is None:
                raise PhazeError(f"cannot find the hidden-state input of block {i}")
            prev = names[i]  # embedding for block 0, else block.{i-1}
            output_bytes.setdefault(prev, tensor_bytes(x))
            input_bytes[f"block.{i}"] = tensor_bytes(x)
            recorder.enter_layer(f"block.{i}")

        return hook

    def post_hook(i):
        def hook(module, args, kwargs, output):
            x = _hidden(args, kwargs, output)
            output_bytes[f"block.{i}"] = tensor_bytes(x)
            # Anything between two blocks would belong to neither: flag it (checked below).
            recorder.enter_layer("head" if i == num_blocks - 1 else f"between.{i}")

        return hook

    handles = []
    for i, block in enumerate(blocks):
        handles.append(block.register_forward_pre_hook(pre_hook(i), with_kwargs=True))
        handles.append(block.register_forward_hook(post_hook(i), with_kwargs=True))
    # MoE roles (phaze.trace.moe_layer): entered before any other pre-hook of the module runs
    # (a tensor-parallel f registered on it belongs to the role), left after its output
    for module in model.modules():
        role = getattr(module, ROLE_ATTR, None)
        if role is None:
            continue
        expert = getattr(module, EXPERT_ATTR, -1)
        handles.append(
            module.register_forward_pre_hook(
                lambda m, a, r=role, e=expert: recorder.enter_moe(r, e), prepend=True
            )
        )
        handles.append(module.register_forward_hook(lambda m, a, o: recorder.exit_moe()))
    inputs = model_inputs(spec, microbatch, seq)
    try:
        with (
            recorder,
            torch.autograd.graph.saved_tensors_hooks(recorder.pack_hook, recorder.unpack_hook),
        ):
            out = model(**inputs)
            loss = out.loss if getattr(out, "loss", None) is not None else None
            if loss is None:
                raise PhazeError(f"{type(model).__name__} returned no loss for labels")
        recorder.pass_ = "bwd"
        with recorder:
            loss.backward()
    except PhazeError:
        raise
    except Exception as exc:
        raise PhazeError(
            f"{spec.name}: tracing forward/backward failed: {type(exc).__name__}: {exc}"
        ) from exc
    finally:
        for h in handles:
            h.remove()

    stray = sorted({op.layer for op in recorder.ops if op.layer not in names})
    if stray:
        raise PhazeError(
            f"{spec.name}: operators ran outside any layer ({stray}); the block "
            "structure is not what the tracer assumes"
        )
    input_bytes["embedding"] = tensor_bytes(inputs["input_ids"])
    input_bytes["head"] = output_bytes[f"block.{num_blocks - 1}"]
    output_bytes["head"] = 0
    param_bytes = {n: 0 for n in names}
    tied_param_bytes = {n: 0 for n in names}
    expert_param_bytes = {n: 0 for n in names}
    unused = []
    for pname, p in params.items():
        layer = recorder.param_layer.get(pname)
        if layer is None:
            unused.append(pname)
            continue
        param_bytes[layer] += tensor_bytes(p)
        if getattr(p, EXPERT_PARAM, False):
            expert_param_bytes[layer] += tensor_bytes(p)
        for user in recorder.param_users[pname] - {layer}:
            tied_param_bytes[user] += tensor_bytes(p)
    if unused:
        raise PhazeError(f"{spec.name}: parameters never used in training: {unused[:5]}")
    return Capture(
        recorder.ops,
        names,
        param_bytes,
        tied_param_bytes,
        {n: recorder.activation_bytes.get(n, 0) for n in names},
        {n: recorder.attention_bytes.get(n, 0) for n in names},
        {n: recorder.replicated_bytes.get(n, 0) for n in names},
        input_bytes,
        output_bytes,
        recorder.collapsed_views,
        expert_param_bytes,
    )
