"""A TorchDispatchMode that records every ATen operator of forward + ``loss.backward()``.

What it keeps per operator: its layer, pass, ATen name, input/output shapes, where each input
came from (an earlier operator, a parameter, or outside the graph), FLOPs (``torch.utils.
flop_counter``'s formulas) and matmul dimensions. It holds only WEAK references to tensors
(``WeakIdKeyDictionary``): a strong reference would keep tensors alive that autograd would have
freed and change what the model does (e.g. in-place ops turn into copies).

Views and reshapes are collapsed while recording: their outputs inherit the origin of the tensor
they alias, so consumers get an edge straight to the real producer.

Layer attribution: forward ops take the layer the module hooks say is running; backward ops take
the layer whose forward created the autograd node being executed (autograd sequence numbers are
assigned in forward order, so the layer boundaries recorded in forward are ranges of them). The
role of an op in a mixture-of-experts layer (router, dispatch, expert e, ...: phaze.trace.
moe_layer) is attributed the same way, from the hooks of the layer's modules.

Two flags per tensor, by data flow (what sequence parallelism and selective recomputation need):

* inside the tensor-parallel region (t > 1): an op's outputs are inside when an activation input
  is, or when it reads a parameter the tensor-parallel rewrite sliced (column- or row-parallel
  weights, vocab-parallel embedding/head: `phaze.trace.tensor_parallel.SLICED`); the all-reduce
  leaves the region. ``phaze::sp_split`` enters it and ``phaze::sp_gather`` leaves it (the
  routed experts' path at etp = 1 runs on the rank's own shard of the tokens, phaze.trace.
  moe_layer). Ops whose outputs are outside are ``replicated``: every rank of the group
  runs them on the whole activation, and sequence parallelism splits them (Korthikanti et al.
  2022 §4.2.2);
* core attention (forward): seeded by a matmul of two activations with an s×s result that reads
  no core-attention tensor (QKᵀ), carried by non-matmul ops whose output is s×s and reads such a
  tensor (scale, mask, softmax, dropout); a matmul reading one (×V) is part of core attention
  but ends it — what selective recomputation re-runs. Shapes alone would not do: h/t, the FFN
  width per rank or the head size can equal s.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry
from torch.utils.weak import WeakIdKeyDictionary

from phaze.trace.moe_layer import ALL_TO_ALL_OP, SP_GATHER_OP, SP_SPLIT_OP
from phaze.trace.tensor_parallel import ALL_REDUCE_OP, SLICED

#: phaze's collective custom ops -> the ``collective`` column's name for them
COLLECTIVE_OPS = {ALL_REDUCE_OP: "all_reduce", ALL_TO_ALL_OP: "all_to_all"}

# Training precision: bf16/fp16 activations and weights.
FLOAT_BYTES = 2

# Not views by schema but pure reshapes of a fresh tensor: no data movement worth an operator.
_RESHAPES = {"aten._unsafe_view.default", "aten.view_copy.default", "aten._reshape_alias.default"}
# Allocation without computation.
NOP_OPS = {
    "aten.empty.memory_format",
    "aten.empty_like.default",
    "aten.empty_strided.default",
    "aten.new_empty.default",
    "aten.new_empty_strided.default",
    "aten.scalar_tensor.default",
    # the free stand-ins of a sequence-parallel shard (experts without tensor parallelism)
    SP_SPLIT_OP,
    SP_GATHER_OP,
}
_MATMUL_3 = {
    "aten.addmm.default": (1, 2),
    "aten.baddbmm.default": (1, 2),
    "aten.mm.default": (0, 1),
    "aten.bmm.default": (0, 1),
}
_NO_SEQ = 2**64 - 1  # AccumulateGrad and other nodes without a forward sequence number


def element_bytes(t: torch.Tensor) -> int:
    return FLOAT_BYTES if t.is_floating_point() else t.element_size()


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * element_bytes(t)


@dataclass
class RawInput:
    src: int  # index of the producing RawOp, or -1 (parameter / graph input)
    param: str | None  # parameter name if this input is (a view of) a parameter
    shape: tuple
    bytes: int


@dataclass
class RawOp:
    index: int
    layer: str
    pass_: str
    aten: str
    inputs: list[RawInput]
    out_shapes: list[tuple]
    elements: int
    bytes_out: int
    flops: float
    mnkb: tuple[int, int, int, int]
    pointwise: bool
    group_size: int
    attention: bool = False  # part of core attention (forward)
    replicated: bool = False  # outside the tensor-parallel region (t > 1)
    moe_role: str = ""  # role in a mixture-of-experts layer ("" outside one)
    expert: int = -1  # routed expert whose op this is (moe_role "expert"), else -1


@dataclass(eq=False)  # identity semantics: a mode must stay hashable
class Recorder(TorchDispatchMode):
    params: dict  # name -> parameter
    ops: list[RawOp] = field(default_factory=list)
    layer: str = "embedding"
    pass_: str = "fwd"
    param_layer: dict = field(default_factory=dict)  # parameter name -> layer of first use
    param_users: dict = field(default_factory=dict)  # parameter name -> layers that read it
    collapsed_views: int = 0  # view/reshape ops folded into edges
    activation_bytes: dict = field(default_factory=dict)  # layer -> saved-for-backward bytes
    seq: int = 0  # sequence length (the s of core attention's s×s tensors)
    attention_bytes: dict = field(default_factory=dict)  # layer -> of which core attention
    replicated_bytes: dict = field(default_factory=dict)  # layer -> of which outside the region

    def __post_init__(self):
        super().__init__()
        self._origin = WeakIdKeyDictionary()  # tensor -> (op index, parameter name)
        self._saved = WeakIdKeyDictionary()  # saved tensor -> layers that counted it
        self._param_name = WeakIdKeyDictionary()
        self._dropout_masks = WeakIdKeyDictionary()  # tensors filled by bernoulli_ (masks)
        self._region = WeakIdKeyDictionary()  # tensor -> inside the tensor-parallel region
        self._attention = WeakIdKeyDictionary()  # tensor -> a core-attention tensor
        self._sliced = set()
        for name, p in self.params.items():
            self._origin[p] = (-1, name)
            self._param_name[p] = name
            if getattr(p, SLICED, False):
                self._sliced.add(name)
        self.tensor_parallel = bool(self._sliced)
        self._marks_seq: list[int] = []
        self._marks_layer: list[tuple[str, str, int]] = []  # (layer, MoE role, expert)
        self._roles: list[tuple[str, int]] = []  # the enclosing MoE roles (a stack)
        self.moe_role, self.expert = "", -1
        self.param_role: dict = {}  # parameter name -> (MoE role, expert) of its first use
        self._last_bwd = ("head", "", -1)
        self.enter_layer("embedding")

    # --- layer attribution -----------------------------------------------------------------
    def _mark(self) -> None:
        self._marks_seq.append(torch._C._autograd._get_sequence_nr())
        self._marks_layer.append((self.layer, self.moe_role, self.expert))

    def enter_layer(self, name: str) -> None:
        """Called by module hooks in forward: ops from now on (and their backward) are ``name``'s."""
        self.layer = name
        self._roles.clear()
        self.moe_role, self.expert = "", -1
        self._mark()

    def enter_moe(self, role: str, expert: int = -1) -> None:
        """A MoE module starts (forward): its ops (and their backward) get ``role``, ``expert``."""
        self._roles.append((self.moe_role, self.expert))
        self.moe_role, self.expert = role, expert
        self._mark()

    def exit_moe(self) -> None:
        self.moe_role, self.expert = self._roles.pop()
        self._mark()

    def _backward_place(self) -> tuple[str, str, int]:
        """(layer, MoE role, expert) of the backward op running now."""
        node = torch._C._current_autograd_node()
        if node is None:  # e.g. the loss gradient seed, created before the engine runs
            return self._last_bwd
        seq = node._sequence_nr()
        if seq == _NO_SEQ:
            variable = getattr(node, "variable", None)
            name = self._param_name.get(variable) if variable is not None else None
            if name in self.param_layer:
                return (self.param_layer[name], *self.param_role[name])
            return self._last_bwd
        i = bisect.bisect_right(self._marks_seq, seq) - 1
        self._last_bwd = self._marks_layer[max(i, 0)]
        return self._last_bwd

    # --- saved activations (forward) --------------------------------------------------------
    def pack_hook(self, t: torch.Tensor):
        # Counted once per layer that saves it: a tensor several layers save (e.g. Llama's
        # rotary cos/sin, computed once and passed to every block) must be held by every
        # pipeline stage that holds one of those layers.
        base = t._base if t._base is not None else t
        if base in self._param_name:
            return t
        layers = self._saved.setdefault(base, set())
        if self.layer not in layers:
            layers.add(self.layer)
            # A dropout mask is kept as one byte per element (CUDA's fused dropout keeps a bool
            # mask); the decomposed meta dropout materialises it in the activation dtype.
            size = base.numel() if base in self._dropout_masks else tensor_bytes(base)
            self.activation_bytes[self.layer] = self.activation_bytes.get(self.layer, 0) + size
            if self._attention.get(base, False):
                self.attention_bytes[self.layer] = self.attention_bytes.get(self.layer, 0) + size
            if self.tensor_parallel and not self._region.get(base, False):
                self.replicated_bytes[self.layer] = self.replicated_bytes.get(self.layer, 0) + size
        return t

    def _square(self, shape) -> bool:
        return len(shape) >= 2 and shape[-1] == shape[-2] == self.seq

    @staticmethod
    def unpack_hook(t):
        return t

    # --- the recorder -----------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = str(func)
        flat_in = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        flat_out = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]

        if (func.is_view or name in _RESHAPES) and flat_in:
            origin = self._origin.get(flat_in[0], (-1, None))
            region = self._region.get(flat_in[0], False)
            attention = self._attention.get(flat_in[0], False)
            for o in flat_out:
                self._origin[o] = origin
                self._region[o] = region
                self._attention[o] = attention
            self.collapsed_views += 1
            return out

        if self.pass_ == "fwd":
            layer, moe_role, expert = self.layer, self.moe_role, self.expert
        else:
            layer, moe_role, expert = self._backward_place()
        index = len(self.ops)
        inputs = []
        for t in flat_in:
            src, param = self._origin.get(t, (-1, None))
            if param is not None:
                self.param_layer.setdefault(param, layer)
                self.param_role.setdefault(param, (moe_role, expert))
                self.param_users.setdefault(param, set()).add(layer)
            inputs.append(RawInput(src, param, tuple(t.shape), tensor_bytes(t)))
        flops = 0.0
        if func.overloadpacket in flop_registry:
            flops = float(flop_registry[func.overloadpacket](*args, **kwargs, out_val=out))
        mnkb = (0, 0, 0, 0)
        if name in _MATMUL_3:
            a, b = (args[i] for i in _MATMUL_3[name])
            batch = a.shape[0] if a.dim() == 3 else 1
            mnkb = (a.shape[-2], b.shape[-1], a.shape[-1], batch)
        group_size = 1
        if name in COLLECTIVE_OPS:
            group_size = int(args[1] if len(args) > 1 else kwargs["group_size"])
        activations = [t for t in flat_in if self._origin.get(t, (-1, None))[1] is None]
        if name == SP_SPLIT_OP:  # the rank's own shard: its work is never split again
            region = True
        elif name in (ALL_REDUCE_OP, SP_GATHER_OP):
            region = False
        else:
            region = any(self._region.get(t, False) for t in activations) or any(
                x.param in self._sliced for x in inputs
            )
        reads_attention = any(self._attention.get(t, False) for t in activations)
        square_out = bool(flat_out) and all(self._square(tuple(o.shape)) for o in flat_out)
        if name in _MATMUL_3:  # QKᵀ seeds; ×V reads attention and ends it
            makes_attention = len(activations) >= 2 and not reads_attention and square_out
        else:
            makes_attention = reads_attention and square_out
        makes_attention = makes_attention and self.pass_ == "fwd"
        self.ops.append(
            RawOp(
                index=index,
                layer=layer,
                pass_=self.pass_,
                aten=name,
                inputs=inputs,
                out_shapes=[tuple(o.shape) for o in flat_out],
                elements=sum(o.numel() for o in flat_out),
                bytes_out=sum(tensor_bytes(o) for o in flat_out),
                flops=flops,
                mnkb=tuple(int(x) for x in mnkb),
                pointwise=torch.Tag.pointwise in func.tags,
                group_size=group_size,
                attention=self.pass_ == "fwd" and (makes_attention or reads_attention),
                replicated=self.tensor_parallel and not region,
                moe_role=moe_role,
                expert=expert,
            )
        )
        for o in flat_out:
            self._origin[o] = (index, None)
            self._region[o] = region
            self._attention[o] = makes_attention
        if name.startswith("aten.bernoulli"):
            for o in flat_out:
                self._dropout_masks[o] = True
        return out
