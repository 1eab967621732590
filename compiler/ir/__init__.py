"""Graph IR whose node vocabulary is ggml's op names (the op table: `ops.TABLE`; `graph.OPS` its names)."""
from .graph import OPS, Graph, Node

__all__ = ["OPS", "Graph", "Node"]
