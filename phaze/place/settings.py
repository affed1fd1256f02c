"""The settings of one placement job and what an architecture is placed on.

`PlaceSettings` is config section ``place`` (and ``step``) for one model, HBM capacity and
microbatch; `arch_costmodel`, `link_parameters` and `network_for` give an architecture's cost-model
constants, flat link and network (its preset's overrides, config ``place.network``, the flat
link). Both placement objectives (phaze/place/objective_megatron.py,
phaze/place/objective_upstream.py) and the space bounds (phaze/search/space_bounds.py) read them.
"""

from __future__ import annotations

from dataclasses import dataclass

from phaze.arch.presets import load_preset
from phaze.config import from_section
from phaze.errors import PhazeError
from phaze.network import network_for_architecture
from phaze.place.megatron import Axes
from phaze.units import GIB

STATE_BYTES_PER_PARAM = {"sgd": 4.0, "adam": 16.0}


#: the largest HBM capacity per device, GiB: 1 PiB, the preset schema's bound of
#: gpu.hbm_capacity_bytes (config/preset_schema.yaml), far below the int64 bytes of the tables
MAX_HBM_GIB = 2**20


def hbm_capacity_bytes_of(gib: float) -> int:
    """An HBM capacity in GiB (config ``place.hbm_gib``, ``--hbm-gib``) in bytes, as every
    placement table and the space bounds key it."""
    return round(float(gib) * GIB)


#: the recompute modes of the upstream model (its DP knows recompute on / off only)
UPSTREAM_RECOMPUTE = ("none", "full")


@dataclass
class PlaceSettings:
    model: str
    hbm_capacity_bytes: int
    microbatch: int
    global_batch: int
    place_model: str  # "megatron" or "upstream" (config place.model)
    axes: Axes  # the placement axes of config place (recompute modes among them)
    step: dict  # config section step (the step model's accounting)
    optimizer: str  # upstream: parameter state
    bytes_per_element: int  # upstream
    dp_must_divide_batch: bool  # upstream
    dp_must_divide_devices: bool  # upstream
    expert: dict | None  # {"pp", "dp", "tp"[, "ep"]} or None
    network: dict | None  # config place.network (two levels) or None = flat link
    preset_networks: bool  # a preset's own network: section wins for its architecture

    @classmethod
    def from_config(
        cls, config: dict, model: str, hbm_capacity_bytes: int, microbatch: int
    ) -> PlaceSettings:
        """The settings of one placement job: the outer axes given, the rest from the validated
        config (phaze.config.load_config fills its defaults)."""
        place = config["place"]
        given = {
            "model": model,
            "hbm_capacity_bytes": int(hbm_capacity_bytes),
            "microbatch": int(microbatch),
            "place_model": place["model"],
            "axes": Axes.from_config(place),
            "step": dict(config["step"]),
            "expert": place["expert"].get(model),
        }
        return from_section(cls, place, given=given)

    @property
    def scatter_gather(self) -> bool:
        return bool(self.step["scatter_gather"])

    @property
    def upstream_recompute(self) -> list[str]:
        """The recompute modes the upstream model searches (selective is not one of its)."""
        modes = [m for m in self.axes.recompute if m in UPSTREAM_RECOMPUTE]
        if not modes:
            raise PhazeError(
                "place.model upstream knows recompute none and full only; "
                f"place.recompute lists {list(self.axes.recompute)}"
            )
        return modes

    @property
    def microbatches(self) -> int:
        if self.global_batch % self.microbatch:
            raise PhazeError(
                f"global batch {self.global_batch} is not a multiple of the "
                f"microbatch size {self.microbatch}"
            )
        return self.global_batch // self.microbatch

    @property
    def param_state_factor(self) -> float:
        if self.optimizer not in STATE_BYTES_PER_PARAM:
            raise PhazeError(
                f"optimizer must be one of {sorted(STATE_BYTES_PER_PARAM)}, got {self.optimizer!r}"
            )
        return STATE_BYTES_PER_PARAM[self.optimizer] / self.bytes_per_element


def arch_costmodel(costmodel: dict, preset_name: str | None) -> dict:
    """The config's costmodel with the architecture's preset overrides."""
    cm = dict(costmodel)
    if preset_name:
        cm.update(load_preset(preset_name).get("costmodel") or {})
    return cm


def link_parameters(costmodel: dict, preset_name: str | None) -> tuple[float, float]:
    cm = arch_costmodel(costmodel, preset_name)
    try:
        bw, lat = float(cm["link_bandwidth_Bps"]), float(cm["link_latency_s"])
    except KeyError as exc:
        raise PhazeError(f"costmodel lacks {exc.args[0]}") from None
    if bw <= 0 or lat < 0:
        raise PhazeError("costmodel: link_bandwidth_Bps must be > 0 and link_latency_s >= 0")
    return bw, lat


def network_for(settings: PlaceSettings, preset_name: str | None, costmodel: dict, devices: int):
    """The network an architecture is placed on (a `phaze.network` network, None = the flat
    costmodel link) and its label for the output, for a job of `devices` devices, as
    `phaze.network.network_for_architecture` chooses it for every stage: the preset's
    ``network:`` section, else ``place.network``, else the flat link."""
    preset_net = load_preset(preset_name).get("network") if preset_name else None
    net, label = network_for_architecture(
        preset_net,
        settings.network,
        settings.preset_networks,
        costmodel,
        devices,
        preset_name or "",
    )
    return (None if label == "flat" else net), label
