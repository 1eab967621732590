"""Arch name (GGUF `general.architecture`) → the model's config reader, tensor table and graph builders."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from nextn.common.errors import NextnError, shown


@dataclass(frozen=True)
class ModelSpec:
    arch: str
    config_from_gguf: Callable
    config_from_json: Callable
    trunk_tensors: Callable
    nextn_tensors: Callable
    nextn_optional: Callable
    build_trunk: Callable      # (config, has_tensor, all_rows) -> Graph
    build_mtp: Callable        # (config, has_tensor, all_rows) -> Graph
    # Compile options (e.g. "mtp_dense_attention") this arch's builders take as keyword arguments.
    compile_options: tuple = ()
    # (config, has_tensor, **options) -> {entry name: (graph kind "trunk"|"mtp", Graph)}: arch-specific extra entries.
    extra_entry_points: Callable | None = None


def _glm4moe() -> ModelSpec:
    from .glm_base.config import nextn_optional
    from .glm4moe import config, graph

    return ModelSpec("glm4moe", config.config_from_gguf, config.Glm4MoeConfig.from_json, config.trunk_tensors,
                     config.nextn_tensors, nextn_optional, graph.build_trunk, graph.build_mtp)


def _glm_dsa() -> ModelSpec:
    from .glm_base.config import nextn_optional
    from .glm_dsa import config, graph

    return ModelSpec("glm-dsa", config.config_from_gguf, config.GlmDsaConfig.from_json, config.trunk_tensors,
                     config.nextn_tensors, nextn_optional, graph.build_trunk, graph.build_mtp,
                     ("mtp_dense_attention",), graph.extra_entry_points)


def _glm5next() -> ModelSpec:
    from .glm5next import config, graph

    return ModelSpec("glm5-next", config.config_from_gguf, config.Glm5NextConfig.from_json, config.trunk_tensors,
                     config.nextn_tensors, config.nextn_optional, graph.build_trunk, graph.build_mtp,
                     (), graph.extra_entry_points)


# GLM-5.3-Flash GGUFs carry either spelling (llama.cpp upstream: glm5-next; the first published files: glm5next)
_REGISTRY = {"glm4moe": _glm4moe, "glm-dsa": _glm_dsa, "glm5-next": _glm5next, "glm5next": _glm5next}


def supported() -> list[str]:
    return sorted(_REGISTRY)


def get(arch: str, where: str = "") -> ModelSpec:
    if arch not in _REGISTRY:
        raise NextnError(f"{where + ': ' if where else ''}unsupported architecture '{shown(arch)}' "
                         f"(general.architecture); supported: {', '.join(supported())}")
    return _REGISTRY[arch]()
