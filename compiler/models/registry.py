"""Arch name (GGUF `general.architecture`) → the model's config reader, tensor table and graph builders."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from nextn.runtime.errors import NextnError


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


def _glm4moe() -> ModelSpec:
    from .glm4moe import config, graph

    return ModelSpec("glm4moe", config.config_from_gguf, config.Glm4MoeConfig.from_json, config.trunk_tensors,
                     config.nextn_tensors, config.nextn_optional, graph.build_trunk, graph.build_mtp)


_REGISTRY = {"glm4moe": _glm4moe}


def supported() -> list[str]:
    return sorted(_REGISTRY)


def get(arch: str, where: str = "") -> ModelSpec:
    if arch not in _REGISTRY:
        raise NextnError(f"{where + ': ' if where else ''}unsupported architecture '{arch}' "
                         f"(general.architecture); supported: {', '.join(supported())}")
    return _REGISTRY[arch]()
