"""Graph IR whose node vocabulary is ggml's op names (see `graph.OPS`)."""
from .graph import OPS, Graph, Node

__all__ = ["OPS", "Graph", "Node"]
